"""The ``advopenood`` command line (:mod:`advopenood.cli.main`); importing it does not import torch."""
from typing import Any

from advopenood.cli.main import main
from advopenood.deprecated import forward

__all__ = ["main"]


def __getattr__(name: str) -> Any:
    """The names this module held before the split, from where they live now (with a DeprecationWarning)."""
    return forward(__name__, name)
