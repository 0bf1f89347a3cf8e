"""Re-derivation of ``paired.csv`` and of the leaderboard's ``<metric>_rank`` columns (``advopenood verify``), written
apart from ``plugins/paired.py``.

Each set's pairs are listed again from the saved scores (every pair of detectors by name up to 20 detectors, else
each against the best by AUROC; every declared twin, derived first). The bootstrap interval is re-derived by a plain
loop over the same seeded draws (the generator of :func:`advopenood.evaluation.intervals.cell_seed` of the run seed
and ``paired|<set>``, ID indices then OOD indices), each resample's two AUROCs from the Mann-Whitney rank sum
(``scipy.stats.rankdata``), not on the vectorised grid that wrote them; DeLong's from the pairwise comparison
matrices; the point AUROCs with ``sklearn.metrics.roc_auc_score``.
"""
from __future__ import annotations

import math
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import norm, rankdata
from sklearn.metrics import roc_auc_score

from advopenood import registry
from advopenood.capabilities import twin_of
from advopenood.errors import UsageError
from advopenood.evaluation.intervals import cell_seed

COLUMNS = ["group", "twin", "auroc_a", "auroc_b", "delta_auroc", "delta_auroc_lo", "delta_auroc_hi", "ci",
           "significant", "n_id", "n_ood"]
KEYS = ["detector_a", "detector_b", "ood_set"]


def rank_auroc(conf_id: np.ndarray, conf_ood: np.ndarray) -> float:
    """AUROC in percent (OOD positive, decision score ``-conf``) from the Mann-Whitney rank sum, ties counting half."""
    n, m = len(conf_id), len(conf_ood)
    rank = rankdata(-np.concatenate([conf_id, conf_ood]))
    return 100.0 * (rank[n:].sum() - m * (m + 1) / 2.0) / (n * m)


def point_auroc(conf_id: np.ndarray, conf_ood: np.ndarray) -> float:
    """AUROC in percent by ``roc_auc_score`` on dense ranks (NaN when a side is empty or holds NaN)."""
    if not len(conf_id) or not len(conf_ood) or np.isnan(conf_id).any() or np.isnan(conf_ood).any():
        return math.nan
    rank = rankdata(np.concatenate([conf_id, conf_ood]), method="dense")
    return 100.0 * roc_auc_score(np.r_[np.zeros(len(conf_id)), np.ones(len(conf_ood))], -rank)


def delong_delta(cell_a: tuple[np.ndarray, np.ndarray], cell_b: tuple[np.ndarray, np.ndarray]) -> tuple[float, float]:
    """DeLong's 95 % interval on the AUROC difference (points) from the pairwise comparison matrices."""
    comps = []
    for conf_id, conf_ood in (cell_a, cell_b):
        psi = (conf_id[None, :] > conf_ood[:, None]) + 0.5 * (conf_id[None, :] == conf_ood[:, None])
        comps.append((psi.mean(), psi.mean(axis=1), psi.mean(axis=0)))
    (auc_a, v10_a, v01_a), (auc_b, v10_b, v01_b) = comps
    var = np.var(v10_a - v10_b, ddof=1) / len(v10_a) + np.var(v01_a - v01_b, ddof=1) / len(v01_a)
    half = norm.ppf(0.975) * math.sqrt(var)
    return 100.0 * max(-1.0, auc_a - auc_b - half), 100.0 * min(1.0, auc_a - auc_b + half)


def _twin(det: str) -> str:
    try:
        return twin_of(registry.get("detectors", det))
    except UsageError:
        return ""


def pairs_of(aurocs: dict[str, float]) -> list[tuple[str, str, bool]]:
    """The pairs of one set: all (sorted names) up to 20 detectors, else each against the best; twins always."""
    names = sorted(aurocs)
    twins = {(d, _twin(d)) for d in names if _twin(d) in names}
    if len(names) <= 20:
        plain = set(combinations(names, 2))
    else:
        finite = [d for d in names if not math.isnan(aurocs[d])]
        best = sorted(finite, key=lambda d: (-aurocs[d], d))[0] if finite else names[0]
        plain = {(best, d) for d in names if d != best}
    plain = {p for p in plain if p not in twins and p[::-1] not in twins}
    return [(a, b, False) for a, b in plain] + [(a, b, True) for a, b in twins]


def rederive_paired(run: Any, ood: pd.DataFrame) -> pd.DataFrame:
    """``paired.csv`` re-computed from ``scores/*.npz`` and the positives of ``ood.csv``'s rows."""
    ci = run.config.get("ci") or {}
    method, resamples, seed = str(ci.get("method", "none")), int(ci.get("resamples", 0)), int(run.config.get("seed", 0))
    label = f"bootstrap-{resamples}" if method == "bootstrap" else method
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
        aurocs = {d: point_auroc(*c) for d, c in cells.items()}
        n, m = len(next(iter(cells.values()))[0]), len(next(iter(cells.values()))[1])
        boot: dict[str, np.ndarray] = {}
        if method == "bootstrap" and n >= 2 and m >= 2:
            rng = np.random.default_rng(cell_seed(seed, f"paired|{ood_set}"))
            idx_id, idx_ood = rng.integers(0, n, (resamples, n)), rng.integers(0, m, (resamples, m))
            for d, (conf_id, conf_ood) in cells.items():
                if not math.isnan(aurocs[d]):
                    boot[d] = np.array([rank_auroc(conf_id[i], conf_ood[j]) for i, j in zip(idx_id, idx_ood)])
        for a, b, twin in pairs_of(aurocs):
            lo = hi = math.nan
            usable = min(n, m) >= 2 and not math.isnan(aurocs[a]) and not math.isnan(aurocs[b])
            if usable and method == "bootstrap":
                lo, hi = np.percentile(boot[a] - boot[b], [2.5, 97.5])
            elif usable and method == "delong":
                lo, hi = delong_delta(cells[a], cells[b])
            sig = math.nan if math.isnan(lo) else bool(lo > 0 or hi < 0)
            rows.append({"detector_a": a, "detector_b": b, "ood_set": ood_set, "group": part["group"].iloc[0],
                         "twin": twin, "auroc_a": aurocs[a], "auroc_b": aurocs[b], "delta_auroc": aurocs[a] - aurocs[b],
                         "delta_auroc_lo": lo, "delta_auroc_hi": hi, "ci": label, "significant": sig, "n_id": n,
                         "n_ood": m})
    return pd.DataFrame(rows, columns=KEYS + COLUMNS)


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
    """Differences between ``paired.csv`` / the leaderboard's ranks and their re-derivation."""
    from advopenood.evaluation.verify import compare

    lines: list[str] = []
    if run.has("paired.csv"):
        lines += compare(rederive_paired(run, ood), run.table("paired.csv"), KEYS, COLUMNS, atol=1e-6,
                         table="paired.csv")
    if board is not None and rederived_board is not None:
        metrics = [c[:-5] for c in board.columns if c.endswith("_rank") and c[:-5] in rederived_board]
        lines += compare(rederive_ranks(rederived_board, metrics), board[board["detector"].isin(run.detectors)],
                         ["detector"], [f"{m}_rank" for m in metrics], table="leaderboard.csv")
    return lines
