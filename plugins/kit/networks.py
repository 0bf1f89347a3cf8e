"""Helpers about the evaluated network that attacks and detectors share (its input normalisation).

Public and tested (``tests/plugins/test_kit.py``).
"""
from __future__ import annotations

import torch
import torch.nn as nn
from torch import Tensor


def normalisation(net: nn.Module, like: Tensor) -> tuple[Tensor, Tensor]:
    """The network's ``(mean, std)`` as ``1 x C x 1 x 1`` tensors on ``like``'s device and dtype (C: ``like``'s
    channels): our :class:`~advopenood.models.Classifier`'s buffers, which map [0, 1] pixels to the normalised units
    ``(x - mean) / std`` it feeds its backbone; zeros and ones for a network that declares none."""
    shape = (1, like.shape[1], 1, 1)
    mean, std = getattr(net, "mean", None), getattr(net, "std", None)
    if not isinstance(mean, Tensor) or not isinstance(std, Tensor):
        return (torch.zeros(shape, dtype=like.dtype, device=like.device),
                torch.ones(shape, dtype=like.dtype, device=like.device))
    return (mean.detach().reshape(1, -1, 1, 1).to(like.device, like.dtype).expand(shape),
            std.detach().reshape(1, -1, 1, 1).to(like.device, like.dtype).expand(shape))
