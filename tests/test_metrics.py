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


def _delong_brute(conf_id: np.ndarray, conf_ood: np.ndarray) -> tuple[float, float]:
    """DeLong's AUROC and variance from the O(n m) kernel itself (another route than the midrank form)."""
    s_pos, s_neg = -np.asarray(conf_ood, float), -np.asarray(conf_id, float)
    psi = (s_pos[:, None] > s_neg[None, :]) + 0.5 * (s_pos[:, None] == s_neg[None, :])
    v10, v01 = psi.mean(axis=1), psi.mean(axis=0)
    return psi.mean(), v10.var(ddof=1) / len(s_pos) + v01.var(ddof=1) / len(s_neg)


@pytest.mark.parametrize("shift, n_id, n_ood, ties", [(0.0, 50, 40, False), (1.0, 30, 70, False),
                                                      (2.5, 20, 20, False), (0.7, 60, 60, True)])
def test_delong_interval_matches_the_kernel_and_a_bootstrap(shift, n_id, n_ood, ties):
    from scipy.stats import norm

    from advopenood.evaluation.metrics import auroc_interval

    rng = np.random.default_rng(int(shift * 10) + n_id)
    conf_id, conf_ood = rng.normal(shift, 1, n_id), rng.normal(0, 1, n_ood)
    if ties:
        conf_id, conf_ood = np.round(conf_id), np.round(conf_ood)
    lo, hi = auroc_interval(conf_id, conf_ood)
    auc, var = _delong_brute(conf_id, conf_ood)
    half = norm.ppf(0.975) * np.sqrt(var)
    assert (lo, hi) == pytest.approx((max(0, auc - half), min(1, auc + half)), abs=1e-12)
    assert auroc(conf_id, conf_ood) == pytest.approx(auc)
    boot = [auroc(rng.choice(conf_id, n_id), rng.choice(conf_ood, n_ood)) for _ in range(600)]
    b_lo, b_hi = np.percentile(boot, [2.5, 97.5])
    if hi < 1:  # a stratified percentile bootstrap agrees within a few points
        assert abs(b_lo - lo) < 0.04 and abs(b_hi - hi) < 0.04


@pytest.mark.parametrize("n_id, n_ood", [(1, 10), (10, 1), (0, 5)])
def test_delong_interval_needs_two_per_side(n_id, n_ood):
    from advopenood.evaluation.metrics import auroc_interval

    with pytest.raises(ValueError):
        auroc_interval(np.arange(n_id, dtype=float), np.arange(n_ood, dtype=float))


@pytest.mark.parametrize("auc, n, expected", [(0.5, 100, 0.0409), (0.5, 30, 0.0752), (0.9, 100, 0.0226)])
def test_hanley_mcneil_se(auc, n, expected):
    from advopenood.evaluation.metrics import hanley_mcneil_se

    assert hanley_mcneil_se(auc, n, n) == pytest.approx(expected, abs=2e-4)
