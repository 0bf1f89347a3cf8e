"""Run configuration: the YAML schema, loading and validation, protocols and the resolved run plan."""
from typing import Any

from advopenood.deprecated import forward


def __getattr__(name: str) -> Any:
    """The names this module held before the split, from where they live now (with a DeprecationWarning)."""
    return forward(__name__, name)
