"""The independent checker's score and adjustment rules that need no sample (:mod:`advopenood.evaluation.oracle`
re-exports them): Wilson's and Newcombe's score intervals, the rule at a bound, the bootstrap p-value and Holm's
adjustment. Like the checker, it imports none of the code it checks (the import-linter contract ``oracle``)."""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

#: the two-sided level of every interval
LEVEL = 0.95


def _z() -> float:
    """The two-sided 95 % normal quantile."""
    from scipy.stats import norm

    return float(norm.ppf(0.5 + LEVEL / 2))


def wilson(successes: int, n: int) -> tuple[float, float]:
    """Wilson's (1927) 95 % interval in percent as the two roots ``p`` of ``(k/n - p)^2 = z^2 p (1 - p) / n``
    (a quadratic in ``p``, solved with :func:`numpy.roots`); NaN when ``n`` is 0."""
    if n <= 0:
        return math.nan, math.nan
    z2, share = _z() ** 2, successes / n
    roots = np.sort(np.real(np.roots([1 + z2 / n, -(2 * share + z2 / n), share * share])))
    lo, hi = float(np.clip(roots[0], 0, 1)), float(np.clip(roots[-1], 0, 1))
    return 100.0 * (0.0 if successes == 0 else lo), 100.0 * (1.0 if successes == n else hi)  # p itself at 0 or 1


def bootstrap_p(differences: np.ndarray) -> float:
    """The two-sided bootstrap p-value of a zero difference: twice the smaller share of replicates on one side of 0
    (0 itself on both), at most 1, over the replicates that are not NaN; NaN without replicates."""
    values = np.asarray(differences, dtype=np.float64)
    ordered = np.sort(values[~np.isnan(values)])
    if not len(ordered):
        return math.nan
    at_most, below = np.searchsorted(ordered, 0.0, "right"), np.searchsorted(ordered, 0.0, "left")
    return min(1.0, 2.0 * min(at_most, len(ordered) - below) / len(ordered))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's (1979) adjusted p-values: sorted ascending, the ``i``-th (from 0) of ``k`` is the largest of
    ``(k - j) p_(j)`` for ``j <= i``, at most 1; a NaN stays NaN and is no comparison."""
    order = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    out = [math.nan] * len(p_values)
    running = 0.0
    for j, (p, i) in enumerate(order):
        running = max(running, min(1.0, (len(order) - j) * p))
        out[i] = running
    return out


def newcombe(auroc_pct: float, n_id: int, n_ood: int) -> tuple[float, float]:
    """Newcombe's (2006, Stat. Med. 25:559-573, method 5) 95 % score interval on an AUROC in percent: the ``t``
    either side of the estimate ``A`` where ``(t - A)^2 = z^2 t (1 - t) (1 + (N - 1) ((1 - t) / (2 - t) + t /
    (1 + t))) / (n_id n_ood)``, ``N = (n_id + n_ood) / 2`` (Hanley and McNeil's variance at ``t``); each root by
    :func:`scipy.optimize.brentq` on ``[0, A]`` and ``[A, 1]``, the bound itself at an estimate of 0 or 100."""
    from scipy.optimize import brentq

    a, big, z2 = auroc_pct / 100.0, (n_id + n_ood) / 2.0 - 1.0, _z() ** 2

    def gap(t: float) -> float:
        return (t - a) ** 2 - z2 * t * (1 - t) * (1 + big * ((1 - t) / (2 - t) + t / (1 + t))) / (n_id * n_ood)

    inner = min(max(a, 1e-12), 1 - 1e-12)  # gap < 0 just inside the bound: the bracket of the other root
    lo = 0.0 if a <= 0 else brentq(gap, 0.0, inner, xtol=1e-14)
    hi = 1.0 if a >= 1 else brentq(gap, inner, 1.0, xtol=1e-14)
    return 100.0 * lo, 100.0 * hi


def at_bound(metric: str, lo: float, hi: float) -> bool:
    """Whether an interval takes the method at a bound: it is one point, or (an AUROC or an FPR95: a column ending in
    ``auroc`` or ``fpr95``) it reaches 0 or 100, each to 1e-6 points; never without an interval."""
    if math.isnan(lo) or math.isnan(hi):
        return False
    near = 1e-6  # points: floating-point sums leave a resample's 100 at 99.99999999999997
    return abs(hi - lo) <= near or (metric.endswith(("auroc", "fpr95")) and (lo <= near or hi >= 100 - near))


def bounded(metric: str, value: float, lo: float, hi: float, n_id: int, n_ood: int) -> tuple[float, float, str]:
    """``(lo, hi, method)`` of one interval after the rule at a bound (:func:`at_bound`); ``""`` when it keeps its
    own."""
    if not at_bound(metric, lo, hi) or math.isnan(value):
        return lo, hi, ""
    if metric.endswith("auroc"):
        return (*newcombe(value, n_id, n_ood), "newcombe")
    if metric.endswith("fpr95"):
        return (*wilson(int(round(value / 100.0 * n_id)), n_id), "wilson")
    return math.nan, math.nan, "none"


def bound_label(label: str, methods: Mapping[str, str]) -> str:
    """``<label>; at a bound: <metric> <method>, ...`` for the metrics that took a method at a bound, else
    ``label``."""
    taken = [f"{m} {how}" for m, how in methods.items() if how]
    return label + ("; at a bound: " + ", ".join(taken) if taken else "")
