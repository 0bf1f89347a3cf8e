"""95 % intervals on OOD metrics and on shares: the stratified percentile bootstrap, DeLong, Wilson.

Every table that writes a metric ``m`` writes ``m_lo`` and ``m_hi`` right after it and a ``ci`` column naming the
method (:func:`ci_label`). The plan's ``ci`` section (``method``: ``bootstrap`` | ``delong`` | ``none``,
``resamples``) chooses it; the run seed and a stable key of the cell (:func:`cell_key`) seed the resamples
(:func:`generator`), so ``advopenood verify`` draws the same ones.

* **bootstrap** (default): Efron and Tibshirani (1993), "An Introduction to the Bootstrap", ch. 13, the percentile
  interval; stratified: the ID and the OOD side are resampled separately, each with replacement at its own size
  (:func:`draw`). Paired arrays (an attacked image and its clean twin, the two sides of a robust AUROC) are
  resampled with the same index draws: pass the same ``(idx_id, idx_ood)`` to :func:`replicates` for each.
  The four metrics of all resamples are computed at once on a grid of the pooled scores' distinct values
  (:func:`replicates`), exactly as :mod:`advopenood.evaluation.metrics` defines them (sklearn's ``roc_curve`` with
  its dropped intermediate points for FPR95, trapezoidal AUPR over ``precision_recall_curve``).
* **delong**: DeLong, DeLong and Clarke-Pearson (1988), the analytic AUROC interval
  (:func:`advopenood.evaluation.metrics.auroc_interval`); FPR95 and AUPR have no analytic interval and are left
  empty under it (their ``ci`` stays ``delong``, which covers AUROC only).
* **wilson**: Wilson (1927), "Probable inference, the law of succession, and statistical inference", the score
  interval on a share (:func:`wilson`), for the attack success rates of ``asr.csv``.

A cell with fewer than :data:`MIN_PER_SIDE` images on a side gets empty interval cells and the reason
(:func:`metric_intervals`).
"""
from __future__ import annotations

import hashlib
import math
from typing import Iterable

import numpy as np

from advopenood.evaluation.metrics import TPR_LEVEL, Z95, auroc_interval

METHODS = ("bootstrap", "delong", "none")
DEFAULT_RESAMPLES = 2000
MIN_RESAMPLES = 100
MIN_PER_SIDE = 2
LEVEL = 0.95
METRICS = ("fpr95", "auroc", "aupr_in", "aupr_out")
#: resamples per block of :func:`replicates` (bounds memory at about 8 arrays of BLOCK x distinct values)
BLOCK = 250


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
    """Stratified resample indices: ``(resamples, n_id)`` into the ID side, then ``(resamples, n_ood)`` into the OOD
    side, each uniform with replacement (in this order, so a re-derivation draws the same)."""
    return rng.integers(0, n_id, (resamples, n_id)), rng.integers(0, n_ood, (resamples, n_ood))


def _finite(conf: np.ndarray) -> np.ndarray:
    """Infinite confidences replaced by values just beyond the finite range (the metrics depend on order only)."""
    finite = np.isfinite(conf)
    if finite.all():
        return conf
    lo, hi = (conf[finite].min(), conf[finite].max()) if finite.any() else (0.0, 0.0)
    span = max(hi - lo, 1.0)
    return np.where(conf == np.inf, hi + span, np.where(conf == -np.inf, lo - span, conf))


def _grid(inv: np.ndarray, idx: np.ndarray, size: int) -> np.ndarray:
    """Per resample (row), how many drawn images sit at each distinct score: ``(rows, size)`` counts."""
    rows = idx.shape[0]
    flat = (inv[idx] + size * np.arange(rows)[:, None]).ravel()
    return np.bincount(flat, minlength=rows * size).reshape(rows, size).astype(np.float64)


def _pr_area(tp: np.ndarray, fp: np.ndarray) -> np.ndarray:
    """Trapezoidal area under the precision-recall curve per row, from the cumulative true and false positives at
    each threshold in the grid's column order (columns = distinct scores from the most to the least positive):
    sklearn's points plus its start (recall 0, precision 1); a distinct score absent from a resample repeats the
    previous point and adds no area."""
    total = tp + fp
    precision = np.divide(tp, total, out=np.ones_like(tp), where=total > 0)
    recall = tp / tp[:, -1:]
    first = recall[:, 0] * (precision[:, 0] + 1.0)
    rest = np.einsum("ij,ij->i", np.diff(recall, axis=1), precision[:, 1:] + precision[:, :-1])
    return (first + rest) / 2.0


def _fpr95(g_id: np.ndarray, g_ood: np.ndarray, fp: np.ndarray, tp: np.ndarray) -> np.ndarray:
    """``fpr[argmax(tpr >= 0.95)]`` of sklearn's ``roc_curve(is_ood, -conf)`` per row (columns: distinct scores in
    increasing confidence = the curve's threshold order). A point is on sklearn's curve when its score is drawn and
    it is the first or last such, or its step ``(d fp, d tp)`` differs from the next drawn score's
    (``drop_intermediate``); the answer is the first kept point at or after the first with TPR >= 0.95."""
    rows, size = g_id.shape
    cols = np.arange(size)
    present = (g_id + g_ood) > 0
    nxt = np.where(present, cols, size)
    nxt = np.minimum.accumulate(nxt[:, ::-1], axis=1)[:, ::-1]
    nxt = np.concatenate([nxt[:, 1:], np.full((rows, 1), size)], axis=1)  # the next drawn score after each column
    last = nxt == size
    safe = np.minimum(nxt, size - 1)
    same = (np.take_along_axis(g_id, safe, 1) == g_id) & (np.take_along_axis(g_ood, safe, 1) == g_ood)
    first = cols[None, :] == np.argmax(present, axis=1)[:, None]
    kept = present & (first | last | ~same)
    reached = tp / tp[:, -1:] >= TPR_LEVEL
    start = np.argmax(reached, axis=1)
    at = np.argmax(kept & (cols[None, :] >= start[:, None]), axis=1)
    return fp[np.arange(rows), at] / fp[:, -1]


def replicates(conf_id: np.ndarray, conf_ood: np.ndarray, idx_id: np.ndarray, idx_ood: np.ndarray,
               metrics: Iterable[str] = METRICS) -> dict[str, np.ndarray]:
    """Each metric (percent) on every resample: row ``b`` scores ``conf_id[idx_id[b]]`` against
    ``conf_ood[idx_ood[b]]``.

    Vectorised on the pooled scores' distinct values, sorted once: AUROC is the Mann-Whitney statistic with half
    credit for ties (equal to the trapezoidal ROC area), FPR95 and AUPR follow sklearn's curves (:func:`_fpr95`,
    :func:`_pr_area`). No NaN confidences (the caller checks).
    """
    wanted = tuple(metrics)
    conf_id = np.asarray(conf_id, dtype=np.float64).ravel()
    conf_ood = np.asarray(conf_ood, dtype=np.float64).ravel()
    pooled = _finite(np.concatenate([conf_id, conf_ood]))
    values, inv = np.unique(pooled, return_inverse=True)
    inv_id, inv_ood = inv[:len(conf_id)], inv[len(conf_id):]
    n_id, n_ood, size = idx_id.shape[1], idx_ood.shape[1], len(values)
    out: dict[str, list[np.ndarray]] = {m: [] for m in wanted}
    for start in range(0, len(idx_id), BLOCK):
        g_id = _grid(inv_id, idx_id[start:start + BLOCK], size)
        g_ood = _grid(inv_ood, idx_ood[start:start + BLOCK], size)
        c_id, c_ood = np.cumsum(g_id, axis=1), np.cumsum(g_ood, axis=1)  # images at or below each score
        if "auroc" in wanted:  # OOD images times the ID images above them, ties counting half
            below = np.einsum("ij,ij->i", g_ood, c_id) - 0.5 * np.einsum("ij,ij->i", g_ood, g_id)
            out["auroc"].append(100.0 * (n_id * n_ood - below) / (n_id * n_ood))
        if "fpr95" in wanted:
            out["fpr95"].append(100.0 * _fpr95(g_id, g_ood, c_id, c_ood))
        if "aupr_out" in wanted:
            out["aupr_out"].append(100.0 * _pr_area(c_ood, c_id))
        if "aupr_in" in wanted:  # ID positive, thresholds from the highest confidence down: suffix sums
            out["aupr_in"].append(100.0 * _pr_area((n_id - c_id + g_id)[:, ::-1], (n_ood - c_ood + g_ood)[:, ::-1]))
    return {m: np.concatenate(v) if v else np.empty(0) for m, v in out.items()}


def paired_replicates(cells: list[tuple[np.ndarray, np.ndarray]], seed: int, key: str,
                      resamples: int = DEFAULT_RESAMPLES) -> list[dict[str, np.ndarray]]:
    """:func:`replicates` of paired cells on the same resamples: every cell's ID array has one length and is
    indexed by the same ID draws, likewise its OOD array (image ``i`` of each is the same image, e.g. clean and
    attacked; robust AUROC, a detector and its twin). Differences of the returned replicates give paired intervals."""
    n_id, n_ood = {len(c[0]) for c in cells}, {len(c[1]) for c in cells}
    if len(n_id) != 1 or len(n_ood) != 1:
        raise ValueError(f"paired cells need one ID and one OOD length; got {sorted(n_id)} and {sorted(n_ood)}")
    idx_id, idx_ood = draw(generator(seed, key), n_id.pop(), n_ood.pop(), resamples)
    return [replicates(conf_id, conf_ood, idx_id, idx_ood) for conf_id, conf_ood in cells]


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
    """``(bounds, replicates, reason)`` of one cell: ``<m>_lo`` / ``<m>_hi`` in percent for the four metrics, the
    bootstrap replicates (empty unless ``method`` is ``bootstrap``; a group mean averages them, see
    :func:`mean_interval`) and why the bounds are empty ("" when they are not, or when ``method`` is ``none``).

    ``bootstrap``: :func:`draw` from :func:`generator` ``(seed, key)``, :func:`replicates`, :func:`percentile`.
    ``delong``: AUROC only (:func:`~advopenood.evaluation.metrics.auroc_interval`); the other bounds stay empty.
    """
    conf_id = np.asarray(conf_id, dtype=np.float64).ravel()
    conf_ood = np.asarray(conf_ood, dtype=np.float64).ravel()
    bounds = empty_bounds()
    if method == "none":
        return bounds, {}, ""
    reason = too_few(len(conf_id), len(conf_ood))
    if reason or np.isnan(conf_id).any() or np.isnan(conf_ood).any():
        return bounds, {}, reason
    if method == "delong":
        lo, hi = auroc_interval(conf_id, conf_ood)
        bounds.update(auroc_lo=100.0 * lo, auroc_hi=100.0 * hi)
        return bounds, {}, ""
    idx_id, idx_ood = draw(generator(seed, key), len(conf_id), len(conf_ood), resamples)
    reps = replicates(conf_id, conf_ood, idx_id, idx_ood)
    for m, values in reps.items():
        bounds[f"{m}_lo"], bounds[f"{m}_hi"] = percentile(values)
    return bounds, reps, ""


def mean_interval(parts: list[np.ndarray]) -> tuple[float, float]:
    """The interval of a group mean (OpenOOD's near/far rows): each set's replicates were drawn independently, so
    replicate ``b`` of the mean is the mean of the sets' replicates ``b`` (NaN when a set has none)."""
    if not parts or any(len(p) == 0 for p in parts):
        return math.nan, math.nan
    return percentile(np.mean(np.stack(parts), axis=0))


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's (1927) score interval on a share, in percent: ``(p + z^2/2n +- z sqrt(p(1-p)/n + z^2/4n^2)) /
    (1 + z^2/n)``; NaN when ``n`` is 0."""
    if n <= 0:
        return math.nan, math.nan
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return 100.0 * max(0.0, centre - half), 100.0 * min(1.0, centre + half)
