"""OOD detection metrics, exactly as OpenOOD computes them (``openood/evaluators/metrics.py``).

Conventions (OpenOOD v1.5, Zhang et al. 2023, "OpenOOD v1.5: Enhanced Benchmark for Out-of-Distribution
Detection"): a detector gives a confidence ``conf`` per sample, higher = more in-distribution. OOD samples
are the *positive* class and the decision score is ``-conf``. Adversarial examples count as OOD.
All four metrics depend only on the order of the scores, so infinite confidences (e.g. an infinite
KL divergence) are replaced by finite values just beyond the finite range, which leaves the metrics
unchanged; NaN confidences have no order and raise :class:`NaNScoreError`.
"""
from __future__ import annotations

import numpy as np


def _skm():
    """``sklearn.metrics``, imported on first use (about a second), so that config checks stay fast."""
    from sklearn import metrics

    return metrics

TPR_LEVEL = 0.95


class NaNScoreError(ValueError):
    """A detector produced NaN confidences; the metrics are undefined (the caller reports it)."""


def _prepare(conf_id: np.ndarray, conf_ood: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated confidences and OOD indicator (1 = OOD), after the NaN/inf/empty checks."""
    conf_id = np.asarray(conf_id, dtype=np.float64).ravel()
    conf_ood = np.asarray(conf_ood, dtype=np.float64).ravel()
    if len(conf_id) == 0 or len(conf_ood) == 0:
        raise ValueError(f"OOD metrics need ID and OOD samples; got {len(conf_id)} ID and {len(conf_ood)} OOD")
    n_nan_id, n_nan_ood = int(np.isnan(conf_id).sum()), int(np.isnan(conf_ood).sum())
    if n_nan_id or n_nan_ood:
        raise NaNScoreError(f"NaN scores: {n_nan_id} of {len(conf_id)} ID and {n_nan_ood} of {len(conf_ood)} OOD")
    conf = np.concatenate([conf_id, conf_ood])
    finite = np.isfinite(conf)
    if not finite.all():
        lo, hi = (conf[finite].min(), conf[finite].max()) if finite.any() else (0.0, 0.0)
        span = max(hi - lo, 1.0)
        conf = np.where(conf == np.inf, hi + span, np.where(conf == -np.inf, lo - span, conf))
    label = np.concatenate([np.zeros(len(conf_id), dtype=np.int64), np.ones(len(conf_ood), dtype=np.int64)])
    return conf, label


def fpr_at_tpr95(conf_id: np.ndarray, conf_ood: np.ndarray) -> float:
    """FPR95 in [0, 1]: the fraction of ID samples flagged as OOD at the first ROC threshold with TPR >= 0.95.

    ``fpr, tpr = roc_curve(is_ood, -conf)``; ``FPR95 = fpr[argmax(tpr >= 0.95)]`` (OpenOOD's
    ``auc_and_fpr_recall``; Liang et al. 2018, "Enhancing the Reliability of OOD Image Detection").
    """
    conf, label = _prepare(conf_id, conf_ood)
    fpr, tpr, _ = _skm().roc_curve(label, -conf)
    return float(fpr[np.argmax(tpr >= TPR_LEVEL)])


def auroc(conf_id: np.ndarray, conf_ood: np.ndarray) -> float:
    """AUROC in [0, 1]: trapezoidal area under ``roc_curve(is_ood, -conf)``, OOD positive (Hendrycks & Gimpel 2017)."""
    conf, label = _prepare(conf_id, conf_ood)
    fpr, tpr, _ = _skm().roc_curve(label, -conf)
    return float(_skm().auc(fpr, tpr))


def aupr_in(conf_id: np.ndarray, conf_ood: np.ndarray) -> float:
    """AUPR-In in [0, 1]: trapezoidal area under ``precision_recall_curve(is_id, conf)``, ID positive."""
    conf, label = _prepare(conf_id, conf_ood)
    precision, recall, _ = _skm().precision_recall_curve(1 - label, conf)
    return float(_skm().auc(recall, precision))


def aupr_out(conf_id: np.ndarray, conf_ood: np.ndarray) -> float:
    """AUPR-Out in [0, 1]: trapezoidal area under ``precision_recall_curve(is_ood, -conf)``, OOD positive."""
    conf, label = _prepare(conf_id, conf_ood)
    precision, recall, _ = _skm().precision_recall_curve(label, -conf)
    return float(_skm().auc(recall, precision))


def id_threshold(conf_id: np.ndarray, fpr: float = 1.0 - TPR_LEVEL) -> float:
    """The confidence below which a share ``fpr`` of clean ID samples falls: ``quantile(conf_id, fpr)`` (linear).

    A detector rejects an input when ``conf < threshold``; the default rejects 5 % of clean ID samples, i.e.
    accepts 95 % (OpenOOD's TPR level, the operating point of FPR95).
    """
    return float(np.quantile(np.asarray(conf_id, dtype=np.float64), fpr))


def ood_metrics(conf_id: np.ndarray, conf_ood: np.ndarray) -> dict[str, float]:
    """``{fpr95, auroc, aupr_in, aupr_out}`` in percent, as OpenOOD's ``compute_all_metrics`` times 100.

    Raises :class:`NaNScoreError` on NaN confidences and ``ValueError`` when either side is empty.
    """
    return {"fpr95": 100.0 * fpr_at_tpr95(conf_id, conf_ood), "auroc": 100.0 * auroc(conf_id, conf_ood),
            "aupr_in": 100.0 * aupr_in(conf_id, conf_ood), "aupr_out": 100.0 * aupr_out(conf_id, conf_ood)}


Z95 = 1.959963984540054
"""The two-sided 95 % normal quantile."""
MIN_CONCLUSIVE = 100
"""The fewest images per side (ID and OOD) from which a reading draws a conclusion. Below it a 95 % interval on an
AUROC near chance is wider than about +-8 points (:func:`hanley_mcneil_se`: 0.041 at AUROC 0.5 and 100 + 100), so
the report says the sample is too small to conclude instead of ranking detectors or calling one below chance."""


def auroc_interval(conf_id: np.ndarray, conf_ood: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """DeLong's interval on the AUROC in [0, 1] (OOD positive, decision score ``-conf``), clipped to [0, 1].

    DeLong, DeLong and Clarke-Pearson (1988), "Comparing the areas under two or more correlated ROC curves", with
    Sun and Xu's (2014) midrank form: for OOD image i and ID image j with ``psi = 1[s_i > s_j] + 0.5 * 1[s_i = s_j]``
    (``s = -conf``), ``V10_i = mean_j psi`` and ``V01_j = mean_i psi``; ``AUROC = mean(V10)``,
    ``Var = var(V10) / n_ood + var(V01) / n_id`` (sample variances); the interval is ``AUROC +- z * sqrt(Var)``.
    Needs at least 2 images per side.
    """
    from scipy.stats import norm

    v10, v01 = delong_components(conf_id, conf_ood)
    auc = float(v10.mean())
    half = float(norm.ppf(0.5 + level / 2)) * float(np.sqrt(v10.var(ddof=1) / len(v10) + v01.var(ddof=1) / len(v01)))
    return max(0.0, auc - half), min(1.0, auc + half)


def delong_components(conf_id: np.ndarray, conf_ood: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """DeLong's structural components ``(V10, V01)`` (see :func:`auroc_interval`): ``V10`` one per OOD image, ``V01``
    one per ID image, in input order (so two detectors' components on the same images pair up)."""
    from scipy.stats import rankdata

    conf, label = _prepare(conf_id, conf_ood)
    pos, neg = -conf[label == 1], -conf[label == 0]
    m, n = len(pos), len(neg)
    if m < 2 or n < 2:
        raise ValueError(f"an AUROC interval needs at least 2 ID and 2 OOD samples; got {n} ID and {m} OOD")
    both = rankdata(np.concatenate([pos, neg]))
    return (both[:m] - rankdata(pos)) / n, 1.0 - (both[m:] - rankdata(neg)) / m


def auroc_difference_interval(id_a: np.ndarray, ood_a: np.ndarray, id_b: np.ndarray, ood_b: np.ndarray,
                              level: float = 0.95) -> tuple[float, float]:
    """DeLong's interval on ``AUROC_a - AUROC_b`` in [-1, 1] for two detectors scored on the same images (image ``i``
    of ``id_a`` is image ``i`` of ``id_b``, likewise OOD): DeLong, DeLong and Clarke-Pearson (1988), eq. for the
    contrast ``L = (1, -1)``: ``Var = (S10_aa + S10_bb - 2 S10_ab) / n_ood + (S01_aa + S01_bb - 2 S01_ab) / n_id``
    with ``S10`` / ``S01`` the sample covariances of the two detectors' ``V10`` / ``V01``
    (:func:`delong_components`)."""
    from scipy.stats import norm

    v10_a, v01_a = delong_components(id_a, ood_a)
    v10_b, v01_b = delong_components(id_b, ood_b)
    if len(v10_a) != len(v10_b) or len(v01_a) != len(v01_b):
        raise ValueError("a paired AUROC difference needs both detectors scored on the same images")
    delta = float(v10_a.mean() - v10_b.mean())
    var = np.var(v10_a - v10_b, ddof=1) / len(v10_a) + np.var(v01_a - v01_b, ddof=1) / len(v01_a)
    half = float(norm.ppf(0.5 + level / 2)) * float(np.sqrt(var))
    return max(-1.0, delta - half), min(1.0, delta + half)


def auroc_difference_p(id_a: np.ndarray, ood_a: np.ndarray, id_b: np.ndarray, ood_b: np.ndarray) -> float:
    """DeLong's two-sided p-value of ``AUROC_a = AUROC_b`` (the contrast of :func:`auroc_difference_interval`):
    ``2 (1 - Phi(|delta| / sqrt(Var)))``; 1 when the variance is 0 and the AUROCs are equal, 0 when it is 0 and they
    differ."""
    from scipy.stats import norm

    v10_a, v01_a = delong_components(id_a, ood_a)
    v10_b, v01_b = delong_components(id_b, ood_b)
    delta = float(v10_a.mean() - v10_b.mean())
    var = float(np.var(v10_a - v10_b, ddof=1) / len(v10_a) + np.var(v01_a - v01_b, ddof=1) / len(v01_a))
    if var <= 0:
        return 1.0 if delta == 0 else 0.0
    return float(2 * norm.sf(abs(delta) / np.sqrt(var)))


def hanley_mcneil_se(auc: float, n_id: int, n_ood: int) -> float:
    """The standard error of an AUROC (in [0, 1]) from its value and sample sizes alone (Hanley and McNeil 1982,
    "The meaning and use of the area under a ROC curve", eq. 2): ``Q1 = A / (2 - A)``, ``Q2 = 2 A^2 / (1 + A)``,
    ``SE^2 = (A (1 - A) + (n_ood - 1)(Q1 - A^2) + (n_id - 1)(Q2 - A^2)) / (n_ood n_id)``. Used where only a
    table's cells are at hand (the report's readings), not for the written intervals."""
    a = min(max(float(auc), 0.0), 1.0)
    q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
    var = (a * (1 - a) + (n_ood - 1) * (q1 - a * a) + (n_id - 1) * (q2 - a * a)) / (n_ood * n_id)
    return float(np.sqrt(max(var, 0.0)))


def sample_note(n_id: int, n_ood: int) -> dict[str, object]:
    """What ``run.json`` says of a run's sample size: the fewest images per side, :data:`MIN_CONCLUSIVE`, whether
    the sample reaches it, and the half-width in AUROC points of a 95 % interval near chance at these sizes
    (:func:`hanley_mcneil_se` at 0.5)."""
    half = 100 * Z95 * hanley_mcneil_se(0.5, max(n_id, 1), max(n_ood, 1))
    return {"n_id": int(n_id), "n_ood": int(n_ood), "min_conclusive": MIN_CONCLUSIVE,
            "conclusive": bool(min(n_id, n_ood) >= MIN_CONCLUSIVE), "auroc_halfwidth_at_chance": round(half, 1)}
