"""Multi-attack metrics for OOD detectors (evaluator ``multiattack``), after MultiRobustBench.

Dai, Mahloujifar, Xiang, Sehwag, Chen, Mittal, "MultiRobustBench: Benchmarking Robustness Against Multiple
Attacks" (ICML 2023), Sec. 3.2, adapted from robust accuracy to detection. Every adversarial set ``P`` of
the run (one per attack and eps; an eps sweep is an attack entry with an eps list) is scored as in
``mead``: clean ID samples are the negatives, the *successful* adversarial examples the positives, OpenOOD's
AUROC and FPR95 in percent. Per detector ``h``:

* ``avg``: mean over the sets; ``worst``: the worst set (lowest AUROC, highest FPR95), named in ``worst_set``;
* ``union``: the per-sample worst case over every set (MultiRobustBench's "union" accuracy; the MEAD worst case
  over all attack types and strengths; see :func:`advopenood_plugins.mead.worst_case_scores`).

Competitiveness ratio (their Definition 3.4, "CR(h; K) = 100 x acc_multi(h, K) / acc*_multi(K)", with
``acc*_multi(K) = 1 - min_{h*} err_multi(h*; K)`` the best any evaluated model reaches; with the per-attack error
vector, Definition 3.5, Eqs. 2-3). The detection analogue of the robust accuracy ``acc(h, P)`` is the score
itself, higher is better and 0 the worst: ``a(h, P) = AUROC / 100`` and ``a(h, P) = (100 - FPR95) / 100``
(the TNR at 95 % TPR). With ``a*(P) = max_h a(h, P)``, the best evaluated detector on ``P``
(``reference: best``, the default):

* ``CR_ind-avg(h)   = 100 * mean_P  a(h, P) / a*(P)``  (uniform distribution over the sets),
* ``CR_ind-worst(h) = 100 * min_P   a(h, P) / a*(P)``,

so both lie in [0, 100] (the ratio in [0, 1], times 100 as in the paper). A set where ``a*(P) = 0`` (every
detector at AUROC 0, or at FPR95 100 %) has no defined ratio and is left out; ``n_sets_cr`` counts the sets used.

Chance-corrected variant (``cr_cc_ind_avg`` / ``cr_cc_ind_worst``, advopenood's extension, not in
MultiRobustBench): the same ratios on ``g(h, P) = max(0, (AUROC - 50) / 50)`` or ``max(0, (95 - FPR95) / 95)``
(0 at chance or below, 1 for a perfect detector; a random detector has FPR95 = 95 %), over the sets where some
detector beats chance (``g*(P) > 0``, counted in ``n_sets_cr_cc``). Clipping the numerator at chance keeps the
ratio in [0, 1]: without it a detector below chance on a set where the best barely beats chance divides a
negative number by one close to 0 (issue 13: about -9000 on the data pack). Near-chance sets still make the ratio noisy:
read it together with ``n_sets_cr_cc``.

A named detector as ``reference`` replaces ``a*(P)`` by that detector's score (not Definition 3.4; ratios may
exceed 100); the ``reference`` column says which was used.

The stability constant (their Definition 3.7, Eq. 4) uses the same ``a(h, P)`` as the CR, the attack strength
``s(P) = eps / eps_max`` within one attack's sweep (``eps_max`` its largest eps), and every set as known
(post-hoc detectors are fitted on clean data only, so no set is privileged):

* ``L_alpha(h) = max |a(h, P1) - a(h, P2)| / |s(P1) - s(P2)|`` over pairs of sets of the same attack with
  ``|s(P1) - s(P2)| <= alpha``; ``alpha: null`` (default) takes neighbouring eps values of the sweep.

``L = 1`` is a linear fall from AUROC 100 to AUROC 0 over the whole sweep (0.5 from perfect to chance).
Outputs: ``multiattack.csv`` (one row per detector and metric), ``multiattack_curves.csv`` (per detector and
set, plus the per-sample union of the attacks sharing a group and eps), both with the run's ``protocol``, and
``plots/eps_sweep_<detector>_<norm>.png`` (AUROC-vs-eps and FPR95-vs-eps).
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd

from advopenood import io as aio
from advopenood import registry
from advopenood.evaluation.context import RunContext
from advopenood.errors import UsageError
from advopenood.outputs.results import Results
from advopenood.outputs.plots import safe_name
from advopenood_plugins.mead import SetInfo, detector_groups, set_info, worst_case_metrics

METRICS = ("auroc", "fpr95")
MULTI_COLUMNS = ["detector", "backend", "metric", "avg", "worst", "worst_set", "union", "cr_ind_avg", "cr_ind_worst",
                 "n_sets_cr", "cr_cc_ind_avg", "cr_cc_ind_worst", "n_sets_cr_cc", "stability", "reference", "n_sets",
                 "protocol"]
CURVE_COLUMNS = ["detector", "backend", "attack", "norm", "eps", "set", "auroc", "fpr95", "n_pos", "n_neg", "protocol"]
UNION = "union"


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


def stability_constant(perf: Mapping[str, float], labels: Mapping[str, str], eps: Mapping[str, float],
                       alpha: float | None = None) -> float:
    """MultiRobustBench's stability constant ``L_alpha`` of one detector (module docstring, their Eq. 4).

    ``perf``, ``labels`` and ``eps`` map set names to performance (:func:`detection_accuracy`), attack label
    and eps.
    Pairs are sets of the same label; ``s = eps / eps_max`` of that label; ``alpha=None`` pairs neighbouring
    eps values only. NaN when no pair exists (no sweep) or every pair has a NaN performance.
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
        s = [e / top for e, _ in points]
        g = [v for _, v in points]
        pairs = ([(i, i + 1) for i in range(len(points) - 1)] if alpha is None else
                 [(i, j) for i in range(len(points)) for j in range(i + 1, len(points)) if abs(s[j] - s[i]) <= alpha])
        for i, j in pairs:
            ds = abs(s[j] - s[i])
            if ds > 0 and np.isfinite(g[i]) and np.isfinite(g[j]):
                slopes.append(abs(g[j] - g[i]) / ds)
    return float(max(slopes)) if slopes else float("nan")


def sweep_curves(scores: Mapping[str, Mapping[str, np.ndarray]], sets: list[SetInfo],
                 backend: str = "", protocol: str = "strong") -> pd.DataFrame:
    """Per detector and set: AUROC and FPR95 of clean vs successful adversarial samples; plus, per norm and
    eps shared by several attacks, the per-sample union (``attack = "union"``). The ``multiattack_curves.csv``."""
    rows: list[dict[str, Any]] = []
    for detector, by_set, conf_id, norm, eps, members in detector_groups(scores, sets):
        members = [m for m in members if m.name in by_set]
        for m in members:
            row = worst_case_metrics(conf_id, by_set[m.name], m.success)
            rows.append({"detector": detector, "backend": backend, "attack": attack_label(m.name), "norm": norm,
                         "eps": eps, "set": m.name, **{k: row[k] for k in ("auroc", "fpr95", "n_pos", "n_neg")},
                         "protocol": protocol})
        if len({attack_label(m.name) for m in members}) > 1:
            conf = np.stack([np.asarray(by_set[m.name], dtype=np.float64) for m in members], axis=1)
            row = worst_case_metrics(conf_id, conf, np.stack([m.success for m in members], axis=1))
            rows.append({"detector": detector, "backend": backend, "attack": UNION, "norm": norm, "eps": eps,
                         "set": "+".join(m.name for m in members),
                         **{k: row[k] for k in ("auroc", "fpr95", "n_pos", "n_neg")}, "protocol": protocol})
    return pd.DataFrame(rows, columns=CURVE_COLUMNS)


def multiattack_table(scores: Mapping[str, Mapping[str, np.ndarray]], sets: list[SetInfo], backend: str = "",
                      reference: str = "best", alpha: float | None = None,
                      curves: pd.DataFrame | None = None, protocol: str = "strong") -> pd.DataFrame:
    """The ``multiattack.csv`` table: per detector and metric the average, worst and union over the sets, the
    competitiveness ratios against ``reference`` (MultiRobustBench's and the chance-corrected extension) and
    the stability constant (module docstring)."""
    curves = sweep_curves(scores, sets, backend, protocol) if curves is None else curves
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
        conf = np.stack([np.asarray(scores[detector][m.name], dtype=np.float64) for m in members], axis=1)
        union[detector] = worst_case_metrics(np.asarray(scores[detector]["id"], dtype=np.float64), conf,
                                             np.stack([m.success for m in members], axis=1))
    rows: list[dict[str, Any]] = []
    for metric in METRICS:
        raw = per_set.pivot(index="detector", columns="set", values=metric).reindex(index=detectors, columns=columns)
        perf = pd.DataFrame(detection_accuracy(raw.to_numpy(), metric), index=raw.index, columns=raw.columns)
        cr = competitiveness_table(raw, metric, reference)
        for detector in detectors:
            values = raw.loc[detector].dropna()
            worst_set = str(values.idxmin() if metric == "auroc" else values.idxmax()) if len(values) else ""
            rows.append({"detector": detector, "backend": backend, "metric": metric,
                         "avg": float(values.mean()) if len(values) else float("nan"),
                         "worst": float(values[worst_set]) if len(values) else float("nan"), "worst_set": worst_set,
                         "union": union[detector][metric],
                         **{k: float(cr.loc[detector, k]) for k in ("cr_ind_avg", "cr_ind_worst", "cr_cc_ind_avg",
                                                                     "cr_cc_ind_worst")},
                         **{k: int(cr.loc[detector, k]) for k in ("n_sets_cr", "n_sets_cr_cc")},
                         "stability": stability_constant(perf.loc[detector].to_dict(), labels, eps, alpha),
                         "reference": reference, "n_sets": int(len(values)), "protocol": protocol})
    return pd.DataFrame(rows, columns=MULTI_COLUMNS)


def plot_sweeps(curves: pd.DataFrame, plot_dir: Any) -> list[str]:
    """``eps_sweep_<detector>_<norm>.png``: AUROC and FPR95 against eps, one line per attack (dashed: union).
    Only attacks with two or more eps values are drawn; returns the file names written."""
    from matplotlib.figure import Figure

    written: list[str] = []
    bounded = curves[curves["eps"].notna()]
    for (detector, norm), part in bounded.groupby(["detector", "norm"], sort=False):
        swept = [a for a, g in part.groupby("attack", sort=False) if g["eps"].nunique() > 1]
        if not swept:
            continue
        fig = Figure(figsize=(9, 3.4))
        axes = fig.subplots(1, 2)
        for attack in swept:
            g = part[part["attack"] == attack].sort_values("eps")
            style = {"linestyle": "--", "color": "black"} if attack == UNION else {}
            for ax, metric in zip(axes, METRICS):
                ax.plot(g["eps"], g[metric], marker="o", markersize=3, label=attack, **style)
        for ax, metric, chance in zip(axes, METRICS, (50.0, 95.0)):
            ax.axhline(chance, color="grey", linewidth=0.8, linestyle=":")
            ax.set_xlabel(f"eps ({norm})")
            ax.set_ylabel(f"{metric.upper()} (%)")
            ax.grid(alpha=0.3)
        axes[0].set_title(f"{detector}: AUROC vs eps")
        axes[1].set_title(f"{detector}: FPR95 vs eps")
        axes[1].legend(fontsize=7)
        name = safe_name(f"eps_sweep_{detector}_{norm}.png")
        aio.save_figure(fig, plot_dir / name)
        written.append(name)
    return written


@registry.register("evaluators", "multiattack")
class MultiAttackEvaluator:
    """Multi-attack metrics (MultiRobustBench): avg/worst/union, CR_ind-avg/-worst (and the chance-corrected
    extension), stability; eps-sweep plots."""

    def __init__(self, reference: str = "best", alpha: float | None = None, detectors: Iterable[str] | None = None,
                 plots: bool = True):
        """``reference``: ``best`` or a detector name; ``alpha``: stability window in ``eps / eps_max`` units
        (``null``: neighbouring eps); ``detectors``: subset of the run's detectors; ``plots``: write the figures."""
        if alpha is not None and not float(alpha) > 0:
            raise UsageError(f"alpha {alpha!r} must be positive; valid choices: a number > 0 or null (neighbours)")
        self.reference = str(reference).lower()
        self.alpha = None if alpha is None else float(alpha)
        self.detectors = [d.lower() for d in detectors] if detectors is not None else None
        self.plots = bool(plots)

    def __call__(self, ctx: RunContext) -> Results:
        sets = [set_info(name, adv) for name, adv in ctx.id_adv_sets.items()]
        scores = {d: s for d, s in ctx.scores.items() if self.detectors is None or d in self.detectors}
        curves = sweep_curves(scores, sets, ctx.backend, ctx.protocol)
        table = multiattack_table(scores, sets, ctx.backend, self.reference, self.alpha, curves, ctx.protocol)
        figures = [ctx.plot_dir / name for name in plot_sweeps(curves, ctx.plot_dir)] if self.plots else []
        return Results(tables={"multiattack.csv": table, "multiattack_curves.csv": curves}, figures=figures)
