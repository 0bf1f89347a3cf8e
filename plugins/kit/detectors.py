"""Helpers that several built-in detectors share (the pytorch-ood backend, BPDA, the classifier head).

Public and tested (``tests/plugins/test_kit.py``); a detector imports them from here, never from another detector.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch.nn as nn
from torch import Tensor

from advopenood.plugin import fc_layer


def pytorch_ood() -> Any:
    """``pytorch_ood.detector``, imported on first use (it pulls in torchvision's model zoo: seconds), so that
    listing and validating detectors stays fast."""
    import pytorch_ood.detector

    return pytorch_ood.detector


def with_grad(method: Callable) -> Callable:
    """A bound pytorch-ood scoring method without its decorators (``@torch.no_grad()`` and pytorch-ood's
    device mover, which both keep the original as ``__wrapped__``), so the attack differentiates the very
    code that scores; the caller's tensors are already on the detector's device."""
    return inspect.unwrap(method.__func__).__get__(method.__self__)


def straight_through(value: Tensor, surrogate: Tensor) -> Tensor:
    """BPDA straight-through: the forward value of ``value``, the gradient of ``surrogate``."""
    return surrogate + (value - surrogate).detach()


def classifier_head(net: nn.Module) -> Callable[[Tensor], Tensor]:
    """The final linear layer applied to (possibly ``B x D x 1 x 1``) features."""
    fc = fc_layer(net)
    return lambda z: fc(z.flatten(1))
