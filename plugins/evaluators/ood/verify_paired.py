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
from advopenood_plugins.kit.verify import ci_plan, pairs_of, shared_sources

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
            how = ""
            usable = min(n, m) >= 2 and not math.isnan(aurocs[a]) and not math.isnan(aurocs[b])
            if usable:
                lo, hi, how = plan.bounded_difference(cells[a], cells[b], boot.get(a), boot.get(b))
                p = plan.difference_p(cells[a], cells[b], boot.get(a), boot.get(b)) if not math.isnan(lo) else p
            sig = math.nan if math.isnan(lo) else bool(lo > 0 or hi < 0)
            rows.append({"detector_a": a, "detector_b": b, "ood_set": ood_set, "group": part["group"].iloc[0],
                         "twin": twin, "auroc_a": aurocs[a], "auroc_b": aurocs[b], "delta_auroc": aurocs[a] - aurocs[b],
                         "delta_auroc_lo": lo, "delta_auroc_hi": hi,
                         "ci": oracle.bound_label(plan.label, {"delta_auroc": how}), "significant": sig,
                         "p_value": p, "n_id": n, "n_ood": m})
    table = pd.DataFrame(rows, columns=KEYS + COLUMNS)
    for _, part in table.groupby("ood_set", sort=False):  # Holm over every pair on the set
        table.loc[part.index, "p_holm"] = oracle.holm(list(part["p_value"].astype(float)))
    return table


def rederive_ranks(board: pd.DataFrame, metrics: list[str], run: Any = None, ood: pd.DataFrame | None = None
                   ) -> pd.DataFrame:
    """``<metric>_rank`` and ``<metric>_rank_worst`` per detector from ``board``'s means: best first (AUROC down,
    FPR95 up), 1 + the number of detectors whose paired bootstrap test of the means (replicates of the checker,
    :func:`advopenood.evaluation.oracle.shared_mean_replicates`, key ``rank|<group>`` for every detector, the images
    its sets share drawn once), Holm-adjusted over the metric's pairs, shows better (``p_holm < 0.05``), and the
    number ranked - the number it shows worse; competition ranks (at both ends) of the means without replicates for
    every ranked detector (no run, not the bootstrap, too few images); none below the run's ``min_conclusive``."""
    out = board[["detector"]].copy()
    plan = ci_plan(run) if run is not None else None
    minimum = ((run.info.get("sample") or {}).get("min_conclusive") if run is not None else None) or 0
    n_id = int(ood["n_id"].max()) if ood is not None and len(ood) else 0
    for metric in metrics:
        sign = -1.0 if metric.endswith("auroc") else 1.0
        vals = board[metric].to_numpy(float)
        kept = [i for i in range(len(board)) if not math.isnan(vals[i])]
        reps = {i: _mean_replicates(run, plan, ood, board.iloc[i], metric) for i in kept} if plan is not None else {}
        ranks: list[float] = [math.nan] * len(board)
        worst: list[float] = [math.nan] * len(board)
        if kept and all(reps.get(i) is not None for i in kept):
            pairs = [(a, b) for x, a in enumerate(kept) for b in kept[x + 1:]]
            adjusted = oracle.holm([oracle.bootstrap_p(reps[a] - reps[b]) for a, b in pairs])
            better, shown_worse = {i: 0 for i in kept}, {i: 0 for i in kept}
            for (a, b), p in zip(pairs, adjusted):
                if p < 1 - oracle.LEVEL and vals[a] != vals[b]:  # the threshold of the headline (1 - LEVEL)
                    low, high = (a, b) if sign * vals[a] > sign * vals[b] else (b, a)
                    better[low] += 1
                    shown_worse[high] += 1
            for i in kept:
                ranks[i], worst[i] = 1 + better[i], len(kept) - shown_worse[i]
        else:
            for i in kept:
                ranks[i] = worst[i] = 1 + sum(sign * vals[j] < sign * vals[i] for j in kept)
        if run is not None and n_id < minimum:
            ranks = worst = [math.nan] * len(board)
        out[f"{metric}_rank"], out[f"{metric}_rank_worst"] = ranks, worst
    return out


def _mean_replicates(run: Any, plan: Any, ood: pd.DataFrame, row: pd.Series, metric: str) -> np.ndarray | None:
    """The checker's replicates of ``row``'s mean ``metric`` over its ``<group>_sets`` (each set's positives as its
    ood row says), drawn with key ``rank|<group>``; None without the bootstrap, sets, or 2 images a side."""
    group, _, name = metric.partition("_")
    sets = [s for s in str(row.get(f"{group}_sets", "") if not pd.isna(row.get(f"{group}_sets")) else "").split(",")
            if s]
    if not plan.bootstrap or group not in ("near", "far", "adv") or not sets:
        return None
    arrays = run.scores(row["detector"])
    mine = ood[ood["detector"] == row["detector"]].set_index("ood_set")
    oods, masks = {}, {}
    for s in sets:
        conf = arrays[s].astype(float)
        masks[s] = arrays[f"{s}.success"].astype(bool) if mine.loc[s, "positives"] == "successful" else None
        oods[s] = conf if masks[s] is None else conf[masks[s]]
    conf_id = arrays["id"].astype(float)
    if min(len(conf_id), *(len(o) for o in oods.values())) < 2 or \
            any(np.isnan(a).any() for a in (conf_id, *oods.values())):
        return None
    return oracle.shared_mean_replicates(conf_id, oods, plan.seed, f"rank|{group}", plan.resamples, (name,),
                                         shared_sources(run, arrays, masks))[name]


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
        columns = [c for m in metrics for c in (f"{m}_rank", f"{m}_rank_worst") if c in board.columns]
        lines += compare(rederive_ranks(rederived_board, metrics, run, ood),
                         board[board["detector"].isin(run.detectors)], ["detector"], columns, table="leaderboard.csv")
        lines += verify_openood_rank(run, board)
    return lines


def verify_openood_rank(run: Any, board: pd.DataFrame) -> list[str]:
    """``leaderboard_openood.json``'s ``Rank`` / ``Rank_Worst`` of each detector: ``leaderboard.csv``'s
    ``near_auroc_rank`` / ``near_auroc_rank_worst`` (checked above against their re-derivation) as integers, ``/``
    where there is none (a file written before ``Rank_Worst`` existed is not checked)."""
    import json

    if not run.has("leaderboard_openood.json") or "near_auroc_rank_worst" not in board.columns:
        return []
    ranks = board.set_index(board["detector"].astype(str))
    lines = []
    for entry in json.loads((run.path / "leaderboard_openood.json").read_text()):
        det = str(entry["advopenood"]["detector"])
        if det not in ranks.index:
            continue
        want = ["/" if pd.isna(v) else int(v) for v in ranks.loc[det, ["near_auroc_rank", "near_auroc_rank_worst"]]]
        if [entry.get("Rank"), entry.get("Rank_Worst")] != want:
            lines.append(f"leaderboard_openood.json: {det} Rank, Rank_Worst: written "
                         f"{[entry.get('Rank'), entry.get('Rank_Worst')]!r}, leaderboard.csv {want!r}")
    return lines
