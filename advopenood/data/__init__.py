"""Datasets: readers for .npz, IDX, OpenOOD image lists, torchvision sets and the demo; OpenOOD v1.5 benchmark layouts."""
from typing import Any

from advopenood.deprecated import removed


def __getattr__(name: str) -> Any:
    """A name this module held before the split fails naming where it lives now (removed in 0.3.0)."""
    raise removed(__name__, name)
