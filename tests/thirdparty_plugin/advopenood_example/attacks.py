"""A tiny Linf attack: one random corner of the eps-ball (a baseline any real attack must beat)."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from advopenood.plugin import Attack


class RandomSign(Attack):
    """Random-sign Linf noise: x + eps * s with s uniform in {-1, +1} per pixel (seeded), clipped to [0, 1]."""

    norm = "linf"

    @classmethod
    def defaults(cls, input_size: int) -> dict[str, Any]:
        return {"eps": 8 / 255}

    def perturb(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        sign = torch.randint(0, 2, x.shape, device=x.device, dtype=x.dtype) * 2 - 1
        return x + self.p.eps * sign
