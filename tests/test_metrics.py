"""advopenood.evaluation.metrics: OpenOOD's conventions (OOD positive, score = -conf, trapezoidal AUPR, FPR at TPR >= 95 %)."""
from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from advopenood.evaluation.metrics import NaNScoreError, aupr_in, aupr_out, auroc, fpr_at_tpr95, ood_metrics


def test_perfect_and_reversed_separation():
    conf_id, conf_ood = np.array([5.0, 4.0, 3.0]), np.array([1.0, 0.0, -1.0])
    assert ood_metrics(conf_id, conf_ood) == {"fpr95": 0.0, "auroc": 100.0, "aupr_in": 100.0, "aupr_out": 100.0}
    reversed_ = ood_metrics(conf_ood, conf_id)
    assert reversed_["auroc"] == 0.0 and reversed_["fpr95"] == 100.0


def test_hand_computed_example():
    # AUROC = P(conf_id > conf_ood): the OOD score 0.65 beats one ID score -> 15/16.
    conf_id, conf_ood = np.array([0.9, 0.8, 0.7, 0.6]), np.array([0.65, 0.2, 0.1, 0.0])
    assert auroc(conf_id, conf_ood) == pytest.approx(15 / 16)
    # Flagging all 4 OOD samples (TPR 1 >= 0.95) needs threshold 0.65, which flags ID 0.6 -> FPR 1/4.
    assert fpr_at_tpr95(conf_id, conf_ood) == pytest.approx(0.25)


def test_aupr_is_trapezoidal_like_openood():
    # -conf ranks: ood 0, id -1, ood -2, id -3. PR points (R, P): (0.5, 1), (0.5, 0.5), (1, 2/3), (1, 0.5).
    # Trapezoidal area = 0.5 * 1 + 0.5 * (0.5 + 2/3) / 2 = 0.7917 (average precision would give 0.8333).
    conf_id, conf_ood = np.array([3.0, 1.0]), np.array([2.0, 0.0])
    assert aupr_out(conf_id, conf_ood) == pytest.approx(0.5 + 0.5 * (0.5 + 2 / 3) / 2)
    # ID positive, score = conf: ranks id 3, ood 2, id 1, ood 0 -> the mirror image, same area.
    assert aupr_in(conf_id, conf_ood) == pytest.approx(0.5 + 0.5 * (0.5 + 2 / 3) / 2)


def test_random_scores_match_independent_formulas():
    rng = np.random.default_rng(0)
    conf_id, conf_ood = rng.normal(1.0, 1.0, 700), rng.normal(0.0, 1.0, 300)
    labels = np.r_[np.zeros(700), np.ones(300)]
    assert auroc(conf_id, conf_ood) == pytest.approx(roc_auc_score(labels, -np.r_[conf_id, conf_ood]))
    # FPR95 from its definition: threshold at the ceil(0.95 n)-th highest OOD score -conf.
    t = np.sort(-conf_ood)[::-1][math.ceil(0.95 * len(conf_ood)) - 1]
    assert fpr_at_tpr95(conf_id, conf_ood) == pytest.approx(np.mean(-conf_id >= t))
    m = ood_metrics(conf_id, conf_ood)
    assert set(m) == {"fpr95", "auroc", "aupr_in", "aupr_out"}
    assert all(0.0 <= v <= 100.0 for v in m.values())
    assert m["auroc"] == pytest.approx(100 * auroc(conf_id, conf_ood))


def test_nan_scores_raise_with_counts():
    with pytest.raises(NaNScoreError, match="1 of 3 ID and 2 of 2 OOD"):
        ood_metrics(np.array([1.0, np.nan, 0.5]), np.array([np.nan, np.nan]))


def test_empty_side_raises():
    with pytest.raises(ValueError, match="0 OOD"):
        ood_metrics(np.array([1.0, 2.0]), np.array([]))


def test_infinite_scores_keep_their_order():
    finite = ood_metrics(np.array([3.0, 2.0, 1.0]), np.array([1.5, 0.0, -5.0]))
    infinite = ood_metrics(np.array([np.inf, 2.0, 1.0]), np.array([1.5, 0.0, -np.inf]))
    assert infinite == finite


@pytest.mark.skipif(importlib.util.find_spec("openood") is None,
                    reason="OpenOOD not installed (docs/openood.md)")
def test_equals_openood_compute_all_metrics():
    from openood.evaluators.metrics import compute_all_metrics

    rng = np.random.default_rng(1)
    conf_id, conf_ood = rng.normal(0.5, 1.0, 400), np.round(rng.normal(0.0, 1.0, 250), 1)  # with ties
    conf = np.r_[conf_id, conf_ood]
    label = np.r_[np.zeros(400, dtype=int), -np.ones(250, dtype=int)]
    fpr, au, ain, aout, _ = compute_all_metrics(conf, label, np.zeros_like(label))
    ours = ood_metrics(conf_id, conf_ood)
    assert ours == pytest.approx({"fpr95": 100 * fpr, "auroc": 100 * au, "aupr_in": 100 * ain, "aupr_out": 100 * aout})
