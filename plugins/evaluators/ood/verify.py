"""Re-derivation of the ``ood`` evaluator's tables (``ood.csv``, ``leaderboard.csv``, ``fsood.csv``; ``paired.csv``
and the leaderboard's ranks in :mod:`advopenood_plugins.evaluators.ood.verify_paired`) from
``scores/*.npz`` and ``run.json``, written apart from :mod:`advopenood.evaluation.metrics` and ``plugins/evaluators/ood/plugin.py``.

Every metric and interval comes from the independent checker :mod:`advopenood.evaluation.oracle` (OpenOOD v1.5's
definitions: OOD positive, decision score ``-conf``; AUROC as the Mann-Whitney statistic, FPR95 at the first kept
ROC point with TPR >= 95 %, trapezoidal AUPR-In / AUPR-Out): the bootstrap by a plain loop over the cell's seeded
resamples (key ``ood|<detector>|<set>``), not on the vectorised grid that wrote them; DeLong's interval from the
pairwise comparison matrix; a group mean's from the mean of its cells' re-derived replicates.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from advopenood.evaluation import oracle
from advopenood_plugins.evaluators.ood.verify_paired import verify_paired
from advopenood_plugins.kit.verify import BOUNDS, METRICS, Draws, rederive_bounds

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
                         **oracle.ood_metrics(arrays["id"], conf), "n_id": len(arrays["id"]), "n_ood": len(conf),
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
                lo, hi = oracle.percentile_interval(sum(reps) / len(reps)) if ok else (math.nan, math.nan)
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
                     **oracle.ood_metrics(conf_id, arrays[r["ood_set"]]),
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
