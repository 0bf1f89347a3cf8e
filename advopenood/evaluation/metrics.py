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
