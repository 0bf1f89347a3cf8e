"""Smoothed detectors ``smoothed_<det>`` and their plain and EOT attacks (issue 23, item 4), on the pack's trained
CIFAR-10 ResNet-20."""
from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from advopenood import registry
from advopenood.attacks.base import build_attack
from advopenood.capabilities import bind_attack, is_differentiable
from advopenood.cli.main import main
from advopenood.detection.bank import create_detector
from advopenood.detection.scoring import fit_detectors, score_all
from advopenood.evaluation.metrics import ood_metrics
from advopenood.detection.scorecache import detector_key
from advopenood_plugins.detectors import BUILTIN_DETECTORS
from advopenood_plugins.detectors.logits import MSP
from advopenood_plugins.detectors.smoothed import noise_draws, smooth, stream_seed

CPU = torch.device("cpu")
N_COPIES = 8
SIGMA = 0.05
#: the 16 detectors and GRAM as the paper ran it (own pass, own fit pass, not differentiable)
WRAPPED = (*BUILTIN_DETECTORS, "gram_legacy")


def _smoothed(params: dict | None = None, seed: int = 0, name: str = "smoothed_msp"):
    return create_detector(name, "pytorch-ood", {"n": N_COPIES, "sigma": SIGMA, **(params or {})}, seed=seed)


@pytest.mark.parametrize("det", BUILTIN_DETECTORS)
def test_every_detector_has_a_smoothed_twin_outside_all(det):
    names = registry.names("detectors")
    assert f"smoothed_{det}" in names and f"smoothed_{det}" not in registry.parse_names("detectors", "all")
    assert det in registry.parse_names("detectors", "all")
    attacks = registry.names("attacks")
    for prefix in ("adaptive_", "adaptive_ood_", "adaptive_apgd_", "adaptive_eot_", "adaptive_ood_eot_",
                   "adaptive_apgd_eot_"):
        assert prefix + f"smoothed_{det}" in attacks
    assert is_differentiable(registry.get("detectors", f"smoothed_{det}"))


@pytest.mark.parametrize("copies, statistic, expected", [
    ([[1.0], [5.0], [2.0], [4.0]], "median", [3.0]),  # numpy's median: the mean of the two middle values
    ([[1.0], [5.0], [2.0]], "median", [2.0]),
    ([[1.0], [5.0], [2.0], [4.0]], "mean", [3.0]),
    ([[0.0, 1.0], [0.0, 9.0], [6.0, 2.0]], "mean", [2.0, 4.0]),
    ([[0.0, 1.0], [0.0, 9.0], [6.0, 2.0]], "median", [0.0, 2.0]),
])
def test_statistic(copies, statistic, expected):
    got = smooth(torch.tensor(copies, dtype=torch.float64), statistic)
    assert got.tolist() == expected


@pytest.mark.parametrize("params", [{"n": 0}, {"sigma": -0.1}, {"statistic": "max"}, {"n": 2.5}])
def test_bad_parameters_are_refused(params):
    from advopenood.errors import UsageError

    with pytest.raises(UsageError):
        _smoothed(params)


def test_run_settings_reach_the_wrapped_detector():
    det = create_detector("smoothed_odin", "pytorch-ood", {"temperature": 10}, seed=3, batch_size=7)
    det.input_std = (0.5, 0.5, 0.5)
    assert (det.base.seed, det.base.batch_size, det.base.input_std) == (3, 7, (0.5, 0.5, 0.5))
    assert det.base.params["temperature"] == 10 and det.params["n"] == N_COPIES


def test_scores_are_seeded_reproducible_and_differ_from_msp(cifar_model, cifar_batch):
    """(a) The same seed gives the same scores whatever the batch split; another seed other scores; the scores are
    the median of MSP over the 8 noisy copies (by hand) and differ from MSP's; sigma 0 gives MSP itself."""
    x, _ = cifar_batch
    with torch.no_grad():
        det = _smoothed()
        whole = det.score(cifar_model, x, None).numpy()
        split = np.concatenate([det.score(cifar_model, part, None).numpy() for part in x.split(16)])
        other_seed = _smoothed(seed=1).score(cifar_model, x, None).numpy()
        msp = MSP().score(cifar_model, x, _outputs(cifar_model, x)).double().numpy()
        copies = np.stack([MSP().score(cifar_model, x + SIGMA * e, _outputs(cifar_model, x + SIGMA * e)).double().numpy()
                           for e in noise_draws(x, det.evaluation_noise_seed(), N_COPIES)])
        noiseless = _smoothed({"sigma": 0.0}).score(cifar_model, x, None).numpy()
    np.testing.assert_array_equal(whole, split)
    np.testing.assert_allclose(whole, np.median(copies, axis=0), rtol=0, atol=1e-12)
    assert np.abs(whole - other_seed).max() > 1e-3
    assert np.abs(whole - msp).max() > 1e-2 and np.mean(whole != msp) > 0.9
    np.testing.assert_allclose(noiseless, msp, rtol=0, atol=1e-12)


def _outputs(net, x):
    from advopenood.detection.outputs import forward_outputs

    return forward_outputs(net, x)


@pytest.fixture(scope="module")
def sigma_zero(cifar_model, pack_set):
    """The detectors and their smoothed twins with sigma 0 (one copy), fitted and scored by one score_all."""
    from advopenood.data.datasets import make_loader

    fit = pack_set("train", "cifar10_train_10k.npz", 384)
    ids = pack_set("cifar10", "cifar10_test.npz", 64)
    twins = [f"smoothed_{d}" for d in WRAPPED]
    return score_all(list(WRAPPED) + twins, "pytorch-ood", cifar_model, fit,
                     {"id": lambda: make_loader(ids, 32)}, batch_size=64, device=CPU, seed=0,
                     params={t: {"sigma": 0.0, "n": 1} for t in twins}, progress=False)


@pytest.mark.parametrize("det", WRAPPED)
def test_sigma_zero_is_the_wrapped_detector(sigma_zero, det):
    """Fitted as the wrapped detector on the same clean rows (shared fit pass, tap statistics included) and scored
    through its own pass, smoothed_<det> without noise gives <det>'s scores."""
    assert sigma_zero.errors == {}
    np.testing.assert_allclose(sigma_zero.scores[f"smoothed_{det}"]["id"], sigma_zero.scores[det]["id"], rtol=1e-6,
                               atol=1e-9)


@pytest.mark.parametrize("det", BUILTIN_DETECTORS)
def test_attack_calibration_path_without_gradients(sigma_zero, cifar_model, cifar_batch, det):
    """The attacks calibrate and judge acceptance with grad_score under no_grad: it is the detector's score (ODIN
    too, whose score differentiates its own pass)."""
    smoothed = sigma_zero.bank.dets[f"smoothed_{det}"]
    x = cifar_batch[0][:8]
    want = smoothed.score(cifar_model, x, None)
    with torch.no_grad():
        got = smoothed.grad_score(cifar_model, x, None)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_detector_gone_takes_its_twin_and_attacks_along():
    from advopenood_plugins.detectors.logits import EBO

    registry.register("detectors", "zzebo")(type("ZZEBO", (EBO,), {"openood_name": None, "__module__": __name__}))
    try:
        assert {"smoothed_zzebo", "adaptive_eot_smoothed_zzebo"} <= {*registry.names("detectors"),
                                                                       *registry.names("attacks")}
    finally:
        registry.unregister("detectors", "zzebo")
    assert "smoothed_zzebo" not in registry.names("detectors")
    assert not [a for a in registry.names("attacks") if a.endswith("eot_smoothed_zzebo")]


def test_fit_state_is_the_wrapped_detectors(sigma_zero):
    plain, smoothed = sigma_zero.bank.dets["mds"], sigma_zero.bank.dets["smoothed_mds"]
    tensors = {k: v for k, v in plain.det.__dict__.items() if isinstance(v, torch.Tensor)}
    assert tensors and all(torch.equal(v, smoothed.base.det.__dict__[k]) for k, v in tensors.items())


def test_store_key_holds_the_smoothing_and_the_wrapped_code(monkeypatch):
    """n, sigma and statistic enter the detector key, and so does the wrapped detector's source file."""
    import advopenood.detection.scorecache as scorecache

    def key(det) -> str:
        return detector_key(model_hash="m", name="smoothed_msp", backend="pytorch-ood", detector=det, params=det.params,
                            fit_identity={"rows": 1}, seed=0, batch_size=8)

    base = key(_smoothed())
    assert len({base, key(_smoothed({"n": 9})), key(_smoothed({"sigma": 0.1})),
                key(_smoothed({"statistic": "mean"}))}) == 4
    real = scorecache.source_sha
    monkeypatch.setattr(scorecache, "source_sha", lambda obj: "edited" if type(obj) is MSP else real(obj))
    assert key(_smoothed()) != base


def test_plain_and_eot_gradients(cifar_model, cifar_batch):
    """Both attacks see the smoothed confidence itself; the plain gradient is MSP's at the noise-free image, the EOT
    gradient (mean statistic, m = n) the exact gradient of the mean over the detector's own noise draws."""
    x = cifar_batch[0][:4]
    det = _smoothed({"statistic": "mean"})
    xs = x.clone().requires_grad_()
    value = det.grad_score(cifar_model, xs, None)
    (plain,) = torch.autograd.grad(value.sum(), xs)
    eot_det = det.with_eot(N_COPIES)
    xe = x.clone().requires_grad_()
    eot_value = eot_det.grad_score(cifar_model, xe, None)
    (eot,) = torch.autograd.grad(eot_value.sum(), xe)
    with torch.no_grad():
        score = det.score(cifar_model, x, None)
    torch.testing.assert_close(value.detach(), score, rtol=0, atol=0)
    torch.testing.assert_close(eot_value.detach(), score, rtol=0, atol=0)
    xr = x.clone().requires_grad_()
    (msp_grad,) = torch.autograd.grad(MSP().score(cifar_model, xr, _outputs_grad(cifar_model, xr)).sum(), xr)
    torch.testing.assert_close(plain, msp_grad)
    xh = x.clone().requires_grad_()
    mean = sum(MSP().score(cifar_model, xh + SIGMA * e, _outputs_grad(cifar_model, xh + SIGMA * e))
               for e in noise_draws(x, det.evaluation_noise_seed(), N_COPIES)) / N_COPIES
    (exact,) = torch.autograd.grad(mean.sum(), xh)
    torch.testing.assert_close(eot, exact)
    assert (eot - plain).abs().max() > 1e-3 * plain.abs().max()


def _outputs_grad(net, x):
    from advopenood.detection.outputs import grad_outputs

    return grad_outputs(net, x, keep_maps=False)


def test_eot_attack_is_at_least_as_strong_as_the_plain_one(cifar_model, cifar_batch, pack_set):
    """(b) Same 48 images, same budget (8/255, 5 steps, lambda 1), same start: the EOT attack lowers smoothed_msp's
    AUROC (clean ID vs all adversarial images) at least as much as the plain attack."""
    x, y = cifar_batch[0][:48], cifar_batch[1][:48]
    fit = pack_set("cifar10", "cifar10_train_10k.npz", 64)
    params = {"n": N_COPIES, "sigma": SIGMA}
    bank = fit_detectors(["smoothed_msp"], "pytorch-ood", cifar_model, fit, batch_size=64, device=CPU, seed=0,
                         params={"smoothed_msp": params}, progress=False)
    det = bank.dets["smoothed_msp"]
    with torch.no_grad():
        clean = det.score(cifar_model, x, None).numpy()
    auroc, fooled = {}, {}
    for name in ("adaptive_smoothed_msp", "adaptive_eot_smoothed_msp"):
        attack = build_attack(name, {"steps": 5, "lam": [1.0]}, input_size=32)
        bind_attack(attack, cifar_model, fit, seed=0, batch_size=64, device=CPU, detector_params=params)
        torch.manual_seed(0)
        x_adv = attack.perturb(cifar_model, x, y)
        assert (x_adv - x).abs().max() <= 8 / 255 + 1e-6
        with torch.no_grad():
            auroc[name] = ood_metrics(clean, det.score(cifar_model, x_adv, None).numpy())["auroc"]
            fooled[name] = (cifar_model(x_adv).argmax(1) != y).float().mean().item()
    print(auroc, fooled)
    assert auroc["adaptive_eot_smoothed_msp"] <= auroc["adaptive_smoothed_msp"]
    assert min(fooled.values()) > 0.9


@pytest.mark.parametrize("name, params", [
    ("adaptive_smoothed_msp", {"steps": 3, "lam": [1.0]}), ("adaptive_eot_smoothed_msp", {"steps": 3, "lam": [1.0]}),
    ("robust_id_smoothed_msp", {"steps": 3}), ("robust_ood_eot_smoothed_msp", {"steps": 3}),
    ("robust_apgd_id_eot_smoothed_msp", {"n_iter": 3}),
])
def test_evaluation_noise_is_independent_of_every_draw_an_attack_saw(name, params, cifar_model, cifar_batch, pack_set,
                                                                      monkeypatch):
    """Issue 31, finding 1: every per-image noise seed an attack on smoothed_msp draws (its candidates, its success,
    its calibration, its EOT gradient) is recorded; the run's scoring of the clean and the attacked images (fitted
    and scored as the pipeline does, score_all) draws none of them. Before, the noise was a function of the image and
    the run's seed alone, so the attack kept the iterate whose evaluation noise looked best."""
    import advopenood_plugins.detectors.smoothed as smoothed

    drawn: list[tuple[int, int]] = []
    real = smoothed.noise_seed

    def recorded(seed: int, image):
        drawn.append((seed, real(seed, image)))
        return drawn[-1][1]

    monkeypatch.setattr(smoothed, "noise_seed", recorded)
    x, y = cifar_batch[0][:8], cifar_batch[1][:8]
    fit = pack_set("cifar10", "cifar10_train_10k.npz", 64)
    det_params = {"smoothed_msp": {"n": 4, "sigma": SIGMA}}
    attack = bind_attack(build_attack(name, params, input_size=32), cifar_model, fit, seed=0, batch_size=64,
                         device=CPU, detector_params=det_params)
    torch.manual_seed(0)
    x_adv = attack.perturb(cifar_model, x, y)
    seen, drawn[:] = {v for _, v in drawn}, []
    assert len(seen) > len(x)
    result = score_all(["smoothed_msp"], "pytorch-ood", cifar_model, fit,
                       {"id": lambda: [(x, y)], "adv": lambda: [(x_adv, y)]}, batch_size=64, device=CPU, seed=0,
                       params=det_params, progress=False)
    assert result.errors == {} and len(result.scores["smoothed_msp"]["adv"]) == len(x)
    evaluation = {v for s, v in drawn if s == stream_seed(0, "eval")}
    assert evaluation and not seen & evaluation
    # the attack-stream confidences a worst case over sets chooses on (issue 48) draw from the attack's stream
    assert {s for s, _ in drawn} == {stream_seed(0, "eval"), stream_seed(0, "attack")}
    assert set(result.selection["smoothed_msp"]) == {"id", "adv"}


def test_randomised_is_a_declared_capability_not_a_name():
    """EOT attacks (adaptive and robust, PGD and APGD) exist for every detector that declares Randomised with a
    differentiable score, whatever its name, and for no other (a detector named smoothed_* that does not declare it
    gets none)."""
    from advopenood.capabilities import Randomised, is_randomised
    from advopenood_plugins.detectors.logits import EBO

    class Noisy(EBO, Randomised):
        openood_name = None
        draws = 2

        def evaluation_noise_seed(self) -> int:
            return 7

        def with_eot(self, samples):
            return self

    plain = type("Plain", (EBO,), {"openood_name": None, "__module__": __name__})
    registry.register("detectors", "zznoisy")(Noisy)
    registry.register("detectors", "smoothed_zzplain")(plain)
    eot = ("adaptive_eot_", "adaptive_ood_eot_", "adaptive_apgd_eot_", "robust_id_eot_", "robust_ood_eot_",
           "robust_apgd_id_eot_", "robust_apgd_ood_eot_")
    try:
        attacks = set(registry.names("attacks"))
        assert is_randomised(Noisy) and not is_randomised(plain) and is_randomised(_smoothed())
        assert {prefix + "zznoisy" for prefix in eot} <= attacks
        assert not {prefix + "smoothed_zzplain" for prefix in eot} & attacks
        assert {prefix + "smoothed_msp" for prefix in eot} <= attacks
    finally:
        registry.unregister("detectors", "zznoisy")
        registry.unregister("detectors", "smoothed_zzplain")
    assert not [a for a in registry.names("attacks") if "eot_" in a and a.endswith(("zznoisy", "zzplain"))]


def test_the_evaluation_noise_seed_decides_the_scores_and_the_store_key(cifar_model, cifar_batch):
    """Derived from the run's seed by default, or given (eval_seed); another seed gives other scores and another
    store key; the attack stream differs from the evaluation stream of the same seed."""
    from advopenood_plugins.detectors.smoothed import stream_seed

    x = cifar_batch[0][:16]
    derived, given = _smoothed(), _smoothed({"eval_seed": 5})
    assert derived.evaluation_noise_seed() == stream_seed(0, "eval") and given.evaluation_noise_seed() == 5
    assert derived.for_attack().draw_seed() == stream_seed(0, "attack") != derived.draw_seed()
    with torch.no_grad():
        scores = [d.score(cifar_model, x, None).numpy() for d in (derived, given, derived.for_attack())]
    assert np.abs(scores[0] - scores[1]).max() > 1e-3 and np.abs(scores[0] - scores[2]).max() > 1e-3
    keys = {detector_key(model_hash="m", name="smoothed_msp", backend="pytorch-ood", detector=d, params=d.params,
                         fit_identity={"rows": 1}, seed=0, batch_size=8) for d in (derived, given)}
    assert len(keys) == 2


@pytest.mark.parametrize("eval_seed", [-1, 1.5, "x", True])
def test_a_bad_eval_seed_is_refused(eval_seed):
    from advopenood.errors import UsageError

    with pytest.raises(UsageError, match="eval_seed"):
        _smoothed({"eval_seed": eval_seed})


@pytest.fixture(scope="module")
def smoothed_run(session_cache, tmp_path_factory) -> Path:
    """A demo run with smoothed_msp under PGD, its plain and its EOT attack, the smoothed evaluator, and the
    robust_auroc evaluator (whose robust_id_eot_/robust_ood_eot_smoothed_msp sets are attacks on the smoothed detector
    that are neither plain nor EOT rows)."""
    cfg = yaml.safe_load((resources.files("advopenood.configs") / "demo.yaml").read_text())
    cfg.update(attacks=["pgd", "adaptive", "adaptive_eot"], detectors=["msp", "smoothed_msp"],
               evaluators=["ood", "smoothed", "robust_auroc"], analyses=[],
               attack_params={"pgd": {"steps": 5, "eps": "16/255"}, "adaptive": {"steps": 5, "eps": "16/255", "lam": [1.0]},
                              "adaptive_eot": {"steps": 5, "eps": "16/255", "lam": [1.0]},
                              "robust_id": {"steps": 5}, "robust_ood": {"steps": 5}},
               evaluator_params={"robust_auroc": {"ood_sets": ["textures"], "eot": 2}},
               detector_params={"smoothed_msp": {"n": 4, "sigma": 0.1}})
    folder = tmp_path_factory.mktemp("smoothed")
    (folder / "smoothed.yaml").write_text(yaml.safe_dump(cfg))
    out = folder / "run"
    assert main(["run", "--config", str(folder / "smoothed.yaml"), "--out", str(out), "--quiet", "--limit", "48"]) == 0
    return out


def test_the_report_puts_plain_and_eot_side_by_side(smoothed_run):
    attacked = set(pd.read_csv(smoothed_run / "asr.csv")["attack"])
    assert {"robust_id_eot_smoothed_msp", "robust_ood_eot_smoothed_msp-textures"} <= attacked  # not in the table
    table = pd.read_csv(smoothed_run / "table_smoothed.csv")
    assert len(table) == 1
    row = table.iloc[0]
    assert (row.detector, row.plain_attack, row.eot_attack, row.baseline) == \
        ("smoothed_msp", "adaptive_smoothed_msp", "adaptive_eot_smoothed_msp", "pgd")
    assert (row.n, row.sigma, row.statistic, row.eot_samples) == (4, 0.1, "median", 4)
    ood = pd.read_csv(smoothed_run / "ood.csv").set_index(["detector", "attack"])
    for attack, column in (("adaptive_smoothed_msp", "auroc_plain"), ("adaptive_eot_smoothed_msp", "auroc_eot"),
                           ("pgd", "auroc_baseline")):
        assert row[column] == pytest.approx(ood.loc[("smoothed_msp", attack), "auroc"], abs=1e-4)
    report = (smoothed_run / "report.md").read_text()
    assert "Smoothed detectors: plain vs EOT attacks" in report
    assert f"AUROC {row.auroc_plain:.1f} under the plain attack" in report and f"{row.auroc_eot:.1f} under EOT" in report


def test_every_auroc_and_fpr95_has_the_interval_of_its_ood_csv_cell(smoothed_run):
    row = pd.read_csv(smoothed_run / "table_smoothed.csv").iloc[0]
    ood = pd.read_csv(smoothed_run / "ood.csv").set_index(["detector", "attack"])
    assert row.ci == "bootstrap-2000"
    for attack, kind in (("adaptive_smoothed_msp", "plain"), ("adaptive_eot_smoothed_msp", "eot"), ("pgd", "baseline")):
        cell = ood.loc[("smoothed_msp", attack)]
        for metric in ("auroc", "fpr95"):
            lo, value, hi = (row[f"{metric}_{kind}{end}"] for end in ("_lo", "", "_hi"))
            assert lo <= value <= hi
            assert [lo, hi] == pytest.approx([cell[f"{metric}_lo"], cell[f"{metric}_hi"]], abs=1e-4)


def test_the_run_records_the_evaluation_noise_and_attacks_both_sides_with_eot(smoothed_run):
    """run.json names the evaluation noise's seed of every randomised detector; robust_auroc attacks smoothed_msp
    with the EOT attacks (attack_family eot, the evaluator's number of draws) and msp with the plain ones, and says
    so."""
    import json

    from advopenood_plugins.detectors.smoothed import stream_seed

    info = json.loads((smoothed_run / "run.json").read_text())
    assert info["evaluation_noise_seed"] == {"smoothed_msp": stream_seed(info["seed"], "eval")}
    robust = pd.read_csv(smoothed_run / "robust_auroc.csv").set_index("detector")
    assert robust.loc["smoothed_msp", "attack_family"] == "eot" and robust.loc["msp", "attack_family"] == "plain"
    assert robust.loc["smoothed_msp", "id_attack"] == "robust_id_eot_smoothed_msp"
    assert info["attacks"]["robust_id_eot_smoothed_msp"]["params"]["eot"] == 2  # evaluator_params.robust_auroc.eot
    report = (smoothed_run / "report.md").read_text()
    assert "(PGD with EOT gradients, eps" in report


def test_the_untouched_run_verifies_in_this_process(smoothed_run):
    """The control of the edits below (once for all three; a fresh process checks it too, further down)."""
    assert main(["verify", str(smoothed_run)]) == 0


@pytest.mark.parametrize("column, change", [("auroc_eot", 0.5), ("auroc_plain_lo", -0.5), ("fpr95_baseline_hi", -1)])
def test_the_smoothed_table_verifies(smoothed_run, tmp_path, capsys, column, change):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(smoothed_run, run)
    table = pd.read_csv(run / "table_smoothed.csv")
    table.loc[0, column] += change
    table.to_csv(run / "table_smoothed.csv", index=False, float_format="%.6g")
    capsys.readouterr()
    assert main(["verify", str(run)]) == 1
    lines = [line for line in capsys.readouterr().out.splitlines() if "DIFFERENCE" in line]
    assert len(lines) == 1 and "table_smoothed.csv" in lines[0] and f" {column}:" in lines[0]


def _edit_auroc(run: Path) -> None:
    table = pd.read_csv(run / "table_smoothed.csv")
    table.loc[0, "auroc_eot"] += 0.5
    table.to_csv(run / "table_smoothed.csv", index=False, float_format="%.6g")


def _name_a_gone_evaluator(run: Path) -> None:
    import json

    info = json.loads((run / "run.json").read_text())
    info["config"]["evaluators"].append("gone_evaluator")
    (run / "run.json").write_text(json.dumps(info))


def _both_edits(run: Path) -> None:
    _edit_auroc(run)
    _name_a_gone_evaluator(run)


@pytest.mark.parametrize("edit, rc, expected", [
    (None, 0, []),
    # both edits in one copy, one fresh process for the two (each is its own difference): the table re-derived in a
    # fresh process too (it once was 'not installed here'), the evaluator that cannot be loaded a difference
    (_both_edits, 1, ["table_smoothed.csv", "evaluator 'gone_evaluator' ran but cannot be loaded here"]),
])
def test_verify_in_a_fresh_process(smoothed_run, tmp_path, edit, rc, expected):
    """``advopenood verify`` in a new process finds the smoothed evaluator's hook (registered by the detectors'
    module, not by an evaluators entry point), and an evaluator the run names that cannot be loaded is a
    difference, not a note."""
    import os
    import shutil
    import subprocess
    import sys

    run = tmp_path / "run"
    shutil.copytree(smoothed_run, run)
    if edit:
        edit(run)
    done = subprocess.run([sys.executable, "-m", "advopenood.cli", "verify", str(run)], capture_output=True,
                          text=True, env=os.environ.copy())
    assert done.returncode == rc, done.stdout + done.stderr
    assert "not installed here" not in done.stdout
    lines = [line for line in done.stdout.splitlines() if "DIFFERENCE" in line]
    assert len(lines) == len(expected) and all(any(e in line for line in lines) for e in expected), lines


def test_a_deleted_smoothed_table_names_the_sets_in_no_row(smoothed_run, tmp_path, capsys):
    """Without ``table_smoothed.csv`` verify still knows the rows the run must have: each plain and EOT adaptive
    set on the smoothed detector is in no row (and the file is missing against ``manifest.json``)."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(smoothed_run, run)
    (run / "table_smoothed.csv").unlink()
    capsys.readouterr()
    assert main(["verify", str(run)]) == 1
    found = [line for line in capsys.readouterr().out.splitlines() if "DIFFERENCE" in line]
    lines = [x for x in found if "table_smoothed.csv: attack set" in x]
    assert len(lines) == 2 and all("is in no row" in x for x in lines), found
    assert {"adaptive_smoothed_msp", "adaptive_eot_smoothed_msp"} == {x.split("'")[1] for x in lines}
    # the only other difference: the smoothed evaluator's report section cannot be rendered without its table
    assert all("table_smoothed.csv" in x for x in found) and len(found) <= 3, found


def test_the_table_pairs_only_plain_and_eot_attacks():
    """Other attacks on a smoothed detector (robust_id_/robust_ood_<det>, which the robust_auroc evaluator adds) are
    not plain attacks: they stay out of table_smoothed (they once entered it as 'plain' rows with AUROC 100)."""
    from advopenood_plugins.attacks.eot import EOT_PREFIXES

    assert not any("robust_id_smoothed_msp".startswith(plain) for plain in EOT_PREFIXES.values())
    assert any("adaptive_smoothed_msp".startswith(plain) for plain in EOT_PREFIXES.values())
