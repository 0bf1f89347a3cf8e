"""Attacks of the robust AUROC: one side lowers the confidence of ID images, the other raises that of OOD images.

A robust AUROC (Azizmalayeri et al., "Your Out-of-Distribution Detection Method is Not Robust!", NeurIPS 2022,
ATD; Mirzaei et al., AROS, ICLR 2025) is the AUROC of a detector when both sides of the detection problem are
attacked within the same Linf ball: every ID test image is pushed to look OOD and every OOD image to look ID.
For a detector with confidence ``c(x)`` (higher = more ID), standardised on its fit set,
``s(x) = (c(x) - mean_fit) / std_fit``, the attacks maximise

* ``robust_id_<det>`` (ID images, :class:`~advopenood.capabilities.IdNegatives`): ``L(x') = -s(x')``;
* ``robust_ood_<det>`` (natural OOD images, parameter ``ood_set``): ``L(x') = +s(x')``,

with Linf PGD (foolbox ``LinfPGD``, random start, 100 steps of ``2.5 * eps / steps``: ATD's ``attack_pgd`` with
``attack_iters=100, alpha=2.5*eps/attack_iters``) or, as ``robust_apgd_id_<det>`` / ``robust_apgd_ood_<det>``, APGD
(Croce & Hein 2020) through pyautoattack's external-loss interface (``is_tf_model``, as ``adaptive_apgd_<det>``).
A randomised detector (:class:`~advopenood.capabilities.Randomised`, e.g. ``smoothed_<det>``) with a differentiable
score also gets the EOT twin of each (``robust_id_eot_<det>``, ``robust_ood_eot_<det>``, ``robust_apgd_id_eot_<det>``,
``robust_apgd_ood_eot_<det>``; :class:`~.adaptive.EOTAttack`): the same attack, its gradient the
mean over ``eot`` of the detector's attack-stream draws (default: as many as one confidence takes), which the
``robust_auroc`` evaluator runs by default for such a detector.
The attack ensemble's other members (``evaluator_params.robust_auroc.ensemble: standard``): ``robust_apgd_aux_id_<det>``
/ ``robust_apgd_aux_ood_<det>`` (:class:`RobustAuxAPGD`: APGD on a second objective, the logit margin or a feature
distance by the detector's ``score_space``, with EOT twins) and ``robust_square_id_<det>`` / ``robust_square_ood_<det>``
(:class:`RobustSquare`: pyautoattack's Square Attack, Andriushchenko et al. ECCV 2020, on the score; gradient-free,
no EOT twin: a randomised detector scores each query with fresh noise).
Every iterate is a candidate and so is the clean image (``delta = 0`` lies in the ball); each image keeps the
candidate with the lowest (ID side) or highest (OOD side) confidence, so an attacked ID image never looks more ID
than its clean self and an attacked OOD image never less. Success, as stored: the detector rejects the ID image
(confidence below its 95 %-TPR threshold on the fit set) or accepts the OOD image. The detector is fitted and
differentiated as for ``adaptive_<det>`` (:mod:`advopenood_plugins.attacks.adaptive`: the evaluated detector's fit rows
and parameters, ``grad_score`` with BPDA where the detector is not differentiable).

Binarization test (detector variant, Zimmermann et al. 2022, App. A.1): its binary classifier must be flipped,
which these attacks never try; :meth:`RobustScoreAttack.test_form` therefore runs the attack's own optimiser and
detector term with the adaptive attacks' classifier term added (``min(max_{j != y} f_j - f_y, kappa) +
lambda * sign * s(x')``, kappa 5, lambda 0, 1, 4 swept per sample): ``sign = +1`` (raise the confidence) in the
regular test, ``-1`` in the inverted one. A weakened optimiser or a broken detector gradient fails it.
"""
from __future__ import annotations

import copy
import functools
from typing import Any, Callable, ClassVar

import torch
import torch.nn as nn
from pyautoattack.autopgd_base import APGDAttack
from pyautoattack.square import SquareAttack
from torch import Tensor

from advopenood.plugin import (Attack, DetectorTestForms, IdNegatives, IterationCount, QueryCount, UsageError,
                               count_step, default_eps, fit_subset, foolbox_model, is_differentiable, is_randomised,
                               make_loader, registry)
from advopenood_plugins.attacks.adaptive import (DIFFERENTIABLE, AdaptiveAttack, AdaptiveFamily, DetectorTarget,
                                                 EOTAttack, JointLinfPGD, SharedTarget, margin_loss)
from advopenood_plugins.attacks.autoattack import VERSION, ObjectiveHead, SquareFraction, aa_seed
from advopenood_plugins.kit.attacks import Best, rel_stepsize

#: the binarization-test form's classifier term: C&W margin clip and detector weights (``adaptive_<det>``'s)
TEST_KAPPA = 5.0
TEST_LAMS = (0.0, 1.0, 4.0)
#: ``(side, method) -> name prefix``
PREFIXES = {("id", "pgd"): "robust_id_", ("ood", "pgd"): "robust_ood_",
            ("id", "apgd"): "robust_apgd_id_", ("ood", "apgd"): "robust_apgd_ood_",
            ("id", "apgd_aux"): "robust_apgd_aux_id_", ("ood", "apgd_aux"): "robust_apgd_aux_ood_",
            ("id", "square"): "robust_square_id_", ("ood", "square"): "robust_square_ood_"}
#: the methods that follow a gradient (they get EOT twins on a randomised detector); ``square`` is gradient-free
GRADIENT_METHODS = ("pgd", "apgd", "apgd_aux")
#: ``(side, method) -> name prefix`` of the EOT twins (randomised detectors only)
EOT_PREFIXES = {key: prefix + "eot_" for key, prefix in PREFIXES.items() if key[1] in GRADIENT_METHODS}
#: AutoAttack's standard query budget for Square (``AutoAttack(version='standard')``: ``n_queries=5000``)
SQUARE_QUERIES = 5000
#: fit rows whose class-mean features the OOD side's feature objective pulls towards
AUX_FIT_ROWS = 500


Objective = Callable[[Tensor], tuple[Tensor, Tensor, Tensor, Tensor]]


class RobustScoreAttack(SharedTarget, AdaptiveAttack, DetectorTestForms):
    """Base of the robust-AUROC attacks: move the detector's standardised confidence down (``side = "id"``) or up
    (``side = "ood"``) within the eps-ball; bind with the ID fit data first (the pipeline does)."""

    objective = "robust"
    #: ``"id"``: ID images pushed to look OOD; ``"ood"``: OOD images pushed to look ID
    side: ClassVar[str] = "id"
    #: the optimiser, ``"pgd"`` or ``"apgd"``
    method: ClassVar[str] = "pgd"
    param_types: ClassVar[dict[str, Any]] = {"steps": IterationCount, "n_iter": IterationCount,
                                             "n_restarts": IterationCount}

    #: the objective counts its evaluations (:meth:`planned_steps`): the bar moves per iteration or query
    counts_steps = True

    def __init__(self, **params: Any):
        Attack.__init__(self, **params)  # no lambda or kappa: the objective is the detector's score alone
        self.sign = -1.0 if self.side == "id" else 1.0
        self.joint = False
        self._bound: dict[str, Any] | None = None
        self._target = None

    @classmethod
    def defaults(cls, input_size: int) -> dict[str, Any]:
        base = ({"eps": default_eps(input_size), "steps": 100, "rel_stepsize": None, "random_start": True}
                if cls.method == "pgd" else {"eps": default_eps(input_size), "n_iter": 100, "n_restarts": 1, "rho": 0.75})
        return {**base, "ood_set": None} if cls.source == "ood" else base

    def bind(self, *args: Any, **kwargs: Any) -> RobustScoreAttack:
        super().bind(*args, **kwargs)
        if self.method == "apgd":
            self.context = {**self.context, **VERSION}
        return self

    def test_form(self, test: str) -> RobustScoreAttack:
        """The binarization test's form: this optimiser and detector term plus the classifier term, raising the
        confidence in the ``regular`` test and lowering it in the ``inverted`` one."""
        if test not in ("regular", "inverted"):
            raise UsageError(f"test {test!r} for the detector variant; valid choices: regular, inverted")
        form = copy.copy(self)
        form.sign, form.joint = (1.0 if test == "regular" else -1.0), True
        return form

    def _wanted(self, conf: Tensor) -> Tensor:
        """Whether the detector decides as this attack wants: rejects (sign < 0) or accepts (sign > 0)."""
        accepted = conf >= self.target.threshold
        return accepted if self.sign > 0 else ~accepted

    def succeeded(self, model: nn.Module, x_adv: Tensor, y: Tensor, adv_pred: Tensor) -> Tensor:
        """ID side: the detector rejects the image; OOD side: it accepts it (95 %-TPR threshold on the fit set)."""
        return self._wanted(self.target.score(x_adv).to(adv_pred.device))

    def objective_fn(self, model: nn.Module, y: Tensor, lam: float, target: DetectorTarget | None = None) -> Objective:
        """``x' -> (loss per sample, success, sign * confidence, logits)`` for the optimiser and :class:`Best`
        (``target``: one of :meth:`targets`, the detector's plain target by default)."""
        target = self.target if target is None else target

        def objective(x_adv: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
            count_step()  # one iteration or query: the shard's progress bar moves
            shared = target.outputs(x_adv) if model is target.net else None
            conf = target.standardized(x_adv, shared)
            if self.joint:
                logits = model(x_adv) if shared is None else shared.logits
                loss = margin_loss(logits, y, -1.0, TEST_KAPPA) + lam * self.sign * conf
            else:
                loss = self.sign * conf
                with torch.no_grad():
                    logits = model(x_adv) if shared is None else shared.logits
            with torch.no_grad():
                raw = conf * target.std + target.mean
                success = self._wanted(raw)
                if self.joint:
                    success &= logits.argmax(1) != y
            return loss, success, self.sign * raw, logits

        return objective

    def planned_steps(self, images: int | None = None, classes: int | None = None) -> tuple[int, str] | None:
        """The objective's evaluations one call makes (:func:`~advopenood.attacks.base.count_step` in the objective):
        the clean one, then per target and lambda each restart's iterations (or Square's queries) and the one
        before them."""
        p = self.params
        unit, per_run = next(((u, p[k]) for k, u in (("n_queries", "queries"), ("n_iter", "iterations"),
                                                     ("steps", "iterations")) if isinstance(p.get(k), int)))
        runs = len(self.targets()) * (len(TEST_LAMS) if self.joint else 1) * (p.get("n_restarts") or 1)
        return 1 + runs * (per_run + 1), unit

    def perturb(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        best = Best(x)
        with torch.no_grad():
            _, success, value, logits = self.objective_fn(model, y, 0.0)(x)
        best.update(x, success, value)
        if not self.joint:
            y = logits.argmax(1)  # OOD rows carry no class label; the optimisers only need one (from the clean pass)
        for target in self.targets():
            for lam in (TEST_LAMS if self.joint else (1.0,)):
                self.optimise(model, x, y, self.objective_fn(model, y, lam, target), best)
        return best.x

    def optimise(self, model: nn.Module, x: Tensor, y: Tensor, objective: Objective, best: Best) -> None:
        """Run the optimiser on ``objective``; every iterate it evaluates is offered to ``best``."""
        raise NotImplementedError


class RobustPGD(RobustScoreAttack):
    """Linf PGD (foolbox ``LinfPGD``) on the detector's score."""

    def optimise(self, model: nn.Module, x: Tensor, y: Tensor, objective: Objective, best: Best) -> None:
        p = self.p
        attack = JointLinfPGD(lambda z: objective(z)[:3], best, rel_stepsize=rel_stepsize(p), steps=p.steps,
                              random_start=p.random_start)
        _, clipped, _ = attack(foolbox_model(model, x.device), x, y, epsilons=p.eps)
        with torch.no_grad():
            _, success, value, _ = objective(clipped)
        best.update(clipped, success, value)


class RobustAPGD(RobustScoreAttack):
    """APGD-Linf (pyautoattack ``APGDAttack``, external loss) on the detector's score."""

    method = "apgd"

    def optimise(self, model: nn.Module, x: Tensor, y: Tensor, objective: Objective, best: Best) -> None:
        p = self.p
        apgd = APGDAttack(ObjectiveHead(model, objective, best), n_iter=p.n_iter, norm="Linf", n_restarts=1,
                          eps=p.eps, seed=aa_seed(), loss="ce", rho=p.rho, device=x.device,
                          is_tf_model=True)
        apgd.init_hyperparam(x)
        for _ in range(p.n_restarts):
            apgd.attack_single_run(x, y)


class RobustAuxAPGD(RobustAPGD):
    """APGD-Linf on a second objective that does not run through the detector's score (the ensemble's second
    gradient member; the forward value that picks each image's candidate is still the detector's confidence).

    By the detector's :attr:`~advopenood.detectors.Postprocessor.score_space`: ``logits``: the top-1 logit margin
    ``m(x') = f_(1)(x') - f_(2)(x')``, lowered on the ID side (an uncertain prediction), raised on the OOD side;
    ``features``: on the ID side the distance ``||z(x') - z(x)||`` of the penultimate features from the clean
    image's, raised; on the OOD side the distance ``||z(x') - mu_c||`` to the fit-set mean feature of the clean
    prediction's class ``c`` (first :data:`AUX_FIT_ROWS` fit rows), lowered."""

    method = "apgd_aux"

    def targets(self) -> list[DetectorTarget]:
        """The plain target once: the objective does not use the detector's gradient, so no surrogate applies."""
        return [self.target]

    def objective_fn(self, model: nn.Module, y: Tensor, lam: float, target: DetectorTarget | None = None) -> Objective:
        if self.joint:
            return super().objective_fn(model, y, lam, target)
        target = self.target if target is None else target
        features = getattr(target.detector, "score_space", "logits") == "features"
        anchor = self._anchor(target) if features else None

        def objective(x_adv: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
            count_step()
            out = target.outputs(x_adv)  # the detector's network: the attacked model, or the one it reads
            if anchor is None:
                top = out.logits.topk(2, dim=1).values
                loss = self.sign * (top[:, 0] - top[:, 1])
            else:
                loss = -self.sign * (out.features.flatten(1) - anchor).norm(dim=1)
            with torch.no_grad():
                raw = target.confidence(x_adv, out)
            return loss, self._wanted(raw), self.sign * raw, out.logits.detach()

        return objective

    def perturb(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        self._clean = x
        return super().perturb(model, x, y)

    @torch.no_grad()
    def _anchor(self, target: DetectorTarget) -> Tensor:
        """ID side: the clean images' features; OOD side: the fit-set class mean of each clean prediction."""
        if self.sign < 0:
            return target.outputs(self._clean).features.flatten(1).detach()
        if getattr(self, "_means", None) is None:
            b = self._bound
            rows = fit_subset(b["fit_set"], b["seed"], AUX_FIT_ROWS)
            feats, preds = [], []
            for xb, _ in make_loader(rows, b["batch_size"]):
                out = target.outputs(xb.to(b["device"]))
                feats.append(out.features.flatten(1).detach())
                preds.append(out.logits.argmax(1))
            z, c = torch.cat(feats), torch.cat(preds)
            self._means = torch.stack([z[c == k].mean(0) if (c == k).any() else z.mean(0)
                                       for k in range(int(out.logits.shape[1]))])  # unpredicted class: all rows
        return self._means[target.outputs(self._clean).logits.argmax(1).to(self._means.device)]


class ScoreSquare(SquareAttack):
    """pyautoattack's Square Attack with the detector's score as its loss: :meth:`margin_and_loss` returns a margin
    that never reaches 0 (so no image stops early: the attack spends every query, as on a score there is no
    decision to flip) and the loss ``-sign * s(x')`` it minimises; every query is offered to ``best``."""

    def __init__(self, objective: Objective, best: Best, **kwargs: Any):
        super().__init__(None, loss="margin", **kwargs)
        self.objective, self.best = objective, best

    @torch.no_grad()
    def margin_and_loss(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        loss, success, value, _ = self.objective(x)
        if len(x) == len(self.best.x):  # the margin never reaches 0, so every query holds the whole batch
            self.best.update(x, success, value)
        return torch.ones_like(loss), -loss


class RobustSquare(RobustScoreAttack):
    """Square Attack (Andriushchenko et al., ECCV 2020; pyautoattack's ``SquareAttack.attack_single_run``, Linf)
    on the detector's standardised score: random search over square patches of +-2 eps at the Linf budget, each
    query kept when it moves the confidence the attack's way. ``n_queries`` (default 5,000, AutoAttack's);
    ``p_init`` 0.8; the square-size schedule is AutoAttack's (``resc_schedule=False``) at 5,000 queries and the
    library's rescaling of it to the budget otherwise. A randomised detector scores every query with fresh noise
    from its attack stream, as it is used. Gradient-free: a detector that masks its gradient does not stop it."""

    method = "square"
    param_types: ClassVar[dict[str, Any]] = {"n_queries": QueryCount, "p_init": SquareFraction}

    @classmethod
    def defaults(cls, input_size: int) -> dict[str, Any]:
        base = {"eps": default_eps(input_size), "n_queries": SQUARE_QUERIES, "p_init": 0.8}
        return {**base, "ood_set": None} if cls.source == "ood" else base

    def targets(self) -> list[DetectorTarget]:
        """The plain target once: Square reads only the detector's forward value."""
        return [self.target]

    def optimise(self, model: nn.Module, x: Tensor, y: Tensor, objective: Objective, best: Best) -> None:
        p = self.p
        square = ScoreSquare(objective, best, norm="Linf", n_queries=p.n_queries, eps=p.eps, p_init=p.p_init,
                             seed=aa_seed(), resc_schedule=p.n_queries != SQUARE_QUERIES, device=x.device)
        square.init_hyperparam(x)
        square.attack_single_run(x, y)


def robust_attack(detector: str, side: str, method: str = "pgd", eot: bool = False) -> type[RobustScoreAttack]:
    """The class of the robust-AUROC attack on ``detector`` for ``side`` (``id``, ``ood``) and ``method`` (``pgd``,
    ``apgd``, ...), its EOT twin when ``eot`` (e.g. ``robust_id_mds``, ``robust_apgd_ood_knn``,
    ``robust_id_eot_smoothed_msp``): the families' factory."""
    if (side, method) not in (EOT_PREFIXES if eot else PREFIXES):
        raise UsageError(f"robust attack side {side!r}, method {method!r}, eot {eot!r}; valid choices: side id or "
                         f"ood, method {', '.join(GRADIENT_METHODS)} or (without eot) square")
    name = (EOT_PREFIXES if eot else PREFIXES)[side, method] + detector
    optimiser = {"pgd": RobustPGD, "apgd": RobustAPGD, "apgd_aux": RobustAuxAPGD, "square": RobustSquare}[method]
    bases = ((EOTAttack,) if eot else ()) + (optimiser,) + ((IdNegatives,) if side == "id" else ())
    return type(name, bases, {
        "__doc__": f"Robust-AUROC attack, Linf {method.upper()}{', EOT gradient' if eot else ''}: "
                   f"{_what(detector.upper(), side)}.",
        "__module__": __name__, "detector": detector, "side": side, "source": side,
        **({"plain_attack": PREFIXES[side, method] + detector} if eot else {})})


def _what(detector: str, side: str) -> str:
    """What the attack on ``detector`` does on ``side``, in its description."""
    return (f"lower {detector}'s confidence of an ID image (ID looks OOD)" if side == "id"
            else f"raise {detector}'s confidence of a natural OOD image (OOD looks ID)")


def _randomised_differentiable(obj: Any) -> bool:
    return is_randomised(obj) and is_differentiable(obj)


def robust_class(name: str) -> type[RobustScoreAttack] | None:
    """The robust-AUROC attack class registered as ``name``, None for any other attack."""
    cls = registry.get("attacks", name)
    return cls if isinstance(cls, type) and issubclass(cls, RobustScoreAttack) else None


# the four robust-AUROC attacks of every registered detector that declares a differentiable score
# (:class:`~advopenood.capabilities.DifferentiableDetector`), built-in or third-party, and their EOT twins when it is
# randomised too (:class:`~advopenood.capabilities.Randomised`), with their shorthands (one per selected detector)
for (_side, _method), _prefix in PREFIXES.items():
    _twins = (("", "with a differentiable score"), ("eot_", "that is randomised, with a differentiable score"))
    for _eot, _hint in _twins if _method in GRADIENT_METHODS else _twins[:1]:
        _family = _prefix + _eot.rstrip("_") if _eot else _prefix.rstrip("_")
        registry.register("attacks", _family)(type(_family, (AdaptiveFamily,), {
            "__doc__": f"One {_prefix}{_eot}<det> per selected detector (robust AUROC, {_side.upper()} side, "
                       f"{_method.upper()}{', EOT' if _eot else ''}).", "__module__": __name__,
            "prefix": _prefix + _eot, "hint": f"one robust-AUROC attack per selected detector {_hint}"}))
        registry.family(
            "attacks", _prefix + _eot, functools.partial(robust_attack, side=_side, method=_method, eot=bool(_eot)),
            accepts=_randomised_differentiable if _eot else is_differentiable, source=__name__, shorthand=_family,
            hint="a randomised detector with a differentiable score" if _eot else DIFFERENTIABLE,
            description=f"Robust-AUROC attack, Linf {_method.upper()}{', EOT gradient' if _eot else ''}: "
                        f"{_what('a detector', _side)}.")
