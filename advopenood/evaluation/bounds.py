"""Intervals at a bound and the tests claims rest on, for :mod:`advopenood.evaluation.intervals` (which re-exports
them): an AUROC interval valid at 0 or 100 (Newcombe 2006, method 5), Wilson's interval for a proportion, which of
them a metric takes where its bootstrap or DeLong interval reaches a bound or collapses to a point (:func:`bound_rule`),
the bootstrap's two-sided p-value and Holm's (1979) step-down adjustment.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from advopenood.evaluation.metrics import Z95

def auroc_score_interval(auroc_pct: float, n_id: int, n_ood: int, z: float = Z95) -> tuple[float, float]:
    """Newcombe's score interval on an AUROC in percent, valid at 0 and 100: Newcombe (2006), "Confidence intervals
    for an effect size measure based on the Mann-Whitney statistic. Part 2: asymptotic methods and evaluation",
    Stat. Med. 25:559-573, method 5. The bounds are the roots ``t`` of ``(t - A)^2 = z^2 V(t)`` around the estimate
    ``A``, with the Hanley-McNeil (1982) variance evaluated at ``t`` and ``N* - 1 = (n_id + n_ood) / 2 - 1`` for
    both ``n_id - 1`` and ``n_ood - 1``: ``V(t) = t (1 - t) / (n_id n_ood) (1 + (N* - 1) ((1 - t) / (2 - t) +
    t / (1 + t)))``. Multiplied by ``(2 - t)(1 + t) > 0`` that is a quartic in ``t``, solved with
    :class:`numpy.polynomial.Polynomial`; its root 0 (1) is the bound of an estimate of 0 (100)."""
    from numpy.polynomial import Polynomial

    a, t, big = float(auroc_pct) / 100.0, Polynomial([0.0, 1.0]), (n_id + n_ood) / 2.0 - 1.0
    poly = ((t - a) ** 2 * (2 - t) * (1 + t) * (n_id * n_ood)
            - z * z * t * (1 - t) * ((2 - t) * (1 + t) + big * (1 - t) * (1 + t) + big * t * (2 - t)))
    roots = poly.roots()
    real = np.clip(np.real(roots[np.abs(np.imag(roots)) < 1e-9]), 0.0, 1.0)
    lower = real[real < a - 1e-12]
    upper = real[real > a + 1e-12]
    lo = 0.0 if a <= 0.0 or not len(lower) else float(lower.max())
    hi = 1.0 if a >= 1.0 or not len(upper) else float(upper.min())
    return 100.0 * lo, 100.0 * hi


#: the method each kind of metric takes at a bound (:func:`bound_rule`); ``none``: the cell states no interval there
AT_BOUND = {"auroc": "newcombe", "fpr95": "wilson", "aupr": "none"}


def metric_kind(metric: str) -> str:
    """``auroc``, ``fpr95`` or ``aupr``: what a metric column measures (``robust_auroc`` is an AUROC)."""
    return "auroc" if metric.endswith("auroc") else "fpr95" if metric.endswith("fpr95") else "aupr"


#: how close (points) an interval's ends are to each other or to 0 / 100 to count as a point or at the bound: far
#: under the tables' precision, far over floating-point sums' rounding (a resample's AUPR of 99.99999999999997)
BOUND_TOL = 1e-6


def at_bound(metric: str, lo: float, hi: float) -> bool:
    """Whether a percentile (or DeLong) interval of ``metric`` (percent) takes the method of :data:`AT_BOUND`: it
    collapsed to a point (every resample equal) or, for an AUROC or an FPR95, reaches 0 or 100 (each to
    :data:`BOUND_TOL`)."""
    if math.isnan(lo) or math.isnan(hi):
        return False
    return hi - lo <= BOUND_TOL or (metric_kind(metric) != "aupr" and (lo <= BOUND_TOL or hi >= 100.0 - BOUND_TOL))


def bound_rule(metric: str, value: float, lo: float, hi: float, n_id: int, n_ood: int) -> tuple[float, float, str]:
    """``(lo, hi, method)``: the interval as given and ``""`` when :func:`at_bound` is False, else the interval of
    the method :data:`AT_BOUND` names (an AUROC: :func:`auroc_score_interval` of the estimate ``value``; an FPR95:
    :func:`wilson` on ``round(value n_id / 100)`` of the ``n_id`` ID images; an AUPR: NaN, ``none``)."""
    if not at_bound(metric, lo, hi) or math.isnan(value):
        return lo, hi, ""
    kind = metric_kind(metric)
    if kind == "auroc":
        return (*auroc_score_interval(value, n_id, n_ood), AT_BOUND[kind])
    if kind == "fpr95":
        return (*wilson(round(value * n_id / 100.0), n_id), AT_BOUND[kind])
    return math.nan, math.nan, AT_BOUND[kind]


def bound_label(label: str, methods: dict[str, str]) -> str:
    """The ``ci`` column of a row where some metrics took a method at a bound (``methods``: metric -> method):
    ``bootstrap-2000; at a bound: auroc newcombe, fpr95 wilson``; ``label`` alone when none did."""
    shown = ", ".join(f"{m} {how}" for m, how in methods.items() if how)
    return f"{label}; at a bound: {shown}" if shown else label


def bootstrap_p(differences: np.ndarray) -> float:
    """The two-sided bootstrap p-value of a difference being 0 from its replicates (the test the percentile
    interval inverts; Efron and Tibshirani 1993, sec. 16.4): ``min(1, 2 min(P*(d <= 0), P*(d >= 0)))`` over the
    replicates where ``d`` is defined (a NaN replicate: a mean with a set that drew none of its rows); NaN
    without replicates."""
    d = np.asarray(differences, dtype=np.float64)
    d = d[~np.isnan(d)]
    if not len(d):
        return math.nan
    return float(min(1.0, 2.0 * min(np.mean(d <= 0), np.mean(d >= 0))))


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm's (1979) step-down adjusted p-values, "A simple sequentially rejective multiple test procedure", Scand.
    J. Statist. 6:65-70: with the ``k`` p-values sorted ascending, ``p_(i)`` becomes ``max_{j <= i} min(1, (k - j
    + 1) p_(j))``; rejecting where the adjusted value is below 0.05 keeps the chance of any false rejection among
    the ``k`` at most 5 %. NaN p-values are no comparison: they stay NaN and do not count in ``k``. (statsmodels'
    ``multipletests(method="holm")`` computes the same; it is not a dependency of this package.)"""
    p = np.asarray(p_values, dtype=np.float64)
    out = np.full(len(p), math.nan)
    kept = np.flatnonzero(~np.isnan(p))
    order = kept[np.argsort(p[kept], kind="stable")]
    k = len(order)
    out[order] = np.minimum(1.0, np.maximum.accumulate((k - np.arange(k)) * p[order]))
    return out


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's (1927) score interval on a share, in percent: ``(p + z^2/2n +- z sqrt(p(1-p)/n + z^2/4n^2)) /
    (1 + z^2/n)``; NaN when ``n`` is 0. Its bound at a share of 0 (1) is exactly 0 (100): the formula's value
    there, which floating point would leave a rounding error away (``5.6e-15``)."""
    if n <= 0:
        return math.nan, math.nan
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    lo = 0.0 if successes <= 0 else max(0.0, centre - half)
    hi = 1.0 if successes >= n else min(1.0, centre + half)
    return 100.0 * lo, 100.0 * hi


Cell = tuple[np.ndarray, np.ndarray]
