"""Multi-attack metrics for OOD detectors (evaluator ``multiattack``), after MultiRobustBench.

Dai, Mahloujifar, Xiang, Sehwag, Chen, Mittal, "MultiRobustBench: Benchmarking Robustness Against Multiple
Attacks" (ICML 2023), Sec. 3.2, adapted from robust accuracy to detection. Every adversarial set ``P`` of
the run (one per attack and eps; an eps sweep is an attack entry with an eps list) is scored as in
``mead``: clean ID samples are the negatives, the set's OOD positives *under the run's protocol*
(:meth:`RunContext.ood_positives`: the examples that are adversarial as the detectors see them under ``strong``,
every attacked image under ``lorenz2024``; column ``positives``) the positives, OpenOOD's AUROC and FPR95 in
percent. Per detector ``h``:

* ``avg``: mean over the sets; ``worst``: the worst set (lowest AUROC, highest FPR95), named in ``worst_set``;
* ``union``: the per-sample worst case over every set (MultiRobustBench's "union" accuracy, App. B: "an image
  incorrectly classified if any of the attacks in the attack set succeed"; the MEAD worst case over all attack
  types and strengths, :func:`advopenood_plugins.kit.worstcase.worst_case_scores`).

Competitiveness ratio. The paper (Definition 3.5): "For a single P in K, let acc*(P) := 1 - min_{h in H}
err(h; P) and acc(h, P) := 1 - err(h; P). Then, CR_ind-avg(h; K) := 100 x E_{P ~ P(K)} [acc(h, P) / acc*(P)]
(Eq. 2), CR_ind-worst(h; K) := 100 x min_{P in K} acc(h, P) / acc*(P) (Eq. 3)", with the uniform distribution
over K (App. C.2). The detection analogue of ``acc(h, P)`` is the score itself, higher is better and 0 the
worst: ``a(h, P) = AUROC / 100`` or ``a(h, P) = (100 - FPR95) / 100`` (the TNR at 95 % TPR). Then

* ``CR_ind-avg(h)   = 100 * mean_P  a(h, P) / a*(P)``,
* ``CR_ind-worst(h) = 100 * min_P   a(h, P) / a*(P)``,

both in [0, 100] with ``a*(P) = max_h a(h, P)`` (``reference: best``, the default). A set where ``a*(P) = 0``
(every detector at AUROC 0, or at FPR95 100 %) has no defined ratio and is left out; ``n_sets_cr`` counts the
sets used. Deviations from the paper (each named in the ``deviations`` column of ``multiattack.csv``):

* ``a*(P)`` is the best *evaluated* detector, not "the best model in the hypothesis set" (Sec. 3.2), which the
  paper approximates by "ResNet-18 models that are trained using adversarial training directly on to attack of
  interest P" (Sec. 4.1): a post-hoc detector has no such training, so the run's detectors are the
  hypothesis class. A named detector as ``reference`` replaces ``a*(P)`` by that detector's score (ratios may
  exceed 100).
* ``K`` has no "attack representing no attacker (eps = 0)" (App. C.2): the eps-0 set's images are the clean ID
  images, the negatives themselves (as positives: all of them under ``lorenz2024``, the misclassified ones
  under ``strong``), so ``a(h, P_0)`` compares a set with itself or with part of itself.

Chance-corrected variant (``cr_cc_ind_avg`` / ``cr_cc_ind_worst``, advopenood's extension, not in
MultiRobustBench): the same ratios on ``g(h, P) = max(0, (AUROC - 50) / 50)`` or ``max(0, (95 - FPR95) / 95)``
(0 at chance or below, 1 for a perfect detector; a random detector has FPR95 = 95 %), over the sets where some
detector beats chance (``g*(P) > 0``, counted in ``n_sets_cr_cc``). Clipping the numerator at chance keeps the
ratio in [0, 1]: without it a detector below chance on a set where the best barely beats chance divides a
negative number by one close to 0 (issue 13: about -9000 on the data pack). Near-chance sets still make the
ratio noisy: read it together with ``n_sets_cr_cc``.

Stability constant (``stability``). The paper (Definition 3.7, Eq. 4): "L_alpha(h) = max over P1 in K_learner,
P2 in K, |s(P1) - s(P2)| <= alpha, P1 != P2 of |acc(h, P1) - acc(h, P2)| / |s(P1) - s(P2)|", with the attack
strength "the error of a ResNet-18 model trained directly on the attack" (Sec. 4.1, Definition 3.6's
``s(P) = min_h err(h; P)``) and "alpha = 3 %" (Sec. 4.1, App. C.2). Here, on the same ``a`` as the CR:
``s(P) = 1 - a*(P)`` with ``a*`` the best evaluated detector (whatever ``reference`` says), ``alpha`` 0.03 by
default (column ``alpha``), pairs at most ``alpha + 1e-12`` apart in ``s``. Deviations (also in ``deviations``):
``K_learner = K``, every set counts as known, where the paper takes the sets from eps 0 up to the defense's
training eps: a post-hoc detector is fitted on clean data only, and its only "known" set, eps 0, does not exist
here (above); pairs of equal strength (possible: ties of ``a*``) are left out, their ratio being undefined.

``stability_eps`` (advopenood's extension): the same ratio along one attack's eps sweep, with strength
``s(P) = eps / eps_max`` of that attack (Definition 3.6's first example, normalised) over neighbouring eps
values; 1 is a linear fall from AUROC 100 to AUROC 0 over the whole sweep (0.5 from perfect to chance).

Outputs: ``multiattack.csv`` (one row per detector and metric), ``multiattack_curves.csv`` (per detector and
set, plus the per-sample union of the attacks sharing a group and eps), both with the run's ``protocol`` and
``positives``, and ``plots/eps_sweep_<detector>_<norm>.png`` (AUROC-vs-eps and FPR95-vs-eps). ``verify``
(:func:`advopenood_plugins.evaluators.multiattack.verify.verify_multiattack`) re-derives both tables from a run's saved
scores, masks and ``run.json``.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd

from advopenood.plugin import Results, RunContext, UsageError, Verifiable, cell_key, ood_metrics, registry
from advopenood_plugins.kit.worstcase import (NO_CI, CIPlan, SetInfo, backend_for, detector_groups, set_info,
                                              stacked, worst_case_metrics)
from advopenood_plugins.evaluators.multiattack.report import plot_sweeps
from advopenood_plugins.evaluators.multiattack.verify import verify_multiattack

METRICS = ("auroc", "fpr95")
#: ``worst`` and ``union`` with their 95 % intervals (``ci`` names the method); ``avg``, the ratios and the
#: stability constants are functions of several cells on the same images, with no interval
MULTI_COLUMNS = ["detector", "backend", "metric", "avg", "worst", "worst_lo", "worst_hi", "worst_set", "union",
                 "union_lo", "union_hi", "cr_ind_avg", "cr_ind_worst", "n_sets_cr", "cr_cc_ind_avg", "cr_cc_ind_worst",
                 "n_sets_cr_cc", "stability", "alpha", "stability_eps", "reference", "n_sets", "positives", "protocol",
                 "ci", "deviations"]
CURVE_COLUMNS = ["detector", "backend", "attack", "norm", "eps", "set", "auroc", "auroc_lo", "auroc_hi", "fpr95",
                 "fpr95_lo", "fpr95_hi", "ci", "n_pos", "n_neg", "positives", "protocol", "error"]
#: a curve row's metrics and interval columns, as :func:`~advopenood_plugins.kit.worstcase.worst_case_metrics`
#: names them
CURVE_CELLS = ("auroc", "auroc_lo", "auroc_hi", "fpr95", "fpr95_lo", "fpr95_hi", "ci", "n_pos", "n_neg", "error")
UNION = "union"
#: MultiRobustBench's alpha for the stability constant, "alpha = 3 %" (Sec. 4.1, App. C.2).
ALPHA = 0.03
#: Slack on ``|s(P1) - s(P2)| <= alpha`` for floating-point differences of the strengths.
ALPHA_SLACK = 1e-12
#: The deviations from MultiRobustBench (module docstring), as written in the ``deviations`` column.
DEVIATIONS = {
    "auroc": "a(h, P) = AUROC / 100 in place of robust accuracy",
    "fpr95": "a(h, P) = (100 - FPR95) / 100 (TNR at 95 % TPR) in place of robust accuracy",
    "best": "a*(P) = best evaluated detector on P (paper: best model of the hypothesis class, approximated by "
            "ResNet-18s adversarially trained on P, Sec. 4.1)",
    "named": "a*(P) = detector {reference}'s score (not Definition 3.5; ratios may exceed 100)",
    "clean": "K has no eps-0 (no attack) set (paper: App. C.2): its images are the clean ID negatives",
    "sc": "SC: s(P) = 1 - a*(P) of the evaluated detectors (paper: error of a ResNet-18 adversarially trained on "
          "P, Sec. 4.1), K_learner = K (post-hoc detectors are fitted on clean data, paper: eps 0 up to the "
          "training eps), pairs of equal s left out",
}


def deviations(metric: str, reference: str) -> str:
    """The ``deviations`` cell of a ``multiattack.csv`` row: :data:`DEVIATIONS` that apply, "; "-separated."""
    ref = DEVIATIONS["best"] if reference == "best" else DEVIATIONS["named"].format(reference=reference)
    return "; ".join([DEVIATIONS[metric], ref, DEVIATIONS["clean"], DEVIATIONS["sc"]])


def attack_label(set_name: str) -> str:
    """The attack entry a set belongs to: ``"pgd@0.0314"`` -> ``"pgd"`` (the pipeline's ``<label>@<eps>``)."""
    return set_name.rsplit("@", 1)[0]


def detection_accuracy(value: np.ndarray | float, metric: str) -> np.ndarray | float:
    """MultiRobustBench's ``acc(h, P)`` for a detector: ``AUROC / 100`` or ``(100 - FPR95) / 100`` (TNR at 95 %
    TPR), from percent to [0, 1], higher is better, 0 the worst."""
    if metric == "auroc":
        return np.asarray(value, dtype=np.float64) / 100.0
    if metric == "fpr95":
        return (100.0 - np.asarray(value, dtype=np.float64)) / 100.0
    raise UsageError(f"unknown metric {metric!r}; valid choices: {', '.join(METRICS)}")


def chance_corrected(value: np.ndarray | float, metric: str) -> np.ndarray | float:
    """Map AUROC (chance 50) or FPR95 (chance 95) in percent to 0 at chance and 1 for a perfect detector
    (negative below chance)."""
    if metric == "auroc":
        return (np.asarray(value, dtype=np.float64) - 50.0) / 50.0
    if metric == "fpr95":
        return (95.0 - np.asarray(value, dtype=np.float64)) / 95.0
    raise UsageError(f"unknown metric {metric!r}; valid choices: {', '.join(METRICS)}")


def competitiveness(perf: pd.DataFrame, reference: str = "best") -> pd.DataFrame:
    """MultiRobustBench's ``cr_ind_avg`` and ``cr_ind_worst`` per detector (Definitions 3.4-3.5, Eqs. 2-3):
    ``100 * mean_P perf(h, P) / perf*(P)`` and ``100 * min_P perf(h, P) / perf*(P)``.

    ``perf`` has one row per detector and one column per set, with non-negative scores (higher is better).
    ``perf*(P)`` is the column maximum (``"best"``: the ratios lie in [0, 100]) or the named detector's row.
    Sets with ``perf*(P) <= 0`` or NaN have no defined ratio and are left out, as are NaN entries of a
    detector; ``n_sets`` counts the sets with a ratio. A detector with no such set gets NaN.
    """
    if (perf < 0).any().any():
        raise ValueError("competitiveness needs non-negative scores; clip chance-corrected ones at 0 first")
    if reference == "best":
        ref = perf.max(axis=0, skipna=True)
    elif reference in perf.index:
        ref = perf.loc[reference]
    else:
        raise UsageError(f"reference detector {reference!r} was not scored; valid choices: best, "
                         f"{', '.join(map(str, perf.index))}")
    usable = ref.index[(ref > 0).to_numpy()]
    ratios = perf[usable].div(ref[usable], axis=1)
    return pd.DataFrame({"cr_ind_avg": 100.0 * ratios.mean(axis=1, skipna=True),
                         "cr_ind_worst": 100.0 * ratios.min(axis=1, skipna=True),
                         "n_sets": ratios.notna().sum(axis=1).astype(int)}, index=perf.index)


def competitiveness_table(raw: pd.DataFrame, metric: str, reference: str = "best") -> pd.DataFrame:
    """MultiRobustBench's CRs on ``a(h, P)`` (:func:`detection_accuracy`) and the chance-corrected extension on
    ``max(0, g(h, P))`` (:func:`chance_corrected`), from ``raw`` AUROC or FPR95 in percent (one row per detector,
    one column per set): ``cr_ind_avg``, ``cr_ind_worst``, ``n_sets_cr``, ``cr_cc_ind_avg``, ``cr_cc_ind_worst``,
    ``n_sets_cr_cc`` (module docstring)."""
    perf = pd.DataFrame(detection_accuracy(raw.to_numpy(), metric), index=raw.index, columns=raw.columns)
    cc = pd.DataFrame(np.maximum(chance_corrected(raw.to_numpy(), metric), 0.0), index=raw.index, columns=raw.columns)
    cr, cr_cc = competitiveness(perf, reference), competitiveness(cc, reference)
    return pd.DataFrame({"cr_ind_avg": cr["cr_ind_avg"], "cr_ind_worst": cr["cr_ind_worst"], "n_sets_cr": cr["n_sets"],
                         "cr_cc_ind_avg": cr_cc["cr_ind_avg"], "cr_cc_ind_worst": cr_cc["cr_ind_worst"],
                         "n_sets_cr_cc": cr_cc["n_sets"]}, index=raw.index)


def stability_constant(perf: Mapping[str, float], strength: Mapping[str, float], alpha: float = ALPHA) -> float:
    """MultiRobustBench's stability constant of one detector (Definition 3.7, Eq. 4):
    ``L_alpha = max |a(P1) - a(P2)| / |s(P1) - s(P2)|`` over pairs of sets ``P1 != P2`` with
    ``0 < |s(P1) - s(P2)| <= alpha`` (:data:`ALPHA_SLACK` added), every set in ``K_learner`` and ``K``.

    ``perf`` maps set names to ``a(h, P)`` (:func:`detection_accuracy`), ``strength`` to ``s(P)`` (the run uses
    ``1 - a*(P)``, module docstring). NaN when no pair qualifies (or every one has a NaN performance).
    """
    names = [n for n in perf if n in strength and np.isfinite(perf[n]) and np.isfinite(strength[n])]
    a = np.array([perf[n] for n in names], dtype=np.float64)
    s = np.array([strength[n] for n in names], dtype=np.float64)
    ds = np.abs(s[:, None] - s[None, :])
    pairs = (ds > 0) & (ds <= alpha + ALPHA_SLACK)
    if not pairs.any():
        return float("nan")
    return float((np.abs(a[:, None] - a[None, :])[pairs] / ds[pairs]).max())


def sweep_stability(perf: Mapping[str, float], labels: Mapping[str, str], eps: Mapping[str, float | None]) -> float:
    """advopenood's ``stability_eps`` of one detector: Eq. 4's ratio ``|a(P1) - a(P2)| / |s(P1) - s(P2)|``
    maximised over neighbouring eps values of one attack's sweep, ``s = eps / eps_max`` of that attack.

    ``perf``, ``labels`` and ``eps`` map set names to performance (:func:`detection_accuracy`), attack label
    and eps (None: unbounded, left out). NaN when no attack has two eps values or every pair has a NaN performance.
    """
    by_label: dict[str, list[tuple[float, float]]] = {}
    for name, value in perf.items():
        if eps.get(name) is not None:
            by_label.setdefault(labels[name], []).append((float(eps[name]), float(value)))
    slopes: list[float] = []
    for points in by_label.values():
        points.sort()
        top = points[-1][0]
        if len(points) < 2 or top <= 0:
            continue
        for (e1, g1), (e2, g2) in zip(points, points[1:]):
            ds = (e2 - e1) / top
            if ds > 0 and np.isfinite(g1) and np.isfinite(g2):
                slopes.append(abs(g2 - g1) / ds)
    return float(max(slopes)) if slopes else float("nan")


def union_key(detector: str, norm: str, eps: float | None) -> str:
    """The cell key of a union's resamples: ``union|<det>|<norm>|<eps>`` (eps to 6 significant digits, ``none``
    unbounded), ``union|<det>|all`` for the union over every set (``norm`` ``all``)."""
    return cell_key("union", detector, "all") if norm == "all" else \
        cell_key("union", detector, norm, "none" if eps is None else f"{eps:.6g}")


def sweep_curves(scores: Mapping[str, Mapping[str, np.ndarray]], sets: list[SetInfo],
                 backend: str | Mapping[str, str] = "", protocol: str = "strong",
                 positives: str = "successful", ci: CIPlan = NO_CI,
                 choice: Mapping[str, Mapping[str, np.ndarray]] | None = None) -> pd.DataFrame:
    """Per detector and set: AUROC and FPR95 of clean vs the set's positive rows (``SetInfo.positive``); plus, per
    norm and eps shared by several attacks, the per-sample union (``attack = "union"``), each sample's attack chosen
    on ``choice[detector]`` (a randomised detector's attack-stream confidences; default the scores). The
    ``multiattack_curves.csv``; ``positives`` names the protocol's rule for its column. Intervals by ``ci``: a set's
    is its ``ood.csv`` cell's (key ``ood|<det>|<set>``), a union's that of its worst-case scores
    (:func:`union_key`)."""
    rows: list[dict[str, Any]] = []
    for detector, by_set, conf_id, norm, eps, members in detector_groups(scores, sets):
        members = [m for m in members if m.name in by_set]
        for m in members:
            row = worst_case_metrics(conf_id, by_set[m.name], m.positive, ci, cell_key("ood", detector, m.name))
            rows.append({"detector": detector, "backend": backend_for(backend, detector),
                         "attack": attack_label(m.name), "norm": norm,
                         "eps": eps, "set": m.name, **{k: row[k] for k in CURVE_CELLS},
                         "positives": positives, "protocol": protocol})
        if len({attack_label(m.name) for m in members}) > 1:
            row = worst_case_metrics(conf_id, stacked(by_set, members), np.stack([m.positive for m in members], axis=1),
                                     ci, union_key(detector, norm, eps),
                                     stacked((choice or {}).get(detector, by_set), members))
            rows.append({"detector": detector, "backend": backend_for(backend, detector), "attack": UNION, "norm": norm,
                         "eps": eps,
                         "set": "+".join(m.name for m in members),
                         **{k: row[k] for k in CURVE_CELLS}, "positives": positives,
                         "protocol": protocol})
    return pd.DataFrame(rows, columns=CURVE_COLUMNS)


def multiattack_table(scores: Mapping[str, Mapping[str, np.ndarray]], sets: list[SetInfo],
                      backend: str | Mapping[str, str] = "", reference: str = "best", alpha: float = ALPHA,
                      curves: pd.DataFrame | None = None,
                      protocol: str = "strong", positives: str = "successful", ci: CIPlan = NO_CI,
                      choice: Mapping[str, Mapping[str, np.ndarray]] | None = None) -> pd.DataFrame:
    """The ``multiattack.csv`` table: per detector and metric the average, worst and union over the sets, the
    competitiveness ratios against ``reference`` (MultiRobustBench's and the chance-corrected extension), the
    stability constant (Eq. 4 with ``alpha``) and ``stability_eps``, with the ``deviations`` from the paper
    (module docstring). ``worst`` has the interval of the worst set's curve row, ``union`` that of the union's
    worst-case scores (:func:`union_key`, by ``ci``)."""
    curves = sweep_curves(scores, sets, backend, protocol, positives, ci, choice) if curves is None else curves
    per_set = curves[curves["attack"] != UNION]
    if per_set.empty:
        return pd.DataFrame(columns=MULTI_COLUMNS)
    labels = {s.name: attack_label(s.name) for s in sets}
    eps = {s.name: s.eps for s in sets}
    detectors = list(dict.fromkeys(per_set["detector"]))
    columns = [s.name for s in sets if s.name in set(per_set["set"])]
    union = {}
    for detector in detectors:
        members = [s for s in sets if s.name in scores[detector]]
        union[detector] = worst_case_metrics(np.asarray(scores[detector]["id"], dtype=np.float64),
                                             stacked(scores[detector], members),
                                             np.stack([m.positive for m in members], axis=1), ci,
                                             union_key(detector, "all", None),
                                             stacked((choice or {}).get(detector, scores[detector]), members))
    rows: list[dict[str, Any]] = []
    for metric in METRICS:
        raw = per_set.pivot(index="detector", columns="set", values=metric).reindex(index=detectors, columns=columns)
        bounds = per_set.set_index(["detector", "set"])[[f"{metric}_lo", f"{metric}_hi"]]
        perf = pd.DataFrame(detection_accuracy(raw.to_numpy(), metric), index=raw.index, columns=raw.columns)
        strength = (1.0 - perf.max(axis=0, skipna=True)).to_dict()
        cr = competitiveness_table(raw, metric, reference)
        for detector in detectors:
            values = raw.loc[detector].dropna()
            by = chosen_on(choice, detector, sets, values, metric)
            worst_set = str(by.idxmin() if metric == "auroc" else by.idxmax()) if len(values) else ""
            rows.append({"detector": detector, "backend": backend_for(backend, detector), "metric": metric,
                         "avg": float(values.mean()) if len(values) else float("nan"),
                         "worst": float(values[worst_set]) if len(values) else float("nan"), "worst_set": worst_set,
                         "worst_lo": float(bounds.loc[(detector, worst_set)].iloc[0]) if len(values) else float("nan"),
                         "worst_hi": float(bounds.loc[(detector, worst_set)].iloc[1]) if len(values) else float("nan"),
                         "union": union[detector][metric], "union_lo": union[detector][f"{metric}_lo"],
                         "union_hi": union[detector][f"{metric}_hi"], "ci": union[detector]["ci"],
                         **{k: float(cr.loc[detector, k]) for k in ("cr_ind_avg", "cr_ind_worst", "cr_cc_ind_avg",
                                                                     "cr_cc_ind_worst")},
                         **{k: int(cr.loc[detector, k]) for k in ("n_sets_cr", "n_sets_cr_cc")},
                         "stability": stability_constant(perf.loc[detector].to_dict(), strength, alpha),
                         "alpha": alpha,
                         "stability_eps": sweep_stability(perf.loc[detector].to_dict(), labels, eps),
                         "reference": reference, "n_sets": int(len(values)), "positives": positives,
                         "protocol": protocol, "deviations": deviations(metric, reference)})
    return pd.DataFrame(rows, columns=MULTI_COLUMNS)


def chosen_on(choice: Mapping[str, Mapping[str, np.ndarray]] | None, detector: str, sets: list[SetInfo],
              values: pd.Series, metric: str) -> pd.Series:
    """What the ``worst`` set is chosen on, per set of ``values``: for a randomised detector (in ``choice``) the metric
    of its attack-stream confidences (clean against the set's positives), so that no evaluation draw chooses the set
    it reports; else ``values`` themselves."""
    if not choice or detector not in choice:
        return values
    mine, positive = choice[detector], {s.name: s.positive for s in sets}
    return pd.Series({name: ood_metrics(np.asarray(mine["id"], dtype=np.float64),
                                        np.asarray(mine[name], dtype=np.float64)[positive[name]])[metric]
                      for name in values.index}, dtype=float)


@registry.register("evaluators", "multiattack")
class MultiAttackEvaluator(Verifiable):
    """Multi-attack metrics (MultiRobustBench): avg/worst/union, CR_ind-avg/-worst (and the chance-corrected
    extension), the stability constant (and its eps-sweep variant); eps-sweep plots."""

    verify = staticmethod(verify_multiattack)
    #: it writes no report section (its figures are the report's plots): verify holds any saved under its name
    report_sections = staticmethod(lambda run: [])

    def __init__(self, reference: str = "best", alpha: float = ALPHA, detectors: Iterable[str] | None = None,
                 plots: bool = True):
        """``reference``: ``best`` or a detector name; ``alpha``: Eq. 4's window on the strength ``s = 1 - a*``
        (default 0.03, the paper's 3 %); ``detectors``: subset of the run's detectors; ``plots``: write the
        figures."""
        if alpha is None or not float(alpha) > 0:
            raise UsageError(f"alpha {alpha!r} must be positive; valid choices: a number > 0 (the paper's 0.03)")
        self.reference = str(reference).lower()
        self.alpha = float(alpha)
        self.detectors = [d.lower() for d in detectors] if detectors is not None else None
        self.plots = bool(plots)

    def __call__(self, ctx: RunContext) -> Results:
        sets = [set_info(name, adv, ctx.ood_positives(name)) for name, adv in ctx.id_adv_sets.items()]
        scores = {d: s for d, s in ctx.scores.items() if self.detectors is None or d in self.detectors}
        backends = {d: ctx.backend_of(d) for d in scores}
        ci, choice = ctx.intervals, {d: ctx.choice_scores(d) for d in ctx.selection if d in scores}
        curves = sweep_curves(scores, sets, backends, ctx.protocol, ctx.positives_rule, ci, choice)
        table = multiattack_table(scores, sets, backends, self.reference, self.alpha, curves, ctx.protocol,
                                  ctx.positives_rule, ci, choice)
        figures = ([ctx.plot_dir / name for name in plot_sweeps(curves, ctx.plot_dir, UNION, METRICS)]
                   if self.plots else [])
        return Results(tables={"multiattack.csv": table, "multiattack_curves.csv": curves}, figures=figures)
