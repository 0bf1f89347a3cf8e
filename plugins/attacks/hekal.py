"""ROSS's attacks as Hekal, Lomuscio & Stoica ran them (issue 33; "A Robust Out-of-Distribution Detection Framework
via Synergistic Smoothing", CVPR Findings 2026, arXiv 2605.08191, Table 2): ``hekal_min_<det>`` (PGD-Min: ID images,
the detector's confidence lowered) and ``hekal_max_<det>`` (PGD-Max: natural OOD images, parameter ``ood_set``, the
confidence raised), for every registered detector with a differentiable score, and the families ``hekal_min`` /
``hekal_max`` (one per selected detector).

Their loop (Abdu-Hekal/ROSS f8f030d): ``scripts/attack_ood.py`` wraps the network and the postprocessor in
``OODScoreModel`` (lines 76-103: the output is the postprocessor's confidence), builds ``fb.PyTorchModel(ood_model,
bounds=(-inf, inf))`` (line 201) and runs foolbox ``LinfPGD(steps=...)`` (lines 205-213; ``steps`` 40 in
``scripts/experiments/run_attack_ood.sh``, the other settings foolbox's defaults: ``rel_stepsize`` 0.01 / 0.3,
random start) with the criteria ``OODMinConfidence`` / ``OODMaxConfidence`` (``foolbox/foolbox/criteria.py`` lines
146-165: the confidence, its negation). Their patched ``run`` (``foolbox/foolbox/attacks/gradient_descent_base.py``
lines 136-172) descends the criterion summed over the batch (``gradient_step_sign = -1``), starts at a uniform
random point of the ball, projects after every step, clips to the model's bounds (none: infinite) and returns the
**last** iterate; nothing keeps the best iterate (our ``robust_*`` attacks do). ``--attack-base-pp`` (lines 192-197)
attacks ROSS's base postprocessor (``base_pp``) instead of ROSS; ``scripts/ross/run_experiments.py``
(``generate_table2``) sets it for ROSS. Their loaders hand the network *normalised* tensors, so their eps is in
normalised units.

Here: foolbox ``LinfPGD``'s own ``run`` (ascent on ``-sum c`` for PGD-Min and ``+sum c`` for PGD-Max, the same steps
as their descent) with parameters ``eps``, ``steps`` (40), ``rel_stepsize`` (0.01 / 0.3), ``random_start`` (true),
``units`` (``normalised``: the ball and the steps in the network's normalised units ``z = (x - mean) / std``, so a
pixel moves by at most ``eps * std_c``; ``pixel``: the usual [0, 1] ball), ``clip`` (true: every iterate kept in
[0, 1] pixels; false: none, as their infinite bounds, so images may leave [0, 1]) and ``through`` (``base``: a ROSS
detector's gradient is its base detector's, fitted as ROSS's base is; ``self``: the detector's own gradient;
``base`` is ``self`` for every other detector). Under ``strong`` (ours): ``units: pixel``, ``clip: true``,
``through: self``; under ``hekal2026``: ``units: normalised``, ``clip: false``, ``through: base``, 40 steps.

The sets are as ``robust_id_<det>`` / ``robust_ood_<det>``'s: every row counts, a ``hekal_min`` set is ID negatives
(:class:`~advopenood.capabilities.IdNegatives`), and success as stored is the detector rejecting the ID image /
accepting the OOD image at its 95 %-TPR threshold on the fit set (the detector itself, whatever ``through``).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, ClassVar

import eagerpy as ep
import foolbox as fb
import torch
import torch.nn as nn
from torch import Tensor

from advopenood.plugin import Attack, IdNegatives, UsageError, default_eps, is_composite, is_differentiable, registry
from advopenood_plugins.attacks.adaptive import (DIFFERENTIABLE, AdaptiveAttack, AdaptiveFamily, DetectorTarget,
                                                 SharedTarget)
from advopenood_plugins.kit.attacks import counted
from advopenood_plugins.kit.networks import normalisation

PROTOCOL = "hekal2026"
UNITS = ("normalised", "pixel")
THROUGH = ("base", "self")
#: ``side -> name prefix``: ``min`` (PGD-Min, ID images), ``max`` (PGD-Max, natural OOD images)
PREFIXES = {"min": "hekal_min_", "max": "hekal_max_"}
#: their foolbox's ``LinfPGD`` default step, relative to eps
FOOLBOX_REL_STEPSIZE = 0.01 / 0.3


class ScoreLinfPGD(fb.attacks.LinfPGD):
    """foolbox's ``LinfPGD`` whose loss is ``loss(z)`` (summed over the batch) and whose iterates stay in the box
    ``[lo, hi]`` when one is given (after the random start and after every projection, where foolbox clips to the
    model's bounds; the model's bounds are infinite)."""

    def __init__(self, loss: Callable[[Tensor], Tensor], box: tuple[Tensor, Tensor] | None, **kwargs: Any):
        super().__init__(**kwargs)
        self.loss, self.box = loss, box

    def get_loss_fn(self, model: fb.Model, labels: ep.Tensor) -> Callable[[ep.Tensor], ep.Tensor]:
        return lambda inputs: ep.astensor(self.loss(inputs.raw))

    def _clip(self, x: ep.Tensor) -> ep.Tensor:
        return x if self.box is None else ep.astensor(torch.maximum(torch.minimum(x.raw, self.box[1]), self.box[0]))

    def get_random_start(self, x0: ep.Tensor, epsilon: float) -> ep.Tensor:
        return self._clip(super().get_random_start(x0, epsilon))

    def project(self, x: ep.Tensor, x0: ep.Tensor, epsilon: float) -> ep.Tensor:
        return self._clip(super().project(x, x0, epsilon))


class HekalAttack(SharedTarget, AdaptiveAttack):
    """Base of ``hekal_min_<det>`` / ``hekal_max_<det>``: Linf PGD on the detector's raw confidence, last iterate;
    bind with the ID fit data first (the pipeline does)."""

    objective = "hekal"
    #: ``"min"``: PGD-Min on ID images; ``"max"``: PGD-Max on natural OOD images
    side: ClassVar[str] = "min"

    def planned_steps(self, images: int | None = None, classes: int | None = None) -> tuple[int, str] | None:
        """``steps`` iterations: one PGD run (no lambda sweep, one target)."""
        return self.p.steps, "iterations"

    def __init__(self, **params: Any):
        Attack.__init__(self, **params)  # no lambda or kappa: the loss is the detector's confidence alone
        p = self.p
        for key, valid in (("units", UNITS), ("through", THROUGH)):
            if getattr(p, key) not in valid:
                raise UsageError(f"{key} {getattr(p, key)!r} for attack {self.name!r}; valid choices: {', '.join(valid)}")
        if p.rel_stepsize <= 0:
            raise UsageError(f"rel_stepsize {p.rel_stepsize!r} for attack {self.name!r}; "
                             "valid choices: a number > 0")
        self.sign = -1.0 if self.side == "min" else 1.0
        self._bound: dict[str, Any] | None = None
        self._target: DetectorTarget | None = None
        self._std: list[float] | None = None

    @classmethod
    def defaults(cls, input_size: int) -> dict[str, Any]:
        base = {"eps": default_eps(input_size), "steps": 40, "rel_stepsize": FOOLBOX_REL_STEPSIZE,
                "random_start": True, "units": "pixel", "clip": True, "through": "self"}
        return {**base, "ood_set": None} if cls.source == "ood" else base

    @classmethod
    def protocol_defaults(cls, protocol: str, input_size: int) -> dict[str, Any]:
        """``hekal2026``: their setting (module docstring): normalised units, no clipping, ROSS through its base."""
        return {"units": "normalised", "clip": False, "through": "base", "steps": 40} if protocol == PROTOCOL else {}

    def bind(self, net: nn.Module, *args: Any, **kwargs: Any) -> HekalAttack:
        super().bind(net, *args, **kwargs)
        std = getattr(net, "std", None)
        self._std = [float(v) for v in std.detach().flatten()] if isinstance(std, Tensor) else [1.0]
        #: the network's normalisation std in the cache key and the store's spec.json (verify reads ``eps_pixel``)
        self.context = {**self.context, "pixel_std": self._std}
        return self

    @property
    def gradient_target(self) -> DetectorTarget:
        """What the loss differentiates: a ROSS detector's base detector under ``through: base`` (their
        ``--attack-base-pp``), the detector itself otherwise."""
        target = self.target
        if self.p.through == "base" and is_composite(target.detector):
            return dataclasses.replace(target, detector=target.detector.base)
        return target

    @property
    def in_range(self) -> bool:
        return self.p.clip

    def pixel_budget(self) -> float:
        """``eps`` in pixel units: ``eps * max_c std_c`` for a ball in normalised units, else ``eps``."""
        eps = self.p.eps
        return eps * max(self._std or [1.0]) if self.p.units == "normalised" else eps

    def succeeded(self, model: nn.Module, x_adv: Tensor, y: Tensor, adv_pred: Tensor) -> Tensor:
        """PGD-Min: the detector rejects the ID image; PGD-Max: it accepts the OOD image (95 %-TPR threshold)."""
        accepted = self.target.score(x_adv).to(adv_pred.device) >= self.target.threshold
        return accepted if self.sign > 0 else ~accepted

    def perturb(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        p, target = self.p, self.gradient_target
        mean, std = normalisation(model, x)
        if p.units == "pixel":
            mean, std = torch.zeros_like(mean), torch.ones_like(std)
        box = ((0.0 - mean) / std, (1.0 - mean) / std) if p.clip else None

        def loss(z: Tensor) -> Tensor:
            return (self.sign * target.confidence(z * std + mean)).sum()

        pgd = counted(ScoreLinfPGD(loss, box, rel_stepsize=p.rel_stepsize, steps=p.steps,
                                   random_start=p.random_start))
        fmodel = fb.PyTorchModel(model, bounds=(-math.inf, math.inf), device=x.device)
        labels = fb.criteria.Misclassification(torch.zeros(len(x), dtype=torch.long, device=x.device))
        z = pgd.run(fmodel, (x - mean) / std, labels, epsilon=p.eps)
        return z * std + mean


def hekal_attack(detector: str, side: str) -> type[HekalAttack]:
    """The class of ``hekal_min_<detector>`` (``side`` ``min``) or ``hekal_max_<detector>`` (``max``): the families'
    factory."""
    if side not in PREFIXES:
        raise UsageError(f"hekal attack side {side!r}; valid choices: {', '.join(PREFIXES)}")
    name = PREFIXES[side] + detector
    what = (f"lower {detector.upper()}'s confidence of an ID image (PGD-Min)" if side == "min"
            else f"raise {detector.upper()}'s confidence of a natural OOD image (PGD-Max)")
    return type(name, (HekalAttack,) + ((IdNegatives,) if side == "min" else ()), {
        "__doc__": f"ROSS's Linf PGD (Hekal et al. 2026, last iterate): {what}.", "__module__": __name__,
        "detector": detector, "side": side, "source": "id" if side == "min" else "ood"})


def hekal_class(name: str) -> type[HekalAttack] | None:
    """The hekal attack class registered as ``name``, None for any other attack."""
    cls = registry.get("attacks", name)
    return cls if isinstance(cls, type) and issubclass(cls, HekalAttack) else None


for _side, _prefix in PREFIXES.items():
    registry.register("attacks", _prefix.rstrip("_"))(type(_prefix.rstrip("_"), (AdaptiveFamily,), {
        "__doc__": f"One {_prefix}<det> per selected detector (Hekal et al. 2026, PGD-{_side.capitalize()}).",
        "__module__": __name__, "prefix": _prefix,
        "hint": "one hekal attack per selected detector with a differentiable score"}))
    registry.family("attacks", _prefix, functools.partial(hekal_attack, side=_side), accepts=is_differentiable,
                    hint=DIFFERENTIABLE, source=__name__, shorthand=_prefix.rstrip("_"),
                    description=f"ROSS's Linf PGD (Hekal et al. 2026, last iterate): "
                                f"{'lower a detector' if _side == 'min' else 'raise a detector'}'s confidence of "
                                f"{'an ID' if _side == 'min' else 'a natural OOD'} image (PGD-{_side.capitalize()}).")
