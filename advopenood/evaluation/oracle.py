"""The one independent checker of every metric and interval a run writes: what each ``verify`` hook re-derives with.

It is written apart from the writers (:mod:`advopenood.evaluation.metrics`, :mod:`advopenood.evaluation.intervals`
and the plugins) and imports none of them (an import-linter contract, ``oracle``, keeps it so), so that one bug
cannot hide in a table and in its check. The definitions are OpenOOD v1.5's (``openood/evaluators/metrics.py``):
a detector's confidence ``conf`` is higher for more in-distribution inputs, OOD is the positive class and the
decision score is ``-conf``; every metric is in percent.

* **AUROC**: the Mann-Whitney statistic on average ranks (Hanley and McNeil 1982),
  ``(R_id - n_id (n_id + 1) / 2) / (n_id n_ood)``: ties count one half, which equals the trapezoidal ROC area.
* **FPR95**: the false positive rate at the first ROC point whose true positive rate reaches 95 %, on the points
  ``sklearn.metrics.roc_curve`` keeps (``drop_intermediate``: a point whose step in false and true positives equals
  the next one's is dropped), built here from cumulative counts at each distinct score of the sorted sample.
* **AUPR-In / AUPR-Out**: the trapezoidal areas under the precision-recall points (``precision_recall_curve`` with
  its end point recall 0, precision 1) with ID / OOD positive, as OpenOOD's ``auc(recall, precision)``.
* **bootstrap**: the stratified percentile interval (2.5 and 97.5 % linear quantiles) over the run's resamples: the
  cell's seed is the first 8 bytes, little-endian, of SHA-256 of ``"<run seed>\\0<cell key>"``; a PCG64 generator
  seeded with it draws the ``(resamples, n_id)`` ID indices, then the ``(resamples, n_ood)`` OOD indices, uniform
  with replacement, drawn and used a block at a time (:func:`resample_blocks`). Each resample's metrics are read
  off its pooled images sorted by confidence (:func:`replicates`), a block of resamples at a time.
* **DeLong**: DeLong, DeLong and Clarke-Pearson (1988) from the pairwise comparison matrix ``psi`` (one row per
  OOD image, one column per ID image), for one AUROC and for the difference of two on the same images.
* **Wilson**: the 95 % score interval on a share as the roots of its quadratic (Wilson 1927).
* **At a bound** (:func:`at_bound`): an interval that collapsed to a point, or an AUROC's or FPR95's that reaches 0
  or 100, is replaced: an AUROC by Newcombe's (2006, method 5) score interval (:func:`newcombe`, its two roots found
  by :func:`scipy.optimize.brentq`), an FPR95 by Wilson's on its share of the ID images, an AUPR by none; the
  ``ci`` column names them (``bootstrap-2000; at a bound: auroc newcombe``, :func:`bound_label`).

Every verify hook asks :class:`IntervalPlan` (built from ``run.json`` by :meth:`IntervalPlan.of`) for a cell's
interval; it holds the checker's recipe (draws, replicates, percentiles) once, apart from the writers' policy
(:class:`advopenood.evaluation.intervals.IntervalPolicy`) so that one bug cannot hide in both.
"""
from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

# the rules that need no sample, re-exported (verify hooks read them as oracle.<name>)
from advopenood.evaluation.oracle_bounds import (LEVEL, _z, at_bound, bootstrap_p, bound_label, bounded, holm,
                                                newcombe, wilson)

METRICS = ("fpr95", "auroc", "aupr_in", "aupr_out")
TPR = 0.95
#: index draws per side that :func:`resample_blocks` holds at once (int64: 8 MiB a side)
HELD = 1_000_000
#: grid cells (resamples x pooled images) that :func:`replicates` sorts and reads at once
GRID = 1 << 16


def usable(conf_id: np.ndarray, conf_ood: np.ndarray) -> bool:
    """Whether both sides hold at least one confidence and none is NaN (otherwise every metric is NaN)."""
    return bool(len(conf_id) and len(conf_ood) and not np.isnan(conf_id).any() and not np.isnan(conf_ood).any())


def _arrays(conf_id: np.ndarray, conf_ood: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(conf_id, dtype=np.float64).ravel(), np.asarray(conf_ood, dtype=np.float64).ravel()


def _distinct(conf_id: np.ndarray, conf_ood: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each image's sort code: ``2 v`` for an ID image, ``2 v + 1`` for an OOD one, ``v`` the index of its
    confidence among the pooled confidences' distinct values (ascending)."""
    _, where = np.unique(np.concatenate([conf_id, conf_ood]), return_inverse=True)
    codes = 2 * where.ravel().astype(np.int64)
    codes[len(conf_id):] += 1
    return codes[:len(conf_id)], codes[len(conf_id):]


def _sorted_metrics(codes: np.ndarray, n_id: int, n_ood: int, wanted: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The ``wanted`` metrics in percent of each row of ``codes``: one sample's pooled sort codes
    (:func:`_distinct`), sorted ascending, so that a row lists its images from the lowest confidence up.

    A value's copies in a row are a run; its ROC / PR point sits at the run's last position, where the counts of ID
    and OOD images at or below the value are read off the row's cumulative sums (a value shared by several images is
    one point, as in sklearn). AUROC: the ID images' average ranks (a run at 1-based positions ``a..b`` gives each
    copy ``(a + b) / 2``), ``R_id - n_id (n_id + 1) / 2`` over ``n_id n_ood``. With OOD positive and score ``-conf``
    the points run from the lowest confidence up: true positives the OOD images at or below each value, false the
    ID ones; with ID positive and score ``conf`` they run from the highest down, counting the images at or above."""
    rows, n = codes.shape
    value = codes >> 1
    is_end = np.empty((rows, n), dtype=bool)  # the last position of each run
    np.not_equal(value[:, 1:], value[:, :-1], out=is_end[:, :-1])
    is_end[:, -1] = True
    per_row = is_end.sum(axis=1)
    start = np.zeros(rows, dtype=np.int64)  # each row's first point among the points, row after row
    np.cumsum(per_row[:-1], out=start[1:])
    ends = np.flatnonzero(is_end)
    col = ends - np.repeat(np.arange(rows) * n, per_row)
    ood = np.cumsum(codes & 1, axis=None)  # OOD images so far, over the rows laid end to end
    before_row = np.zeros(rows, dtype=np.int64)
    before_row[1:] = ood[n - 1:-1:n]
    tp = (ood[ends] - np.repeat(before_row, per_row)).astype(np.float64)  # OOD at or below the value
    fp = (col + 1) - tp  # ID at or below it
    first = np.zeros(len(ends), dtype=bool)
    first[start] = True
    last = np.zeros(len(ends), dtype=bool)
    last[start[1:] - 1] = True
    last[-1] = True
    fp_before, tp_before = _shifted(fp, 1, first), _shifted(tp, 1, first)
    out: dict[str, np.ndarray] = {}
    for metric in wanted:
        if metric == "auroc":
            col_before = _shifted(col.astype(np.float64), 1, first, -1.0)
            rank_sum = np.add.reduceat((fp - fp_before) * ((col_before + 1 + col) / 2.0 + 1.0), start)
            out[metric] = 100.0 * (rank_sum - n_id * (n_id + 1) / 2.0) / (n_id * n_ood)
        elif metric == "fpr95":  # sklearn's drop_intermediate keeps the first, the last and every bend
            bend = ((_shifted(fp, -1, last) - 2 * fp + fp_before != 0)
                    | (_shifted(tp, -1, last) - 2 * tp + tp_before != 0))
            ok = (bend | first | last) & (tp / n_ood >= TPR)
            chosen = np.flatnonzero(ok)
            chosen = chosen[np.searchsorted(chosen, start)]  # each row's first (its last point always qualifies)
            out[metric] = 100.0 * (fp[chosen] / n_id)
        elif metric == "aupr_out":  # each point after the one below it, from the start point (recall 0, precision 1)
            out[metric] = 100.0 * _pr_area(tp, fp, tp_before, fp_before, first, start, n_ood)
        elif metric == "aupr_in":  # from the highest value down: the images at or above a value
            out[metric] = 100.0 * _pr_area(n_id - fp_before, n_ood - tp_before, n_id - fp, n_ood - tp, last, start,
                                           n_id)
        else:
            raise ValueError(f"unknown metric {metric!r}; valid: {', '.join(METRICS)}")
    return out


def _shifted(values: np.ndarray, step: int, edge: np.ndarray, fill: float = 0.0) -> np.ndarray:
    """Each point's neighbour on its curve: ``values`` moved one place (``step`` 1: the point before, -1: the point
    after), ``fill`` where ``edge`` (a row's first or last point) has none."""
    out = np.empty_like(values)
    if step == 1:
        out[1:] = values[:-1]
    else:
        out[:-1] = values[1:]
    out[edge] = fill
    return out


def _pr_area(tp: np.ndarray, fp: np.ndarray, tp_prev: np.ndarray, fp_prev: np.ndarray, origin: np.ndarray,
             start: np.ndarray, positives: int) -> np.ndarray:
    """Per row (points ``start[r]`` on), the trapezoidal area under the precision-recall points: each point (recall
    ``tp / positives``, precision ``tp / (tp + fp)``) joined to the point before it on the curve (``tp_prev``,
    ``fp_prev``; the start point recall 0, precision 1 where ``origin``)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        precision_prev = np.where(origin, 1.0, tp_prev / (tp_prev + fp_prev))
    recall_prev = np.where(origin, 0.0, tp_prev / positives)
    area = (tp / positives - recall_prev) * (tp / (tp + fp) + precision_prev)
    return np.add.reduceat(area, start) / 2.0


def _metrics(conf_id: np.ndarray, conf_ood: np.ndarray, wanted: tuple[str, ...]) -> dict[str, float]:
    """The ``wanted`` metrics in percent of usable float arrays (:func:`_sorted_metrics` of their one row)."""
    codes = np.sort(np.concatenate(_distinct(conf_id, conf_ood)))[None]
    return {m: float(v[0]) for m, v in _sorted_metrics(codes, len(conf_id), len(conf_ood), wanted).items()}


def ood_metrics(conf_id: np.ndarray, conf_ood: np.ndarray, wanted: Iterable[str] = METRICS) -> dict[str, float]:
    """The ``wanted`` metrics (default all four) in percent; NaN when a side is empty or holds NaN."""
    conf_id, conf_ood = _arrays(conf_id, conf_ood)
    wanted = tuple(wanted)
    if not usable(conf_id, conf_ood):
        return {m: math.nan for m in wanted}
    return _metrics(conf_id, conf_ood, wanted)


def auroc(conf_id: np.ndarray, conf_ood: np.ndarray) -> float:
    """AUROC in percent (Mann-Whitney); NaN when a side is empty or holds NaN."""
    return ood_metrics(conf_id, conf_ood, ("auroc",))["auroc"]


def fpr95(conf_id: np.ndarray, conf_ood: np.ndarray) -> float:
    """FPR95 in percent (OpenOOD's); NaN when a side is empty or holds NaN."""
    return ood_metrics(conf_id, conf_ood, ("fpr95",))["fpr95"]


def cell_seed(seed: int, key: str) -> int:
    """A cell's 64-bit resampling seed: SHA-256 of ``"<seed>\\0<key>"``, its first 8 bytes as a little-endian
    unsigned integer."""
    digest = hashlib.sha256(str(int(seed)).encode() + b"\x00" + key.encode()).digest()
    return int(struct.unpack("<Q", digest[:8])[0])


def resample_blocks(seed: int, key: str, n_id: int, n_ood: int, resamples: int
                    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The cell's stratified draws in consecutive blocks of resamples ``(idx_id, idx_ood)``: the stream draws the
    ``(resamples, n_id)`` ID indices first, then the ``(resamples, n_ood)`` OOD indices. A second generator on the
    same seed first draws the ID indices block by block and drops them, to stand where the OOD draws begin; so at
    most :data:`HELD` indices a side are held, whatever the resample count (PCG64's stream does not depend on how
    its draws are split into calls)."""
    rows = max(1, HELD // max(n_id, n_ood, 1))
    ids = np.random.Generator(np.random.PCG64(cell_seed(seed, key)))
    oods = np.random.Generator(np.random.PCG64(cell_seed(seed, key)))
    for start in range(0, resamples, rows):
        oods.integers(0, n_id, size=(min(rows, resamples - start), n_id))
    for start in range(0, resamples, rows):
        size = min(rows, resamples - start)
        idx_id = ids.integers(0, n_id, size=(size, n_id))
        yield idx_id, oods.integers(0, n_ood, size=(size, n_ood))


def resample_indices(seed: int, key: str, n_id: int, n_ood: int, resamples: int) -> tuple[np.ndarray, np.ndarray]:
    """The cell's stratified draws all at once, ``(resamples, n_id)`` ID then ``(resamples, n_ood)`` OOD indices,
    for hooks written against it; its memory grows with the resamples (:func:`seeded_replicates` does not)."""
    rng = np.random.Generator(np.random.PCG64(cell_seed(seed, key)))
    idx_id = rng.integers(0, n_id, size=(resamples, n_id))
    return idx_id, rng.integers(0, n_ood, size=(resamples, n_ood))


def replicates(conf_id: np.ndarray, conf_ood: np.ndarray, idx_id: np.ndarray, idx_ood: np.ndarray,
               wanted: Iterable[str] = METRICS) -> dict[str, np.ndarray]:
    """The ``wanted`` metrics (percent) of every resample: row ``b`` scores ``conf_id[idx_id[b]]`` against
    ``conf_ood[idx_ood[b]]`` (usable arrays: no NaN). The resamples' pooled images are sorted a block of rows at a
    time (:data:`GRID` cells), each row one sample of :func:`_sorted_metrics`."""
    conf_id, conf_ood = _arrays(conf_id, conf_ood)
    wanted = tuple(wanted)
    code_id, code_ood = _distinct(conf_id, conf_ood)
    n_id, n_ood = idx_id.shape[1], idx_ood.shape[1]
    rows = max(1, GRID // max(n_id + n_ood, 1))
    parts = []
    for s in range(0, len(idx_id), rows):
        codes = np.concatenate([code_id[idx_id[s:s + rows]], code_ood[idx_ood[s:s + rows]]], axis=1)
        codes.sort(axis=1)
        parts.append(_sorted_metrics(codes, n_id, n_ood, wanted))
    return {m: np.concatenate([p[m] for p in parts]) if parts else np.empty(0) for m in wanted}


def seeded_replicates(cells: list[tuple[np.ndarray, np.ndarray]], seed: int, key: str, resamples: int,
                      wanted: Iterable[str] = METRICS) -> list[dict[str, np.ndarray]]:
    """:func:`replicates` of each cell on the seeded draws of ``(seed, key)`` (:func:`resample_blocks`), the same
    draws for every cell (they share one ID and one OOD length: paired cells)."""
    wanted = tuple(wanted)
    out = [{m: np.empty(resamples) for m in wanted} for _ in cells]
    done = 0
    if cells:
        for idx_id, idx_ood in resample_blocks(seed, key, len(cells[0][0]), len(cells[0][1]), resamples):
            for (conf_id, conf_ood), into in zip(cells, out):
                for m, values in replicates(conf_id, conf_ood, idx_id, idx_ood, wanted).items():
                    into[m][done:done + len(values)] = values
            done += len(idx_id)
    return out


def shared_mean_interval(conf_id: np.ndarray, oods: Mapping[str, np.ndarray], seed: int, key: str, resamples: int,
                         wanted: Iterable[str] = ("fpr95", "auroc"), sources: Mapping[str, Any] | None = None
                         ) -> dict[str, tuple[float, float]]:
    """The percentile interval of a mean over sets that share images (:func:`shared_mean_replicates`), over the
    replicates where the mean is defined (NaN bounds where none is)."""
    got = shared_mean_replicates(conf_id, oods, seed, key, resamples, wanted, sources)
    return {m: percentile_interval(v[~np.isnan(v)]) if (~np.isnan(v)).any() else (math.nan, math.nan)
            for m, v in got.items()}


def shared_mean_replicates(conf_id: np.ndarray, oods: Mapping[str, np.ndarray], seed: int, key: str, resamples: int,
                           wanted: Iterable[str] = ("fpr95", "auroc"), sources: Mapping[str, Any] | None = None
                           ) -> dict[str, np.ndarray]:
    """The bootstrap replicates of a mean over sets that share images: each resample draws the ID indices once for
    every set (PCG64 seeded by :func:`cell_seed` of ``key``) and each pool of OOD-side images once for every set it
    feeds (generator ``key|<pool>``). ``sources``: set -> ``(pool, pool size, rows)``, the pool image of each of the
    set's rows (pool ``"id"``: the ID images, drawn with the ID indices); a set without one is its own pool, named
    after it. A set whose rows are its whole pool in order is scored on the pool's indices; any other holds, in
    each resample, the drawn pool images that are its rows, as often as each was drawn (the resamples that hold
    the same number of rows scored together; NaN in one that holds none). The mean's replicate is the mean of the sets' metrics
    (:func:`replicates`), a block of at most :data:`HELD` indices a side at a time."""
    wanted = tuple(wanted)
    conf_id = np.asarray(conf_id, dtype=np.float64).ravel()
    names = list(oods)
    arrays = [np.asarray(oods[n], dtype=np.float64).ravel() for n in names]
    given = dict(sources or {})
    of = [tuple(given[n]) if n in given else (str(n), len(o), np.arange(len(o))) for n, o in zip(names, arrays)]
    pools = {pool: int(size) for pool, size, _ in of if pool != "id"}
    rows = max(1, HELD // max([len(conf_id), *pools.values()]))
    ids = np.random.Generator(np.random.PCG64(cell_seed(seed, key)))
    each = {pool: np.random.Generator(np.random.PCG64(cell_seed(seed, f"{key}|{pool}"))) for pool in pools}
    means: dict[str, list[np.ndarray]] = {m: [] for m in wanted}
    for start in range(0, resamples, rows):
        size = min(rows, resamples - start)
        drawn = {"id": ids.integers(0, len(conf_id), size=(size, len(conf_id)))}
        drawn.update({pool: g.integers(0, pools[pool], size=(size, pools[pool])) for pool, g in each.items()})
        got = []
        for o, (pool, pool_size, pool_rows) in zip(arrays, of):
            pool_rows = np.asarray(pool_rows)
            if pool_size == len(o) and np.array_equal(pool_rows, np.arange(len(o))):
                got.append(replicates(conf_id, o, drawn["id"], drawn[pool], wanted))
                continue
            where = np.full(int(pool_size), -1)
            where[pool_rows] = np.arange(len(o))
            held = where[drawn[pool]]  # each drawn pool image's row in the set, -1 when the set does not hold it
            count = (held >= 0).sum(axis=1)
            one = {m: np.full(size, math.nan) for m in wanted}
            for k in np.unique(count[count > 0]):  # the resamples that hold k rows, scored together
                chosen = count == k
                idx = np.sort(held[chosen], axis=1)[:, -k:]  # the held rows (the -1s sort first)
                for m, v in replicates(conf_id, o, drawn["id"][chosen], idx, wanted).items():
                    one[m][chosen] = v
            got.append(one)
        for m in wanted:
            means[m].append(sum(r[m] for r in got) / len(got))
    return {m: np.concatenate(v) for m, v in means.items()}


def percentile_interval(values: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """The percentile interval of bootstrap replicates: the linear-interpolation quantiles (Hyndman and Fan's
    type 7) at ``(1 - level) / 2`` and ``(1 + level) / 2``."""
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    ends = []
    for q in ((1 - level) / 2, (1 + level) / 2):
        h = (len(ordered) - 1) * q
        below = int(math.floor(h))
        above = min(below + 1, len(ordered) - 1)
        ends.append(float(ordered[below] + (h - below) * (ordered[above] - ordered[below])))
    return ends[0], ends[1]


def bootstrap_interval(conf_id: np.ndarray, conf_ood: np.ndarray, seed: int, key: str, resamples: int,
                       wanted: Iterable[str] = METRICS) -> tuple[dict[str, tuple[float, float]], dict[str, np.ndarray]]:
    """``({metric: (lo, hi)}, replicates)`` of one cell's seeded stratified bootstrap (usable arrays)."""
    reps = seeded_replicates([_arrays(conf_id, conf_ood)], seed, key, resamples, wanted)[0]
    return {m: percentile_interval(v) for m, v in reps.items()}, reps


def _psi(conf_id: np.ndarray, conf_ood: np.ndarray) -> np.ndarray:
    """The comparison matrix: ``psi[i, j] = 1`` when OOD image ``i`` looks less ID than ID image ``j``, 1/2 on a
    tie, else 0."""
    conf_id, conf_ood = _arrays(conf_id, conf_ood)
    return (conf_ood[:, None] < conf_id[None, :]) + 0.5 * (conf_ood[:, None] == conf_id[None, :])


def delong_interval(conf_id: np.ndarray, conf_ood: np.ndarray) -> tuple[float, float]:
    """DeLong's 95 % interval on the AUROC in percent, clipped to [0, 100]: ``V10`` the rows' and ``V01`` the
    columns' means of ``psi``, ``Var = var(V10) / n_ood + var(V01) / n_id`` (sample variances)."""
    psi = _psi(conf_id, conf_ood)
    v10, v01 = psi.mean(axis=1), psi.mean(axis=0)
    half = _z() * math.sqrt(np.var(v10, ddof=1) / len(v10) + np.var(v01, ddof=1) / len(v01))
    return 100.0 * max(0.0, psi.mean() - half), 100.0 * min(1.0, psi.mean() + half)


def delong_difference(cell_a: tuple[np.ndarray, np.ndarray], cell_b: tuple[np.ndarray, np.ndarray]
                      ) -> tuple[float, float]:
    """DeLong's 95 % interval on ``AUROC_a - AUROC_b`` in points, clipped to [-100, 100], for two detectors' cells
    ``(conf_id, conf_ood)`` on the same images: the variance of the contrast ``(1, -1)``."""
    psi_a, psi_b = _psi(*cell_a), _psi(*cell_b)
    d10, d01 = psi_a.mean(axis=1) - psi_b.mean(axis=1), psi_a.mean(axis=0) - psi_b.mean(axis=0)
    delta = psi_a.mean() - psi_b.mean()
    half = _z() * math.sqrt(np.var(d10, ddof=1) / len(d10) + np.var(d01, ddof=1) / len(d01))
    return 100.0 * max(-1.0, delta - half), 100.0 * min(1.0, delta + half)


def delong_difference_p(cell_a: tuple[np.ndarray, np.ndarray], cell_b: tuple[np.ndarray, np.ndarray]) -> float:
    """DeLong's two-sided p-value of equal AUROCs on the same images: ``erfc(|delta| / sqrt(2 Var))`` with the
    contrast's variance of :func:`delong_difference`; 1 (equal) or 0 (different) when that variance is 0."""
    psi_a, psi_b = _psi(*cell_a), _psi(*cell_b)
    d10, d01 = psi_a.mean(axis=1) - psi_b.mean(axis=1), psi_a.mean(axis=0) - psi_b.mean(axis=0)
    delta = float(psi_a.mean() - psi_b.mean())
    var = float(np.var(d10, ddof=1) / len(d10) + np.var(d01, ddof=1) / len(d01))
    if var <= 0:
        return 1.0 if delta == 0 else 0.0
    return math.erfc(abs(delta) / math.sqrt(2 * var))


Cell = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class IntervalPlan:
    """The run's intervals as the checker re-derives them: ``ci.method``, ``ci.resamples`` and the seed of
    ``run.json``'s config (:meth:`of`); every verify hook's "interval of this cell" goes here."""

    method: str = "none"
    resamples: int = 0
    seed: int = 0

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> "IntervalPlan":
        """The plan of a run's saved config (``none`` for a run written before intervals)."""
        ci = config.get("ci") or {}
        return cls(str(ci.get("method", "none")), int(ci.get("resamples", 0)), int(config.get("seed", 0)))

    @property
    def label(self) -> str:
        """The ``ci`` column: ``bootstrap-<resamples>``, ``delong`` or ``none``."""
        return f"bootstrap-{self.resamples}" if self.method == "bootstrap" else self.method

    @property
    def bootstrap(self) -> bool:
        return self.method == "bootstrap"

    def paired(self, key: str, cells: Sequence[Cell], wanted: Iterable[str] = METRICS) -> list[dict[str, np.ndarray]]:
        """:func:`seeded_replicates` of ``cells`` on the draws of ``(seed, key)``."""
        return seeded_replicates(list(cells), self.seed, key, self.resamples, wanted)

    def interval(self, values: np.ndarray) -> tuple[float, float]:
        """:func:`percentile_interval` of replicates."""
        return percentile_interval(values)

    def cell(self, key: str, conf_id: np.ndarray, conf_ood: np.ndarray
             ) -> tuple[dict[str, tuple[float, float]], dict[str, np.ndarray]]:
        """``({metric: (lo, hi)}, replicates)`` of one usable cell (at least 2 per side, no NaN): the bootstrap's
        four metrics (:func:`bootstrap_interval`), DeLong's AUROC only, nothing under ``none``."""
        if self.method == "delong":
            return {"auroc": delong_interval(conf_id, conf_ood)}, {}
        if self.method != "bootstrap":
            return {}, {}
        return bootstrap_interval(conf_id, conf_ood, self.seed, key, self.resamples)

    def difference(self, cell_a: Cell, cell_b: Cell, reps_a: np.ndarray | None = None,
                   reps_b: np.ndarray | None = None) -> tuple[float, float]:
        """The interval of ``AUROC_a - AUROC_b`` in points: the percentiles of the paired replicates' differences,
        or :func:`delong_difference`; NaN under ``none``."""
        if self.method == "bootstrap":
            return percentile_interval(np.asarray(reps_a) - np.asarray(reps_b))
        if self.method == "delong":
            return delong_difference(cell_a, cell_b)
        return math.nan, math.nan

    def bounded_difference(self, cell_a: Cell, cell_b: Cell, reps_a: np.ndarray | None = None,
                           reps_b: np.ndarray | None = None) -> tuple[float, float, str]:
        """``(lo, hi, method)``: :meth:`difference`, or where it is one point (to 1e-6 points) the square-and-add
        interval of the two AUROCs' :func:`newcombe` intervals (Newcombe 1998, method 10), method ``mover``."""
        lo, hi = self.difference(cell_a, cell_b, reps_a, reps_b)
        if math.isnan(lo) or math.isnan(hi) or abs(hi - lo) > 1e-6:
            return lo, hi, ""
        a, b = auroc(*cell_a), auroc(*cell_b)
        (la, ua), (lb, ub) = newcombe(a, len(cell_a[0]), len(cell_a[1])), newcombe(b, len(cell_b[0]), len(cell_b[1]))
        return (a - b - math.sqrt((a - la) ** 2 + (ub - b) ** 2), a - b + math.sqrt((ua - a) ** 2 + (b - lb) ** 2),
                "mover")

    def difference_p(self, cell_a: Cell, cell_b: Cell, reps_a: np.ndarray | None = None,
                     reps_b: np.ndarray | None = None) -> float:
        """The two-sided p-value of equal AUROCs: :func:`bootstrap_p` of the paired replicates' differences or
        :func:`delong_difference_p`; NaN under ``none``."""
        if self.method == "bootstrap":
            return bootstrap_p(np.asarray(reps_a) - np.asarray(reps_b))
        if self.method == "delong":
            return delong_difference_p(cell_a, cell_b)
        return math.nan

    def wilson(self, successes: int, n: int) -> tuple[float, float]:
        """:func:`wilson`'s interval in percent; NaN under ``none``."""
        return (math.nan, math.nan) if self.method == "none" else wilson(successes, n)
