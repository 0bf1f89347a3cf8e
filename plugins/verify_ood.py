"""Re-derivation of the ``ood`` evaluator's tables (``ood.csv``, ``leaderboard.csv``, ``fsood.csv``; ``paired.csv``
and the leaderboard's ranks in :mod:`advopenood_plugins.verify_paired`) from
``scores/*.npz`` and ``run.json``, written apart from :mod:`advopenood.evaluation.metrics` and ``plugins/ood_eval.py``.

Definitions (OpenOOD v1.5, ``openood/evaluators/metrics.py``): OOD is the positive class, the decision score is
``-conf``; AUROC is the area under the ROC curve (here ``sklearn.metrics.roc_auc_score``); FPR95 is the false
positive rate at the first ROC point whose true positive rate reaches 95 %; AUPR-In / AUPR-Out the trapezoidal
areas under the precision-recall curves with ID / OOD positive. All four depend only on the order of the
confidences, so they are computed on dense ranks (which also orders infinite confidences without special cases).

Intervals (``<m>_lo`` / ``<m>_hi``, ``ci``): the bootstrap is re-derived by a plain loop over the same resamples
(the cell's generator, :func:`advopenood.evaluation.intervals.cell_seed` of the run seed and the cell's key, draws
the ID indices then the OOD indices), each resample's ROC and precision-recall curves built point by point
(:func:`resample_metrics`, sklearn's construction in plain numpy: sklearn's own checks cost about 8 ms a call, 16 s
a cell at 2,000 resamples), not on the vectorised grid that wrote them;
DeLong's interval from the pairwise comparison matrix, not from ranks; a group mean's from the mean of its cells'
re-derived replicates.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import rankdata
from scipy.stats import norm
from sklearn.metrics import precision_recall_curve, roc_auc_score, roc_curve

from advopenood.evaluation.intervals import cell_seed
from advopenood_plugins.verify_paired import verify_paired

METRICS = ("fpr95", "auroc", "aupr_in", "aupr_out")
BOUNDS = [f"{m}_{end}" for m in METRICS for end in ("lo", "hi")]
#: a cell's re-derived bootstrap replicates per metric, by cell key (``ood|<detector>|<set>``)
Draws = dict[str, dict[str, np.ndarray]]


def rederive_metrics(conf_id: np.ndarray, conf_ood: np.ndarray) -> dict[str, float]:
    """The four metrics in percent; NaN when a side is empty or holds NaN."""
    conf_id, conf_ood = np.asarray(conf_id, float).ravel(), np.asarray(conf_ood, float).ravel()
    if not len(conf_id) or not len(conf_ood) or np.isnan(conf_id).any() or np.isnan(conf_ood).any():
        return {m: math.nan for m in METRICS}
    rank = rankdata(np.concatenate([conf_id, conf_ood]), method="dense")
    is_ood = np.r_[np.zeros(len(conf_id)), np.ones(len(conf_ood))]
    fpr, tpr, _ = roc_curve(is_ood, -rank)
    first = int(np.flatnonzero(tpr >= 0.95)[0])
    p_in, r_in, _ = precision_recall_curve(1 - is_ood, rank)
    p_out, r_out, _ = precision_recall_curve(is_ood, -rank)
    return {"fpr95": 100.0 * fpr[first], "auroc": 100.0 * roc_auc_score(is_ood, -rank),
            "aupr_in": 100.0 * _trapezoid(r_in, p_in), "aupr_out": 100.0 * _trapezoid(r_out, p_out)}


def _trapezoid(x: np.ndarray, y: np.ndarray) -> float:
    """Area under ``y(x)`` by the trapezoidal rule, whichever way ``x`` runs."""
    return float(abs(np.sum(np.diff(x) * (y[1:] + y[:-1]) / 2.0)))


def ci_plan(run: Any) -> tuple[str, int, int]:
    """``(method, resamples, seed)`` of the run's intervals from ``run.json`` (``none`` for a run written before)."""
    ci = run.config.get("ci") or {}
    return str(ci.get("method", "none")), int(ci.get("resamples", 0)), int(run.config.get("seed", 0))


def _curve(positive: np.ndarray, score: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative false and true positives at each distinct score, highest first (sklearn's ``_binary_clf_curve``)."""
    order = np.argsort(-score, kind="mergesort")
    ranked, pos = score[order], positive[order]
    ends = np.r_[np.flatnonzero(np.diff(ranked)), len(ranked) - 1]
    tp = np.cumsum(pos)[ends].astype(float)
    return ends + 1.0 - tp, tp


def _pr_area(fp: np.ndarray, tp: np.ndarray) -> float:
    """Trapezoidal area of the precision-recall points plus sklearn's end point (recall 0, precision 1)."""
    return _trapezoid(np.r_[0.0, tp / tp[-1]], np.r_[1.0, tp / (tp + fp)])


def resample_metrics(rank_id: np.ndarray, rank_ood: np.ndarray) -> dict[str, float]:
    """The four metrics in percent of one resample of dense ranks (OOD positive, decision score ``-rank``): FPR95 on
    sklearn's ``roc_curve`` points after its ``drop_intermediate``, AUROC the trapezoidal ROC area."""
    rank = np.r_[rank_id, rank_ood]
    is_ood = np.r_[np.zeros(len(rank_id)), np.ones(len(rank_ood))]
    fp, tp = _curve(is_ood, -rank)
    keep = np.r_[True, np.logical_or(np.diff(fp, 2), np.diff(tp, 2)), True] if len(fp) > 2 else slice(None)
    fpr, tpr = np.r_[0.0, fp[keep]] / fp[-1], np.r_[0.0, tp[keep]] / tp[-1]
    fp_in, tp_in = _curve(1 - is_ood, rank)
    return {"fpr95": 100.0 * fpr[np.argmax(tpr >= 0.95)],
            "auroc": 100.0 * _trapezoid(np.r_[0.0, fp] / fp[-1], np.r_[0.0, tp] / tp[-1]),
            "aupr_in": 100.0 * _pr_area(fp_in, tp_in), "aupr_out": 100.0 * _pr_area(fp, tp)}


def rederive_bounds(conf_id: np.ndarray, conf_ood: np.ndarray, run: Any, key: str,
                    draws: Draws | None = None) -> dict[str, Any]:
    """A cell's ``<m>_lo`` / ``<m>_hi`` and ``ci`` by the run's ``ci`` plan; the bootstrap replicates go into
    ``draws[key]``. NaN bounds when a side has fewer than 2 images or holds NaN."""
    method, resamples, seed = ci_plan(run)
    out: dict[str, Any] = {c: math.nan for c in BOUNDS}
    out["ci"] = f"bootstrap-{resamples}" if method == "bootstrap" else method
    conf_id, conf_ood = np.asarray(conf_id, float).ravel(), np.asarray(conf_ood, float).ravel()
    n, m = len(conf_id), len(conf_ood)
    if method == "none" or n < 2 or m < 2 or np.isnan(conf_id).any() or np.isnan(conf_ood).any():
        return out
    if method == "delong":
        psi = (conf_id[None, :] > conf_ood[:, None]) + 0.5 * (conf_id[None, :] == conf_ood[:, None])
        auc, v10, v01 = psi.mean(), psi.mean(axis=1), psi.mean(axis=0)
        half = norm.ppf(0.975) * math.sqrt(np.var(v10, ddof=1) / m + np.var(v01, ddof=1) / n)
        out.update(auroc_lo=100.0 * max(0.0, auc - half), auroc_hi=100.0 * min(1.0, auc + half))
        return out
    rng = np.random.default_rng(cell_seed(seed, key))
    idx_id, idx_ood = rng.integers(0, n, (resamples, n)), rng.integers(0, m, (resamples, m))
    rank = rankdata(np.concatenate([conf_id, conf_ood]), method="dense").astype(float)
    rank_id, rank_ood = rank[:n], rank[n:]
    reps = pd.DataFrame([resample_metrics(rank_id[i], rank_ood[j]) for i, j in zip(idx_id, idx_ood)])
    for metric in METRICS:
        out[f"{metric}_lo"], out[f"{metric}_hi"] = np.percentile(reps[metric].to_numpy(), [2.5, 97.5])
    if draws is not None:
        draws[key] = {metric: reps[metric].to_numpy() for metric in METRICS}
    return out


def _positives(arrays: dict[str, np.ndarray], name: str, positives: str) -> np.ndarray:
    """Rows of a set that a row with this ``positives`` label scores as OOD."""
    if positives == "successful":
        return arrays[f"{name}.success"].astype(bool)
    return np.ones(len(arrays[name]), dtype=bool)


def expected_positives(run: Any, ood: pd.DataFrame) -> list[str]:
    """The ``positives`` label of every adversarial row follows the protocol (or the evaluator's ``success_only``)."""
    override = ((run.config.get("evaluator_params") or {}).get("ood") or {}).get("success_only")
    rule = run.info.get("protocol", {}).get("ood_positives", "successful")
    successful = rule == "successful" if override is None else bool(override)
    lines = []
    for r in ood[ood["attack"] != "none"].to_dict("records"):
        source = (run.info.get("attacks") or {}).get(r["attack"], {}).get("source", "id")
        want = "successful" if successful and source == "id" else "all"
        if r["positives"] != want:
            lines.append(f"ood.csv: {r['detector']} on {r['ood_set']}: positives {r['positives']!r}, the run's rule "
                         f"gives {want!r}")
    return lines


def rederive_ood(run: Any, ood: pd.DataFrame, draws: Draws | None = None) -> pd.DataFrame:
    """ood.csv's metric rows and intervals re-computed from the saved scores (rows of detectors without scores keep
    NaN); each cell's bootstrap replicates go into ``draws``."""
    rows = []
    for det in ood["detector"].unique():
        if det not in run.detectors:
            continue
        arrays = run.scores(det)
        for r in ood[ood["detector"] == det].to_dict("records"):
            conf = arrays[r["ood_set"]]
            conf = conf[_positives(arrays, r["ood_set"], r["positives"])] if r["attack"] != "none" else conf
            rows.append({"detector": det, "attack": r["attack"], "ood_set": r["ood_set"], "group": r["group"],
                         **rederive_metrics(arrays["id"], conf), "n_id": len(arrays["id"]), "n_ood": len(conf),
                         **rederive_bounds(arrays["id"], conf, run, f"ood|{det}|{r['ood_set']}", draws)})
    return pd.DataFrame(rows)


def rederive_leaderboard(ood: pd.DataFrame, draws: Draws | None = None) -> pd.DataFrame:
    """Per detector, the plain means of the (re-derived) ood rows of each group, near / far / adversarial (NaN if
    any member is NaN), as OpenOOD's ``nearood`` / ``farood`` rows; each mean's interval the percentiles of the
    mean of its cells' replicates (NaN without them)."""
    draws = draws or {}
    rows = []
    for det, part in ood.groupby("detector", sort=False):
        row: dict[str, Any] = {"detector": det}
        for group, prefix in (("near", "near"), ("far", "far"), ("adversarial", "adv")):
            sub = part[part["group"] == group]
            for m in ("fpr95", "auroc"):
                vals = sub[m].to_numpy(float)
                row[f"{prefix}_{m}"] = math.nan if not len(vals) or np.isnan(vals).any() else float(vals.sum() / len(vals))
                reps = [draws.get(f"ood|{det}|{s}", {}).get(m) for s in sub["ood_set"]]
                ok = bool(reps) and all(r is not None for r in reps)
                lo, hi = np.percentile(sum(reps) / len(reps), [2.5, 97.5]) if ok else (math.nan, math.nan)
                row[f"{prefix}_{m}_lo"], row[f"{prefix}_{m}_hi"] = lo, hi
            row[f"n_{prefix}"] = len(sub)
        rows.append(row)
    return pd.DataFrame(rows)


def rederive_fsood(run: Any, fsood: pd.DataFrame) -> pd.DataFrame:
    """fsood.csv re-computed: ID = the ID test set and every csid set concatenated."""
    rows = []
    for r in fsood.to_dict("records"):
        if r["detector"] not in run.detectors:
            continue
        arrays = run.scores(r["detector"])
        csid = [s for s in str(r["csid_sets"]).split(",") if s]
        conf_id = np.concatenate([arrays["id"]] + [arrays[s] for s in csid])
        rows.append({"detector": r["detector"], "ood_set": r["ood_set"],
                     **rederive_metrics(conf_id, arrays[r["ood_set"]]),
                     **rederive_bounds(conf_id, arrays[r["ood_set"]], run, f"fsood|{r['detector']}|{r['ood_set']}")})
    return pd.DataFrame(rows)


def verify(run: Any) -> list[str]:
    """Differences between the ``ood`` evaluator's tables and their re-derivation (``advopenood verify``)."""
    from advopenood.evaluation.verify import compare

    ood = run.table("ood.csv")
    lines = expected_positives(run, ood)
    draws: Draws = {}
    rederived = rederive_ood(run, ood, draws)
    lines += compare(rederived, ood[ood["detector"].isin(run.detectors)], ["detector", "attack", "ood_set"],
                     [*METRICS, *BOUNDS, "ci", "n_id", "n_ood"], atol=1e-6, table="ood.csv")
    board = rederived_board = None
    if run.has("leaderboard.csv") and len(rederived):
        board, rederived_board = run.table("leaderboard.csv"), rederive_leaderboard(rederived, draws)
        means = [f"{g}_{m}" for g in ("near", "far", "adv") for m in ("fpr95", "auroc")]
        lines += compare(rederived_board, board[board["detector"].isin(run.detectors)],
                         ["detector"], [*means, *[f"{c}_{end}" for c in means for end in ("lo", "hi")], "n_near",
                                        "n_far", "n_adv"], atol=1e-6, table="leaderboard.csv")
    lines += verify_paired(run, ood, board, rederived_board)
    if run.has("fsood.csv"):
        fsood = run.table("fsood.csv")
        lines += compare(rederive_fsood(run, fsood), fsood, ["detector", "ood_set"], [*METRICS, *BOUNDS, "ci"],
                         atol=1e-6, table="fsood.csv")
    return lines
