"""95 % intervals on OOD metrics and on shares: the stratified percentile bootstrap, DeLong, Wilson.

Every table that writes a metric ``m`` writes ``m_lo`` and ``m_hi`` right after it and a ``ci`` column naming the
method (:func:`ci_label`). The plan's ``ci`` section (``method``: ``bootstrap`` | ``delong`` | ``none``,
``resamples``) chooses it; the run seed and a stable key of the cell (:func:`cell_key`) seed the resamples
(:func:`generator`), so ``advopenood verify`` draws the same ones.

* **bootstrap** (default): Efron and Tibshirani (1993), "An Introduction to the Bootstrap", ch. 13, the percentile
  interval; stratified: the ID and the OOD side are resampled separately, each with replacement at its own size
  (:func:`draws`, in blocks whose memory does not grow with the resamples). Paired arrays (an attacked image and
  its clean twin, the two sides of a robust AUROC) are resampled with the same index draws
  (:func:`paired_replicates`). The four metrics of a block of resamples are computed at once on the grid of each
  side's distinct scores (:func:`replicates`), exactly as :mod:`advopenood.evaluation.metrics` defines them
  (sklearn's ``roc_curve`` with its dropped intermediate points for FPR95, trapezoidal AUPR over
  ``precision_recall_curve``).
* **delong**: DeLong, DeLong and Clarke-Pearson (1988), the analytic AUROC interval
  (:func:`advopenood.evaluation.metrics.auroc_interval`); FPR95 and AUPR have no analytic interval and are left
  empty under it (their ``ci`` stays ``delong``, which covers AUROC only).
* **wilson**: Wilson (1927), "Probable inference, the law of succession, and statistical inference", the score
  interval on a share (:func:`wilson`), for the attack success rates of ``asr.csv``.

**At a bound** (:func:`at_bound`, :func:`bound_rule`): a percentile interval that reaches 0 or 100, or collapses to
a point because every resample gives the same value (an AUROC of 0 or 100: each resample of a perfectly separated
cell is perfectly separated), undercovers (over 2,000 simulated 32 + 32 cells at a true AUROC of 2 %, the percentile
interval covers it 85 % of the time, and never when the estimate is 0). There, and for a DeLong interval at a bound
(its variance is 0 at AUROC 0 or 100), the cell states a method valid at the bound instead and the ``ci`` column names
it (``bootstrap-2000; at a bound: auroc newcombe``, :func:`bound_label`): an AUROC takes Newcombe's score interval
(:func:`auroc_score_interval`), an FPR95 Wilson's on the share of the ID images above the threshold, and an AUPR
whose resamples all agree has no interval (``aupr_in none``): no boundary-valid method for it is established.

A cell with fewer than :data:`MIN_PER_SIDE` images on a side gets empty interval cells and the reason
(:func:`metric_intervals`).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, NamedTuple, Sequence

import numpy as np

from advopenood.evaluation.bounds import (AT_BOUND, BOUND_TOL, at_bound, auroc_score_interval,  # noqa: F401
                                         bootstrap_p, bound_label, bound_rule, holm, metric_kind, wilson)
from advopenood.evaluation.intervalstore import IntervalStore
from advopenood.evaluation.metrics import (TPR_LEVEL, auroc, auroc_difference_interval, auroc_difference_p,
                                          auroc_interval, ood_metrics)

METHODS = ("bootstrap", "delong", "none")
DEFAULT_RESAMPLES = 2000
MIN_RESAMPLES = 100
MIN_PER_SIDE = 2
LEVEL = 0.95
METRICS = ("fpr95", "auroc", "aupr_in", "aupr_out")
#: grid cells (resamples x a side's distinct scores) per block of :func:`replicates`: its arrays stay small (256 KiB)
BLOCK = 1 << 15
#: index draws held at once per side by :func:`draws` (int32: 8 MiB), whatever the resample count
DRAW_BLOCK = 1 << 21


def ci_label(method: str, resamples: int = DEFAULT_RESAMPLES) -> str:
    """The ``ci`` column: ``bootstrap-<resamples>``, ``delong`` or ``none``."""
    return f"bootstrap-{resamples}" if method == "bootstrap" else method


def bound_columns(metrics: Iterable[str]) -> list[str]:
    """``[m, m_lo, m_hi, ...]`` for each metric: a table's columns with the interval right after each metric."""
    return [c for m in metrics for c in (m, f"{m}_lo", f"{m}_hi")]


def cell_key(*parts: object) -> str:
    """The stable string key of a table cell (e.g. ``cell_key("ood", detector, ood_set)``) that seeds its resamples."""
    return "|".join(str(p) for p in parts)


def cell_seed(seed: int, key: str) -> int:
    """A 64-bit seed derived from the run seed and a cell's key (SHA-256; the same on every machine)."""
    return int.from_bytes(hashlib.sha256(f"{int(seed)}\0{key}".encode()).digest()[:8], "little")


def generator(seed: int, key: str) -> np.random.Generator:
    """The cell's own generator (PCG64 seeded by :func:`cell_seed`)."""
    return np.random.default_rng(cell_seed(seed, key))


def draw(rng: np.random.Generator, n_id: int, n_ood: int, resamples: int) -> tuple[np.ndarray, np.ndarray]:
    """Stratified resample indices all at once: ``(resamples, n_id)`` into the ID side, then ``(resamples, n_ood)``
    into the OOD side, each uniform with replacement. For plugins written against it; its memory grows with the
    resamples, so the built-ins use :func:`draws` (the same numbers from :func:`generator`, in blocks)."""
    return rng.integers(0, n_id, (resamples, n_id)), rng.integers(0, n_ood, (resamples, n_ood))


def draws(seed: int, key: str, n_id: int, n_ood: int, resamples: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The cell's stratified resample indices (int32), in blocks of rows ``(idx_id, idx_ood)``: concatenated, they
    are the ``(resamples, n_id)`` ID indices that :func:`generator` ``(seed, key)`` draws first, each uniform with
    replacement, and the ``(resamples, n_ood)`` OOD indices it draws next (in this order, so a re-derivation draws
    the same). A block holds at most :data:`DRAW_BLOCK` indices a side, so memory does not grow with the resamples;
    when the ID draws span several blocks, a second generator draws them first and drops them to reach the OOD
    draws (a generator's stream does not depend on how its draws are split into calls)."""
    rows = max(1, DRAW_BLOCK // max(n_id, n_ood, 1))
    sizes = [min(rows, resamples - start) for start in range(0, resamples, rows)]
    rng_id = generator(seed, key)
    rng_ood = rng_id if len(sizes) == 1 else generator(seed, key)
    if rng_ood is not rng_id:
        for size in sizes:
            rng_ood.integers(0, n_id, (size, n_id), dtype=np.int32)
    for size in sizes:  # a tuple is built left to right (the ID block first); no block is kept here
        yield (rng_id.integers(0, n_id, (size, n_id), dtype=np.int32),
               rng_ood.integers(0, n_ood, (size, n_ood), dtype=np.int32))


class _Cell(NamedTuple):
    """One cell's scores as ranks, computed once for all its resamples (:func:`_cell`)."""
    inv_id: np.ndarray  # each ID image's index among the ID side's distinct scores (ascending)
    inv_ood: np.ndarray  # each OOD image's index among the OOD side's distinct scores (ascending)
    id_le: np.ndarray  # per OOD distinct score: how many ID distinct scores are <= it (a row of the padded cumsum)
    id_lt: np.ndarray  # ... and < it
    ood_le: np.ndarray  # per ID distinct score: how many OOD distinct scores are <= it
    ood_lt: np.ndarray  # ... and < it
    pooled: np.ndarray  # per OOD distinct score: its rank among the pooled distinct scores
    id_at: np.ndarray  # per pooled distinct score: its index among the ID side's distinct scores, -1 if none
    ood_at: np.ndarray  # ... among the OOD side's
    need: int  # OOD draws at or below a score that make TPR >= 95 %: the least t with t / n_ood >= TPR_LEVEL


def _cell(conf_id: np.ndarray, conf_ood: np.ndarray) -> _Cell:
    """The ranks of a cell's pooled scores (infinities in their place: the metrics depend on order only) and each
    side's distinct scores placed among the other side's."""
    conf_id = np.asarray(conf_id, dtype=np.float64).ravel()
    conf_ood = np.asarray(conf_ood, dtype=np.float64).ravel()
    values, inv = np.unique(np.concatenate([conf_id, conf_ood]), return_inverse=True)
    u_id, inv_id = np.unique(inv.ravel()[:len(conf_id)], return_inverse=True)
    u_ood, inv_ood = np.unique(inv.ravel()[len(conf_id):], return_inverse=True)
    at = np.full((2, len(values)), -1)
    at[0, u_id], at[1, u_ood] = np.arange(len(u_id)), np.arange(len(u_ood))
    n = len(conf_ood)
    need = min(t for t in (math.ceil(TPR_LEVEL * n) + d for d in (-1, 0, 1)) if t / n >= TPR_LEVEL) if n else 0
    return _Cell(inv_id.ravel(), inv_ood.ravel(), np.searchsorted(u_id, u_ood, "right"),
                 np.searchsorted(u_id, u_ood, "left"), np.searchsorted(u_ood, u_id, "right"),
                 np.searchsorted(u_ood, u_id, "left"), u_ood, at[0], at[1], need)


def _counts(inv: np.ndarray, idx: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Per resample (a column: the grid is transposed so that cumulative sums run down contiguous rows), the drawn
    images at each of ``size`` distinct scores and the cumulative counts with a leading 0 row: ``(counts (size,
    rows), below (size + 1, rows))`` in float64, ``below[j]`` = the draws under distinct score ``j``."""
    rows = idx.shape[0]
    flat = np.take((inv * rows).astype(np.intp), idx)  # bincount counts intp without a copy
    flat += np.arange(rows)[:, None]
    counts = np.bincount(flat.ravel(), minlength=size * rows).reshape(size, rows)
    below = np.zeros((size + 1, rows), dtype=np.intp)
    np.cumsum(counts, axis=0, out=below[1:])  # summed as integers: exact, and several times faster than floats
    return counts.astype(np.float64), below.astype(np.float64)


def _weighted_counts(inv: np.ndarray, weights: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_counts` of a weighted draw: ``weights[b, i]`` copies of image ``i`` in resample ``b`` (the times its
    shared source image was drawn, :func:`shared_id_replicates`)."""
    rows = weights.shape[0]
    flat = (inv * rows).astype(np.intp)[None, :] + np.arange(rows)[:, None]
    counts = np.bincount(flat.ravel(), weights=weights.ravel().astype(np.float64), minlength=size * rows)
    counts = counts.reshape(size, rows)
    below = np.zeros((size + 1, rows))
    np.cumsum(counts, axis=0, out=below[1:])
    return counts, below


def _need(n: np.ndarray) -> np.ndarray:
    """``_Cell.need`` per resample of a weighted draw with ``n`` OOD copies (0 where ``n`` is 0)."""
    n = np.asarray(n, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        first = np.ceil(TPR_LEVEL * n) - 1
        return np.where(n == 0, 0.0, np.where(first / n >= TPR_LEVEL, first,
                                              np.where((first + 1) / n >= TPR_LEVEL, first + 1, first + 2)))


def _pr_area(g: np.ndarray, tp: np.ndarray, fp: np.ndarray, tp_prev: np.ndarray, fp_prev: np.ndarray,
             positives: int) -> np.ndarray:
    """Trapezoidal area under the precision-recall curve per column (sklearn's ``precision_recall_curve`` with its
    start point recall 0, precision 1; ``auc``): only the distinct scores where positives were drawn (``g`` of them)
    add area, ``g / P * (precision + the previous point's precision) / 2``, the previous point holding the draws
    beyond this score. With precision ``1 - fp / (tp + fp)`` (1 where nothing is counted yet, the start point) and
    ``sum(g) = P`` that is ``1 - sum(g * (fp / (tp + fp) + fp_prev / (tp_prev + fp_prev))) / (2 P)``."""
    share = np.add(tp, fp)
    np.maximum(share, 1.0, out=share)
    np.divide(fp, share, out=share)
    prev = np.add(tp_prev, fp_prev)
    np.maximum(prev, 1.0, out=prev)
    np.divide(fp_prev, prev, out=prev)
    share += prev
    return 1.0 - np.einsum("ij,ij->j", g, share) / (2.0 * positives)


def _block(cell: _Cell, idx_id: np.ndarray, idx_ood: np.ndarray, wanted: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The ``wanted`` metrics (percent) of one block of resamples (rows of ``idx_id`` / ``idx_ood``)."""
    n_id, n_ood = idx_id.shape[1], idx_ood.shape[1]
    g_id, id_below = _counts(cell.inv_id, idx_id, len(cell.ood_le))
    g_ood, ood_below = _counts(cell.inv_ood, idx_ood, len(cell.id_le))
    return _block_metrics(cell, g_id, id_below, g_ood, ood_below, n_id, n_ood, cell.need, wanted)


def _block_metrics(cell: _Cell, g_id: np.ndarray, id_below: np.ndarray, g_ood: np.ndarray, ood_below: np.ndarray,
                   n_id: Any, n_ood: Any, need: Any, wanted: tuple[str, ...]) -> dict[str, np.ndarray]:
    """:func:`_block` from each side's counts per resample (:func:`_counts` or :func:`_weighted_counts`); ``n_id``,
    ``n_ood``, ``need``: numbers, or one per resample (a weighted draw's size varies)."""
    id_le, id_lt = id_below[cell.id_le], id_below[cell.id_lt]  # ID draws <= / < each OOD distinct score
    out = {}
    if "auroc" in wanted:  # OOD images times the ID images above them, ties counting half
        below = np.einsum("ij,ij->j", g_ood, id_le + id_lt) / 2.0
        out["auroc"] = 100.0 * (n_id * n_ood - below) / (n_id * n_ood)
    if "fpr95" in wanted:
        out["fpr95"] = 100.0 * _fpr95(cell, g_id, g_ood, ood_below, id_le, id_lt, n_id, need)
    if "aupr_out" in wanted:  # OOD positive, thresholds from the lowest confidence up
        out["aupr_out"] = 100.0 * _pr_area(g_ood, ood_below[1:], id_le, ood_below[:-1], id_lt, n_ood)
    if "aupr_in" in wanted:  # ID positive, thresholds from the highest confidence down: draws at or above
        id_above, ood_above = n_id - id_below, n_ood - ood_below
        out["aupr_in"] = 100.0 * _pr_area(g_id, id_above[:-1], ood_above[cell.ood_lt], id_above[1:],
                                          ood_above[cell.ood_le], n_id)
    return out


def _fpr95(cell: _Cell, g_id: np.ndarray, g_ood: np.ndarray, ood_below: np.ndarray, id_le: np.ndarray,
           id_lt: np.ndarray, n_id: Any, need: Any) -> np.ndarray:
    """``fpr[argmax(tpr >= 0.95)]`` of sklearn's ``roc_curve(is_ood, -conf)`` per resample (a column). Its points
    are the drawn distinct scores in increasing confidence; one is kept when it is the first or the last drawn, or
    its step ``(d fp, d tp)`` differs from the next drawn score's (``drop_intermediate``); the answer is the first
    kept point at or after the score where ``need`` OOD draws are reached (TPR >= 95 %; ``cell.need``, or one per
    resample for a weighted draw). The points dropped
    after that score repeat its step, so the answer's false positives are that score's plus its ID draws once per
    dropped point: a walk only where the score has ID draws and is not the first drawn."""
    cols = np.arange(g_id.shape[1])
    at = np.sum(ood_below[1:] < need, axis=0)
    fp, under = id_le[at, cols], id_lt[at, cols]
    walk = np.flatnonzero((fp > under) & (under + ood_below[at, cols] > 0))
    step_id, step_ood, p = fp[walk] - under[walk], g_ood[at[walk], walk], cell.pooled[at[walk]]
    while len(walk):  # each walking resample's next pooled distinct score; past the last one, the point is kept
        p = p + 1
        inside = p < len(cell.id_at)
        i, o = cell.id_at[np.where(inside, p, 0)], cell.ood_at[np.where(inside, p, 0)]
        c_id, c_ood = np.where(i >= 0, g_id[i, walk], 0), np.where(o >= 0, g_ood[o, walk], 0)
        same = inside & (c_id == step_id) & (c_ood == step_ood)
        fp[walk[same]] += step_id[same]  # that point is dropped: the answer moves on to the next drawn one
        going = same | (inside & (c_id + c_ood == 0))
        walk, step_id, step_ood, p = walk[going], step_id[going], step_ood[going], p[going]
    return fp / n_id


def replicates(conf_id: np.ndarray, conf_ood: np.ndarray, idx_id: np.ndarray, idx_ood: np.ndarray,
               metrics: Iterable[str] = METRICS) -> dict[str, np.ndarray]:
    """Each metric (percent) on every resample: row ``b`` scores ``conf_id[idx_id[b]]`` against
    ``conf_ood[idx_ood[b]]``. No NaN confidences (the caller checks).

    Vectorised over blocks of resamples (:data:`BLOCK`) on each side's distinct scores (:func:`_cell`): per resample
    the drawn images at each distinct score and their cumulative counts (a counting sort by ``bincount``); AUROC is
    the Mann-Whitney statistic with half credit for ties (equal to the trapezoidal ROC area), FPR95 and AUPR follow
    sklearn's curves (:func:`_fpr95`, :func:`_pr_area`), exactly as :mod:`advopenood.evaluation.metrics`
    defines them.
    """
    return _replicates(_cell(conf_id, conf_ood), idx_id, idx_ood, tuple(metrics))


def _replicates(cell: _Cell, idx_id: np.ndarray, idx_ood: np.ndarray, wanted: tuple[str, ...]
                ) -> dict[str, np.ndarray]:
    """:func:`replicates` of a prepared cell, :data:`BLOCK` grid cells a side at a time."""
    rows = max(1, BLOCK // max(len(cell.ood_lt), len(cell.id_lt)))
    parts = [_block(cell, idx_id[s:s + rows], idx_ood[s:s + rows], wanted) for s in range(0, len(idx_id), rows)]
    return {m: np.concatenate([p[m] for p in parts]) if parts else np.empty(0) for m in wanted}


def paired_replicates(cells: list[tuple[np.ndarray, np.ndarray]], seed: int, key: str,
                      resamples: int = DEFAULT_RESAMPLES, metrics: Iterable[str] = METRICS
                      ) -> list[dict[str, np.ndarray]]:
    """:func:`replicates` of each cell on the same resamples, the cell's :func:`draws` ``(seed, key)`` block by
    block: every cell's ID array has one length and is indexed by the same ID draws, likewise its OOD array (image
    ``i`` of each is the same image, e.g. clean and attacked; robust AUROC, a detector and its twin). Differences
    of the returned replicates give paired intervals. One cell alone is the unpaired bootstrap."""
    n_id, n_ood = {len(c[0]) for c in cells}, {len(c[1]) for c in cells}
    if not cells:
        return []
    if len(n_id) != 1 or len(n_ood) != 1:
        raise ValueError(f"paired cells need one ID and one OOD length; got {sorted(n_id)} and {sorted(n_ood)}")
    wanted = tuple(metrics)
    prepared = [_cell(*c) for c in cells]
    parts: list[list[dict[str, np.ndarray]]] = [[] for _ in cells]
    for idx_id, idx_ood in draws(seed, key, n_id.pop(), n_ood.pop(), resamples):
        for cell, part in zip(prepared, parts):
            part.append(_replicates(cell, idx_id, idx_ood, wanted))
        del idx_id, idx_ood  # one block held at a time: dropped before the next is drawn
    return [{m: np.concatenate([p[m] for p in part]) if part else np.empty(0) for m in wanted} for part in parts]


def percentile(values: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """The percentile interval of bootstrap replicates (Efron and Tibshirani 1993, eq. 13.5; linear quantiles)."""
    lo, hi = np.percentile(values, [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)


def too_few(n_id: int, n_ood: int) -> str:
    """The reason a cell has no interval ("" when it has enough images on each side)."""
    if min(n_id, n_ood) >= MIN_PER_SIDE:
        return ""
    return (f"no interval: {n_id} ID and {n_ood} OOD images (an interval needs at least {MIN_PER_SIDE} per side)")


def empty_bounds(metrics: Iterable[str] = METRICS) -> dict[str, float]:
    """NaN ``<m>_lo`` / ``<m>_hi`` for each metric."""
    return {f"{m}_{end}": math.nan for m in metrics for end in ("lo", "hi")}


def metric_intervals(conf_id: np.ndarray, conf_ood: np.ndarray, method: str, seed: int, key: str,
                     resamples: int = DEFAULT_RESAMPLES) -> tuple[dict[str, float], dict[str, np.ndarray], str]:
    """:meth:`IntervalPolicy.cell` of a policy of ``(method, resamples, seed)`` without a store, for plugins written
    against it: ``(bounds, replicates, reason)`` of one cell."""
    return IntervalPolicy(method, resamples, seed).cell(key, conf_id, conf_ood)


class ImageSource(NamedTuple):
    """Where a set's OOD-side images come from, for a mean over sets that share them
    (:func:`shared_id_replicates`): ``pool`` names the images (``"id"``: the ID images, the mean's ID side; else a
    natural set's name), ``size`` their number, ``rows[r]`` the pool image of the set's row ``r`` (an attacked set's
    row ``i`` is its source's row ``i``; only its positives where a mask selects them)."""
    pool: str
    size: int
    rows: np.ndarray


def image_sources(names: Iterable[str], source_of: Mapping[str, str], sizes: Mapping[str, int],
                  masks: Mapping[str, np.ndarray | None], lengths: Mapping[str, int]) -> dict[str, ImageSource]:
    """The :class:`ImageSource` of each set of a mean: an attacked set's source (``source_of``: set -> ``"id"`` or
    the natural set it attacked, as ``run.json``'s ``attacks.<set>.source``), a natural set its own; ``sizes``: each
    pool's image count (``"id"`` and every natural set), ``masks``: the set's positive rows (None: every row),
    ``lengths``: each set's rows. A set whose rows cannot be its source's (more rows than the source holds) is
    its own pool (drawn apart, as it is in its own cell)."""
    out = {}
    for name in names:
        pool, mask = source_of.get(name, name), masks.get(name)
        rows = np.arange(lengths[name]) if mask is None else np.flatnonzero(mask)
        size = sizes.get(pool)
        if size is None or lengths[name] > size:
            pool, size, rows = name, len(rows), np.arange(len(rows))
        out[name] = ImageSource(pool, int(size), rows)
    return out


def _identity(source: ImageSource, n: int) -> bool:
    """Whether a set's rows are its pool's images in order, all of them (its draws are the pool's draws)."""
    return source.size == n and bool(np.array_equal(source.rows, np.arange(n)))


def _weighted_replicates(cell: _Cell, idx_id: np.ndarray, w_ood: np.ndarray, wanted: tuple[str, ...]
                         ) -> dict[str, np.ndarray]:
    """:func:`replicates` of a prepared cell whose OOD side is a weighted draw (``w_ood[b, r]`` copies of row ``r``;
    NaN in a resample that drew none of its rows), :data:`BLOCK` grid cells a side at a time."""
    rows = max(1, BLOCK // max(len(cell.ood_lt), len(cell.id_lt)))
    parts = []
    for s in range(0, len(idx_id), rows):
        ids, w = idx_id[s:s + rows], w_ood[s:s + rows]
        g_id, id_below = _counts(cell.inv_id, ids, len(cell.ood_le))
        g_ood, ood_below = _weighted_counts(cell.inv_ood, w, len(cell.id_le))
        n_ood = w.sum(axis=1).astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            got = _block_metrics(cell, g_id, id_below, g_ood, ood_below, ids.shape[1], n_ood, _need(n_ood), wanted)
        parts.append({m: np.where(n_ood > 0, v, math.nan) for m, v in got.items()})
    return {m: np.concatenate([p[m] for p in parts]) if parts else np.empty(0) for m in wanted}


def shared_id_replicates(conf_id: np.ndarray, oods: dict[str, np.ndarray], seed: int, key: str,
                         resamples: int = DEFAULT_RESAMPLES, metrics: Iterable[str] = METRICS,
                         sources: Mapping[str, ImageSource] | None = None) -> list[dict[str, np.ndarray]]:
    """Each set's replicates (in the order of ``oods``: set name -> its OOD confidences) for a mean over sets that
    share images (a detector's near / far / adversarial mean): replicate ``b`` resamples every image ONCE for every
    set that holds it, each with replacement at its pool's size. The ID images: the ``(resamples, n_id)`` draws of
    :func:`generator` ``(seed, key)``. The OOD side: each set's :class:`ImageSource` (``sources``; a set not in it is
    its own pool, named after it, all its rows) names its pool; a pool's images are drawn with generator
    ``(seed, key|<pool>)``, once for all the sets it feeds (several attacks on one natural set, the clean set beside
    its attacked forms), and pool ``"id"`` takes the ID side's draws (an ID->ID set's positives are ID images).
    A set whose rows are its whole pool in order takes the pool's draws as they are; one that holds only some of
    them (its positives) holds each drawn copy of its rows (a weighted draw, so its size varies; NaN in a replicate
    that drew none of them). The mean of the sets' replicates ``b`` is then a replicate of the mean: drawing
    shared images apart per set would treat the sets as independent samples, and the mean's interval would be
    narrower than its sampling variation. Drawn a block of rows at a time (:data:`DRAW_BLOCK`)."""
    conf_id = np.asarray(conf_id, dtype=np.float64).ravel()
    names, n_id = list(oods), len(conf_id)
    arrays = [np.asarray(o, dtype=np.float64).ravel() for o in oods.values()]
    given = dict(sources or {})
    of = [given.get(name) or ImageSource(str(name), len(o), np.arange(len(o))) for name, o in zip(names, arrays)]
    for name, src, o in zip(names, of, arrays):
        if len(src.rows) != len(o) or (src.pool == "id" and src.size != n_id) or \
                (len(o) and (src.rows.min() < 0 or src.rows.max() >= src.size)):
            raise ValueError(f"set {name!r}: its source rows do not index its pool {src.pool!r} of {src.size} images")
    pools = {src.pool: src.size for src in of if src.pool != "id"}
    wanted = tuple(metrics)
    prepared = [_cell(conf_id, o) for o in arrays]
    rng_id = generator(seed, key)
    rng_pool = {pool: generator(seed, f"{key}|{pool}") for pool in pools}
    rows = max(1, DRAW_BLOCK // max([n_id, *pools.values()]))
    parts: list[list[dict[str, np.ndarray]]] = [[] for _ in arrays]
    for start in range(0, resamples, rows):
        size = min(rows, resamples - start)
        drawn = {"id": rng_id.integers(0, n_id, (size, n_id), dtype=np.int32)}
        drawn.update({pool: rng.integers(0, pools[pool], (size, pools[pool]), dtype=np.int32)
                      for pool, rng in rng_pool.items()})
        copies: dict[str, np.ndarray] = {}
        for cell, src, ood, part in zip(prepared, of, arrays, parts):
            if _identity(src, len(ood)):
                part.append(_replicates(cell, drawn["id"], drawn[src.pool], wanted))
                continue
            if src.pool not in copies:  # how often each pool image was drawn, per resample
                idx = drawn[src.pool]
                flat = (idx + (np.arange(size) * src.size)[:, None]).ravel()
                copies[src.pool] = np.bincount(flat, minlength=size * src.size).reshape(size, src.size)
            part.append(_weighted_replicates(cell, drawn["id"], copies[src.pool][:, src.rows], wanted))
    return [{m: np.concatenate([p[m] for p in part]) if part else np.empty(0) for m in wanted} for part in parts]


def shared_mean_replicates(conf_id: np.ndarray, oods: dict[str, np.ndarray], seed: int, key: str,
                           resamples: int = DEFAULT_RESAMPLES, metrics: Iterable[str] = METRICS,
                           sources: Mapping[str, ImageSource] | None = None) -> dict[str, np.ndarray]:
    """The replicates of the mean over ``oods`` (:func:`shared_id_replicates`), one per resample (NaN where a set
    drew none of its rows: its metric is undefined there; the same resamples for every detector, so the replicates
    of two detectors' means are paired)."""
    reps = shared_id_replicates(conf_id, oods, seed, key, resamples, metrics, sources)
    return {m: np.mean([r[m] for r in reps], axis=0) for m in tuple(metrics)}


def mean_interval(parts: list[np.ndarray]) -> tuple[float, float]:
    """The interval of a group mean (OpenOOD's near/far rows): each set's replicates were drawn independently, so
    replicate ``b`` of the mean is the mean of the sets' replicates ``b`` (NaN when a set has none)."""
    if not parts or any(len(p) == 0 for p in parts):
        return math.nan, math.nan
    return percentile(np.mean(np.stack(parts), axis=0))


@dataclass(frozen=True)
class IntervalPolicy:
    """The run's one interval policy (``ctx.intervals``): every "interval of this cell" request of the writers.

    Built from the plan's ``ci`` section and the run seed by :meth:`of`; it owns the bootstrap recipe (the cell's
    seeded :func:`draws`, :func:`replicates` on them, :func:`percentile`), once: :meth:`cell` (one cell's four
    metrics: bootstrap, DeLong or none), :meth:`paired` (cells resampled with the same draws), :meth:`interval`,
    :meth:`mean` (a group mean's), :meth:`difference` (a paired AUROC difference: bootstrap or DeLong) and
    :meth:`wilson` (a share's). With a ``store`` (:class:`~advopenood.evaluation.intervalstore.IntervalStore`), the
    replicates of every bootstrap request are stored under their cell key and score digests and read back instead of
    resampled; the numbers are the same either way."""

    method: str = "none"
    resamples: int = DEFAULT_RESAMPLES
    seed: int = 0
    store: IntervalStore | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, ci: Any, seed: int, store: IntervalStore | None = None) -> "IntervalPolicy":
        """The policy of a plan's ``ci`` section (``method``, ``resamples``) and the run seed; ``ci`` None: none."""
        if ci is None:
            return cls(store=store)
        return cls(str(ci.method), int(ci.resamples), int(seed), store)

    @property
    def label(self) -> str:
        """The ``ci`` column (:func:`ci_label`)."""
        return ci_label(self.method, self.resamples)

    @property
    def bootstrap(self) -> bool:
        return self.method == "bootstrap"

    def paired(self, key: str, cells: Sequence[Cell], metrics: Iterable[str] = METRICS) -> list[dict[str, np.ndarray]]:
        """:func:`paired_replicates` of ``cells`` on the draws of ``(seed, key)`` (one cell: the unpaired bootstrap),
        read from the store when it holds them, else resampled and stored."""
        wanted, cells = tuple(metrics), list(cells)
        if self.store is None or not cells:
            return paired_replicates(cells, self.seed, key, self.resamples, wanted)
        entry = self.store.key(key, "bootstrap", self.resamples, self.seed, wanted, cells)
        got = self.store.load(entry, len(cells), wanted, self.resamples)
        if got is None:
            got = paired_replicates(cells, self.seed, key, self.resamples, wanted)
            self.store.save(entry, got)
        return got

    def cell(self, key: str, conf_id: np.ndarray, conf_ood: np.ndarray
             ) -> tuple[dict[str, float], dict[str, np.ndarray], str]:
        """``(bounds, replicates, reason)`` of one cell: ``<m>_lo`` / ``<m>_hi`` in percent for the four metrics,
        the bootstrap replicates (empty unless the method is ``bootstrap``; a group mean averages them,
        :meth:`mean`) and why the bounds are empty ("" when they are not, or under ``none``).

        ``bootstrap``: :meth:`paired` of the one cell, :func:`percentile`. ``delong``: AUROC only
        (:func:`~advopenood.evaluation.metrics.auroc_interval`); the other bounds stay empty. At a bound, the method
        :func:`bound_rule` names (:meth:`labelled_cell` also gives the ``ci`` label that says so)."""
        bounds, reps, reason, _ = self.labelled_cell(key, conf_id, conf_ood)
        return bounds, reps, reason

    def labelled_cell(self, key: str, conf_id: np.ndarray, conf_ood: np.ndarray
                      ) -> tuple[dict[str, float], dict[str, np.ndarray], str, str]:
        """:meth:`cell` and the cell's ``ci`` column: :attr:`label`, with the metrics whose interval reached a bound
        and the method they took instead (:func:`bound_rule`, :func:`bound_label`)."""
        conf_id = np.asarray(conf_id, dtype=np.float64).ravel()
        conf_ood = np.asarray(conf_ood, dtype=np.float64).ravel()
        bounds = empty_bounds()
        if self.method == "none":
            return bounds, {}, "", self.label
        reason = too_few(len(conf_id), len(conf_ood))
        if reason or np.isnan(conf_id).any() or np.isnan(conf_ood).any():
            return bounds, {}, reason, self.label
        reps: dict[str, np.ndarray] = {}
        if self.method == "delong":
            lo, hi = auroc_interval(conf_id, conf_ood)
            bounds.update(auroc_lo=100.0 * lo, auroc_hi=100.0 * hi)
        else:
            reps = self.paired(key, [(conf_id, conf_ood)])[0]
            for m, values in reps.items():
                bounds[f"{m}_lo"], bounds[f"{m}_hi"] = percentile(values)
        values = ood_metrics(conf_id, conf_ood)
        methods = {}
        for m in METRICS:
            bounds[f"{m}_lo"], bounds[f"{m}_hi"], methods[m] = bound_rule(
                m, values[m], bounds[f"{m}_lo"], bounds[f"{m}_hi"], len(conf_id), len(conf_ood))
        return bounds, reps, "", bound_label(self.label, methods)

    def interval(self, values: np.ndarray) -> tuple[float, float]:
        """The percentile interval of replicates (:func:`percentile`)."""
        return percentile(values)

    def mean(self, parts: list[np.ndarray]) -> tuple[float, float]:
        """A group mean's interval from its sets' replicates (:func:`mean_interval`)."""
        return mean_interval(parts)

    def shared_mean(self, key: str, conf_id: np.ndarray, oods: dict[str, np.ndarray],
                    metrics: Iterable[str] = ("fpr95", "auroc"), sources: Mapping[str, ImageSource] | None = None
                    ) -> dict[str, tuple[float, float]]:
        """``{metric: (lo, hi)}``: the interval of the mean over ``oods`` of a detector whose sets share the ID
        images ``conf_id`` and, by ``sources``, OOD images, from replicates that resample every shared image once
        for all sets (:func:`shared_id_replicates`; the percentiles of the replicates where every set drew some of
        its rows); NaN bounds when a set has too few images or NaN scores, or the method is not ``bootstrap``."""
        wanted = tuple(metrics)
        nan = {m: (math.nan, math.nan) for m in wanted}
        arrays = [np.asarray(conf_id, float).ravel(), *(np.asarray(o, float).ravel() for o in oods.values())]
        if not self.bootstrap or not oods or any(too_few(len(arrays[0]), len(o)) for o in arrays[1:]) or \
                any(np.isnan(a).any() for a in arrays):
            return nan
        got = shared_mean_replicates(arrays[0], oods, self.seed, key, self.resamples, wanted, sources)
        return {m: percentile(v[~np.isnan(v)]) if (~np.isnan(v)).any() else (math.nan, math.nan)
                for m, v in got.items()}

    def difference(self, cell_a: Cell, cell_b: Cell, reps_a: np.ndarray | None, reps_b: np.ndarray | None
                   ) -> tuple[float, float, str]:
        """``(lo, hi, reason)`` of ``AUROC_a - AUROC_b`` in points for two detectors on the same images: the
        percentile interval of the paired replicates' differences (``reps_a - reps_b``, from :meth:`paired`) or
        DeLong's paired test (:func:`~advopenood.evaluation.metrics.auroc_difference_interval`); NaN bounds and the
        reason when there is none (no reason under ``none``)."""
        nan = math.nan
        if self.method == "none":
            return nan, nan, ""
        if len(cell_a[0]) != len(cell_b[0]) or len(cell_a[1]) != len(cell_b[1]):
            return nan, nan, "no interval: the two detectors did not score the same images"
        reason = too_few(len(cell_a[0]), len(cell_a[1]))
        if reason:
            return nan, nan, reason
        if any(np.isnan(np.concatenate(c)).any() for c in (cell_a, cell_b)):
            return nan, nan, "no interval: NaN scores"
        if self.method == "delong":
            lo, hi = auroc_difference_interval(*cell_a, *cell_b)
            return 100.0 * lo, 100.0 * hi, ""
        lo, hi = percentile(reps_a - reps_b)
        return lo, hi, ""

    def bounded_difference(self, cell_a: Cell, cell_b: Cell, reps_a: np.ndarray | None, reps_b: np.ndarray | None
                           ) -> tuple[float, float, str, str]:
        """``(lo, hi, reason, method)``: :meth:`difference`, except where its interval collapsed to a point (every
        resample gives the same difference, e.g. both AUROCs 0): then the MOVER / square-and-add interval (Newcombe
        1998, Stat. Med. 17:873-890, method 10; Zou and Donner 2008) from each AUROC's score interval
        (:func:`auroc_score_interval`), ``lo = d - sqrt((A_a - l_a)^2 + (u_b - A_b)^2)``, ``hi = d + sqrt((u_a -
        A_a)^2 + (A_b - l_b)^2)``, method ``mover`` (the two taken as independent: conservative for positively
        correlated detectors); method ``""`` otherwise."""
        lo, hi, reason = self.difference(cell_a, cell_b, reps_a, reps_b)
        if math.isnan(lo) or math.isnan(hi) or hi - lo > BOUND_TOL:
            return lo, hi, reason, ""
        (la, ua), (lb, ub) = (auroc_score_interval(100.0 * auroc(*c), len(c[0]), len(c[1])) for c in (cell_a, cell_b))
        a, b = 100.0 * auroc(*cell_a), 100.0 * auroc(*cell_b)
        return (a - b - math.hypot(a - la, ub - b), a - b + math.hypot(ua - a, b - lb), reason, "mover")

    def difference_p(self, cell_a: Cell, cell_b: Cell, reps_a: np.ndarray | None, reps_b: np.ndarray | None
                     ) -> float:
        """The two-sided p-value of ``AUROC_a = AUROC_b`` that :meth:`difference`'s interval inverts: the bootstrap
        one of the paired replicates' differences (:func:`bootstrap_p`) or DeLong's
        (:func:`~advopenood.evaluation.metrics.auroc_difference_p`); NaN where :meth:`difference` has no interval."""
        lo, _, _ = self.difference(cell_a, cell_b, reps_a, reps_b)
        if math.isnan(lo):
            return math.nan
        if self.method == "delong":
            return auroc_difference_p(*cell_a, *cell_b)
        return bootstrap_p(np.asarray(reps_a) - np.asarray(reps_b))

    def wilson(self, successes: int, n: int) -> tuple[float, float]:
        """:func:`wilson`'s interval on a share in percent; NaN under ``none``."""
        return (math.nan, math.nan) if self.method == "none" else wilson(successes, n)
