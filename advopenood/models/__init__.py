"""Classifiers: backbones (CIFAR ResNets, torchvision, timm), the normalising wrapper, training and the demo model."""
from typing import Any

from advopenood.deprecated import forward


def __getattr__(name: str) -> Any:
    """The names this module held before the split, from where they live now (with a DeprecationWarning)."""
    return forward(__name__, name)
