"""MEAD's attack objectives: FGSM, BIM and PGD with the CE, KL, Fisher-Rao and Gini losses, in L1, L2 and Linf.

Granese, Picot, Romanelli, Messina, Piantanida, "MEAD: A Multi-Armed Approach for Evaluation of
Adversarial Examples Detectors" (ECML-PKDD 2022), Sec. 3. Every attack maximises one objective
``l(x, x')`` inside the eps-ball of its norm (their Eq. 2); ``p`` is the softmax of the clean input
``x`` (a constant, the reference) and ``p'`` the softmax of the perturbed input ``x'``:

* ``ce``:   ``-log p'_y``                                    (adversarial cross-entropy, ACE)
* ``kl``:   ``sum_c p_c log(p_c / p'_c)``                    (Eq. 4)
* ``fr``:   ``2 arccos(sum_c sqrt(p_c p'_c))``               (Eq. 5, factor 2 kept)
* ``gini``: ``1 - sqrt(sum_c p'_c^2)``                       (Eq. 6, label-free)

KL and Fisher-Rao are zero at ``x' = x`` with a zero gradient there, so those attacks always start from
a uniformly random point of the ball (``random_start`` cannot be turned off). Every step normalises the
gradient per sample (sign for Linf, unit L1/L2 norm otherwise), so positive per-sample factors such
as Fisher-Rao's 2 never change an attack; they only matter for the loss values.

Registered names follow ``mead_{method}_{objective}_{norm}``: ``pgd`` for l1/l2/linf (MEAD's L1 and L2
groups use PGD alone), ``bim`` and ``fgsm`` for l2/linf (MEAD's Linf group is FGSM, BIM and PGD; FGM and
BIM in L2 are the usual L2 variants; foolbox's L1 "FGM" is not a steepest-ascent step and is left out).
:data:`MEAD_EPS` holds MEAD's eps groups, :data:`EPS_PRESETS` those and the CIFAR defaults by name.
"""
from __future__ import annotations

import math
from typing import Any, Callable, ClassVar

import eagerpy as ep
import foolbox as fb
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from advopenood.plugin import Attack, IterationCount, UsageError, default_eps, foolbox_model, register
from advopenood_plugins.kit.attacks import counted, rel_stepsize

OBJECTIVES = ("ce", "kl", "fr", "gini")
NORMS = ("l1", "l2", "linf")
#: Norms each method is registered for.
METHOD_NORMS: dict[str, tuple[str, ...]] = {"pgd": NORMS, "bim": ("l2", "linf"), "fgsm": ("l2", "linf")}
#: Objectives with a zero gradient at the clean input: random start is mandatory.
NEEDS_RANDOM_START = ("kl", "fr")
#: Fisher-Rao's arccos argument is clamped to at most this value (arccos' slope is infinite at 1).
FR_CLAMP = 1.0 - 1e-6

#: MEAD's eps groups (Sec. 5.1.2); Linf starts at 8/256 = 0.03125 as in their tables.
MEAD_EPS: dict[str, list[float]] = {
    "l1": [5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0],
    "l2": [0.125, 0.25, 0.3125, 0.5, 1.0, 1.5, 2.0],
    "linf": [0.03125, 0.0625, 0.125, 0.25, 0.3125, 0.5],
}
#: Named eps lists a config can use: MEAD's groups, the CIFAR defaults and the Linf sweep 1/255..16/255.
EPS_PRESETS: dict[str, list[float]] = {
    **{f"mead_{norm}": values for norm, values in MEAD_EPS.items()},
    "cifar_linf": [8 / 255],
    "cifar_l2": [0.5],
    "sweep_linf": [k / 255 for k in range(1, 17)],
}


def eps_preset(name: str) -> list[float]:
    """The eps list of a preset in :data:`EPS_PRESETS`; a UsageError lists the valid names."""
    if name not in EPS_PRESETS:
        raise UsageError(f"unknown eps preset {name!r}; valid choices: {', '.join(EPS_PRESETS)}")
    return list(EPS_PRESETS[name])


def ce_loss(logits: Tensor, labels: Tensor, ref_logp: Tensor | None = None) -> Tensor:
    """Adversarial cross-entropy per sample, ``-log p'_y`` (Goodfellow et al. 2015; MEAD's ACE)."""
    return F.cross_entropy(logits, labels, reduction="none")


def kl_loss(logits: Tensor, labels: Tensor, ref_logp: Tensor) -> Tensor:
    """KL divergence per sample, ``sum_c p_c log(p_c / p'_c)`` with the clean ``p`` as reference (MEAD Eq. 4)."""
    return (ref_logp.exp() * (ref_logp - F.log_softmax(logits, dim=1))).sum(1)


def fisher_rao_loss(logits: Tensor, labels: Tensor, ref_logp: Tensor) -> Tensor:
    """Fisher-Rao distance per sample, ``2 arccos(sum_c sqrt(p_c p'_c))`` (MEAD Eq. 5; Picot et al. 2022).

    ``sqrt(p_c p'_c)`` is computed as ``exp((log p_c + log p'_c) / 2)`` (finite gradient when ``p'_c``
    underflows), and the Bhattacharyya coefficient is clamped to at most :data:`FR_CLAMP`, where the
    gradient is kept (the slope of arccos at the clamp value), so a start point very close to ``x``
    still moves away from it.
    """
    bc = torch.exp(0.5 * (ref_logp + F.log_softmax(logits, dim=1))).sum(1)
    bc = bc - torch.relu(bc - FR_CLAMP).detach()
    return 2.0 * torch.arccos(bc)


def gini_loss(logits: Tensor, labels: Tensor, ref_logp: Tensor | None = None) -> Tensor:
    """Gini impurity per sample, ``1 - sqrt(sum_c p'_c^2)`` (MEAD Eq. 6; label-free, pushes to the boundary)."""
    return 1.0 - torch.linalg.vector_norm(F.softmax(logits, dim=1), dim=1)


#: Objective name -> per-sample loss ``(logits, labels, clean log-probabilities) -> Tensor[N]``.
LOSSES: dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]] = {
    "ce": ce_loss, "kl": kl_loss, "fr": fisher_rao_loss, "gini": gini_loss}


class ObjectiveLoss:
    """Mixin for foolbox's gradient-descent attacks: the CE loss replaced by one of :data:`OBJECTIVES`.

    ``run`` records the clean input so that ``get_loss_fn`` can use its softmax as the reference for
    KL and Fisher-Rao; foolbox maximises the summed per-sample loss (untargeted criterion).
    """

    def __init__(self, *, objective: str, **kwargs: Any):
        super().__init__(**kwargs)
        if objective not in LOSSES:
            raise UsageError(f"unknown objective {objective!r}; valid choices: {', '.join(LOSSES)}")
        self.objective = objective
        self._x0: ep.Tensor | None = None

    def loss_fn_for(self, model: fb.Model, labels: ep.Tensor, x0: ep.Tensor) -> Callable[[ep.Tensor], ep.Tensor]:
        """The summed objective as a function of the perturbed input, with ``x0``'s softmax as reference."""
        loss, y = LOSSES[self.objective], labels.raw
        with torch.no_grad():
            ref_logp = F.log_softmax(model(x0).raw, dim=1)

        def loss_fn(inputs: ep.Tensor) -> ep.Tensor:
            return ep.astensor(loss(model(inputs).raw, y, ref_logp).sum())

        return loss_fn

    def get_loss_fn(self, model: fb.Model, labels: ep.Tensor) -> Callable[[ep.Tensor], ep.Tensor]:
        if self._x0 is None:
            raise RuntimeError("get_loss_fn is only valid inside run(); use loss_fn_for(model, labels, x0)")
        return self.loss_fn_for(model, labels, self._x0)

    def run(self, model: fb.Model, inputs: Any, criterion: Any, *, epsilon: float, **kwargs: Any) -> Any:
        self._x0 = ep.astensor(inputs)
        try:
            return super().run(model, inputs, criterion, epsilon=epsilon, **kwargs)
        finally:
            self._x0 = None


_FOOLBOX_BASES: dict[tuple[str, str], type] = {
    ("pgd", "l1"): fb.attacks.L1ProjectedGradientDescentAttack,
    ("pgd", "l2"): fb.attacks.L2ProjectedGradientDescentAttack,
    ("pgd", "linf"): fb.attacks.LinfProjectedGradientDescentAttack,
    ("bim", "l2"): fb.attacks.L2BasicIterativeAttack,
    ("bim", "linf"): fb.attacks.LinfBasicIterativeAttack,
    ("fgsm", "l2"): fb.attacks.L2FastGradientAttack,
    ("fgsm", "linf"): fb.attacks.LinfFastGradientAttack,
}
#: (method, norm) -> foolbox attack class with a replaceable objective (``cls(objective=..., **foolbox_kwargs)``).
FOOLBOX_CLASSES: dict[tuple[str, str], type] = {
    key: type(f"Objective{base.__name__}", (ObjectiveLoss, base),
              {"__doc__": f"foolbox's {base.__name__} maximising a MEAD objective instead of cross-entropy."})
    for key, base in _FOOLBOX_BASES.items()
}


def default_budget(norm: str, input_size: int) -> float:
    """Default eps: Linf 8/255 (4/255 at ImageNet size), L2 0.5, L1 10 (MEAD's grid), L1/L2 scaled with the
    number of pixels (L1) or its square root (L2) beyond 32x32 so the per-pixel budget stays the same."""
    scale = (input_size / 32.0) ** 2
    if norm == "linf":
        return default_eps(input_size)
    return 0.5 * math.sqrt(scale) if norm == "l2" else 10.0 * scale


class MeadAttack(Attack):
    """Base of the registered MEAD attacks; subclasses set ``name``, ``method``, ``norm`` and ``objective``."""

    method: ClassVar[str] = "pgd"
    objective: ClassVar[str] = "ce"
    param_types: ClassVar[dict[str, Any]] = {"steps": IterationCount}
    #: the shard's bar counts the gradient steps (:func:`~advopenood_plugins.kit.attacks.counted`)
    counts_steps = True

    def __init__(self, **params: Any):
        super().__init__(**params)
        if self.objective in NEEDS_RANDOM_START and not self.p.random_start:
            raise UsageError(f"attack {self.name!r} needs random_start: true (the {self.objective.upper()} objective "
                             "has a zero gradient at the clean input); valid choices: true")

    @classmethod
    def defaults(cls, input_size: int) -> dict[str, Any]:
        """PGD: 40 steps of 2.5*eps/steps from a random start (Madry et al.); BIM: foolbox's 10 steps of
        0.2*eps from x (Kurakin et al.); FGSM: one step of eps. KL/FR always start at a random point."""
        eps = default_budget(cls.norm, input_size)
        random_start = cls.method == "pgd" or cls.objective in NEEDS_RANDOM_START
        if cls.method == "fgsm":
            return {"eps": eps, "random_start": random_start}
        if cls.method == "bim":
            return {"eps": eps, "steps": 10, "rel_stepsize": 0.2, "random_start": random_start}
        return {"eps": eps, "steps": 40, "rel_stepsize": None, "random_start": random_start}

    def foolbox_attack(self) -> fb.attacks.Attack:
        """The configured foolbox attack object."""
        p, cls = self.p, FOOLBOX_CLASSES[(self.method, self.norm)]
        if self.method == "fgsm":
            return cls(objective=self.objective, random_start=p.random_start)
        return cls(objective=self.objective, rel_stepsize=rel_stepsize(p), steps=p.steps, random_start=p.random_start)

    def planned_steps(self, images: int | None = None, classes: int | None = None) -> tuple[int, str] | None:
        """``steps`` iterations (FGSM: one)."""
        return (1 if self.method == "fgsm" else self.p.steps), "iterations"

    def perturb(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        _, clipped, _ = counted(self.foolbox_attack())(foolbox_model(model, x.device), x, y, epsilons=self.p.eps)
        return clipped


_METHOD_TITLES = {"pgd": "PGD", "bim": "BIM", "fgsm": "FGSM"}
_OBJECTIVE_TITLES = {"ce": "cross-entropy", "kl": "KL divergence", "fr": "Fisher-Rao distance", "gini": "Gini impurity"}


def _register_all() -> dict[str, type[MeadAttack]]:
    """Create and register one :class:`MeadAttack` subclass per (method, norm, objective)."""
    out: dict[str, type[MeadAttack]] = {}
    for method, norms in METHOD_NORMS.items():
        for norm in norms:
            for objective in OBJECTIVES:
                name = f"mead_{method}_{objective}_{norm}"
                doc = (f"{_METHOD_TITLES[method]}-{'Linf' if norm == 'linf' else norm.upper()} maximising the "
                       f"{_OBJECTIVE_TITLES[objective]} (MEAD, Granese et al. 2022); foolbox subclass.")
                cls = type(f"Mead{_METHOD_TITLES[method]}{objective.upper()}{norm.upper()}", (MeadAttack,),
                           {"__doc__": doc, "name": name, "method": method, "norm": norm, "objective": objective})
                out[name] = register("attacks", name)(cls)
    return out


#: Registry name -> attack class, for every registered MEAD attack.
ATTACKS: dict[str, type[MeadAttack]] = _register_all()


def attack_name(method: str, objective: str, norm: str) -> str:
    """Registry name of a MEAD attack, validated against :data:`ATTACKS`."""
    name = f"mead_{method}_{objective}_{norm}"
    if name not in ATTACKS:
        raise UsageError(f"no MEAD attack {name!r}; valid choices: {', '.join(ATTACKS)}")
    return name
