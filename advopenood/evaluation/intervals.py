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

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

import numpy as np

from advopenood.evaluation.bounds import (AT_BOUND, BOUND_TOL, Cell, at_bound, auroc_score_interval,  # noqa: F401
                                         bootstrap_p, bound_label, bound_rule, holm, metric_kind, wilson)
from advopenood.evaluation.intervalstore import IntervalStore
from advopenood.evaluation.resampling import (  # noqa: F401  (re-exported: intervals.<name>)
    BLOCK, DEFAULT_RESAMPLES, DRAW_BLOCK, METRICS, cell_seed, draw, draws, generator, paired_replicates, replicates,
    _block_metrics, _Cell, _cell, _counts, _need, _replicates, _weighted_counts)
from advopenood.evaluation.metrics import (auroc, auroc_difference_interval, auroc_difference_p,
                                          auroc_interval, ood_metrics)

METHODS = ("bootstrap", "delong", "none")
MIN_RESAMPLES = 100
MIN_PER_SIDE = 2
LEVEL = 0.95


def ci_label(method: str, resamples: int = DEFAULT_RESAMPLES) -> str:
    """The ``ci`` column: ``bootstrap-<resamples>``, ``delong`` or ``none``."""
    return f"bootstrap-{resamples}" if method == "bootstrap" else method


def bound_columns(metrics: Iterable[str]) -> list[str]:
    """``[m, m_lo, m_hi, ...]`` for each metric: a table's columns with the interval right after each metric."""
    return [c for m in metrics for c in (m, f"{m}_lo", f"{m}_hi")]


def cell_key(*parts: object) -> str:
    """The stable string key of a table cell (e.g. ``cell_key("ood", detector, ood_set)``) that seeds its resamples."""
    return "|".join(str(p) for p in parts)


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
