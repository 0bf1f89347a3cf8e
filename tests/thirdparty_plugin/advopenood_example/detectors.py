"""A detector with a differentiable score, written against advopenood's own detector interface."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from advopenood.plugin import DifferentiableDetector, Outputs, Postprocessor


def top_gap(logits: Tensor) -> Tensor:
    """Gap between the largest and the second-largest logit, ``f_(1)(x) - f_(2)(x)`` (higher = more ID)."""
    top2 = torch.topk(logits, 2, dim=1).values
    return top2[:, 0] - top2[:, 1]


class TopGap(Postprocessor, DifferentiableDetector):
    """Top-2 logit gap, f_(1)(x) - f_(2)(x): a confident, unambiguous prediction scores high."""

    def score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return top_gap(out.logits)

    def grad_score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return top_gap(out.logits)
