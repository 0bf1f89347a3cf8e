"""Helpers that several built-in attacks share (running a foolbox attack, the PGD step size, the best candidate).

Public and tested (``tests/plugins/test_kit.py``); an attack imports them from here, never from another attack.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import foolbox as fb
import torch
import torch.nn as nn
from torch import Tensor

from advopenood.plugin import Params, foolbox_model, typed


def run_foolbox(attack: fb.attacks.Attack, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                eps: float | None) -> torch.Tensor:
    """``attack``'s clipped adversarial images of ``x`` (labels ``y``) on ``model`` at budget ``eps``."""
    _, clipped, _ = attack(foolbox_model(model, x.device), x, y, epsilons=eps)
    return clipped


def rel_stepsize(params: Params | Mapping[str, Any]) -> float:
    """Step size relative to eps: the configured one, or Madry et al.'s 2.5 / steps (reaches the ball's
    surface from anywhere inside it, whatever the number of steps). ``params``: an attack's typed :attr:`p` (or
    the plain mapping of its parameters)."""
    p = params if isinstance(params, Params) else typed(
        "rel_stepsize", {"rel_stepsize": params.get("rel_stepsize"), "steps": params["steps"]},
        {"rel_stepsize": None, "steps": 1}, {"rel_stepsize": float | None})
    return p.rel_stepsize if p.rel_stepsize is not None else 2.5 / p.steps


class Best:
    """Per-sample best candidate: successful first, then the highest ``sign * confidence``."""

    def __init__(self, x: Tensor):
        self.x = x.clone()
        self.success = torch.zeros(len(x), dtype=torch.bool, device=x.device)
        self.value = torch.full((len(x),), -math.inf, device=x.device)

    def update(self, x: Tensor, success: Tensor, value: Tensor) -> None:
        """Keep each sample's ``x`` where it is better than the best so far."""
        better = (success & ~self.success) | ((success == self.success) & (value > self.value))
        self.x[better] = x.detach()[better]
        self.success |= success
        self.value = torch.where(better, value.detach(), self.value)
