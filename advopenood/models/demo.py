"""The embedded demo: its CNN (16x16 grey digits), trained on first use and cached.

The demo needs nothing beyond a fresh ``pip install``: the digits ship with scikit-learn, the far-OOD
textures with scikit-image. Training and its cache are :mod:`advopenood.models.training`'s.
"""
from __future__ import annotations

from pathlib import Path

import torch

from advopenood.data.datasets import build_dataset
from advopenood.models.classifier import Classifier
from advopenood.models.training import trained_model

#: The demo CNN's recipe (as ``configs/demo.yaml``): mixup keeps its logits low off the digits, so the logit
#: detectors separate natural OOD; plain training leaves textures more confident than digits.
DEMO_MODEL = {"arch": "democnn", "num_classes": 10, "in_channels": 1, "input_size": 16, "mean": [0.5], "std": [0.5],
              "train": {"epochs": 30, "lr": 0.01, "batch": 64, "mixup": 1.0}}


def demo_model(cache: Path, seed: int = 0, device: torch.device | str = "cpu", progress: bool = True) -> Classifier:
    """The embedded demo's CNN (16x16 grey digits, :data:`DEMO_MODEL`), as ``advopenood demo`` trains and caches it."""
    digits = build_dataset({"kind": "demo", "name": "digits", "split": "train"}, None, 1, 16)
    return trained_model(DEMO_MODEL, digits, cache, seed, device, progress)
