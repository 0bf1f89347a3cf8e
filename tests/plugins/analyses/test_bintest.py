"""Binarization test (plugins/bintest.py) on real models and real data.

The CIFAR-10 ResNet-20 of the benchmark pack and the embedded demo CNN (sklearn digits) are attacked through
their replaced readouts. A strong PGD (the attack's defaults: 40 steps of 2.5 eps / 40) must pass; the negative
controls (PGD with 3 tiny steps, PGD whose loss sees logits x100, FGSM at a tenth of eps) must fail: they are the
point of the test. Small ``n_inner`` (99) and few samples (10 a model: a pass then needs every one of them, ASR
>= 0.95) keep the file fast; the defaults (999 inner points, 400 random ones) stay the defaults.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from conftest import assert_section_rerendered, make_plan
from advopenood import registry
from advopenood.evaluation.context import CleanRecord, RunContext
from advopenood.data.datasets import Subset, build_dataset, stack
from advopenood.errors import UsageError
from advopenood_plugins.analyses.bintest import binarization as bt
from advopenood_plugins.analyses.bintest.plugin import BinarizationTest
from advopenood_plugins.attacks.standard import FGSM, PGD

EPS = 8 / 255
N_INNER = 99
N_CIFAR = 10
N_DEMO = 10
#: the random baseline of the attacks that must pass (a quarter of the default 400 points a sample)
N_RANDOM = 100


class ScaledLogits(nn.Module):
    """Logits times ``factor``: the softmax saturates and the cross-entropy gradient underflows to zero."""

    def __init__(self, model: nn.Module, factor: float):
        super().__init__()
        self.model, self.factor, self.num_classes = model, factor, model.num_classes
        self.eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x) * self.factor


class SaturatedPGD(PGD):
    """PGD whose loss sees the logits scaled x100 (a deliberately broken attack).

    Its softmax tails underflow into subnormal floats, which slow CPU convolutions down a hundredfold on some
    samples; flushing them to zero keeps the suite fast (the per-sample margins came out identical with and
    without it).
    """

    def perturb(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        torch.set_flush_denormal(True)
        try:
            return super().perturb(ScaledLogits(model, 100.0), x, y)
        finally:
            torch.set_flush_denormal(False)


NEGATIVE_CONTROLS = {
    "pgd_3_tiny_steps": lambda: PGD(steps=3, rel_stepsize=0.01),
    "pgd_logits_x100": lambda: SaturatedPGD(steps=40),
    "fgsm_tenth_eps": lambda: FGSM(eps=EPS / 10),
}


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """One intra-op thread for this module: on a shared 2-core machine, OpenMP's spinning barriers made the
    per-sample loop 10-20x slower at random (0.3 s vs 7 s per sample, measured); one thread is steady."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _correct(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
             n: int) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """The first ``n`` correctly classified samples and their row positions."""
    with torch.no_grad():
        rows = np.nonzero((model(x).argmax(1) == y).numpy())[0][:n]
    return x[rows], y[rows], rows


@pytest.fixture(scope="module")
def cifar_samples(cifar_model, cifar_batch):
    x, y = cifar_batch
    return _correct(cifar_model, x, y, N_CIFAR)


@pytest.fixture(scope="module")
def demo_samples(demo_net):
    x, y = stack(build_dataset({"kind": "demo", "name": "digits", "split": "test"}, None, 1, 16), list(range(40)))
    return _correct(demo_net, x, y, N_DEMO)


def _run(model, samples, attack, **kw):
    x, y, rows = samples
    return bt.run_bintest(model, x, y, attack, eps=EPS, n_inner=kw.pop("n_inner", N_INNER), seed=0,
                          indices=rows, **kw)


# --- sampling and readout ------------------------------------------------------------------------------------

@pytest.mark.parametrize("norm", bt.NORMS)
def test_sampled_points_respect_the_ball(cifar_batch, demo_samples, norm):
    rng = np.random.default_rng(0)
    for x_c in (cifar_batch[0][0], demo_samples[0][0]):  # colour photo, and a digit with most pixels at 0
        inner = bt.sample_inner_points(x_c, 300, EPS, norm, 0.05, rng)
        boundary = bt.sample_boundary_points(x_c, 20, EPS, norm, rng)
        rand = bt.sample_random_attack_points(x_c, 40, EPS, norm, rng)
        for pts in (inner, boundary, rand):
            assert pts.min() >= 0 and pts.max() <= 1 and pts.shape[1:] == x_c.shape
        assert bt.distance(inner, x_c, norm).max() <= 0.95 * EPS + 1e-6
        assert torch.allclose(bt.distance(boundary, x_c, norm), torch.full((20,), EPS), rtol=1e-4)
        d_rand = bt.distance(rand, x_c, norm)
        assert d_rand.max() <= EPS + 1e-6
        assert torch.allclose(d_rand[20:], torch.full((20,), EPS), rtol=1e-4)  # second half on the boundary
        if norm == "linf":  # corners: every unclipped coordinate moved by exactly eps
            delta = (boundary - x_c).abs()
            free = ((x_c >= EPS) & (x_c <= 1 - EPS)).expand_as(delta)
            assert torch.allclose(delta[free], torch.full_like(delta[free], EPS), atol=1e-6)


def test_readout_separates_inner_from_boundary(cifar_model, cifar_samples):
    x, _, _ = cifar_samples
    for i in range(2):
        setup = bt.build_binary_classifier(cifar_model, x[i], eps=EPS, norm="linf", n_inner=N_INNER, gap=0.05,
                                           kappa=0.999, rng=np.random.default_rng(i))
        assert setup.ok and setup.train_acc == 1.0
        assert setup.boundary_dist == pytest.approx(EPS, abs=1e-6)
        assert setup.inner_dist_max <= 0.95 * EPS + 1e-6
        assert torch.equal(setup.x_inner[0], x[i])  # the clean sample is an inner point
        with torch.no_grad():
            assert (setup.binary(setup.x_inner).argmax(1) == 0).all()
            assert int(setup.binary(setup.x_boundary[None]).argmax(1)) == 1
            logits, _ = bt.batched_logits_features(cifar_model, torch.cat([setup.x_inner, setup.x_boundary[None]]), 500)
            binary_logits = setup.binary(torch.cat([setup.x_inner, setup.x_boundary[None]]))
        # rescaled to the original model's logit range on the same points
        assert float(binary_logits.min()) == pytest.approx(float(logits.min()), rel=1e-3, abs=1e-3)
        assert float(binary_logits.max()) == pytest.approx(float(logits.max()), rel=1e-3, abs=1e-3)


def test_boundary_shift_keeps_one_minus_kappa_of_the_margin(cifar_model, cifar_samples):
    x_c = cifar_samples[0][0]
    rng = np.random.default_rng(3)
    pts = torch.cat([x_c[None], bt.sample_inner_points(x_c, N_INNER, EPS, "linf", 0.05, rng),
                     bt.sample_boundary_points(x_c, 1, EPS, "linf", rng)])
    logits, feats = bt.batched_logits_features(cifar_model, pts, 128)
    f = feats.double().numpy()
    labels = np.r_[np.zeros(len(f) - 1, dtype=np.int64), 1]
    w, b, acc = bt.train_readout(f, labels)
    assert acc == 1.0
    s = f @ w + b
    assert s[-1] > 0 and (s[:-1] < 0).all()
    kappa = 0.999
    layer = bt.shift_and_rescale(w, b, f, len(f) - 1, kappa, float(logits.min()), float(logits.max()))
    with torch.no_grad():
        z = layer(feats.float()).double().numpy()
    shifted = s - kappa * s[-1]
    scale = (float(logits.max()) - float(logits.min())) / np.abs(shifted).max()
    assert np.allclose(z[:, 1] - z[:, 0], scale * shifted, rtol=1e-3, atol=1e-3)
    assert z[-1, 1] - z[-1, 0] == pytest.approx(scale * (1 - kappa) * s[-1], rel=1e-2)  # (1 - kappa) of the margin


def test_saturated_logits_have_zero_gradient(cifar_model, cifar_samples):
    """The x100 control is weak for the intended reason: the cross-entropy gradient vanishes exactly."""
    x_c = cifar_samples[0][0]
    setup = bt.build_binary_classifier(cifar_model, x_c, eps=EPS, norm="linf", n_inner=N_INNER, gap=0.05,
                                       kappa=0.999, rng=np.random.default_rng(0))
    x = x_c[None].clone().requires_grad_(True)
    for factor, vanishes in ((100.0, True), (1.0, False)):
        x.grad = None
        F.cross_entropy(ScaledLogits(setup.binary, factor)(x), torch.zeros(1, dtype=torch.long)).backward()
        assert bool((x.grad == 0).all()) == vanishes


# --- the test on real attacks --------------------------------------------------------------------------------

def _assert_passes(summary: dict, samples: pd.DataFrame) -> None:
    assert summary["n"] == len(samples) and summary["n_skipped"] == 0
    assert summary["asr"] >= 0.95 and summary["passed"] and not summary["inconclusive"]
    assert summary["asr"] - summary["random_asr"] >= 0.2
    ok = samples[samples["attack_success"].astype(bool)]
    assert (ok["logit_margin_adv"] > 0).all() and (ok["dist_adv"] <= EPS + 1e-6).all()


def test_strong_pgd_passes_on_cifar_resnet20(cifar_model, cifar_samples):
    summary, samples = _run(cifar_model, cifar_samples, PGD(steps=40), attack_name="pgd", n_random=N_RANDOM)
    assert summary["n"] == N_CIFAR and summary["n_misclassified"] == 0
    assert list(samples["index"]) == list(cifar_samples[2])
    _assert_passes(summary, samples)


def test_strong_pgd_passes_on_demo_cnn(demo_net, demo_samples):
    summary, samples = _run(demo_net, demo_samples, PGD(steps=40), attack_name="pgd", n_random=N_RANDOM)
    assert summary["n"] == N_DEMO
    _assert_passes(summary, samples)


@pytest.mark.parametrize("control", sorted(NEGATIVE_CONTROLS))
def test_weakened_attacks_fail_on_cifar_resnet20(cifar_model, cifar_samples, control):
    """The random-attack baseline is not what a control is judged by (its ASR alone is), so it takes the fewest
    random points (``n_random`` 2; the baseline's 400 forward passes a sample were 60 % of these tests' time)."""
    summary, samples = _run(cifar_model, cifar_samples, NEGATIVE_CONTROLS[control](), attack_name=control,
                            n_random=2)
    assert summary["n"] == N_CIFAR and summary["eps"] == pytest.approx(EPS)
    assert summary["asr"] < 0.95 and not summary["passed"]
    assert summary["asr"] <= 0.5
    assert (samples["dist_adv"] <= EPS + 1e-6).all()  # failures are not budget violations: the attacks stay in the ball


@pytest.mark.parametrize("control", sorted(NEGATIVE_CONTROLS))
def test_weakened_attacks_fail_on_demo_cnn(demo_net, demo_samples, control):
    summary, _ = _run(demo_net, demo_samples, NEGATIVE_CONTROLS[control](), attack_name=control, n_random=2)
    assert summary["n"] == N_DEMO
    assert summary["asr"] < 0.95 and not summary["passed"]
    assert summary["asr"] <= 0.5


def test_unbounded_attack_is_judged_in_the_tests_ball(demo_net, demo_samples):
    """DeepFool has no budget: the test's eps applies, and success needs a point inside that L2 ball."""
    x, y, _ = demo_samples
    df_attack = registry.get("attacks", "df")()
    summary, samples = bt.run_bintest(demo_net, x[:4], y[:4], df_attack, eps=0.5, n_inner=49, seed=0)
    assert summary["norm"] == "l2" and summary["eps"] == 0.5 and summary["n"] == 4
    assert np.allclose(samples["boundary_dist"], 0.5, rtol=1e-4)
    success = samples["attack_success"].astype(bool)
    assert (success == ((samples["logit_margin_adv"] > 0) & (samples["dist_adv"] <= 0.5 + 1e-6))).all()


def test_results_are_deterministic(demo_net, demo_samples):
    x, y, rows = demo_samples
    runs = [bt.run_bintest(demo_net, x[:3], y[:3], PGD(steps=10), n_inner=49, seed=7, indices=rows[:3])
            for _ in range(2)]
    pd.testing.assert_frame_equal(runs[0][1], runs[1][1])
    assert runs[0][0] == runs[1][0]
    other = bt.run_bintest(demo_net, x[1:3], y[1:3], PGD(steps=10), n_inner=49, seed=7, indices=rows[1:3])[1]
    pd.testing.assert_frame_equal(other.reset_index(drop=True), runs[0][1].iloc[1:].reset_index(drop=True))


# --- detector variant ----------------------------------------------------------------------------------------

def test_detector_regular_and_inverted_criteria(cifar_model, cifar_batch, cifar_samples):
    """Max-softmax of the original model as the detector; a detector-oblivious PGD is judged by both criteria
    (a detector-aware attack arrives with the adaptive-attacks issue)."""

    def msp(z: torch.Tensor) -> torch.Tensor:
        return torch.softmax(cifar_model(z), 1).amax(1)

    x_all, _ = cifar_batch
    with torch.no_grad():
        clean = msp(x_all)
    threshold = bt.threshold_at_fpr(clean, 0.05)
    assert float((clean < threshold).float().mean()) == pytest.approx(0.05, abs=1.5 / len(clean))

    x, y, rows = cifar_samples
    summary, samples = bt.run_bintest(cifar_model, x[:4], y[:4], PGD(steps=20), eps=EPS, n_inner=99, seed=0,
                                      indices=rows[:4], detector=msp, detector_threshold=threshold, n_random=2)
    assert set(samples["test"]) == {"regular", "inverted"} and summary["test"] == "detector"
    assert summary["detector_threshold"] == threshold
    ok = samples[samples["setup_ok"]]
    fooled = (ok["logit_margin_adv"] > 0) & (ok["dist_adv"] <= EPS + 1e-6)
    detected = ok["detected_adv"].astype(bool)
    regular, inverted = ok["test"] == "regular", ok["test"] == "inverted"
    assert (ok["attack_success"][regular] == (fooled & ~detected)[regular]).all()
    assert (ok["attack_success"][inverted] == (fooled & detected)[inverted]).all()
    assert summary["asr"] == min(summary["asr_regular"], summary["asr_inverted"])
    assert summary["passed"] == (summary["passed_regular"] and summary["passed_inverted"])

    check = bt.DetectorCheck(msp, threshold)
    for test, want_detected in (("regular", False), ("inverted", True)):
        setup = bt.build_binary_classifier(cifar_model, x[0], eps=EPS, norm="linf", n_inner=49, gap=0.05,
                                           kappa=0.999, rng=np.random.default_rng(0), test=test, detector=check)
        if setup.ok:  # the boundary point meets the test's detector condition and is still adversarial
            assert bool(check.detected(setup.x_boundary[None])[0]) == want_detected
        else:
            assert "detector condition" in setup.reason


# --- summaries, the analysis plugin, validation ---------------------------------------------------------------

def test_summary_counts_skips_and_flags_inconclusive():
    samples = pd.DataFrame({"test": "standard", "setup_ok": [True] * 20 + [False],
                            "attack_success": pd.array([True] * 19 + [False, pd.NA], dtype="boolean"),
                            "random_success": pd.array([False] * 20 + [pd.NA], dtype="boolean")})
    s = bt.summarize(samples)
    assert (s["n"], s["n_skipped"], s["asr"], s["random_asr"]) == (20, 1, 0.95, 0.0)
    assert s["passed"] and not s["inconclusive"]
    samples["random_success"] = pd.array([True] * 16 + [False] * 4 + [pd.NA], dtype="boolean")
    s = bt.summarize(samples)
    assert s["random_asr"] == 0.8 and s["inconclusive"] and not s["passed"]


def test_analysis_plugin_writes_both_tables(demo_net, tmp_path: Path):
    assert registry.get("analyses", "bintest") is BinarizationTest
    id_set = build_dataset({"kind": "demo", "name": "digits", "split": "test"}, None, 1, 16)
    x, y = stack(id_set, list(range(8)))
    with torch.no_grad():
        pred = demo_net(x).argmax(1).numpy()
    ctx = RunContext(plan=make_plan(attacks=["pgd", "df"], attack_params={"pgd": {"steps": 10}}), out=tmp_path,
                     model=demo_net, id_set=Subset(id_set, np.arange(8)), fit_set=id_set, ood_sets={}, adv_sets={},
                     clean=CleanRecord(y=y.numpy(), pred=pred))
    analysis = BinarizationTest(n_inner=49, limit=3, eps=0.5, progress=False)
    out = analysis(ctx)
    summary, samples = out["bintest.csv"], out["bintest_samples.csv"]
    assert list(summary.columns) == list(bt.SUMMARY_COLUMNS)
    assert list(summary["attack"]) == ["pgd", "df"] and list(summary["norm"]) == ["linf", "l2"]
    assert summary["eps"].tolist() == pytest.approx([EPS, 0.5])  # pgd keeps its own eps; df gets the test's
    assert (summary["n"] + summary["n_skipped"] == 3).all() and (summary["n_inner"] == 49).all()
    assert list(samples.columns) == ["attack", *bt.SAMPLE_COLUMNS]
    correct_rows = np.nonzero(pred == y.numpy())[0][:3]
    for name in ("pgd", "df"):
        assert samples.loc[samples["attack"] == name, "index"].tolist() == correct_rows.tolist()
    assert bool(summary.loc[summary["attack"] == "pgd", "passed"].iloc[0])


def test_analysis_without_an_attack_is_a_usage_error(demo_net, tmp_path: Path):
    id_set = build_dataset({"kind": "demo", "name": "digits", "split": "test"}, None, 1, 16)
    ctx = RunContext(plan=make_plan(), out=tmp_path, model=demo_net, id_set=id_set, fit_set=id_set, ood_sets={},
                     adv_sets={},
                     clean=CleanRecord(y=np.zeros(0), pred=np.zeros(0)))
    with pytest.raises(UsageError, match="pgd"):
        BinarizationTest(progress=False)(ctx)


@pytest.mark.parametrize("kw", [{"kappa": 1.0}, {"gap": -0.1}, {"n_inner": 0}, {"norm": "l1"}, {"eps": 2.0}])
def test_invalid_settings_are_usage_errors(demo_net, demo_samples, kw):
    x, y, _ = demo_samples
    with pytest.raises(UsageError):
        bt.run_bintest(demo_net, x[:1], y[:1], PGD(steps=1), **{"n_inner": 9, **kw})


def test_verify_rerenders_the_binarization_section(demo_analyses_run, tmp_path):
    """Issue 49, item 2: a sentence added to the binarization test's section (report_sections.json and the report
    written again from it, the manifest re-hashed) passed, the section taken as saved; verify renders it again from
    bintest.csv."""
    assert_section_rerendered(demo_analyses_run, tmp_path, "Binarization test")
