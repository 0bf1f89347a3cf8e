"""The ``advopenood`` command line (:mod:`advopenood.cli.main`); importing it does not import torch."""
from typing import Any

from advopenood.cli.main import main
from advopenood.deprecated import removed

__all__ = ["main"]


def __getattr__(name: str) -> Any:
    """A name this module held before the split fails naming where it lives now (removed in 0.3.0)."""
    raise removed(__name__, name)
