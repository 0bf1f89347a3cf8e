"""AutoAttack (Croce & Hein, ICML 2020) through the official implementation, and Carlini-Wagner L2.

Croce & Hein, "Reliable evaluation of adversarial robustness with an ensemble of diverse parameter-free
attacks" (ICML 2020); code: ``pyautoattack`` on the package index (github.com/fra31/auto-attack, MIT), used as
it is, not rewritten. Registered here (a plugin module with its own entry point, as a third party's would be):

* ``apgd_ce``: APGD on the cross-entropy (``APGDAttack(loss='ce')``).
* ``apgd_dlr``: targeted APGD on the DLR loss as in the standard version (``APGDAttack_targeted``,
  ``n_target_classes=9``): "the targeted version of APGD with the DLR loss ... on the top 9 classes".
* ``fab``: targeted FAB as in the standard version (``FABAttack_PT(targeted=True, n_target_classes=9)``);
  a sample counts only when FAB's minimal perturbation lies within ``eps``.
* ``square``: Square Attack (Andriushchenko et al. 2020), score-based, 5000 queries.
* ``autoattack``: the standard ensemble ``AutoAttack(version='standard')``: APGD-CE, APGD-T, FAB-T, Square run
  in turn on the samples still correctly classified, so each sample keeps the first attack that fools it (the
  per-sample worst case over the four).

Every setting is the library's standard-version default (100 iterations, 1 restart, rho 0.75, 9 target
classes, 5000 queries, p_init 0.8); ``n_iter``/``n_queries`` may be lowered for quick runs. ``norm``
(``linf`` or ``l2``) is a parameter: the set's MEAD group and the binarization test's ball follow it; ``eps``
defaults to the Linf budget (:func:`advopenood.attacks.base.default_eps`), so with ``norm: l2`` set ``eps`` too
(RobustBench's CIFAR-10 L2 budget is 0.5). AutoAttack's own ``seed`` is drawn from the torch generator that
:meth:`Attack.__call__` seeds per shard, so a shard's examples depend only on the run's seed and the shard.
The model is the :class:`advopenood.models.Classifier` (normalisation inside, inputs in [0, 1]).
Each attack counts its iterations for the shard's progress bar (``counts_steps``): APGD's are its gradient passes
(the one at the start and one per iteration, ``n_iter + 1`` per run), FAB's ``n_iter`` per run, Square's its queries
(``n_queries + 1`` per run); a run per restart (APGD-T and FAB-T: per target class too). An attack stops early where
every image is fooled (restarts, targets and AutoAttack's later members only run on the images still standing), so it
counts fewer than it planned there.
The DLR losses need at least 4 classes (their denominator uses the third and fourth largest logits):
``apgd_dlr`` refuses smaller models and ``autoattack`` leaves APGD-T out there (the binarization test's
2-class model), with at most ``classes - 1`` target classes for FAB-T.

``cw``: Carlini & Wagner, "Towards Evaluating the Robustness of Neural Networks" (IEEE S&P 2017), the L2
attack: ``minimize ||delta||_2^2 + c * max(max_{j != y} Z_j - Z_y, -kappa)`` in tanh space with Adam and a
binary search over ``c``; foolbox ``L2CarliniWagnerAttack``, minimal perturbation (no budget, like DeepFool).

``adaptive_apgd_<det>``: APGD on the joint objective of :mod:`advopenood_plugins.attacks.adaptive`
(``min(max_{j != y} f_j - f_y, kappa) + lambda * s(x')``, same BPDA rules, lambda swept per sample).
"""
from __future__ import annotations

from typing import Any, Callable, ClassVar

import foolbox as fb
import pyautoattack
import torch
import torch.nn as nn
from pyautoattack import AutoAttack
from pyautoattack.autopgd_base import APGDAttack, APGDAttack_targeted
from pyautoattack.fab_pt import FABAttack_PT
from pyautoattack.square import SquareAttack
from torch import Tensor

from advopenood.plugin import (Attack, IterationCount, QueryCount, UsageError, bounded, default_eps, is_differentiable,
                               registry, swept)
from advopenood_plugins.attacks.adaptive import DIFFERENTIABLE, AdaptiveAttack, AdaptiveFamily, margin_loss
from advopenood_plugins.kit.attacks import Best, counting, counting_gradient_passes, run_foolbox

#: our norm names -> AutoAttack's
AA_NORMS = {"linf": "Linf", "l2": "L2"}
#: the standard version's number of target classes (APGD-T, FAB-T)
TARGET_CLASSES = 9
#: the DLR losses read the 3rd (untargeted) and 4th (targeted) largest logits
DLR_MIN_CLASSES = 4
VERSION = {"pyautoattack": pyautoattack.__version__}
#: the declared type of Square's ``p_init``: the initial square's share of the image, in (0, 1]
SquareFraction = bounded(float, 0, 1, low_open=True)


def aa_seed() -> int:
    """A seed for AutoAttack's own ``manual_seed`` calls, from the (per-shard seeded) torch generator."""
    return int(torch.randint(0, 2**31 - 1, (1,)).item())


def num_classes(model: nn.Module, x: Tensor) -> int:
    """The number of logits ``model`` gives (the binarization test's models have 2)."""
    with torch.no_grad():
        return int(model(x[:1]).shape[1])


def targets(n_target_classes: int, classes: int | None) -> int:
    """The target classes a targeted attack runs (at most ``classes - 1``; all asked for when ``classes`` is None)."""
    return n_target_classes if classes is None else min(n_target_classes, classes - 1)


def counted_square(square: SquareAttack) -> SquareAttack:
    """``square`` with one :func:`~advopenood.plugin.count_step` per query (its ``margin_and_loss`` evaluates the
    candidates once at the start of each run and once per query)."""
    square.margin_and_loss = counting(square.margin_and_loss)  # type: ignore[method-assign]
    return square


def set_iterations(apgd: APGDAttack, n_iter: int) -> None:
    """Give a constructed APGD ``n_iter`` iterations with the checkpoint schedule its constructor derives from
    them (Croce & Hein, Sec. 3.2: checkpoints ``w_j``, first after ``0.22 * n_iter``, spacing shrinking by
    ``0.03 * n_iter`` down to ``0.06 * n_iter``)."""
    apgd.n_iter = apgd.n_iter_orig = n_iter
    apgd.n_iter_2 = max(int(0.22 * n_iter), 1)
    apgd.n_iter_min = max(int(0.06 * n_iter), 1)
    apgd.size_decr = max(int(0.03 * n_iter), 1)


class AutoAttackBase(Attack):
    """A pyautoattack attack with the standard version's settings; ``norm`` is a parameter (``linf``, ``l2``)."""

    norm = "linf"
    context = VERSION
    #: the budgets of the subclasses' defaults, each with its documented bound
    param_types: ClassVar[dict[str, Any]] = {"n_iter": IterationCount, "n_restarts": IterationCount,
                                             "n_queries": QueryCount}
    counts_steps = True

    def __init__(self, **params: Any):
        norm = str(params.get("norm", "linf")).lower()
        if norm not in AA_NORMS:
            raise UsageError(f"norm {params.get('norm')!r} for attack {self.name!r}; valid choices: {', '.join(AA_NORMS)}")
        self.norm = self.threat = norm
        super().__init__(**{**params, "norm": norm})

    @classmethod
    def defaults(cls, input_size: int) -> dict[str, Any]:
        return {"eps": default_eps(input_size), "norm": "linf"}

    def common(self, x: Tensor) -> dict[str, Any]:
        """Keyword arguments every pyautoattack class takes."""
        return {"norm": AA_NORMS[self.norm], "eps": self.p.eps, "seed": aa_seed(), "device": x.device}


@registry.register("attacks", "apgd_ce")
class APGDCE(AutoAttackBase):
    """APGD-CE (Croce & Hein 2020), AutoAttack's step-size-free PGD on the cross-entropy; pyautoattack."""

    objective = "ce"

    @classmethod
    def defaults(cls, input_size: int) -> dict[str, Any]:
        return {**super().defaults(input_size), "n_iter": 100, "n_restarts": 1, "rho": 0.75}

    def perturb(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        p = self.p
        attack = APGDAttack(model, n_iter=p.n_iter, n_restarts=p.n_restarts, loss="ce",
                            rho=p.rho, **self.common(x))
        with counting_gradient_passes(model):
            return attack.perturb(x, y)

    def planned_steps(self, images: int | None = None, classes: int | None = None) -> tuple[int, str] | None:
        """``n_iter + 1`` gradient passes per restart."""
        return self.p.n_restarts * (self.p.n_iter + 1), "iterations"


@registry.register("attacks", "apgd_dlr")
class APGDDLRTargeted(AutoAttackBase):
    """APGD-T (Croce & Hein 2020): targeted APGD on the DLR loss, top-9 target classes as in standard AutoAttack."""

    objective = "dlr"

    @classmethod
    def defaults(cls, input_size: int) -> dict[str, Any]:
        return {**super().defaults(input_size), "n_iter": 100, "n_restarts": 1, "rho": 0.75,
                "n_target_classes": TARGET_CLASSES}

    def perturb(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        p, classes = self.p, num_classes(model, x)
        if classes < DLR_MIN_CLASSES:
            raise UsageError(f"attack 'apgd_dlr' needs a classifier with at least {DLR_MIN_CLASSES} classes (the "
                             f"targeted DLR loss reads the 4th largest logit), this one has {classes}; valid choices: "
                             "apgd_ce, fab, square, autoattack")
        attack = APGDAttack_targeted(model, n_iter=p.n_iter, n_restarts=p.n_restarts,
                                     rho=p.rho,
                                     n_target_classes=min(p.n_target_classes, classes - 1), **self.common(x))
        with counting_gradient_passes(model):
            return attack.perturb(x, y)

    def planned_steps(self, images: int | None = None, classes: int | None = None) -> tuple[int, str] | None:
        """``n_iter + 1`` gradient passes per target class and restart."""
        p = self.p
        return targets(p.n_target_classes, classes) * p.n_restarts * (p.n_iter + 1), "iterations"


@registry.register("attacks", "fab")
class FABTargeted(AutoAttackBase):
    """FAB-T (Croce & Hein 2020): targeted FAB as in standard AutoAttack; succeeds only within eps; pyautoattack."""

    objective = "fab"

    @classmethod
    def defaults(cls, input_size: int) -> dict[str, Any]:
        return {**super().defaults(input_size), "n_iter": 100, "n_restarts": 1, "n_target_classes": TARGET_CLASSES}

    def perturb(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        p = self.p
        attack = FABAttack_PT(model, n_iter=p.n_iter, n_restarts=p.n_restarts, targeted=True,
                              n_target_classes=min(p.n_target_classes, num_classes(model, x) - 1),
                              **self.common(x))
        with counting_gradient_passes(model):
            return attack.perturb(x, y)

    def planned_steps(self, images: int | None = None, classes: int | None = None) -> tuple[int, str] | None:
        """``n_iter`` gradient passes per target class and restart."""
        p = self.p
        return targets(p.n_target_classes, classes) * p.n_restarts * p.n_iter, "iterations"


@registry.register("attacks", "square")
class Square(AutoAttackBase):
    """Square Attack (Andriushchenko et al. 2020), score-based random search, 5000 queries; pyautoattack."""

    objective = "margin"
    param_types = {"p_init": SquareFraction}

    @classmethod
    def defaults(cls, input_size: int) -> dict[str, Any]:
        return {**super().defaults(input_size), "n_queries": 5000, "p_init": 0.8, "n_restarts": 1}

    def perturb(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        p = self.p
        attack = SquareAttack(model, n_queries=p.n_queries, p_init=p.p_init,
                              n_restarts=p.n_restarts, resc_schedule=False, **self.common(x))
        return counted_square(attack).perturb(x, y)

    def planned_steps(self, images: int | None = None, classes: int | None = None) -> tuple[int, str] | None:
        """``n_queries + 1`` queries per restart."""
        return self.p.n_restarts * (self.p.n_queries + 1), "queries"


@registry.register("attacks", "autoattack")
class AutoAttackStandard(AutoAttackBase):
    """AutoAttack, standard version (Croce & Hein 2020): APGD-CE, APGD-T, FAB-T, Square; per-sample worst case."""

    objective = "autoattack"

    @classmethod
    def defaults(cls, input_size: int) -> dict[str, Any]:
        return {**super().defaults(input_size), "n_iter": 100, "n_queries": 5000}

    def perturb(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        p, classes = self.p, num_classes(model, x)
        aa = AutoAttack(model, norm=AA_NORMS[self.norm], eps=p.eps, seed=aa_seed(), device=x.device,
                        version="standard")
        aa.verbose = False
        for apgd in (aa.apgd, aa.apgd_targeted):
            set_iterations(apgd, p.n_iter)
        aa.fab.n_iter = p.n_iter
        aa.square.n_queries = p.n_queries
        aa.apgd_targeted.n_target_classes = min(TARGET_CLASSES, classes - 1)
        aa.fab.n_target_classes = min(TARGET_CLASSES, classes - 1)
        if classes < DLR_MIN_CLASSES:
            aa.attacks_to_run = [a for a in aa.attacks_to_run if a != "apgd-t"]
        counted_square(aa.square)
        with counting_gradient_passes(model):
            x_adv, _ = aa.run_standard_evaluation(x, y, batch_size=len(x))
        return x_adv

    def planned_steps(self, images: int | None = None, classes: int | None = None) -> tuple[int, str] | None:
        """The members' iterations in turn, one run each: APGD-CE ``n_iter + 1``, APGD-T ``n_iter + 1`` per target
        class (none below :data:`DLR_MIN_CLASSES` classes), FAB-T ``n_iter`` per target class, Square
        ``n_queries + 1``."""
        p, per_class = self.p, targets(TARGET_CLASSES, classes)
        apgd_t = 0 if classes is not None and classes < DLR_MIN_CLASSES else per_class * (p.n_iter + 1)
        return (p.n_iter + 1) + apgd_t + per_class * p.n_iter + (p.n_queries + 1), "iterations"


@registry.register("attacks", "cw")
class CarliniWagnerL2(Attack):
    """Carlini-Wagner L2 (Carlini & Wagner 2017), minimal perturbation; foolbox ``L2CarliniWagnerAttack``.

    ``strong`` (ours): 9 binary-search steps over ``c`` from 1e-3 (foolbox's and the paper's), 100 Adam steps
    of 0.01 per search step (foolbox's default is 10,000, too slow for CPU runs), confidence 0, abort early.
    foolbox returns a zero image for a sample it never fools; such a sample keeps its clean image here (a
    failed attack, zero perturbation).
    """

    norm = "l2"
    bounded = False
    param_types = {"binary_search_steps": IterationCount, "steps": IterationCount}
    counts_steps = True

    def planned_steps(self, images: int | None = None, classes: int | None = None) -> tuple[int, str] | None:
        """``steps`` Adam iterations per binary-search step (fewer where it aborts early)."""
        return self.p.binary_search_steps * self.p.steps, "iterations"

    @classmethod
    def defaults(cls, input_size: int) -> dict[str, Any]:
        return {"eps": None, "binary_search_steps": 9, "steps": 100, "stepsize": 0.01, "confidence": 0.0,
                "initial_const": 0.001, "abort_early": True}

    def perturb(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        p = self.p
        attack = fb.attacks.L2CarliniWagnerAttack(
            binary_search_steps=p.binary_search_steps, steps=p.steps, stepsize=p.stepsize,
            confidence=p.confidence, initial_const=p.initial_const,
            abort_early=p.abort_early)
        with counting_gradient_passes(model):
            x_adv = run_foolbox(attack, model, x, y, p.eps)
        with torch.no_grad():
            fooled = model(x_adv).argmax(1) != y
        return torch.where(fooled[:, None, None, None], x_adv, x)


class ObjectiveHead:
    """The joint objective in the shape pyautoattack's APGD takes an externally computed loss: its
    ``is_tf_model`` interface, ``predict(x) -> logits`` and ``get_logits_loss_grad_xent(x, y) -> (logits,
    per-sample loss, input gradient)``, selected by ``loss='ce'``. Every iterate APGD evaluates is offered to
    ``best`` (as :class:`advopenood_plugins.attacks.adaptive.JointLinfPGD` does for foolbox's PGD)."""

    def __init__(self, model: nn.Module, objective: Callable[[Tensor], tuple[Tensor, Tensor, Tensor, Tensor]],
                 best: Best):
        self.model, self.objective, self.best = model, objective, best

    @torch.no_grad()
    def predict(self, x: Tensor) -> Tensor:
        return self.model(x)

    def get_logits_loss_grad_xent(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        x = x.detach().requires_grad_(True)
        with torch.enable_grad():
            loss, success, value, logits = self.objective(x)
            grad, = torch.autograd.grad(loss.sum(), x)
        self.best.update(x.detach(), success, value)
        return logits.detach(), loss.detach(), grad.detach()


class AdaptiveAPGD(AdaptiveAttack):
    """Base of ``adaptive_apgd_<det>``: APGD (pyautoattack, Linf) on ``adaptive_<det>``'s joint objective.

    APGD runs through its ``attack_single_run`` on every sample (also clean-misclassified ones, which the joint
    objective still pushes towards the detector's acceptance), ``n_restarts`` times per lambda, from its random
    start; APGD's step-size schedule (``rho``, checkpoints) is the library's. Candidates and the per-sample
    choice are those of :class:`advopenood_plugins.attacks.adaptive.AdaptiveAttack`.
    """

    source: ClassVar[str] = "id"
    param_types: ClassVar[dict[str, Any]] = {"n_iter": IterationCount, "n_restarts": IterationCount,
                                             "lam": swept(what="lambda values")}

    @classmethod
    def defaults(cls, input_size: int) -> dict[str, Any]:
        return {"eps": default_eps(input_size), "n_iter": 100, "n_restarts": 1, "rho": 0.75,
                "lam": [0.0, 1.0, 4.0], "kappa": 5.0}

    def bind(self, *args: Any, **kwargs: Any) -> AdaptiveAPGD:
        super().bind(*args, **kwargs)
        self.context = {**self.context, **VERSION}
        return self

    def perturb(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        target, p = self.target, self.p
        kappa = p.kappa
        best = Best(x)
        for lam in self.lams:
            @counting
            def objective(x_adv: Tensor, lam: float = lam) -> tuple[Tensor, Tensor, Tensor, Tensor]:
                shared = self.shared_outputs(model, x_adv)
                logits = model(x_adv) if shared is None else shared.logits
                conf = target.standardized(x_adv, shared)
                loss = margin_loss(logits, y, -1.0, kappa) + lam * self.sign * conf
                with torch.no_grad():
                    value = self.sign * (conf * target.std + target.mean)
                return loss, logits.argmax(1) != y, value, logits

            apgd = APGDAttack(ObjectiveHead(model, objective, best), n_iter=p.n_iter, norm="Linf",
                              n_restarts=1, eps=p.eps, seed=aa_seed(), loss="ce", rho=p.rho,
                              device=x.device, is_tf_model=True)
            apgd.init_hyperparam(x)
            for _ in range(p.n_restarts):
                apgd.attack_single_run(x, y)
        return best.x

    def planned_steps(self, images: int | None = None, classes: int | None = None) -> tuple[int, str] | None:
        """``n_iter + 1`` objective evaluations (APGD's gradient passes) per lambda and restart."""
        p = self.p
        return len(self.lams) * p.n_restarts * (p.n_iter + 1), "iterations"

    def shared_outputs(self, model: nn.Module, x: Tensor):
        """The network's outputs with gradients when the attacked model is the detector's network (one pass)."""
        return self.target.outputs(x) if model is self.target.net else None


def adaptive_apgd_attack(detector: str) -> type[AdaptiveAPGD]:
    """The class of ``adaptive_apgd_<detector>`` for a detector with a differentiable ``grad_score`` (the family's
    factory)."""
    name = f"adaptive_apgd_{detector}"
    return type(name, (AdaptiveAPGD,), {
        "__doc__": f"Detector-adaptive APGD-Linf against {detector.upper()}: misclassify an ID image while "
                   f"{detector.upper()} keeps it in-distribution (lambda swept per sample).",
        "__module__": __name__, "detector": detector})


registry.register("attacks", "adaptive_apgd")(type("adaptive_apgd", (AdaptiveFamily,), {
    "__doc__": "One adaptive_apgd_<det> per selected detector: --attack apgd_ce,adaptive_apgd --detectors mds,knn.",
    "__module__": __name__, "prefix": "adaptive_apgd_"}))

registry.family("attacks", "adaptive_apgd_", adaptive_apgd_attack, accepts=is_differentiable,
                hint=DIFFERENTIABLE, shorthand="adaptive_apgd",
                description="Detector-adaptive APGD-Linf against a detector: misclassify an ID image while the detector "
                            "keeps it in-distribution (lambda swept per sample).")
