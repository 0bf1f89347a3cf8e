"""Detector-adaptive attacks: PGD on a joint objective, classifier loss + lambda x detector-score loss.

Lorenz et al., "Deciphering the Definition of Adversarial Robustness for Post-Hoc OOD Detectors" (the paper
behind this project) ends with a roadmap whose level 3 is attacks that adapt to the detector; the recipe is the
adaptive-attack one of Carlini & Wagner ("Adversarial Examples Are Not Easily Detected", AISec 2017) and
Tramer, Carlini, Brendel & Madry ("On Adaptive Attacks to Adversarial Example Defenses", NeurIPS 2020).

For a detector with confidence ``c(x)`` (higher = more ID, OpenOOD's convention), standardised on its fit set,
``s(x) = (c(x) - mean_fit) / std_fit``, and logits ``f``, Linf PGD (foolbox ``LinfPGD``, random start) maximises

* ``adaptive_<det>`` (ID->ID evasion, an ID image ``x`` with label ``y``):
  ``L(x') = min(max_{j != y} f_j(x') - f_y(x'), kappa) + lambda * s(x')``: misclassify with margin ``kappa``
  (clipped, so once misclassified the detector term takes over) while looking in-distribution;
* ``adaptive_ood_<det>`` (OOD->ID, a natural OOD image, clean prediction ``t``):
  ``L(x') = min(f_t(x') - max_{j != t} f_j(x'), kappa) + lambda * s(x')``: stay confidently classified while
  the detector accepts it.

``lam`` is a list swept per sample (default ``[0, 1, 4]``; 0 keeps the classifier-only attack among the candidates,
so the adaptive attack never misclassifies less than PGD): every lambda runs the whole attack, every iterate of
every run is a candidate, and each sample keeps the candidate that succeeds (ID->ID: misclassified; OOD->ID: confidence at or
above the detector's 95 %-TPR threshold on its fit set) with the highest confidence, else the one with the
highest confidence. The detector is the pytorch-ood implementation fitted on the run's fit rows (the same rows
and parameters as the evaluated detector) and differentiated through its ``grad_score`` (BPDA where the
detector is not differentiable; see each detector's docstring in ``plugins/detectors/``); the evaluation then
scores the examples with the run's backend, OpenOOD's own postprocessors included.

A randomised detector (:class:`~advopenood.capabilities.Randomised`, e.g. ``smoothed_<det>``) is attacked through
its attack noise stream (:meth:`~advopenood.capabilities.Randomised.for_attack`), independent of the evaluation
stream the run scores every set with; :class:`EOTAttack` turns any of these attacks into its EOT twin (the gradient
averaged over the detector's draws).

The binarization test's detector variant runs these attacks: the regular test uses them as they are, the
inverted test uses :meth:`AdaptiveAttack.inverted`, which minimises the detector term instead.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import eagerpy as ep
import foolbox as fb
import numpy as np
import torch
import torch.nn as nn
from torch import Tensor
from torch.utils.data import Dataset

from advopenood.plugin import (Attack, AttackFamily, DetectorAware, DrawCount, Invertible, IterationCount, Outputs,
                               Postprocessor, UsageError, code_identity, default_eps, fit_detectors, fit_subset,
                               foolbox_model, grad_outputs, id_threshold, is_differentiable, is_randomised, make_loader,
                               registry, swept)
from advopenood_plugins.kit.attacks import Best, counted, rel_stepsize

#: The detector's fit-set confidences used for standardisation and the acceptance threshold (first rows).
CALIBRATION_ROWS = 2000


def margin_loss(logits: Tensor, target: Tensor, sign: float, kappa: float) -> Tensor:
    """``min(sign * (f_t - max_{j != t} f_j), kappa)`` per sample: ``sign = -1`` rewards leaving class ``t``
    (untargeted misclassification), ``sign = +1`` rewards staying in it; clipped at ``kappa`` (Carlini & Wagner)."""
    other = logits.masked_fill(nn.functional.one_hot(target, logits.shape[1]).bool(), -math.inf).amax(1)
    own = logits.gather(1, target[:, None])[:, 0]
    return (sign * (own - other)).clamp(max=kappa)


def detector_code(name: str) -> list[dict[str, Any]]:
    """What an attack on detector ``name`` depends on besides its parameters: the code identity
    (:func:`~advopenood.provenance.code_identity`) of its class and of every detector it wraps (``base_name``, e.g.
    ``ross_gen`` over ``gen``), so that editing a detector's score recomputes the attack sets made against it."""
    out: list[dict[str, Any]] = []
    while name:
        obj = registry.get("detectors", name)
        cls = obj if isinstance(obj, type) else type(obj)
        out.append(code_identity(cls))
        name = str(getattr(cls, "base_name", "") or "")
    return out


@dataclass
class DetectorTarget:
    """A fitted detector as the attack sees it: differentiable confidence, fit-set statistics, threshold."""

    detector: Postprocessor
    net: nn.Module
    mean: float
    std: float
    threshold: float

    def outputs(self, x: Tensor) -> Outputs:
        """The network's outputs for ``x`` with gradients, with the tapped maps when the detector reads them
        (``needs_taps``, GRAM): one pass serves the classifier term and the detector."""
        return grad_outputs(self.net, x, keep_maps=False, taps=self.detector.needs_taps)

    def confidence(self, x: Tensor, out: Outputs | None = None) -> Tensor:
        """The detector's confidence of ``x`` (higher = more ID), differentiable in ``x``; ``out``: the network's
        outputs for ``x`` when the caller already has them (with gradients)."""
        out = self.outputs(x) if out is None else out
        return self.detector.grad_score(self.net, x, out).flatten()

    def standardized(self, x: Tensor, out: Outputs | None = None) -> Tensor:
        """``(c(x) - mean_fit) / std_fit``."""
        return (self.confidence(x, out) - self.mean) / self.std

    @torch.no_grad()
    def score(self, x: Tensor) -> Tensor:
        """The confidence without gradients (the binarization test's ``score_fn``)."""
        return self.confidence(x)


def calibrate(detector: Postprocessor, net: nn.Module, fit_set: Dataset, seed: int, batch_size: int,
              device: torch.device) -> DetectorTarget:
    """Mean, standard deviation and 95 %-TPR threshold of the confidence on the first
    :data:`CALIBRATION_ROWS` fit rows (in the detectors' seeded order)."""
    target = DetectorTarget(detector, net, 0.0, 1.0, -math.inf)
    conf = []
    with torch.no_grad():
        for x, _ in make_loader(fit_subset(fit_set, seed, CALIBRATION_ROWS), batch_size):
            conf.append(target.confidence(x.to(device)).double().cpu())
    values = torch.cat(conf).numpy()
    finite = values[np.isfinite(values)]
    if len(finite) < 2:
        raise UsageError(f"detector {detector.name!r} gives no finite confidences on the fit set; "
                         "it cannot be attacked adaptively")
    target.mean, target.std = float(finite.mean()), float(max(finite.std(), 1e-12))
    target.threshold = id_threshold(finite)
    return target


class JointLinfPGD(fb.attacks.LinfPGD):
    """foolbox's LinfPGD with the joint objective as loss; every iterate it evaluates is a candidate for ``best``."""

    def __init__(self, objective: Callable[[Tensor], tuple[Tensor, Tensor, Tensor]], best: Best, **kwargs: Any):
        super().__init__(**kwargs)
        self.objective, self.best = objective, best

    def get_loss_fn(self, model: fb.Model, labels: ep.Tensor) -> Callable[[ep.Tensor], ep.Tensor]:
        def loss_fn(inputs: ep.Tensor) -> ep.Tensor:
            loss, success, value = self.objective(inputs.raw)
            self.best.update(inputs.raw, success, value)
            return ep.astensor(loss.sum())

        return loss_fn


class AdaptiveAttack(Attack, DetectorAware, Invertible):
    """Base of ``adaptive_<det>`` / ``adaptive_ood_<det>``: call :meth:`bind` with the ID fit data first
    (the pipeline does, then hands it the run's fitted detector: :meth:`use_fitted`); the detector is fitted on
    first use."""

    #: the run's handle on the attacked detector (:meth:`use_fitted`); None: the attack fits its own
    _fitted: Any = None

    norm = "linf"
    objective = "adaptive"
    detector: ClassVar[str] = ""
    #: ``"id"``: ID->ID evasion; ``"ood"``: OOD->ID
    source: ClassVar[str] = "id"
    param_types: ClassVar[dict[str, Any]] = {"steps": IterationCount, "lam": swept(what="lambda values")}
    #: the shard's bar counts the PGD steps of every run (:meth:`planned_steps`)
    counts_steps = True

    def __init__(self, **params: Any):
        super().__init__(**params)
        lam = self.p.lam
        lams = [lam] if isinstance(lam, (int, float)) else list(lam or [])
        if not lams or any(not isinstance(v, (int, float)) or v < 0 for v in lams):
            raise UsageError(f"lam {lam!r} for attack {self.name!r}; valid choices: a number >= 0 or a list of them")
        if self.p.kappa <= 0:
            raise UsageError(f"kappa {self.p.kappa!r} for attack {self.name!r}; valid choices: a number > 0")
        self.lams = [float(v) for v in lams]
        self.sign = 1.0
        self._bound: dict[str, Any] | None = None
        self._target: DetectorTarget | None = None

    @classmethod
    def defaults(cls, input_size: int) -> dict[str, Any]:
        base = {"eps": default_eps(input_size), "steps": 40, "rel_stepsize": None, "random_start": True,
                "lam": [0.0, 1.0, 4.0], "kappa": 5.0}
        return {**base, "ood_set": None} if cls.source == "ood" else base

    def bind(self, net: nn.Module, fit_set: Dataset, *, seed: int, batch_size: int, device: torch.device | str,
             detector_params: dict[str, Any] | None = None) -> AdaptiveAttack:
        """Fit data and settings for the detector (the run's ``detector_params.<det>`` and seed, so it is the
        evaluated detector's fit); recorded in the cache key through :attr:`context`."""
        params = dict(detector_params or {})
        self._bound = {"net": net, "fit_set": fit_set, "seed": int(seed), "batch_size": int(batch_size),
                       "device": torch.device(device), "params": params}
        self.context = {"fit": fit_set.identity(), "detector": self.detector, "detector_params": params,
                        "fit_seed": int(seed), "detector_code": detector_code(self.detector)}
        self._target = self._fitted = None
        return self

    def use_fitted(self, detector: Any) -> None:
        """Attack the run's fitted detector (the handle :func:`advopenood.capabilities.bind_attack` passes), not a
        copy fitted for the attack; it is fitted on the attack's first need (from the store where it can be)."""
        self._fitted, self._target = detector, None

    @property
    def target(self) -> DetectorTarget:
        """The fitted, calibrated detector (fitted on first use)."""
        if self._target is None:
            if self._bound is None:
                raise UsageError(f"attack {self.name!r} needs the ID fit data to fit detector {self.detector!r}; "
                                 "call bind(net, fit_set, ...) first (advopenood run does)")
            # fitting and calibrating iterate DataLoaders, which draw from torch's global generator: forked, so the
            # attack's seeded random start is the same whether or not this call fits (a resumed run's first shard)
            with torch.random.fork_rng(devices=[]):
                self._target = self._fit_target(self._bound)
        return self._target

    def _fit_target(self, b: dict[str, Any]) -> DetectorTarget:
        """The run's fitted detector (:meth:`use_fitted`), else the detector fitted here on the bound fit data,
        calibrated (:func:`calibrate`)."""
        if self._fitted is not None:
            try:
                det = self._fitted.get()
            except RuntimeError as exc:
                raise RuntimeError(f"attack {self.name!r}: {exc}") from None
        else:
            bank = fit_detectors([self.detector], "pytorch-ood", b["net"], b["fit_set"], batch_size=b["batch_size"],
                                 device=b["device"], seed=b["seed"], params={self.detector: b["params"]},
                                 progress=False)
            if self.detector not in bank.dets:
                raise RuntimeError(f"attack {self.name!r}: {bank.errors.get(self.detector, 'detector did not fit')}")
            det = bank.dets[self.detector]
        if not is_differentiable(det):
            raise UsageError(f"attack {self.name!r}: detector {self.detector!r} declares no differentiable score; "
                             "valid choices: detectors that subclass advopenood.capabilities.DifferentiableDetector")
        det = det.for_attack() if is_randomised(det) else det  # never the noise the run evaluates with
        return calibrate(det, b["net"], b["fit_set"], b["seed"], b["batch_size"], b["device"])

    def targets(self) -> list[DetectorTarget]:
        """The fitted target once per gradient objective its detector offers (a detector's ``surrogates``, e.g.
        ``ross_<det>``'s score, median and log-gate; ``with_surrogate`` picks one): the attack runs each, and every
        image keeps its best candidate over all of them (the forward value, hence the choice, is the detector's
        confidence whatever the objective). One target for a detector that offers none."""
        target = self.target
        names = getattr(target.detector, "surrogates", ())
        return [dataclasses.replace(target, detector=target.detector.with_surrogate(s)) for s in names] or [target]

    def detector_score(self, x: Tensor) -> Tensor:
        """The attacked detector's confidence (no gradients), e.g. the binarization test's detector."""
        return self.target.score(x)

    def inverted(self) -> AdaptiveAttack:
        """The same attack with the detector term negated (seeks detected examples): the inverted binarization test."""
        twin = copy.copy(self)
        twin.sign = -self.sign
        return twin

    def _accepted(self, conf: Tensor) -> Tensor:
        return conf >= self.target.threshold

    def succeeded(self, model: nn.Module, x_adv: Tensor, y: Tensor, adv_pred: Tensor) -> Tensor:
        """ID->ID: misclassified; OOD->ID: accepted by the detector (confidence >= its 95 %-TPR threshold)."""
        if self.source == "id":
            return super().succeeded(model, x_adv, y, adv_pred)
        return self._accepted(self.target.score(x_adv).to(adv_pred.device))

    def planned_steps(self, images: int | None = None, classes: int | None = None) -> tuple[int, str] | None:
        """``steps`` PGD iterations per target (:meth:`targets`) and lambda."""
        return len(self.targets()) * len(self.lams) * self.p.steps, "iterations"

    def perturb(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        p = self.p
        if self.source == "id":
            labels, margin_sign = y, -1.0
        else:
            with torch.no_grad():
                labels, margin_sign = model(x).argmax(1), 1.0
        kappa = p.kappa
        best = Best(x)
        for target, lam in [(t, lam) for t in self.targets() for lam in self.lams]:
            def objective(x_adv: Tensor, lam: float = lam, target: DetectorTarget = target) -> tuple[Tensor, Tensor,
                                                                                                      Tensor]:
                shared = target.outputs(x_adv) if model is target.net else None
                logits = model(x_adv) if shared is None else shared.logits
                conf = target.standardized(x_adv, shared)
                loss = margin_loss(logits, labels, margin_sign, kappa) + lam * self.sign * conf
                with torch.no_grad():
                    raw = conf * target.std + target.mean
                    if self.source == "id":
                        success = logits.argmax(1) != labels
                    else:
                        success = self._accepted(raw) if self.sign > 0 else ~self._accepted(raw)
                return loss, success, self.sign * raw

            attack = counted(JointLinfPGD(objective, best, rel_stepsize=rel_stepsize(p), steps=p.steps,
                                          random_start=p.random_start))
            _, clipped, _ = attack(foolbox_model(model, x.device), x, labels, epsilons=p.eps)
            objective(clipped)
        return best.x


class EOTAttack:
    """Mixin of the EOT attacks (before a detector-adaptive attack class in the bases): the attacked randomised
    detector's gradient averages over ``eot`` of its attack-stream draws (None: the detector's own number of
    draws); everything else is the attack it is mixed into."""

    #: the attack this one differs from in its gradient only
    plain_attack: ClassVar[str] = ""
    param_types: ClassVar[dict[str, Any]] = {"eot": DrawCount | None}

    def __init__(self, **params: Any):
        super().__init__(**params)
        eot = self.params["eot"]  # the value as given: True or 2.0 is refused, not read as a number
        if eot is not None and (isinstance(eot, bool) or not isinstance(eot, int)):
            raise UsageError(f"eot {eot!r} for attack {self.name!r}; valid choices: an integer >= 1, or null for the "
                             "detector's number of draws")

    @classmethod
    def defaults(cls, input_size: int) -> dict[str, Any]:
        return {**super().defaults(input_size), "eot": None}

    @property
    def target(self) -> Any:
        """The plain attack's fitted, calibrated detector (the forward value is the same), with EOT gradients."""
        fresh = self._target is None
        target = super().target
        if fresh:  # a copy: the plain attack may share the fitted target (the robust attacks do)
            det = target.detector
            if not is_randomised(det):
                raise UsageError(f"attack {self.name!r} averages gradients over a randomised detector's draws; "
                                 f"{det.name!r} is not one; valid choices: detectors that subclass "
                                 "advopenood.capabilities.Randomised, e.g. smoothed_<det>")
            draws = det.draws if self.p.eot is None else self.p.eot
            target = self._target = dataclasses.replace(target, detector=det.with_eot(draws))
        return target


class SharedTarget:
    """Mixin (before :class:`AdaptiveAttack` in the bases): the calibrated detector is shared by every such attack on
    the run's fitted detector (:meth:`AdaptiveAttack.use_fitted`) with the same device, fit data, detector
    parameters and seed (its :attr:`context`), through the run's handle on it (``memo``), so a run's ID-side and
    OOD-side sets, or its sets at several eps, calibrate it once. An attack outside a run fits and calibrates its
    own."""

    @property
    def target(self) -> DetectorTarget:
        if self._target is None and self._bound is not None and self._fitted is not None:
            key = json.dumps([str(self._bound["device"]), self.context], sort_keys=True, default=str)
            cached = self._fitted.memo.get(key)
            if cached is not None and cached.net is self._bound["net"]:
                self._target = cached
            else:
                self._target = self._fitted.memo[key] = AdaptiveAttack.target.fget(self)
        return AdaptiveAttack.target.fget(self)


def is_eot(attack: Any) -> bool:
    """Whether an attack (class or instance) is an EOT attack (:class:`EOTAttack`)."""
    cls = attack if isinstance(attack, type) else type(attack)
    return issubclass(cls, EOTAttack)


def adaptive_attack(detector: str, direction: str = "id") -> type[AdaptiveAttack]:
    """The class of ``adaptive_<detector>`` (direction ``"id"``) or ``adaptive_ood_<detector>`` (``"ood"``) for a
    registered detector that declares a differentiable score (a third party's too): the families' factory."""
    if direction not in ("id", "ood"):
        raise UsageError(f"direction {direction!r} for an adaptive attack; valid choices: id, ood")
    name = f"adaptive_{detector}" if direction == "id" else f"adaptive_ood_{detector}"
    what = ("misclassify an ID image while " + detector.upper() + " keeps it in-distribution" if direction == "id"
            else "make a natural OOD image look in-distribution to " + detector.upper())
    return type(name, (AdaptiveAttack,), {
        "__doc__": f"Detector-adaptive Linf PGD against {detector.upper()}: {what} (lambda swept per sample).",
        "__module__": __name__, "detector": detector, "source": direction})


class AdaptiveFamily(AttackFamily):
    """``adaptive`` / ``adaptive_ood``: shorthand for ``adaptive[_ood]_<det>`` of every selected detector that has one
    (``--attack pgd,adaptive --detectors mds,knn`` runs ``pgd``, ``adaptive_mds`` and ``adaptive_knn``)."""

    bounded: ClassVar[bool] = True
    prefix: ClassVar[str] = "adaptive_"
    hint: ClassVar[str] = "one attack per selected detector with a differentiable score"
    remedy: ClassVar[str] = "select such detectors (--detectors mds,knn) or name the attacks (adaptive_mds)"

    @classmethod
    def members(cls, plan: Any) -> list[str]:
        return [cls.prefix + d for d in plan.detectors if registry.resolves("attacks", cls.prefix + d)]


registry.register("attacks", "adaptive")(type("adaptive", (AdaptiveFamily,), {
    "__doc__": "One adaptive_<det> (ID->ID evasion) per selected detector: --attack pgd,adaptive --detectors mds,knn.",
    "__module__": __name__}))
registry.register("attacks", "adaptive_ood")(type("adaptive_ood", (AdaptiveFamily,), {
    "__doc__": "One adaptive_ood_<det> (OOD->ID) per selected detector: --attack adaptive_ood --detectors mds,knn.",
    "__module__": __name__, "prefix": "adaptive_ood_"}))


#: what the families of attacks on a detector's score take: ``adaptive_<det>`` and ``adaptive_ood_<det>`` exist for
#: every detector that declares a differentiable score (:class:`~advopenood.capabilities.DifferentiableDetector`),
#: built-in or not, registered since or not
DIFFERENTIABLE = "a detector with a differentiable score"
registry.family("attacks", "adaptive_", adaptive_attack, accepts=is_differentiable, hint=DIFFERENTIABLE,
                shorthand="adaptive", description="Detector-adaptive Linf PGD against a detector: misclassify an ID "
                "image while the detector keeps it in-distribution (lambda swept per sample).")
registry.family("attacks", "adaptive_ood_", functools.partial(adaptive_attack, direction="ood"),
                accepts=is_differentiable, hint=DIFFERENTIABLE, source=__name__, shorthand="adaptive_ood",
                description="Detector-adaptive Linf PGD against a detector: make a natural OOD image look "
                            "in-distribution to it (lambda swept per sample).")
