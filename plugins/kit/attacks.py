"""Helpers that several built-in attacks share (running a foolbox attack, the PGD step size, the best candidate,
counting iterations for the progress bars).

Public and tested (``tests/plugins/test_kit.py``); an attack imports them from here, never from another attack.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import foolbox as fb
import torch
import torch.nn as nn
from torch import Tensor

from advopenood.plugin import Params, count_step, foolbox_model, typed


def counted(attack: fb.attacks.Attack) -> fb.attacks.Attack:
    """``attack`` with one :func:`~advopenood.plugin.count_step` per gradient step, for a foolbox gradient-descent
    attack (FGSM, PGD, BIM, MI-FGSM and their subclasses: ``run`` calls ``value_and_grad`` once per step); any
    other attack unchanged."""
    if isinstance(attack, fb.attacks.gradient_descent_base.BaseGradientDescent):
        step = attack.value_and_grad

        def value_and_grad(*args: Any, **kwargs: Any) -> Any:
            count_step()
            return step(*args, **kwargs)

        attack.value_and_grad = value_and_grad  # type: ignore[method-assign]
    return attack


def counting(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with one :func:`~advopenood.plugin.count_step` per call (an objective evaluated once per iteration)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        count_step()
        return fn(*args, **kwargs)

    return call


@contextlib.contextmanager
def counting_gradient_passes(model: nn.Module) -> Iterator[None]:
    """One :func:`~advopenood.plugin.count_step` per forward pass of ``model`` on an input that requires a gradient
    while the block runs: one per iteration of an attack that takes one gradient per iteration (pyautoattack's APGD
    and FAB, foolbox's Carlini-Wagner); its passes without a gradient (accuracy checks) do not count."""
    def hook(_module: nn.Module, inputs: tuple[Any, ...], _output: Any) -> None:
        if inputs and isinstance(inputs[0], Tensor) and inputs[0].requires_grad:
            count_step()

    handle = model.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def run_foolbox(attack: fb.attacks.Attack, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                eps: float | None) -> torch.Tensor:
    """``attack``'s clipped adversarial images of ``x`` (labels ``y``) on ``model`` at budget ``eps``; a gradient-
    descent attack counts its steps (:func:`counted`)."""
    _, clipped, _ = counted(attack)(foolbox_model(model, x.device), x, y, epsilons=eps)
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
