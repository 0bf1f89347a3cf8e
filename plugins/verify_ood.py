"""Re-derivation of the ``ood`` evaluator's tables (``ood.csv``, ``leaderboard.csv``, ``fsood.csv``) from
``scores/*.npz`` and ``run.json``, written apart from :mod:`advopenood.metrics` and ``plugins/ood_eval.py``.

Definitions (OpenOOD v1.5, ``openood/evaluators/metrics.py``): OOD is the positive class, the decision score is
``-conf``; AUROC is the area under the ROC curve (here ``sklearn.metrics.roc_auc_score``); FPR95 is the false
positive rate at the first ROC point whose true positive rate reaches 95 %; AUPR-In / AUPR-Out the trapezoidal
areas under the precision-recall curves with ID / OOD positive. All four depend only on the order of the
confidences, so they are computed on dense ranks (which also orders infinite confidences without special cases).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import rankdata
from sklearn.metrics import precision_recall_curve, roc_auc_score, roc_curve

METRICS = ("fpr95", "auroc", "aupr_in", "aupr_out")


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


def rederive_ood(run: Any, ood: pd.DataFrame) -> pd.DataFrame:
    """ood.csv's metric rows re-computed from the saved scores (rows of detectors without scores keep NaN)."""
    rows = []
    for det in ood["detector"].unique():
        if det not in run.detectors:
            continue
        arrays = run.scores(det)
        for r in ood[ood["detector"] == det].to_dict("records"):
            conf = arrays[r["ood_set"]]
            conf = conf[_positives(arrays, r["ood_set"], r["positives"])] if r["attack"] != "none" else conf
            rows.append({"detector": det, "attack": r["attack"], "ood_set": r["ood_set"], "group": r["group"],
                         **rederive_metrics(arrays["id"], conf), "n_id": len(arrays["id"]), "n_ood": len(conf)})
    return pd.DataFrame(rows)


def rederive_leaderboard(ood: pd.DataFrame) -> pd.DataFrame:
    """Per detector, the plain means of the (re-derived) ood rows of each group, near / far / adversarial (NaN if
    any member is NaN), as OpenOOD's ``nearood`` / ``farood`` rows."""
    rows = []
    for det, part in ood.groupby("detector", sort=False):
        row: dict[str, Any] = {"detector": det}
        for group, prefix in (("near", "near"), ("far", "far"), ("adversarial", "adv")):
            sub = part[part["group"] == group]
            for m in ("fpr95", "auroc"):
                vals = sub[m].to_numpy(float)
                row[f"{prefix}_{m}"] = math.nan if not len(vals) or np.isnan(vals).any() else float(vals.sum() / len(vals))
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
                     **rederive_metrics(conf_id, arrays[r["ood_set"]])})
    return pd.DataFrame(rows)


def verify(run: Any) -> list[str]:
    """Differences between the ``ood`` evaluator's tables and their re-derivation (``advopenood verify``)."""
    from advopenood.verify import compare

    ood = run.table("ood.csv")
    lines = expected_positives(run, ood)
    rederived = rederive_ood(run, ood)
    lines += compare(rederived, ood[ood["detector"].isin(run.detectors)], ["detector", "attack", "ood_set"],
                     [*METRICS, "n_id", "n_ood"], atol=1e-6, table="ood.csv")
    if run.has("leaderboard.csv") and len(rederived):
        board = run.table("leaderboard.csv")
        lines += compare(rederive_leaderboard(rederived), board[board["detector"].isin(run.detectors)], ["detector"],
                         ["near_fpr95", "near_auroc", "far_fpr95", "far_auroc", "adv_fpr95", "adv_auroc", "n_near",
                          "n_far", "n_adv"], atol=1e-6, table="leaderboard.csv")
    if run.has("fsood.csv"):
        fsood = run.table("fsood.csv")
        lines += compare(rederive_fsood(run, fsood), fsood, ["detector", "ood_set"], list(METRICS), atol=1e-6,
                         table="fsood.csv")
    return lines
