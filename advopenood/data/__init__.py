"""Datasets: readers for .npz, IDX, OpenOOD image lists, torchvision sets and the demo; OpenOOD v1.5 benchmark layouts."""
from typing import Any

from advopenood.deprecated import forward


def __getattr__(name: str) -> Any:
    """The names this module held before the split, from where they live now (with a DeprecationWarning)."""
    return forward(__name__, name)
