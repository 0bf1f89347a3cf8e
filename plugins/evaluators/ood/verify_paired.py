"""Re-derivation of ``paired.csv`` and of the leaderboard's ``<metric>_rank`` columns (``advopenood verify``), written
apart from ``plugins/kit/paired.py``.

Each set's pairs are listed again from the saved scores (every pair of detectors by name up to 20 detectors, else
each against the best by AUROC; every declared twin, derived first). Every number comes from the independent checker
:mod:`advopenood.evaluation.oracle`: the point AUROCs, the bootstrap interval of the difference by a plain loop over
the same seeded draws (key ``paired|<set>``, each resample's two AUROCs on the same indices) and DeLong's from the
pairwise comparison matrices, each pair's p-value of the same test and Holm's adjustment over the set's pairs.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from advopenood.plugin import oracle
from advopenood_plugins.kit.verify import ci_plan, pairs_of

COLUMNS = ["group", "twin", "auroc_a", "auroc_b", "delta_auroc", "delta_auroc_lo", "delta_auroc_hi", "ci",
           "significant", "p_value", "p_holm", "n_id", "n_ood"]
KEYS = ["detector_a", "detector_b", "ood_set"]


def rederive_paired(run: Any, ood: pd.DataFrame) -> pd.DataFrame:
    """``paired.csv`` re-computed from ``scores/*.npz`` and the re-derived ``ood.csv`` rows (every row the run must
    have, with the positives of the run's rule)."""
    plan = ci_plan(run)
    rows = []
    scored = ood[ood["detector"].isin(run.detectors)]
    for ood_set, part in scored.groupby("ood_set", sort=False):
        cells = {}
        for r in part.to_dict("records"):
            arrays = run.scores(r["detector"])
            conf = arrays[ood_set].astype(float)
            if r["positives"] == "successful":
                conf = conf[arrays[f"{ood_set}.success"].astype(bool)]
            cells[r["detector"]] = (arrays["id"].astype(float), conf)
        aurocs = {d: oracle.auroc(*c) for d, c in cells.items()}
        n, m = len(next(iter(cells.values()))[0]), len(next(iter(cells.values()))[1])
        boot: dict[str, np.ndarray] = {}
        if plan.bootstrap and n >= 2 and m >= 2:
            kept = [d for d in cells if not math.isnan(aurocs[d])]
            got = plan.paired(f"paired|{ood_set}", [cells[d] for d in kept], ("auroc",))
            boot = {d: r["auroc"] for d, r in zip(kept, got)}
        for a, b, twin in pairs_of(aurocs):
            lo = hi = p = math.nan
            usable = min(n, m) >= 2 and not math.isnan(aurocs[a]) and not math.isnan(aurocs[b])
            if usable:
                lo, hi = plan.difference(cells[a], cells[b], boot.get(a), boot.get(b))
                p = plan.difference_p(cells[a], cells[b], boot.get(a), boot.get(b)) if not math.isnan(lo) else p
            sig = math.nan if math.isnan(lo) else bool(lo > 0 or hi < 0)
            rows.append({"detector_a": a, "detector_b": b, "ood_set": ood_set, "group": part["group"].iloc[0],
                         "twin": twin, "auroc_a": aurocs[a], "auroc_b": aurocs[b], "delta_auroc": aurocs[a] - aurocs[b],
                         "delta_auroc_lo": lo, "delta_auroc_hi": hi, "ci": plan.label, "significant": sig,
                         "p_value": p, "n_id": n, "n_ood": m})
    table = pd.DataFrame(rows, columns=KEYS + COLUMNS)
    for _, part in table.groupby("ood_set", sort=False):  # Holm over every pair on the set
        table.loc[part.index, "p_holm"] = oracle.holm(list(part["p_value"].astype(float)))
    return table


def rederive_ranks(board: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    """``<metric>_rank`` per detector from ``board``'s means and bounds: best first (AUROC down, FPR95 up); a detector
    takes its tie group leader's rank when their intervals overlap (equal values without intervals), else its
    position."""
    out = board[["detector"]].copy()
    for metric in metrics:
        sign = -1.0 if metric.endswith("auroc") else 1.0
        rows = [(sign * v, i) for i, v in enumerate(board[metric]) if not pd.isna(v)]
        ranks: list[float] = [math.nan] * len(board)
        leader = -1
        for position, (_, i) in enumerate(sorted(rows), start=1):
            tie = False
            if leader >= 0:
                lo = board[[f"{metric}_lo", f"{metric}_hi"]].to_numpy(float)
                if np.isnan(lo[[i, leader]]).any():
                    tie = board[metric].iloc[i] == board[metric].iloc[leader]
                else:
                    tie = lo[i, 0] <= lo[leader, 1] and lo[leader, 0] <= lo[i, 1]
            if tie:
                ranks[i] = ranks[leader]
            else:
                ranks[i], leader = position, i
        out[f"{metric}_rank"] = ranks
    return out


def verify_paired(run: Any, ood: pd.DataFrame, board: pd.DataFrame | None, rederived_board: pd.DataFrame | None
                  ) -> list[str]:
    """Differences between ``paired.csv`` (always written) / the leaderboard's ranks and their re-derivation; ``ood``
    holds the re-derived ``ood.csv`` rows."""
    from advopenood.plugin import compare

    from advopenood.plugin import Unreadable

    try:
        lines = compare(rederive_paired(run, ood), run.table("paired.csv", KEYS), KEYS, COLUMNS, atol=1e-6,
                        table="paired.csv")
    except Unreadable as exc:
        lines = [str(exc)]
    if board is not None and rederived_board is not None:
        metrics = [c[:-5] for c in board.columns if c.endswith("_rank") and c[:-5] in rederived_board]
        lines += compare(rederive_ranks(rederived_board, metrics), board[board["detector"].isin(run.detectors)],
                         ["detector"], [f"{m}_rank" for m in metrics], table="leaderboard.csv")
    return lines
