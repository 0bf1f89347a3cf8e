"""Detector-adaptive attacks on the real CIFAR-10 ResNet-20: differentiable scores, the joint attack, reporting."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
import torch

from advopenood import registry
from advopenood.attacks.base import build_attack
from advopenood.capabilities import bind_attack
from advopenood.config.loading import apply_overrides, load_config
from advopenood.config.plan import expand_attacks
from advopenood.config.schema import thaw
from advopenood.data.datasets import limit_dataset
from advopenood.detection.scoring import fit_detectors
from advopenood.detection.outputs import forward_outputs, grad_outputs
from advopenood.errors import UsageError
from advopenood.run.pipeline import run
from advopenood.run.resolved import resolve
from advopenood.attacks.store import AdvStore
from advopenood_plugins.detectors import BUILTIN_DETECTORS

CPU = torch.device("cpu")
ALL = list(BUILTIN_DETECTORS)


@pytest.fixture(scope="module")
def cifar_fit(pack_set):
    return pack_set("cifar10_train", "cifar10_train_10k.npz", 1000)


def test_every_builtin_detector_has_a_faithful_differentiable_score(cifar_model, cifar_fit, cifar_batch):
    """grad_score equals score (the detector's own value) and gives finite, non-zero input gradients."""
    bank = fit_detectors(ALL, "pytorch-ood", cifar_model, cifar_fit, batch_size=256, device=CPU, seed=0,
                         progress=False)
    assert not bank.errors and len(bank.dets) == 16
    x = cifar_batch[0][:16]
    for name, det in bank.dets.items():
        ref = det.score(cifar_model, x, forward_outputs(cifar_model, x)).double()
        xr = x.clone().requires_grad_()
        conf = det.grad_score(cifar_model, xr, grad_outputs(cifar_model, xr)).double()
        torch.testing.assert_close(conf.detach(), ref, rtol=1e-4, atol=1e-6, msg=name)
        (grad,) = torch.autograd.grad(conf.sum(), xr)
        assert torch.isfinite(grad).all(), name
        assert (grad.flatten(1).abs().sum(1) > 0).all(), name


@pytest.fixture(scope="module")
def adaptive_run(data_root, session_cache, tmp_path_factory):
    """PGD and the two adaptive attacks on MDS (64 CIFAR test images, Tiny-ImageNet as OOD)."""
    cfg = thaw(load_config("cifar10_resnet20")[0])
    cfg["data"]["ood"] = [{"kind": "npz", "path": "tin_test.npz", "name": "tin"}]
    cfg["data"]["fit_limit"] = 1000
    # one lambda, 10 steps: MDS's AUROC falls from about 100 (PGD) and 64 (Tiny-ImageNet) to about 1, far past the
    # margins below
    cfg["attack_params"] = {"pgd": {"steps": 10},
                            "adaptive_mds": {"steps": 10, "lam": [1.0]},
                            "adaptive_ood_mds": {"steps": 10, "lam": [1.0]}}
    out = tmp_path_factory.mktemp("adaptive")
    cfg = apply_overrides(cfg, data_root=str(data_root), limit=64, attack="pgd,adaptive_mds,adaptive_ood_mds",
                          detectors="mds,msp", evaluator="ood,mead", out=str(out))
    ctx = run(cfg, progress=False)
    return ctx, out


def test_adaptive_attack_drives_mds_auroc_far_below_classifier_only_pgd(adaptive_run):
    _, out = adaptive_run
    table = pd.read_csv(out / "table_adaptive.csv").set_index("attack")
    evade = table.loc["adaptive_mds"]
    assert evade.detector == "mds" and evade.baseline == "pgd"
    assert evade.auroc_baseline > 90
    assert evade.auroc_adaptive < evade.auroc_baseline - 40
    assert evade.fpr95_adaptive > evade.fpr95_baseline
    into = table.loc["adaptive_ood_mds"]
    assert into.baseline == "tin" and into.auroc_adaptive < into.auroc_baseline - 30
    ood = pd.read_csv(out / "ood.csv")
    assert set(ood.attack) == {"none", "pgd", "adaptive_mds", "adaptive_ood_mds"}
    assert (out / "table_adaptive.md").is_file()


def test_adaptive_sets_enter_the_mead_worst_case_next_to_classifier_only(adaptive_run):
    _, out = adaptive_run
    mead = pd.read_csv(out / "mead.csv")
    mds = mead[(mead.detector == "mds") & (mead.norm == "linf")].set_index("setting")
    assert set(mds.index) == {"mead", "ce", "adaptive"}
    assert mds.loc["adaptive", "auroc"] < mds.loc["ce", "auroc"] - 40
    assert mds.loc["mead", "auroc"] <= mds.loc["adaptive", "auroc"] + 1e-9
    assert (mds.n_neg == 64).all()


def test_ood_to_id_success_means_the_detector_accepts(adaptive_run):
    ctx, out = adaptive_run
    asr = pd.read_csv(out / "asr.csv").set_index("attack")
    assert asr.loc["adaptive_ood_mds", "source"] == "tin" and asr.loc["adaptive_mds", "source"] == "id"
    adv = ctx.adv_sets["adaptive_ood_mds"]
    attack = registry.get("attacks", "adaptive_ood_mds")(**adv.params)
    attack.bind(ctx.model, ctx.fit_set, seed=ctx.seed, batch_size=ctx.batch_size, device=CPU)
    assert attack.context == json.loads((adv.path / "spec.json").read_text())["context"]
    conf = torch.cat([attack.detector_score(x) for x, _ in adv.iter_batches(64)])
    accepted = (conf >= attack.target.threshold).numpy()
    np.testing.assert_array_equal(adv.records.success.to_numpy(dtype=bool), accepted)
    assert asr.loc["adaptive_ood_mds", "asr"] == pytest.approx(100 * accepted.mean())
    assert accepted.mean() > 0.5


def test_cache_key_holds_the_detectors_fit_data(cifar_model, cifar_fit, data_root, tmp_path):
    store = AdvStore(tmp_path)
    cls = registry.get("attacks", "adaptive_mds")
    other = limit_dataset(cifar_fit, 500, 0)
    data = {"name": "x"}
    specs = [store.spec("m", data, cls(**cls.defaults(32)).bind(cifar_model, fit, seed=0, batch_size=64, device=CPU), 0)
             for fit in (cifar_fit, cifar_fit, other)]
    assert specs[0] == specs[1] and specs[0] != specs[2]
    assert specs[0]["context"]["detector"] == "mds"
    pgd = registry.get("attacks", "pgd")
    assert "context" not in store.spec("m", data, pgd(**pgd.defaults(32)), 0)


def test_bad_adaptive_input_is_one_clear_error(cifar_model, cifar_batch, data_root, tmp_path):
    cls = registry.get("attacks", "adaptive_knn")
    with pytest.raises(UsageError, match="lam -1.*valid choices"):
        cls(**{**cls.defaults(32), "lam": -1})
    with pytest.raises(UsageError, match="kappa 0.*valid choices"):
        cls(**{**cls.defaults(32), "kappa": 0})
    with pytest.raises(UsageError, match="needs the ID fit data"):
        cls(**cls.defaults(32))(cifar_model, *cifar_batch, seed=0)
    with pytest.raises(UsageError, match="unknown attack 'adaptive_nope'"):
        registry.get("attacks", "adaptive_nope")
    cfg = thaw(load_config("cifar10_resnet20")[0])
    cfg["data"]["ood"] = []
    cfg = apply_overrides(cfg, data_root=str(data_root), limit=8, attack="adaptive_ood_msp", out=str(tmp_path))
    with pytest.raises(UsageError, match="ood_set None is not one of the run's OOD sets"):
        resolve(cfg)


def test_binarization_detector_variant_runs_with_an_adaptive_attack(data_root, session_cache, tmp_path):
    """Regular and inverted tests both run with adaptive_msp's own detector; the attack passes both."""
    cfg = thaw(load_config("cifar10_resnet20")[0])
    cfg["data"]["fit_limit"] = 1000
    cfg["attack_params"] = {"adaptive_msp": {"steps": 20, "lam": [1.0]}}
    cfg["analysis_params"] = {"bintest": {"n_inner": 199, "n_random": 100, "limit": 3}}
    cfg = apply_overrides(cfg, data_root=str(data_root), limit=8, attack="adaptive_msp", detectors="",
                          evaluator="", analysis="bintest", out=str(tmp_path))
    run(cfg, progress=False)
    summary = pd.read_csv(tmp_path / "bintest.csv").iloc[0]
    samples = pd.read_csv(tmp_path / "bintest_samples.csv")
    assert summary.test == "detector" and set(samples.test) == {"regular", "inverted"}
    assert np.isfinite(summary.detector_threshold)
    assert summary.asr_regular >= 0.95 and summary.asr_inverted >= 0.95 and bool(summary.passed)
    hit = samples[samples.attack_success.astype("boolean").fillna(False).astype(bool)]
    assert not hit[hit.test == "regular"].detected_adv.astype(bool).any()
    assert hit[hit.test == "inverted"].detected_adv.astype(bool).all()


def test_adaptive_family_stands_for_one_attack_per_selected_detector(data_root, tmp_path):
    cfg = thaw(load_config("cifar10_resnet20")[0])
    cfg["attack_params"] = {"adaptive": {"steps": 7}, "adaptive_knn": {"steps": 9}}
    cfg = apply_overrides(cfg, data_root=str(data_root), attack="pgd,adaptive,adaptive_ood", eps="4/255",
                          detectors="mds,knn", out=str(tmp_path))
    specs = {s.set_name: s for s in expand_attacks(cfg, 32)}
    assert list(specs) == ["pgd", "adaptive_mds", "adaptive_knn", "adaptive_ood_mds", "adaptive_ood_knn"]
    assert specs["adaptive_mds"].params["steps"] == 7 and specs["adaptive_knn"].params["steps"] == 9
    assert {s.params["eps"] for s in specs.values()} == {4 / 255}
    with pytest.raises(UsageError, match="attack 'adaptive' stands for one attack per selected detector"):
        expand_attacks(cfg.replace(detectors=[]), 32)


@pytest.mark.parametrize("name, steps_key, per_step", [
    ("adaptive_msp", "steps", (1, 1)), ("adaptive_gram", "steps", (1, 1)), ("robust_id_gram", "steps", (1, 1)),
    ("robust_ood_gram", "steps", (1, 1)), ("adaptive_apgd_gram", "n_iter", (1, 1)), ("adaptive_odin", "steps", (2, 3)),
    ("robust_id_odin", "steps", (2, 2)), ("adaptive_apgd_odin", "n_iter", (2, 3)),
    ("adaptive_eot_smoothed_gram", "steps", (5, 3))])
def test_network_passes_per_attack_step(cifar_model, pack_set, cifar_batch, name, steps_key, per_step):
    """Every extra step of a detector-aware attack costs one forward and one backward pass of the network, GRAM's
    included (its tapped maps come from the attack's shared pass, not a pass of its own); ODIN's preprocessing
    gradient is one more backward through that pass, its perturbed input one more forward and backward (the robust
    attacks' loss is the detector's alone: no backward through the shared pass for a classifier term). EOT over
    smoothed GRAM with 2 draws: the smoothed value's 2 noisy forwards, 2 noisy passes for the gradient, the shared
    pass."""
    x, y = cifar_batch[0][:4], cifar_batch[1][:4]
    fit = pack_set("cifar10_train", "cifar10_train_10k.npz", 200)  # the count does not depend on the fit's size
    passes = {"forward": 0, "backward": 0}

    def count(module, inputs, output):
        passes["forward"] += 1
        if output.requires_grad:
            output.register_hook(lambda grad: passes.__setitem__("backward", passes["backward"] + 1))

    handle = cifar_model.backbone.conv1.register_forward_hook(count)
    try:
        counts = []
        for steps in (1, 3):
            attack = build_attack(name, {steps_key: steps, **({"lam": [1.0]} if "robust" not in name else {})},
                                  input_size=32, protocol=None)
            bind_attack(attack, cifar_model, fit, seed=0, batch_size=256, device=CPU,
                        detector_params={"smoothed_gram": {"n": 2}})
            attack.target  # fitting and calibrating are no attack step
            passes.update(forward=0, backward=0)
            attack(cifar_model, x, y, seed=0)
            counts.append(dict(passes))
    finally:
        handle.remove()
    assert counts[1]["forward"] - counts[0]["forward"] == 2 * per_step[0], counts
    assert counts[1]["backward"] - counts[0]["backward"] == 2 * per_step[1], counts


@pytest.mark.parametrize("name", ["gram", "odin"])
def test_gradient_from_the_shared_pass_equals_the_detectors_own(cifar_model, cifar_fit, cifar_batch, name):
    """GRAM's and ODIN's confidence and input gradient from the attack's shared pass (tapped maps; the graph for
    ODIN's preprocessing gradient) equal those from passes of their own, bit for bit."""
    det = fit_detectors([name], "pytorch-ood", cifar_model, cifar_fit, batch_size=256, device=CPU, seed=0,
                        progress=False).dets[name]
    results = []
    for shared in (True, False):
        xr = cifar_batch[0][:8].clone().requires_grad_()
        out = grad_outputs(cifar_model, xr, keep_maps=False, taps=shared)
        out = out if shared else dataclasses.replace(out, logits=out.logits.detach())
        conf = det.grad_score(cifar_model, xr, out)
        results.append((conf.detach(), torch.autograd.grad(conf.sum(), xr)[0]))
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)


@pytest.mark.parametrize("name", ["adaptive_gen", "robust_id_gen", "robust_ood_eot_ross_gen", "hekal_min_gen"])
def test_an_attacks_images_do_not_depend_on_whether_its_detector_was_fitted_before(name, cifar_model, pack_set,
                                                                                      cifar_batch):
    """Fitting and calibrating the attacked detector iterate DataLoaders, which draw from torch's global generator;
    the attack seeds its random start just before, so a fit inside the call (the first shard a process generates,
    e.g. after a resume) shifted every random start of that shard against a run whose detector was already fitted."""
    fit = pack_set("train", "cifar10_train_10k.npz", 96)
    x, y = cifar_batch[0][:4], cifar_batch[1][:4]
    params = {"eps": 8 / 255, **({"steps": 2} if "hekal" in name or "robust" in name else {"steps": 2, "lam": [1.0]})}
    det = {"n": 3, "val_size": 32} if "ross" in name else {}
    images = []
    for fitted_first in (True, False):
        attack = build_attack(name, params, input_size=32).bind(cifar_model, fit, seed=0, batch_size=48, device="cpu",
                                                                 detector_params=det)
        if fitted_first:
            attack.target  # noqa: B018  (fit now, outside the call)
        images.append(attack(cifar_model, x, y, seed=5))
    torch.testing.assert_close(images[0], images[1], rtol=0, atol=0)
