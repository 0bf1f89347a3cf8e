"""Intervals that hold where samples are small or at a bound (issue 50): simulations of the rules in
:mod:`advopenood.evaluation.intervals`, vectorised so that each runs in about a second."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scipy.stats import norm

from advopenood.evaluation import intervals as iv
from advopenood.evaluation import oracle


def _bootstrap_aurocs(conf_id: np.ndarray, conf_ood: np.ndarray, resamples: int, rng: np.random.Generator
                      ) -> np.ndarray:
    """``(samples, resamples)`` stratified bootstrap AUROCs (percent) of ``(samples, n)`` score arrays, as counts of
    each image drawn times the pairwise comparison matrix (continuous scores: no ties)."""
    samples, n_id = conf_id.shape
    n_ood = conf_ood.shape[1]
    above = (conf_id[:, :, None] > conf_ood[:, None, :]).astype(float)  # an ID image above an OOD image

    def counts(n: int) -> np.ndarray:
        idx = rng.integers(0, n, (samples * resamples, n)) + n * np.arange(samples * resamples)[:, None]
        return np.bincount(idx.ravel(), minlength=samples * resamples * n).reshape(samples, resamples, n)

    weighted = np.matmul(counts(n_id).astype(float), above)  # (samples, resamples, n_ood)
    return 100.0 * np.einsum("sbj,sbj->sb", weighted, counts(n_ood).astype(float)) / (n_id * n_ood)


def test_the_stated_auroc_interval_covers_a_true_auroc_of_2_percent():
    """2,000 simulated cells of 32 ID + 32 OOD images (normal scores, OOD shifted so that the true AUROC is 2 %):
    the interval a cell states (the percentile bootstrap, replaced at a bound by :func:`iv.bound_rule`) covers the
    truth at least 93 % of the time, also among the cells whose estimate is 0 (the percentile interval there is
    [0, 0] and never covers)."""
    rng = np.random.default_rng(2)
    samples, n, truth = 2000, 32, 2.0
    shift = -math.sqrt(2) * norm.ppf(truth / 100)  # P(ID score > OOD score) = Phi(-shift / sqrt 2) = 2 %
    conf_id, conf_ood = rng.normal(0, 1, (samples, n)), rng.normal(shift, 1, (samples, n))
    estimate = 100.0 * (conf_id[:, :, None] > conf_ood[:, None, :]).mean(axis=(1, 2))
    lo, hi = np.percentile(_bootstrap_aurocs(conf_id, conf_ood, 100, rng), [2.5, 97.5], axis=1)
    plain = (lo <= truth) & (truth <= hi)
    stated = np.array([iv.bound_rule("auroc", a, low, high, n, n)[:2] for a, low, high in zip(estimate, lo, hi)])
    covered = (stated[:, 0] <= truth) & (truth <= stated[:, 1])
    zero = estimate == 0
    assert zero.sum() > 20 and not plain[zero].any()  # the old interval: a point at 0 that never covers
    assert covered.mean() >= 0.93 and covered[zero].mean() >= 0.93, (covered.mean(), covered[zero].mean())
    assert (stated[:, 1] > stated[:, 0]).all()  # no interval is a point


@pytest.mark.parametrize("auroc", [0.0, 0.5, 2.0, 37.5, 50.0, 93.0, 99.9, 100.0])
def test_newcombe_score_interval_matches_the_checkers(auroc):
    """The writer's quartic roots and the checker's brentq roots are one interval, which holds the estimate and
    is never a point."""
    for n_id, n_ood in ((32, 32), (5, 200), (100, 7)):
        lo, hi = iv.auroc_score_interval(auroc, n_id, n_ood)
        assert np.allclose((lo, hi), oracle.newcombe(auroc, n_id, n_ood), atol=1e-7)
        assert lo <= auroc <= hi and hi - lo > 1.0


def test_a_separated_cell_states_a_method_valid_at_the_bound():
    """A perfectly separated cell (every resample's AUROC 0, FPR95 100): its AUROC and FPR95 intervals are not
    points; its ``ci`` names the methods taken at the bound, as the checker re-derives them."""
    rng = np.random.default_rng(0)
    conf_id = rng.normal(0, 1, 32)
    conf_ood = conf_id.max() + 1 + rng.random(32)
    bounds, _, reason, label = iv.IntervalPolicy("bootstrap", 200, 0).labelled_cell("k", conf_id, conf_ood)
    assert not reason and bounds["auroc_lo"] == 0 and bounds["auroc_hi"] > 5
    assert bounds["fpr95_hi"] == 100 and bounds["fpr95_lo"] < 95
    assert label == "bootstrap-200; at a bound: fpr95 wilson, auroc newcombe"
    assert math.isfinite(bounds["aupr_in_lo"]) and bounds["aupr_in_lo"] < bounds["aupr_in_hi"]
    from advopenood_plugins.kit.verify import rederive_bounds

    class Run:
        config = {"ci": {"method": "bootstrap", "resamples": 200}, "seed": 0}

    got = rederive_bounds(conf_id, conf_ood, Run(), "k")
    assert got["ci"] == label
    assert np.allclose([got[k] for k in bounds], list(bounds.values()), atol=1e-6)


def test_a_mean_over_sets_sharing_the_id_images_is_as_wide_as_its_sampling_variation():
    """100 simulated detectors' means over 8 OOD sets that share 32 ID images (normal scores, true AUROC 63.8 %
    on every set): the interval of :meth:`iv.IntervalPolicy.shared_mean` (the ID images resampled once per
    replicate for all sets) is on average no narrower than the mean's true 95 % spread (2 x 1.96 x its standard
    deviation over the simulations) and covers the truth at least 90 % of the time; resampling each set's ID images
    apart (the sets' own replicates, :func:`iv.mean_interval`) gives an interval far narrower than that."""
    rng = np.random.default_rng(4)
    runs, sets, n, truth = 100, 8, 32, 100 * norm.cdf(0.5 / math.sqrt(2))
    policy = iv.IntervalPolicy("bootstrap", 100, 1)
    means, paired, apart = [], [], []
    for r in range(runs):
        conf_id = rng.normal(0.5, 1, n)
        oods = [rng.normal(0, 1, n) for _ in range(sets)]
        means.append(np.mean([100 * (conf_id[:, None] > o[None, :]).mean() for o in oods]))
        paired.append(policy.shared_mean(f"mean|{r}", conf_id, dict(enumerate(oods)), ("auroc",))["auroc"])
        own = [policy.paired(f"ood|{r}|{i}", [(conf_id, o)], ("auroc",))[0]["auroc"] for i, o in enumerate(oods)]
        apart.append(iv.mean_interval(own))
    spread = 2 * 1.96 * np.std(means)
    paired, apart = np.array(paired), np.array(apart)
    width = np.mean(paired[:, 1] - paired[:, 0])
    assert width >= 0.9 * spread, (width, spread)
    assert np.mean((paired[:, 0] <= truth) & (truth <= paired[:, 1])) >= 0.9
    assert np.mean(apart[:, 1] - apart[:, 0]) < 0.7 * spread  # the sets taken as independent samples


def _shared_sample(rng: np.random.Generator, n: int) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, Any]]:
    """One simulated run of the test below: ``n`` ID images, ``n`` natural OOD images (``tin``), 5 attacks on ``tin``
    (each image's score pushed up by a shift, plus a small noise of its own) and an ID->ID attack (each ID image's
    score pushed down; its positives the images whose attack succeeded, 60 % by a latent draw per image), with
    each set's :class:`iv.ImageSource`."""
    conf_id, tin, succeeded = rng.normal(1.0, 1, n), rng.normal(0, 1, n), rng.uniform(size=n) < 0.6
    oods = {f"ood{k}": tin + 0.2 * k + 0.1 * rng.normal(size=n) for k in range(5)}
    oods["id0"] = (conf_id - 1.5 + 0.15 * rng.normal(size=n))[succeeded]
    sources = {**{f"ood{k}": iv.ImageSource("tin", n, np.arange(n)) for k in range(5)},
               "id0": iv.ImageSource("id", n, np.flatnonzero(succeeded))}
    return conf_id, oods, sources


def test_a_mean_over_sets_sharing_id_and_ood_images_is_as_wide_as_its_sampling_variation():
    """100 simulated means over 6 adversarial sets that share their images (:func:`_shared_sample`: 5 attacks on
    one natural OOD set, an ID->ID attack whose positives are ID images): the interval of
    :meth:`iv.IntervalPolicy.shared_mean` with each set's :class:`iv.ImageSource` (every shared image, ID and OOD,
    resampled once per replicate) is on average no narrower than the mean's true 95 % spread (2 x 1.96 x its
    standard deviation over the simulations) and covers the true mean (of a 4,000-image sample) at least 90 % of
    the time; drawing each set's OOD images apart (no sources: the sets taken as independent samples) is far
    narrower (0.86 of the spread; drawn once, 1.00)."""
    from advopenood.evaluation.metrics import auroc

    rng = np.random.default_rng(5)
    runs, n = 100, 32
    big_id, big, _ = _shared_sample(rng, 4000)
    truth = np.mean([100 * auroc(big_id, o) for o in big.values()])
    policy = iv.IntervalPolicy("bootstrap", 100, 1)
    means, joint, apart = [], [], []
    for r in range(runs):
        conf_id, oods, sources = _shared_sample(rng, n)
        means.append(np.mean([100 * auroc(conf_id, o) for o in oods.values()]))
        joint.append(policy.shared_mean(f"mean|{r}", conf_id, oods, ("auroc",), sources)["auroc"])
        apart.append(policy.shared_mean(f"mean|{r}", conf_id, oods, ("auroc",))["auroc"])
    spread = 2 * 1.96 * np.std(means)
    joint, apart = np.array(joint), np.array(apart)
    assert np.mean(joint[:, 1] - joint[:, 0]) >= 0.9 * spread, (np.mean(joint[:, 1] - joint[:, 0]), spread)
    assert np.mean((joint[:, 0] <= truth) & (truth <= joint[:, 1])) >= 0.9
    assert np.mean(apart[:, 1] - apart[:, 0]) < 0.9 * spread  # the shared OOD images drawn apart per set


def test_a_weighted_draw_is_the_draw_of_the_rows_it_holds():
    """A set that holds some of its pool's images (its positives) takes, in each replicate, every drawn copy of its
    rows: :func:`iv.shared_id_replicates` gives exactly the metrics of those copies (checked against
    :func:`advopenood.evaluation.metrics.ood_metrics` of the expanded sample, replicate by replicate), and a set
    that holds its whole pool in order is the pool's own draw."""
    from advopenood.evaluation.metrics import ood_metrics

    rng = np.random.default_rng(2)
    conf_id, tin = np.round(rng.normal(1, 1, 12), 1), np.round(rng.normal(0, 1, 15), 1)
    rows = np.array([0, 2, 3, 7, 11, 14])
    oods, sources = {"all": tin, "some": tin[rows]}, {"all": iv.ImageSource("tin", 15, np.arange(15)),
                                                     "some": iv.ImageSource("tin", 15, rows)}
    every, some = iv.shared_id_replicates(conf_id, oods, 3, "k", 60, iv.METRICS, sources)
    ids = iv.generator(3, "k").integers(0, 12, (60, 12), dtype=np.int32)
    pool = iv.generator(3, "k|tin").integers(0, 15, (60, 15), dtype=np.int32)
    for b in range(60):
        copies = np.bincount(pool[b], minlength=15)[rows]
        want, drawn = ood_metrics(conf_id[ids[b]], tin[pool[b]]), np.repeat(tin[rows], copies)
        assert all(math.isclose(every[m][b], want[m], abs_tol=1e-9) for m in iv.METRICS)
        if not len(drawn):
            assert math.isnan(some["auroc"][b])
            continue
        got = ood_metrics(conf_id[ids[b]], drawn)
        assert all(math.isclose(some[m][b], got[m], abs_tol=1e-9) for m in iv.METRICS)


@pytest.mark.parametrize("n", [1, 7, 10, 1000])
def test_wilson_bounds_a_share_of_0_or_1_exactly(n):
    """A share of 0 (of 1) has the lower (upper) Wilson bound exactly 0 (100), in the writer and the checker: a
    table never shows 0 outside its own interval (gradcam_summary's ``[2.78e-15, 39.03]``)."""
    for wilson in (iv.wilson, oracle.wilson):
        assert wilson(0, n)[0] == 0.0 and wilson(n, n)[1] == 100.0
        assert 0 < wilson(0, n)[1] < 100 and 0 < wilson(n, n)[0] < 100
