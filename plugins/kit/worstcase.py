"""The worst case over attacks that the ``mead`` and ``multiattack`` evaluators share (MEAD, Zhang et al. 2024:
a detector's score per clean sample is its worst over the successful attacks of a group): the sets' groups (norm,
eps) and objectives from the attack classes, the per-sample worst case and its metrics with their interval."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from advopenood.plugin import AdvSet, IntervalPolicy, NaNScoreError, ood_metrics, registry

#: a run's interval policy (``ctx.intervals``: the plan's ``ci`` and the run seed); the default draws none
CIPlan = IntervalPolicy
NO_CI: CIPlan = IntervalPolicy()


#: MEAD's Lp groups (Sec. 5.1.2), in report order; other groups (``patch``) follow.
NORM_ORDER = ("l1", "l2", "linf")
#: The group of patch attacks (perturbation unbounded inside a patch, zero outside).
PATCH = "patch"


def threat_group(cls: type) -> str:
    """The MEAD group of a registered attack class: its declared ``threat`` attribute if it has one, else
    ``"patch"`` when its parameters (``defaults``) include ``patch`` (masked PGD), else its ``norm``
    (default ``linf``)."""
    threat = getattr(cls, "threat", None)
    if threat is not None:
        return str(threat)
    if "patch" in cls.defaults(32):
        return PATCH
    return str(getattr(cls, "norm", "linf"))


def attack_kind(cls: type) -> tuple[str, str | None]:
    """``(group, objective)`` of a registered attack class.

    ``group`` is :func:`threat_group` (the norm of an Lp attack, ``patch`` for patch attacks); ``objective``
    is the class's own, else ``ce`` for eps-bounded attacks (the built-in foolbox FGSM, PGD and masked PGD all
    maximise cross-entropy) and ``None`` for unbounded (minimal-perturbation) attacks such as DeepFool.
    """
    norm = threat_group(cls)
    objective = getattr(cls, "objective", None)
    if objective is None and getattr(cls, "bounded", True):
        objective = "ce"
    return norm, objective


@dataclass(frozen=True)
class SetInfo:
    """What MEAD needs of one adversarial set: its name, group (``norm``: l1, l2, linf or patch), eps (None if
    unbounded), objective and ``positive``, per row (row ``i`` = clean sample ``i``) whether it may be a
    positive: for MEAD the attack's success on the image the detectors score, for ``multiattack`` the
    protocol's OOD positives."""

    name: str
    norm: str
    eps: float | None
    objective: str | None
    positive: np.ndarray


def set_info(name: str, adv: AdvSet, positive: np.ndarray | None = None) -> SetInfo:
    """:class:`SetInfo` of a run's adversarial set, its group and objective from the attack's registry class
    (an attack whose norm is a parameter, e.g. AutoAttack's ``norm``, is grouped by the set's own norm).
    ``positive`` defaults to the success of the images the detectors see (``AdvSet.seen_success``, what
    :meth:`RunContext.success` returns); ``multiattack`` passes :meth:`RunContext.ood_positives`."""
    cls = registry.get("attacks", adv.attack)
    norm, objective = attack_kind(cls)
    if "norm" in cls.defaults(32):
        norm = str(adv.params.get("norm") or norm)
    eps = float(adv.eps) if getattr(cls, "bounded", True) and adv.eps is not None else None
    mask = adv.seen_success if positive is None else positive
    return SetInfo(name, norm, eps, objective, np.asarray(mask, dtype=bool))


def worst_case_scores(conf: np.ndarray, success: np.ndarray, choice: np.ndarray | None = None
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample worst case over successful attacks.

    ``conf`` and ``success`` are ``n_samples x n_attacks`` (confidence, higher = more ID, and success mask).
    Returns ``(worst, positive)``: ``worst[i]`` is the confidence of the successful attack on sample ``i`` whose
    ``choice`` confidence is the largest (the first on a tie; NaN where none succeeded) and ``positive[i]`` whether
    any succeeded. ``choice`` defaults to ``conf`` (then ``worst`` is the largest confidence, the least OOD-looking
    score); for a randomised detector it is the attack stream's confidences
    (:meth:`~advopenood.evaluation.context.RunContext.choice_scores`), so that no evaluation draw chooses the attack
    whose evaluation draw is scored. A NaN confidence or choice of a successful attack makes the worst case NaN.
    """
    conf = np.asarray(conf, dtype=np.float64)
    success = np.asarray(success, dtype=bool)
    choice = conf if choice is None else np.asarray(choice, dtype=np.float64)
    if conf.ndim == 1:
        conf, success, choice = conf[:, None], success[:, None], choice[:, None]
    if conf.shape != success.shape or choice.shape != conf.shape:
        raise ValueError(f"conf {conf.shape}, success {success.shape} and choice {choice.shape} must have the same "
                         "shape")
    positive = success.any(axis=1)
    masked = np.where(success, choice, -np.inf)
    at = np.nan_to_num(masked, nan=np.inf).argmax(axis=1) if masked.shape[1] else np.zeros(len(conf), dtype=int)
    worst = conf[np.arange(len(conf)), at] if conf.shape[1] else np.full(len(conf), np.nan)
    broken = (success & (np.isnan(conf) | np.isnan(choice))).any(axis=1)
    worst = np.where(broken, np.nan, worst)
    worst[~positive] = np.nan
    return worst, positive


def worst_case_metrics(conf_id: np.ndarray, conf: np.ndarray, success: np.ndarray, ci: CIPlan = NO_CI,
                       key: str = "", choice: np.ndarray | None = None) -> dict[str, Any]:
    """MEAD's AUROC and FPR95 (percent) of clean ``conf_id`` against the per-sample worst cases, with
    ``n_pos``, ``n_neg`` and ``mean_successes`` (successful attacks per clean sample). Metrics are NaN
    without positives or with NaN scores; ``choice``: as :func:`worst_case_scores`. Their 95 % intervals by the
    interval policy ``ci``: the worst-case scores are a score vector like any set's, resampled stratified against the
    clean ones (cell ``key``); ``error`` says why they are empty."""
    worst, positive = worst_case_scores(conf, success, choice)
    success = np.asarray(success, dtype=bool).reshape(len(worst), -1)
    row: dict[str, Any] = {"auroc": float("nan"), "fpr95": float("nan"), "n_pos": int(positive.sum()),
                           "n_neg": int(len(conf_id)),
                           "mean_successes": float(success.sum(1).mean()) if len(success) else float("nan")}
    bounds, _, reason, label = ci.labelled_cell(key, conf_id, worst[positive])
    row.update({k: v for k, v in bounds.items() if k.startswith(("auroc", "fpr95"))}, ci=label, error=reason)
    if positive.any() and len(conf_id):
        try:
            m = ood_metrics(conf_id, worst[positive])
        except NaNScoreError:
            return row
        row.update(auroc=m["auroc"], fpr95=m["fpr95"])
    return row


def backend_for(backend: str | Mapping[str, str], detector: str) -> str:
    """The ``backend`` column of a detector's rows: one name for all, or a name per detector
    (:meth:`RunContext.backend_of`)."""
    return backend if isinstance(backend, str) else str(backend.get(detector, ""))


def _eps_key(eps: float | None) -> float | None:
    return None if eps is None else round(float(eps), 10)


def group_sets(sets: Iterable[SetInfo]) -> dict[tuple[str, float | None], list[SetInfo]]:
    """MEAD's attack groups: sets by (norm, eps), in norm order then eps (unbounded last)."""
    groups: dict[tuple[str, float | None], list[SetInfo]] = {}
    for s in sets:
        groups.setdefault((s.norm, _eps_key(s.eps)), []).append(s)

    def order(key: tuple[str, float | None]) -> tuple:
        norm, eps = key
        return (NORM_ORDER.index(norm) if norm in NORM_ORDER else len(NORM_ORDER), norm, eps is None, eps or 0.0)

    return {k: groups[k] for k in sorted(groups, key=order)}


def stacked(by_set: Mapping[str, np.ndarray], members: Iterable[SetInfo]) -> np.ndarray:
    """The members' confidences side by side, ``n_samples x len(members)`` (float64)."""
    return np.stack([np.asarray(by_set[m.name], dtype=np.float64) for m in members], axis=1)


def detector_groups(scores: Mapping[str, Mapping[str, np.ndarray]], sets: Iterable[SetInfo]
                    ) -> Iterator[tuple[str, Mapping[str, np.ndarray], np.ndarray, str, float | None, list[SetInfo]]]:
    """``(detector, its scores by set, clean confidences, norm, eps, group members)`` for every detector that
    has clean (``"id"``) scores and every (norm, eps) group of :func:`group_sets`."""
    groups = group_sets(sets)
    for detector, by_set in scores.items():
        if "id" not in by_set:
            continue
        conf_id = np.asarray(by_set["id"], dtype=np.float64)
        for (norm, eps), members in groups.items():
            yield detector, by_set, conf_id, norm, eps, members
