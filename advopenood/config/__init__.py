"""Run configuration: the YAML schema, loading and validation, protocols and the resolved run plan."""
from typing import Any

from advopenood.deprecated import removed


def __getattr__(name: str) -> Any:
    """A name this module held before the split fails naming where it lives now (removed in 0.3.0)."""
    raise removed(__name__, name)
