"""Built-in attacks: FGSM, PGD-Linf, MIM-Linf, DeepFool-L2 (foolbox) and masked PGD (patch).

Two sets of settings (docs/attacks.md, "Attack settings by protocol", lists each with its source):

* ``strong`` (default, **ours**): budgets and patch sizes of Lorenz et al., "Deciphering the Definition of
  Adversarial Robustness for Post-Hoc OOD Detectors" (Sec. 4.1: "8/255 for CIFAR-10/100 and 4/255 for the
  ImageNet"; mPGD "8x8 px for CIFAR-10/100 and 60x60 px for the ImageNet ... without an epsilon
  constraint"), with our stronger iterates: PGD and mPGD take 40 steps of 2.5 * eps / steps (Madry et al.)
  from a random start, and mPGD draws one patch location per image.
* ``lorenz2024`` (:meth:`protocol_defaults`): the paper's reference code (OpenOOD
  ``openood/evaluation_api/attackdataset.py``): ``fa.FGSM()``, ``fa.LinfPGD()`` and
  ``fa.L2DeepFoolAttack()`` with foolbox's defaults, and ``masked_pgd_attack(..., epsilon=1, alpha=0.01,
  num_steps=40, patch_size)`` (``openood/attacks/patch_attacks/masked_pgd.py``), mpgd ``variant:
  reference``.

MIM follows Dong et al. (10 steps of eps / 10, decay 1.0); the paper does not use it.

Each attack counts its iterations for the shard's progress bar (``counts_steps``; FGSM one, DeepFool fewer than
``steps`` where every image is fooled sooner).
"""
from __future__ import annotations

import math
from typing import Any

import eagerpy as ep
import foolbox as fb
import torch
import torch.nn as nn
import torch.nn.functional as F

from advopenood.plugin import Attack, IterationCount, UsageError, count_step, default_eps, derive_seed, register
from advopenood_plugins.kit.attacks import rel_stepsize, run_foolbox

#: the protocol whose settings come from Lorenz et al.'s reference code
LORENZ = "lorenz2024"


@register("attacks", "fgsm")
class FGSM(Attack):
    """FGSM (Goodfellow et al. 2015), one Linf step of size eps along the gradient sign; foolbox ``fa.FGSM()``
    under every protocol (the reference code's ``fa.FGSM()``)."""

    norm = "linf"
    counts_steps = True

    @classmethod
    def defaults(cls, input_size: int) -> dict[str, Any]:
        return {"eps": default_eps(input_size)}

    @classmethod
    def protocol_defaults(cls, protocol: str, input_size: int) -> dict[str, Any]:
        return {"eps": default_eps(input_size)} if protocol == LORENZ else {}

    def planned_steps(self, images: int | None = None, classes: int | None = None) -> tuple[int, str] | None:
        """One iteration: the one gradient step."""
        return 1, "iterations"

    def perturb(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return run_foolbox(fb.attacks.FGSM(), model, x, y, self.p.eps)


@register("attacks", "pgd")
class PGD(Attack):
    """PGD-Linf (Madry et al. 2018) with foolbox ``LinfPGD``, random start, 40 steps.

    ``strong`` (ours): steps of 2.5 * eps / steps. ``lorenz2024``: the reference code's ``fa.LinfPGD()``,
    i.e. foolbox 3.3's defaults: ``rel_stepsize`` 0.01 / 0.3 (steps of eps / 30), 40 steps, random start.
    """

    norm = "linf"
    param_types = {"steps": IterationCount}
    counts_steps = True

    @classmethod
    def defaults(cls, input_size: int) -> dict[str, Any]:
        return {"eps": default_eps(input_size), "steps": 40, "rel_stepsize": None,
                "abs_stepsize": None, "random_start": True}

    @classmethod
    def protocol_defaults(cls, protocol: str, input_size: int) -> dict[str, Any]:
        if protocol != LORENZ:
            return {}
        return {"eps": default_eps(input_size), "steps": 40, "rel_stepsize": 0.01 / 0.3, "abs_stepsize": None,
                "random_start": True}

    def perturb(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        p = self.p
        attack = fb.attacks.LinfPGD(rel_stepsize=rel_stepsize(p), abs_stepsize=p.abs_stepsize,
                                    steps=p.steps, random_start=p.random_start)
        return run_foolbox(attack, model, x, y, p.eps)


class CountingL2DeepFool(fb.attacks.L2DeepFoolAttack):
    """foolbox's DeepFool-L2 with one :func:`~advopenood.plugin.count_step` per iteration: foolbox's ``run``
    evaluates the loss of the first candidate (``k = 1``) once at the start of each iteration."""

    def _get_loss_fn(self, model: Any, classes: Any) -> Any:
        loss = super()._get_loss_fn(model, classes)

        def counted_loss(x: Any, k: int) -> Any:
            if k == 1:
                count_step()
            return loss(x, k)

        return counted_loss


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
    param_types = {"steps": IterationCount}
    counts_steps = True

    @classmethod
    def defaults(cls, input_size: int) -> dict[str, Any]:
        return {"eps": default_eps(input_size), "steps": 10, "decay": 1.0, "rel_stepsize": None}

    def perturb(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        p = self.p
        steps = p.steps
        rel = p.rel_stepsize if p.rel_stepsize is not None else 1.0 / steps
        attack = L1MomentumLinfMIM(momentum=p.decay, rel_stepsize=rel, steps=steps, random_start=False)
        return run_foolbox(attack, model, x, y, p.eps)


@register("attacks", "df")
class DeepFool(Attack):
    """DeepFool-L2 (Moosavi-Dezfooli et al. 2016), minimal perturbation; foolbox ``L2DeepFoolAttack``.

    Both protocols use foolbox 3.3's defaults (50 steps, 10 candidates, overshoot 0.02, logit loss, no
    budget), which is the reference code's ``fa.L2DeepFoolAttack()`` with ``epsilons=None``.
    """

    norm = "l2"
    bounded = False
    param_types = {"steps": IterationCount}
    counts_steps = True

    @classmethod
    def defaults(cls, input_size: int) -> dict[str, Any]:
        return {"eps": None, "steps": 50, "candidates": 10, "overshoot": 0.02}

    @classmethod
    def protocol_defaults(cls, protocol: str, input_size: int) -> dict[str, Any]:
        return cls.defaults(input_size) if protocol == LORENZ else {}

    def perturb(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        p = self.p
        candidates = min(p.candidates, model.num_classes)
        attack = CountingL2DeepFool(steps=p.steps, candidates=candidates, overshoot=p.overshoot)
        return run_foolbox(attack, model, x, y, p.eps)


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


def patch_positions(n: int, h: int, w: int, patch: int, group: int) -> list[tuple[int, int]]:
    """Top-left corner (row, column) of each image's patch: one position per ``group`` consecutive images,
    uniform over the positions that keep the patch inside the image (seeded torch generator)."""
    groups = (n + group - 1) // group
    rows = torch.randint(0, h - patch + 1, (groups,)).tolist()
    cols = torch.randint(0, w - patch + 1, (groups,)).tolist()
    return [(rows[i // group], cols[i // group]) for i in range(n)]


def patch_masks(x: torch.Tensor, patch: int, group: int = 1) -> torch.Tensor:
    """A square ``patch x patch`` mask per image, one random position per ``group`` consecutive images."""
    n, c, h, w = x.shape
    mask = torch.zeros(n, 1, h, w, dtype=x.dtype)
    for i, (r, c0) in enumerate(patch_positions(n, h, w, patch, group)):
        mask[i, :, r:r + patch, c0:c0 + patch] = 1.0
    return mask.expand(n, c, h, w).to(x.device)


def reference_masked_pgd(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, alpha: float,
                         steps: int, patch: int, row: int, col: int) -> torch.Tensor:
    """Lorenz et al.'s ``masked_pgd_attack`` (OpenOOD ``openood/attacks/patch_attacks/masked_pgd.py``) for one
    batch and one patch position: ``steps`` times, the mean cross-entropy's gradient sign times ``alpha`` is
    added inside the patch, the patch is clamped to ``[x - eps, x + eps]``, then the whole image to [0, 1];
    no random start, no early stop, the last iterate is returned."""
    window = (slice(None), slice(None), slice(row, row + patch), slice(col, col + patch))
    x_adv = x.clone().detach()
    for _ in range(steps):
        count_step()
        x_adv.requires_grad_(True)
        loss = F.cross_entropy(model(x_adv), y)
        grad, = torch.autograd.grad(loss, x_adv)
        with torch.no_grad():
            x_adv[window] += alpha * grad[window].sign()
            x_adv[window] = torch.clamp(x_adv[window], x[window] - eps, x[window] + eps)
            x_adv = torch.clamp(x_adv, 0, 1).detach()
    return x_adv


MPGD_VARIANTS = ("strong", "reference")


@register("attacks", "mpgd")
class MaskedPGD(Attack):
    """Masked PGD (patch attack): Linf PGD inside a square patch, zero perturbation outside it.

    ``variant: strong`` (default, **ours**): foolbox ``LinfPGD`` restricted to the patch, one position per
    image, random start, 40 steps of 2.5 * eps / steps. ``variant: reference`` (protocol ``lorenz2024``): a
    transcription of the paper's reference loop (:func:`reference_masked_pgd`), "the mPGD randomly attacks an
    area of the image ... without an epsilon constraint" (Sec. 4.1): eps 1, 40 steps of 0.01
    (``abs_stepsize``), no random start, and one position per batch, which the reference draws with python's
    unseeded ``random.randint`` for each loader batch of 200 images (``attack_ood.py --batch-size``). Here the
    position comes from the seeded torch generator, once per ``group`` consecutive images of each call (the
    store calls an attack once per shard, so with a shard size that is a multiple of ``group`` the groups are
    the reference's batches of the (limited) test set). Patch 8 px at 32x32, 60 px at 224x224.
    ``position_seed`` (default None: the call's own seed) redraws the positions on the same images: the call's
    draws come from ``derive_seed(position_seed, call seed)`` instead, so runs that differ only in it measure how
    much a cell depends on where the patches fell (``benchmarks/reproduce_cifar10.py``).
    """

    norm = "linf"
    threat = "patch"
    param_types = {"position_seed": int | None, "steps": IterationCount}
    counts_steps = True

    @classmethod
    def defaults(cls, input_size: int) -> dict[str, Any]:
        patch = max(1, input_size // 4) if input_size <= 64 else round(input_size * 60 / 224)
        return {"eps": 1.0, "patch": patch, "steps": 40, "rel_stepsize": None, "abs_stepsize": None,
                "random_start": True, "group": 1, "variant": "strong", "position_seed": None}

    @classmethod
    def protocol_defaults(cls, protocol: str, input_size: int) -> dict[str, Any]:
        if protocol != LORENZ:
            return {}
        return {"variant": "reference", "eps": 1.0, "steps": 40, "rel_stepsize": None, "abs_stepsize": 0.01,
                "random_start": False, "group": 200}

    def __init__(self, **params: Any):
        super().__init__(**params)
        p = self.p
        if p.variant not in MPGD_VARIANTS:
            raise UsageError(f"variant {p.variant!r} for attack 'mpgd'; valid choices: {', '.join(MPGD_VARIANTS)}")
        for key in ("patch", "group"):
            if getattr(p, key) < 1:
                raise UsageError(f"{key} {getattr(p, key)!r} for attack 'mpgd'; valid choices: an integer >= 1")
        if p.variant == "reference" and p.random_start:
            raise UsageError("random_start True for attack 'mpgd' variant 'reference'; valid choices: false "
                             "(the reference loop starts at the clean image)")

    def planned_steps(self, images: int | None = None, classes: int | None = None) -> tuple[int, str] | None:
        """``steps`` iterations; the reference variant runs them once per group of ``group`` images (None: the
        number of images unknown)."""
        p = self.p
        if p.variant != "reference":
            return p.steps, "iterations"
        return None if images is None else (p.steps * math.ceil(images / p.group), "iterations")

    def perturb(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        p = self.p
        patch, group, eps, steps = min(p.patch, *x.shape[-2:]), p.group, p.eps, p.steps
        if p.position_seed is not None:  # __call__ seeded the generator for this call; redraw from both seeds
            torch.manual_seed(derive_seed(p.position_seed, torch.initial_seed()))
        if p.variant == "reference":
            alpha = p.abs_stepsize if p.abs_stepsize is not None else rel_stepsize(p) * eps
            positions = patch_positions(len(x), x.shape[-2], x.shape[-1], patch, group)
            return torch.cat([reference_masked_pgd(model, x[s:s + group], y[s:s + group], eps, alpha, steps, patch,
                                                   *positions[s]) for s in range(0, len(x), group)])
        attack = MaskedLinfPGD(patch_masks(x, patch, group), rel_stepsize=rel_stepsize(p),
                               abs_stepsize=p.abs_stepsize, steps=steps, random_start=p.random_start)
        return run_foolbox(attack, model, x, y, eps)
