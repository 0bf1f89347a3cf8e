"""Re-derivation of ``robust_paired.csv`` (``advopenood verify``), written apart from ``paired.py``.

The rows of ``robust_auroc.csv`` are re-derived from the scores first (:func:`advopenood_plugins.evaluators.robust_auroc.verify.
rederive_robust`); per (OOD set, eps, method) each detector enters with its EOT row when it has one, else its plain
row; the pairs are listed again (:func:`advopenood_plugins.kit.verify.pairs_of`). The bootstrap interval is a plain
loop over the same seeded draws (:func:`advopenood.evaluation.oracle.seeded_replicates` of the run seed and
``robust_paired|<set>|<eps as %.6g>|<method>``), each resample's robust AUROC from the oracle's Mann-Whitney rank
sum; DeLong's from the oracle's pairwise comparison matrices.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from advopenood.plugin import oracle
from advopenood_plugins.evaluators.robust_auroc.verify_ensemble import Worst
from advopenood_plugins.kit.verify import ci_plan, pairs_of

KEYS = ["ood_set", "eps", "method", "detector_a", "detector_b"]
COLUMNS = ["family_a", "family_b", "twin", "robust_auroc_a", "robust_auroc_b", "delta_robust_auroc",
           "delta_robust_auroc_lo", "delta_robust_auroc_hi", "ci", "significant", "n_id", "n_ood"]


def rederive_robust_paired(run: Any, robust: pd.DataFrame, worst: Worst | None = None) -> pd.DataFrame:
    """``robust_paired.csv`` re-computed from the re-derived robust rows ``robust`` and the saved scores; an
    ensemble row's arrays are its re-derived worst case ``worst[(detector, OOD set, eps as %.6g)]``."""
    plan, worst = ci_plan(run), worst or {}

    def arrays(det: str, r: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        if r["method"] == "ensemble":
            return worst[det, r["ood_set"], f"{float(r['eps']):.6g}"]
        return run.scores(det)[r["id_attack"]].astype(float), run.scores(det)[r["ood_attack"]].astype(float)

    rows = []
    for (ood_set, eps, attack), part in robust.groupby(["ood_set", "eps", "method"], sort=False):
        chosen: dict[str, dict[str, Any]] = {}
        for r in part.to_dict("records"):
            if r["detector"] not in chosen or r["attack_family"] == "eot":
                chosen[r["detector"]] = r
        cells = {d: arrays(d, r) for d, r in chosen.items()}
        aurocs = {d: float(r["robust_auroc"]) for d, r in chosen.items()}
        n, m = len(next(iter(cells.values()))[0]), len(next(iter(cells.values()))[1])
        boot: dict[str, np.ndarray] = {}
        if plan.bootstrap and min(n, m) >= 2:
            kept = [d for d in cells if not math.isnan(aurocs[d])]
            got = plan.paired(f"robust_paired|{ood_set}|{float(eps):.6g}|{attack}", [cells[d] for d in kept],
                              ("auroc",))
            boot = {d: r["auroc"] for d, r in zip(kept, got)}
        for a, b, twin in pairs_of(aurocs):
            lo = hi = math.nan
            how = ""
            if min(n, m) >= 2 and (a in boot and b in boot or plan.method == "delong"
                                   and not math.isnan(aurocs[a] - aurocs[b])):
                lo, hi, how = plan.bounded_difference(cells[a], cells[b], boot.get(a), boot.get(b))
            rows.append({"ood_set": ood_set, "eps": f"{float(eps):.6g}", "method": attack, "detector_a": a,
                         "detector_b": b, "family_a": chosen[a]["attack_family"],
                         "family_b": chosen[b]["attack_family"], "twin": twin, "robust_auroc_a": aurocs[a],
                         "robust_auroc_b": aurocs[b], "delta_robust_auroc": aurocs[a] - aurocs[b],
                         "delta_robust_auroc_lo": lo, "delta_robust_auroc_hi": hi,
                         "ci": oracle.bound_label(plan.label, {"delta_robust_auroc": how}),
                         "significant": math.nan if math.isnan(lo) else bool(lo > 0 or hi < 0), "n_id": n,
                         "n_ood": m})
    return pd.DataFrame(rows, columns=KEYS + COLUMNS)


def verify_robust_paired(run: Any, robust: pd.DataFrame, worst: Worst | None = None) -> list[str]:
    """Differences between ``robust_paired.csv`` and its re-derivation (:func:`rederive_robust_paired`); none when
    the run wrote no such table."""
    from advopenood.plugin import compare

    if not run.has("robust_paired.csv"):
        return ["robust_paired.csv: the robust_auroc evaluator ran but the table is missing"] if len(robust) else []
    written = run.table("robust_paired.csv")
    written = written.assign(eps=[f"{float(e):.6g}" for e in written["eps"]])
    return compare(rederive_robust_paired(run, robust, worst), written, KEYS, COLUMNS, atol=1e-6,
                   table="robust_paired.csv")
