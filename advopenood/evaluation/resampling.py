"""The stratified bootstrap's draws and replicates (:mod:`advopenood.evaluation.intervals` re-exports them): a
cell's seeded index draws in bounded blocks (:func:`draws`), and the four OOD metrics of a block of resamples at
once on the grid of each side's distinct scores (:func:`replicates`; paired cells on the same draws,
:func:`paired_replicates`), exactly as :mod:`advopenood.evaluation.metrics` defines them."""
from __future__ import annotations

import hashlib
import math
from typing import Any, Iterable, Iterator, NamedTuple

import numpy as np

from advopenood.evaluation.metrics import TPR_LEVEL

DEFAULT_RESAMPLES = 2000
METRICS = ("fpr95", "auroc", "aupr_in", "aupr_out")
#: grid cells (resamples x a side's distinct scores) per block of :func:`replicates`: its arrays stay small (256 KiB)
BLOCK = 1 << 15
#: index draws held at once per side by :func:`draws` (int32: 8 MiB), whatever the resample count
DRAW_BLOCK = 1 << 21


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
