"""Paired comparisons of detectors (``paired.csv``) and the leaderboard's ranks with ties, for the ``ood`` evaluator.

**Pairs.** On every set of ``ood.csv`` (natural OOD sets and adversarial positive sets) the detectors scored the
same images, so their AUROCs are compared paired: with at most :data:`MAX_ALL_PAIRS` detectors scored, every pair
(``detector_a`` before ``detector_b`` by name); with more, each detector against the best by AUROC on that set
(``detector_a``; the first by name among equals). A detector that declares a twin
(:func:`advopenood.capabilities.twin_of`: ``smoothed_<det>`` derives from ``<det>``) is always paired with it, as
``detector_a`` = the derived one, ``twin`` = True.

**Intervals** on ``delta_auroc = auroc_a - auroc_b`` (percent points), by the run's ``ci`` plan: ``bootstrap``:
the percentile interval of the replicates' differences, both detectors resampled with the same ID and OOD draws
(one draw per set, :meth:`advopenood.evaluation.intervals.IntervalPolicy.paired` of the cell key ``paired|<set>``);
``delong``: DeLong's paired test for correlated AUROCs
(:meth:`~advopenood.evaluation.intervals.IntervalPolicy.difference`); ``none``: empty bounds. ``significant`` is
True when the interval excludes 0, empty when there is no interval: the test of that one comparison.

**Simultaneous tests** (claims that rest on several comparisons: a rank, "X is first", "can be first"): ``p_value``
is the two-sided p-value of the test the interval inverts (bootstrap: ``min(1, 2 min(P*(d <= 0), P*(d >= 0)))`` of
the paired replicates; DeLong: its normal test), ``p_holm`` Holm's (1979) step-down adjustment of it over every
comparison on the set (:func:`~advopenood.evaluation.intervals.holm`; the family: every row of the set with a
p-value). A pair with ``p_holm < 0.05`` is shown different with the chance of any false difference among all the
set's pairs at most 5 %: the headline's ranks and its ``first`` claims read ``p_holm``, never ``significant``.

**Ranks with ties** (:func:`holm_ranks`): the leaderboard's ``<metric>_rank`` orders the detectors best first (higher
AUROC, lower FPR95) by the headline's rule (:func:`advopenood_plugins.evaluators.ood.headline.rank_ranges`), never by
overlapping intervals: every pair of detectors is compared by the paired bootstrap of their means (``replicates``:
each detector's mean replicates on the same draws of the shared images, :func:`rank_replicates`), two-sided
p-value :func:`~advopenood.evaluation.intervals.bootstrap_p` of ``mean_a - mean_b``, Holm-adjusted over the metric's
pairs (:func:`~advopenood.evaluation.intervals.holm`); a detector's rank is a range (``<metric>_rank`` to
``<metric>_rank_worst``, :func:`holm_rank_ranges`): from 1 + the number of detectors shown better (``p_holm <
0.05``) to the number ranked - the number shown worse, so detectors not shown apart share places. Without
replicates for every ranked detector (a ``delong`` or ``none`` run): competition ranks of the point estimates (1, 1,
3) at both ends. Below ``min_conclusive``
(:data:`~advopenood.evaluation.metrics.MIN_CONCLUSIVE` ID images) no rank; a NaN mean has no rank.
"""
from __future__ import annotations

import math
import warnings
from itertools import combinations
from typing import Any, Callable, Iterable

import numpy as np
import pandas as pd

from advopenood.plugin import (LEVEL, MIN_CONCLUSIVE, Bullets, Claim, Paragraph, RunContext, Section, Table, UsageError,
                               bootstrap_p, bound_label, cell_key, holm, join, name as label, pair_claim, registry,
                               shared_mean_replicates, too_few, twin_of)
from advopenood_plugins.kit.ood import mean_sources

#: up to this many scored detectors every pair is compared; above it, each detector against the best on the set
MAX_ALL_PAIRS = 20
PAIRED_COLUMNS = ["detector_a", "detector_b", "ood_set", "group", "twin", "auroc_a", "auroc_b", "delta_auroc",
                  "delta_auroc_lo", "delta_auroc_hi", "ci", "significant", "p_value", "p_holm", "n_id", "n_ood",
                  "error", "protocol"]
#: the leaderboard's group metrics that get a ``<metric>_rank`` column, and whether higher is better
RANKED = {"near_fpr95": False, "near_auroc": True, "far_fpr95": False, "far_auroc": True, "adv_fpr95": False,
          "adv_auroc": True}
FSOOD_RANKED = {"fsood_near_fpr95": False, "fsood_near_auroc": True, "fsood_far_fpr95": False,
                "fsood_far_auroc": True}


def declared_twin(detector: str) -> str:
    """The registered detector ``detector`` derives from (its twin), "" when it declares none or is unknown here."""
    try:
        return twin_of(registry.get("detectors", detector))
    except UsageError:
        return ""


def detector_pairs(detectors: Iterable[str], aurocs: dict[str, float]) -> list[tuple[str, str, bool]]:
    """``(detector_a, detector_b, twin)`` on one set: every pair (names sorted) with at most :data:`MAX_ALL_PAIRS`
    detectors, else each one against the best by ``aurocs`` (NaN never best); every declared twin pair, derived
    first, whatever the rule."""
    names = sorted(detectors)
    twins = [(d, declared_twin(d)) for d in names if declared_twin(d) in names]
    if len(names) <= MAX_ALL_PAIRS:
        pairs = list(combinations(names, 2))
    else:
        ranked = [d for d in names if not math.isnan(aurocs.get(d, math.nan))]
        best = max(ranked, key=lambda d: aurocs[d]) if ranked else names[0]
        pairs = [(best, d) for d in names if d != best]
    twin_sets = {frozenset(p) for p in twins}
    return [(a, b, False) for a, b in pairs if frozenset((a, b)) not in twin_sets] + [(a, b, True) for a, b in twins]


def significant(lo: float, hi: float) -> Any:
    """Whether the interval ``[lo, hi]`` excludes 0 (``pd.NA`` without one)."""
    return pd.NA if math.isnan(lo) or math.isnan(hi) else bool(lo > 0 or hi < 0)


def paired_table(ctx: RunContext, ood: pd.DataFrame, masks: dict[str, np.ndarray | None]) -> pd.DataFrame:
    """``paired.csv``: the AUROC difference of each pair of detectors (:func:`detector_pairs`) on each set of ``ood``
    with its paired interval. ``masks``: each set's positive rows (None = every row), as ``ood.csv`` used them."""
    policy = ctx.intervals
    rows: list[dict[str, Any]] = []
    scored = ood[ood["detector"].isin(list(ctx.scores))]
    for ood_set, part in scored.groupby("ood_set", sort=False):
        aurocs = dict(zip(part["detector"], part["auroc"].astype(float)))
        group = str(part["group"].iloc[0])
        mask = masks.get(ood_set)
        if mask is not None and any(len(ctx.scores[d][ood_set]) != len(mask) for d in aurocs):
            continue  # ood.csv names the mismatch in its error column
        cells = {d: (ctx.scores[d]["id"], ctx.scores[d][ood_set] if mask is None else ctx.scores[d][ood_set][mask])
                 for d in aurocs}
        reps: dict[str, np.ndarray] = {}
        if policy.bootstrap:
            sizes = {(len(i), len(o)) for i, o in cells.values()}
            if len(sizes) == 1 and not too_few(*next(iter(sizes))):
                kept = [d for d in cells if not math.isnan(aurocs[d])]
                got = policy.paired(cell_key("paired", ood_set), [cells[d] for d in kept], ("auroc",))
                reps = {d: r["auroc"] for d, r in zip(kept, got)}
        for a, b, twin in detector_pairs(aurocs, aurocs):
            row = {"detector_a": a, "detector_b": b, "ood_set": ood_set, "group": group, "twin": twin,
                   "auroc_a": aurocs[a], "auroc_b": aurocs[b], "delta_auroc": aurocs[a] - aurocs[b],
                   "ci": policy.label, "n_id": len(cells[a][0]), "n_ood": len(cells[a][1]),
                   "protocol": ctx.protocol}
            lo, hi, error, how = policy.bounded_difference(cells[a], cells[b], reps.get(a), reps.get(b))
            row["ci"] = bound_label(policy.label, {"delta_auroc": how})
            rows.append({**row, "delta_auroc_lo": lo, "delta_auroc_hi": hi, "significant": significant(lo, hi),
                         "p_value": policy.difference_p(cells[a], cells[b], reps.get(a), reps.get(b)), "error": error})
    table = pd.DataFrame(rows, columns=PAIRED_COLUMNS).astype({"significant": "boolean", "twin": bool})
    for _, part in table.groupby("ood_set", sort=False):
        table.loc[part.index, "p_holm"] = holm(part["p_value"].astype(float))
    return table


def holm_ranks(values: Iterable[float], replicates: dict[int, np.ndarray] | None, higher_better: bool) -> list[Any]:
    """The best end of each row's rank range (:func:`holm_rank_ranges`): 1 + the number of rows shown better;
    NaN -> ``pd.NA``."""
    return [pd.NA if r is None else r[0] for r in holm_rank_ranges(values, replicates, higher_better)]


def holm_rank_ranges(values: Iterable[float], replicates: dict[int, np.ndarray] | None, higher_better: bool
                     ) -> list[tuple[int, int] | None]:
    """Each row's ``(best, worst)`` rank by Holm-adjusted paired tests (module docstring): ``replicates`` maps a row
    to its mean's paired replicates; best = 1 + the rows shown better, worst = the ranked rows - the rows shown
    worse (the headline's :func:`~advopenood_plugins.evaluators.ood.headline.rank_ranges`); without replicates for
    every ranked row, the competition rank of the values at both ends (no test: one place each); NaN -> None."""
    vals = np.asarray(list(values), dtype=float)
    sign = 1.0 if higher_better else -1.0
    kept = [i for i in range(len(vals)) if not math.isnan(vals[i])]
    ranks: list[tuple[int, int] | None] = [None] * len(vals)
    reps = replicates or {}
    if not all(i in reps and len(reps[i]) for i in kept):
        for i in kept:
            ranks[i] = (1 + int(sum(sign * vals[j] > sign * vals[i] for j in kept)),) * 2
        return ranks
    pairs = list(combinations(kept, 2))
    adjusted = holm([bootstrap_p(np.asarray(reps[a]) - np.asarray(reps[b])) for a, b in pairs])
    better, worse = {i: 0 for i in kept}, {i: 0 for i in kept}
    for (a, b), p in zip(pairs, adjusted):
        if p < 1 - LEVEL and vals[a] != vals[b]:
            high, low = (a, b) if sign * vals[a] > sign * vals[b] else (b, a)
            better[low] += 1
            worse[high] += 1
    for i in kept:
        ranks[i] = (1 + better[i], len(kept) - worse[i])
    return ranks


def tie_ranks(values: Iterable[float], lo: Iterable[float], hi: Iterable[float], higher_better: bool) -> list[Any]:
    """Competition ranks with ties by interval overlap (module docstring): best first, a detector shares the rank of
    its tie group's leader when their 95 % intervals overlap (equal values when either has none); NaN -> ``pd.NA``.
    Deprecated: overlapping intervals are no test; the leaderboard ranks by :func:`holm_ranks`."""
    warnings.warn("tie_ranks ranks by overlapping intervals, which are no test; use holm_ranks", DeprecationWarning,
                  stacklevel=2)
    vals, los, his = (np.asarray(list(v), dtype=float) for v in (values, lo, hi))
    order = [i for i in np.argsort(-vals if higher_better else vals, kind="stable") if not math.isnan(vals[i])]
    ranks: list[Any] = [pd.NA] * len(vals)
    leader = None
    for position, i in enumerate(order, start=1):
        if leader is not None and _tied(vals, los, his, leader, i):
            ranks[i] = ranks[leader]
        else:
            ranks[i], leader = position, i
    return ranks


def _tied(vals: np.ndarray, los: np.ndarray, his: np.ndarray, i: int, j: int) -> bool:
    """Whether rows ``i`` and ``j`` tie: their closed intervals overlap, or (without both intervals) equal values."""
    if np.isnan([los[i], his[i], los[j], his[j]]).any():
        return bool(vals[i] == vals[j])
    return bool(los[j] <= his[i] and los[i] <= his[j])


def add_ranks(board: pd.DataFrame, ranked: dict[str, bool],
              replicates: Callable[[str, str], np.ndarray | None] | None = None, n_id: int | None = None
              ) -> pd.DataFrame:
    """``board`` with ``<metric>_rank`` and ``<metric>_rank_worst`` columns (nullable integers: the two ends of the
    rank range, :func:`holm_rank_ranges`) for each metric of ``ranked`` it holds; ``replicates(detector, metric)``:
    the mean's paired replicates (None: none); all NA when ``n_id`` is below
    :data:`~advopenood.evaluation.metrics.MIN_CONCLUSIVE`."""
    for metric, higher in ranked.items():
        if metric in board:
            reps = {} if replicates is None else {i: replicates(d, metric) for i, d in enumerate(board["detector"])}
            ranks = holm_rank_ranges(board[metric], {i: r for i, r in reps.items() if r is not None}, higher)
            if n_id is not None and n_id < MIN_CONCLUSIVE:
                ranks = [None] * len(board)
            board[f"{metric}_rank"] = pd.array([pd.NA if r is None else r[0] for r in ranks], dtype="Int64")
            board[f"{metric}_rank_worst"] = pd.array([pd.NA if r is None else r[1] for r in ranks], dtype="Int64")
    return board


def rank_replicates(ctx: RunContext, masks: dict[str, np.ndarray | None], board: pd.DataFrame
                    ) -> Callable[[str, str], np.ndarray | None]:
    """``replicates(detector, metric)`` for :func:`add_ranks`: the replicates of the detector's mean over its
    ``<group>_sets`` with the ID images and the OOD images its sets share (:func:`~advopenood_plugins.kit.ood.
    mean_sources`) drawn once per replicate by key ``rank|<group>`` (the same draws for every detector, so the means
    are paired; :func:`~advopenood.evaluation.intervals.shared_mean_replicates`); None without bootstrap, without
    scores, or with too few images."""
    done: dict[tuple[str, str], dict[str, np.ndarray] | None] = {}
    sets = {(r["detector"], g): str(r.get(f"{g}_sets") or "") for r in board.to_dict("records")
            for g in ("near", "far", "adv")}

    def replicates(det: str, metric: str) -> np.ndarray | None:
        group, _, name = metric.partition("_")
        scores, names = ctx.scores.get(det), [s for s in sets.get((det, group), "").split(",") if s]
        if not ctx.intervals.bootstrap or scores is None or not names or group not in ("near", "far", "adv"):
            return None
        if (det, group) not in done:
            oods = {s: scores[s] if masks.get(s) is None else scores[s][masks[s]] for s in names}
            arrays = [np.asarray(scores["id"], float), *(np.asarray(o, float) for o in oods.values())]
            usable = not any(too_few(len(arrays[0]), len(o)) for o in arrays[1:]) and \
                not any(np.isnan(a).any() for a in arrays)
            done[(det, group)] = None if not usable else shared_mean_replicates(
                arrays[0], oods, ctx.intervals.seed, cell_key("rank", group), ctx.intervals.resamples,
                ("fpr95", "auroc"), mean_sources(ctx, scores, names, masks))
        got = done[(det, group)]
        return None if got is None else got[name]

    return replicates


# ------------------------------------------------------------------------------------------------- report

#: the columns that pick one row of ``paired.csv``, and the row's ``(a, b, delta, lo, hi)`` columns for its claim
PAIRED_KEYS = ("detector_a", "detector_b", "ood_set")
PAIRED_CLAIM_COLUMNS = ("detector_a", "detector_b", "delta_auroc", "delta_auroc_lo", "delta_auroc_hi")


def read_paired(table: pd.DataFrame) -> list[Claim | str]:
    """Readings of ``paired.csv`` as claims (:func:`advopenood.claims.pair_claim`): a direction is stated only where
    the paired interval excludes 0, with the interval of the difference stated; twins are read always; the other
    pairs whose interval contains 0 are counted (ties: no difference shown)."""
    out: list[Claim | str] = [_reading(r) for r in table[table["twin"].astype(bool)].to_dict("records")]
    others = table[~table["twin"].astype(bool)]
    sig = others[others["significant"].eq(True)]
    out += [_reading(r) for r in sig.to_dict("records")]
    undecided = len(others) - len(sig)
    if undecided:
        out.append(f"{undecided} of {len(others)} other pair(s) of detectors: no difference shown (the interval "
                   "contains 0 or there is none).")
    return out


def _reading(r: dict[str, Any]) -> Claim | str:
    """One pair's claim: which AUROC is higher, stated only when the interval excludes 0."""
    if math.isnan(float(r["delta_auroc"])):
        return f"{label(r['detector_a'])} vs {label(r['detector_b'])} on {label(r['ood_set'])}: undefined " \
               f"({r['error'] or 'NaN AUROC'})."
    return pair_claim(r, "paired.csv", PAIRED_KEYS, PAIRED_CLAIM_COLUMNS)


def paired_cell(r: dict[str, Any]) -> str:
    """``+3.1 [0.5, 5.7]`` (the difference alone without an interval)."""
    if pd.isna(r["delta_auroc"]):
        return "n/a"
    if pd.isna(r["delta_auroc_lo"]):
        return f"{r['delta_auroc']:+.1f}"
    return f"{r['delta_auroc']:+.1f} [{r['delta_auroc_lo']:+.1f}, {r['delta_auroc_hi']:+.1f}]"


def paired_section(table: pd.DataFrame) -> Section:
    """``Paired comparisons``: the AUROC differences with their paired intervals and readings."""
    shown = pd.DataFrame({"detector_a": table["detector_a"], "detector_b": table["detector_b"],
                          "ood_set": table["ood_set"], "delta AUROC [95 %]": [paired_cell(r) for r in
                                                                           table.to_dict("records")],
                          "significant": table["significant"], "twin": table["twin"]})
    top = pd.DataFrame({"twin": ~table["twin"].astype(bool), "shown": ~table["significant"].eq(True).astype(bool),
                        "size": -table["delta_auroc"].abs()}).sort_values(["twin", "shown", "size"], kind="stable")
    shown = shown.loc[top.index]  # top first: twins, then differences shown, largest first
    sets = join([label(s) for s in dict.fromkeys(table["ood_set"])]) if len(table) else "no set"
    return Section("Paired comparisons", [
        Paragraph("AUROC differences (points, detector_a minus detector_b) of detectors scored on the same images, "
                  f"on {sets}, each with a paired 95 % interval (paired.csv); a difference is claimed only where "
                  "its interval excludes 0. A detector and its twin (e.g. smoothed_<det> and <det>) are always "
                  "compared."),
        Table(shown, whole="paired.csv"), Bullets(read_paired(table))])
