"""Built-in attacks: FGSM, PGD-Linf, MIM-Linf, DeepFool-L2 (foolbox) and masked PGD (a foolbox subclass).

Defaults follow Lorenz et al., "Deciphering the Definition of Adversarial Robustness for Post-Hoc OOD
Detectors": eps 8/255 at 32x32 and 4/255 at ImageNet size; mPGD patch 8x8 (32x32) / 60x60 (224x224),
unconstrained inside the patch; PGD steps of 2.5 * eps / steps (Madry et al.), foolbox's settings otherwise.
MIM follows Dong et al. (10 steps of eps / 10, decay 1.0).
"""
from __future__ import annotations

from typing import Any

import eagerpy as ep
import foolbox as fb
import torch
import torch.nn as nn

from advopenood.attacks import Attack, default_eps, foolbox_model
from advopenood.registry import register


def _run_foolbox(attack: fb.attacks.Attack, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                 eps: float | None) -> torch.Tensor:
    _, clipped, _ = attack(foolbox_model(model, x.device), x, y, epsilons=eps)
    return clipped


def rel_stepsize(params: dict[str, Any]) -> float:
    """Step size relative to eps: the configured one, or Madry et al.'s 2.5 / steps (reaches the ball's
    surface from anywhere inside it, whatever the number of steps)."""
    return float(params["rel_stepsize"]) if params.get("rel_stepsize") is not None else 2.5 / int(params["steps"])


@register("attacks", "fgsm")
class FGSM(Attack):
    """FGSM (Goodfellow et al. 2015), one Linf step of size eps along the gradient sign; foolbox."""

    norm = "linf"

    @classmethod
    def defaults(cls, input_size: int) -> dict[str, Any]:
        return {"eps": default_eps(input_size)}

    def perturb(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return _run_foolbox(fb.attacks.FGSM(), model, x, y, float(self.params["eps"]))


@register("attacks", "pgd")
class PGD(Attack):
    """PGD-Linf (Madry et al. 2018), random start, step 2.5*eps/steps; foolbox LinfPGD (all configurable)."""

    norm = "linf"

    @classmethod
    def defaults(cls, input_size: int) -> dict[str, Any]:
        return {"eps": default_eps(input_size), "steps": 40, "rel_stepsize": None,
                "abs_stepsize": None, "random_start": True}

    def perturb(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        p = self.params
        attack = fb.attacks.LinfPGD(rel_stepsize=rel_stepsize(p), abs_stepsize=p["abs_stepsize"],
                                    steps=int(p["steps"]), random_start=bool(p["random_start"]))
        return _run_foolbox(attack, model, x, y, float(p["eps"]))


class L1MomentumLinfMIM(fb.attacks.LinfMomentumIterativeFastGradientMethod):
    """foolbox's Linf MI-FGSM with Dong et al.'s gradient normalisation: the momentum accumulates
    ``g / mean(|g|)`` per sample (``g / ||g||_1`` times the constant dimension: the same signs), as in Dong et
    al.'s reference code; foolbox 3.3.4 accumulates ``sign(g)``, which discards the relative size of the
    gradient's entries that the momentum is meant to average."""

    def normalize(self, gradients: ep.Tensor, *, x: ep.Tensor, bounds) -> ep.Tensor:
        scale = gradients.abs().reshape((len(gradients), -1)).mean(axis=-1)
        return gradients / ep.maximum(scale, 1e-12).reshape((-1,) + (1,) * (gradients.ndim - 1))


@register("attacks", "mim")
class MIM(Attack):
    """MIM-Linf (Dong et al. 2018, momentum iterative FGSM), decay 1.0, 10 steps of eps/10; foolbox.

    Dong et al., "Boosting Adversarial Attacks with Momentum" (CVPR 2018), Algorithm 1, untargeted:
    ``g_{t+1} = decay * g_t + grad_x J(x*_t, y) / ||grad_x J(x*_t, y)||_1``,
    ``x*_{t+1} = clip_{x, eps}(x*_t + alpha * sign(g_{t+1}))`` with ``alpha = eps / steps`` (``rel_stepsize``
    ``None``; a number gives ``alpha = rel_stepsize * eps``), no random start, ``J`` the cross-entropy.
    The momentum stabilises the update direction, which makes the examples transfer better to other models.
    """

    norm = "linf"

    @classmethod
    def defaults(cls, input_size: int) -> dict[str, Any]:
        return {"eps": default_eps(input_size), "steps": 10, "decay": 1.0, "rel_stepsize": None}

    def perturb(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        p = self.params
        steps = int(p["steps"])
        rel = float(p["rel_stepsize"]) if p["rel_stepsize"] is not None else 1.0 / steps
        attack = L1MomentumLinfMIM(momentum=float(p["decay"]), rel_stepsize=rel, steps=steps, random_start=False)
        return _run_foolbox(attack, model, x, y, float(p["eps"]))


@register("attacks", "df")
class DeepFool(Attack):
    """DeepFool-L2 (Moosavi-Dezfooli et al. 2016), minimal perturbation, overshoot configurable; foolbox."""

    norm = "l2"
    bounded = False

    @classmethod
    def defaults(cls, input_size: int) -> dict[str, Any]:
        return {"eps": None, "steps": 50, "candidates": 10, "overshoot": 0.02}

    def perturb(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        p = self.params
        candidates = min(int(p["candidates"]), model.num_classes)
        attack = fb.attacks.L2DeepFoolAttack(steps=int(p["steps"]), candidates=candidates,
                                             overshoot=float(p["overshoot"]))
        return _run_foolbox(attack, model, x, y, None if p["eps"] is None else float(p["eps"]))


class MaskedLinfPGD(fb.attacks.LinfPGD):
    """foolbox's LinfPGD restricted to a per-sample mask: start, step and projection are zero outside it."""

    def __init__(self, mask: torch.Tensor, **kwargs: Any):
        super().__init__(**kwargs)
        self.mask = ep.astensor(mask)

    def get_random_start(self, x0: ep.Tensor, epsilon: float) -> ep.Tensor:
        return x0 + self.mask * ep.uniform(x0, x0.shape, -epsilon, epsilon)

    def normalize(self, gradients: ep.Tensor, *, x: ep.Tensor, bounds) -> ep.Tensor:
        return self.mask * gradients.sign()

    def project(self, x: ep.Tensor, x0: ep.Tensor, epsilon: float) -> ep.Tensor:
        return x0 + self.mask * ep.clip(x - x0, -epsilon, epsilon)


def patch_masks(x: torch.Tensor, patch: int) -> torch.Tensor:
    """One square ``patch x patch`` mask per image at a random position (from the seeded torch generator)."""
    n, c, h, w = x.shape
    patch = min(patch, h, w)
    rows = torch.randint(0, h - patch + 1, (n,)).tolist()
    cols = torch.randint(0, w - patch + 1, (n,)).tolist()
    mask = torch.zeros(n, 1, h, w, dtype=x.dtype)
    for i, (r, c0) in enumerate(zip(rows, cols)):
        mask[i, :, r:r + patch, c0:c0 + patch] = 1.0
    return mask.expand(n, c, h, w).to(x.device)


@register("attacks", "mpgd")
class MaskedPGD(Attack):
    """Masked PGD (patch): PGD-Linf inside one seeded square patch per image, zero perturbation outside."""

    norm = "linf"

    @classmethod
    def defaults(cls, input_size: int) -> dict[str, Any]:
        patch = max(1, input_size // 4) if input_size <= 64 else round(input_size * 60 / 224)
        return {"eps": 1.0, "patch": patch, "steps": 40, "rel_stepsize": None, "random_start": True}

    def perturb(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        p = self.params
        attack = MaskedLinfPGD(patch_masks(x, int(p["patch"])), rel_stepsize=rel_stepsize(p),
                               steps=int(p["steps"]), random_start=bool(p["random_start"]))
        return _run_foolbox(attack, model, x, y, float(p["eps"]))
