"""ROSS detectors ``ross_<det>`` (issue 33, ``plugins/detectors/ross.py``) against a transcription of Hekal et al.'s
``openood/postprocessors/ross_postprocessor.py`` (Abdu-Hekal/ROSS f8f030d), on the pack's trained CIFAR-10
ResNet-20."""
from __future__ import annotations

import json
from importlib import resources
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from torch import Tensor

from advopenood import registry
from advopenood.attacks.base import build_attack
from advopenood.capabilities import bind_attack, is_differentiable
from advopenood.cli.main import main
from advopenood.data.datasets import stack
from advopenood.detection.bank import create_detector, fit_subset
from advopenood.detection.outputs import forward_outputs
from advopenood.detection.scoring import fit_detectors
from advopenood.errors import UsageError
from advopenood_plugins.detectors import BUILTIN_DETECTORS
from advopenood_plugins.detectors.ross import SURROGATES, is_ross, pixel_sigma, ross_statistics
from advopenood_plugins.detectors.smoothed import is_smoothed, stream_seed

CPU = torch.device("cpu")
N = 5
VAL = 64
FIT_ROWS = 160
#: ross_knn's base fits on this many rows (its fit_size), q on the VAL rows after them
KNN_ROWS = 48
PARAMS = {"ross_gen": {"n": N, "val_size": VAL}, "ross_knn": {"n": N, "val_size": VAL, "fit_size": KNN_ROWS, "K": 5},
          "ross_gram": {"n": N, "val_size": VAL}}
#: third-party detectors installed here (the example package registers negentropy and topgap)
THIRD_PARTY = tuple(sorted(ep.name for ep in entry_points(group="advopenood.detectors")
                           if not ep.value.startswith("advopenood_plugins")))


def their_ross(scores: Tensor, q: float, lam: float) -> dict[str, Tensor]:
    """A transcription of their ``postprocess``, lines 130-136 (``num_samples x B`` base scores -> components)."""
    eps = 1e-12
    median = scores.median(dim=0).values  # torch.median: the lower middle value for even n
    mad = torch.mean(torch.abs(scores - median), dim=0)
    cov = mad / (median + eps)
    low = torch.clamp(median, max=q)
    high = torch.clamp(median - q, min=0.0)
    stab = 1 / (mad + eps)
    return {"median": median, "neg_mad": -mad, "neg_cov": -cov, "ross": low + high * (1 + lam * stab)}


def openood_base(det, net, x: Tensor) -> Tensor:
    """Their ``base_pp`` confidence, transcribed from OpenOOD (the scale ROSS's gate reads): GEN as
    ``gen_postprocessor.py`` ``generalized_entropy`` (the softmax sorted ascending, the top M summed, unclamped), KNN
    as ``knn_postprocessor.py`` (faiss ``IndexFlatL2``: the squared distance), any other base as this project's."""
    out = forward_outputs(net, x)
    if det.base_name == "gen":
        top = torch.sort(torch.softmax(out.logits, dim=1), dim=1)[0][:, -det.base.p.M:]
        gamma = det.base.p.gamma
        return -torch.sum(top ** gamma * (1 - top) ** gamma, dim=1)
    if det.base_name == "knn":
        return -det.base.score(net, x, out) ** 2
    return det.base.score(net, x, out)


def by_hand(det, net, x: Tensor, noise: Tensor) -> Tensor:
    """Their base confidence (:func:`openood_base`) of every noisy copy ``x + noise_j``, one pass per copy
    (``n x B``)."""
    with torch.no_grad():
        return torch.stack([openood_base(det, net, x + e).double() for e in noise])


@pytest.fixture(scope="module")
def fitted(cifar_model, pack_set):
    """ross_gen, ross_knn and ross_gram fitted by one fit_detectors on 160 CIFAR-10 training rows, and those rows
    in the order the fit reads them."""
    fit = pack_set("cifar10", "cifar10_train_10k.npz", FIT_ROWS)
    bank = fit_detectors(list(PARAMS), "pytorch-ood", cifar_model, fit, batch_size=64, device=CPU, seed=0,
                         params=PARAMS, progress=False)
    assert bank.errors == {}
    return bank.dets, stack(fit_subset(fit, 0))[0], fit


# ---------------------------------------------------------------------------------------------- faithfulness


@pytest.mark.parametrize("copies, q, lam, median", [
    ([[0.1, 2.0], [0.5, 1.0], [0.3, 3.0]], 0.2, 0.05, [0.3, 2.0]),  # odd n
    ([[1.0, 0.0], [5.0, 1.0], [2.0, 3.0], [4.0, 2.0]], 0.5, 0.05, [2.0, 1.0]),  # even n: the lower middle value
    ([[0.4, 0.9], [0.4, 0.9], [0.9, 0.1], [0.4, 0.9]], 0.3, 0.01, [0.4, 0.9]),  # ties
    ([[0.3, -2.0], [0.2, -1.0], [0.4, -3.0]], 0.8, 0.05, [0.3, -2.0]),  # m below q: ROSS is m
    ([[0.95, 7.0], [0.9, 8.0], [0.99, 9.0]], 0.1, 0.05, [0.95, 8.0]),  # m above q: gated by the deviation
    ([[0.7, 0.7], [0.7, 0.7], [0.7, 0.7]], 0.5, 0.05, [0.7, 0.7]),  # MAD 0: the 1e-12
])
def test_statistics_are_their_postprocess(copies, q, lam, median):
    scores = torch.tensor(copies, dtype=torch.float64)
    ours, theirs = ross_statistics(scores, q, lam), their_ross(scores, q, lam)
    assert ours["median"].tolist() == median
    for name, value in theirs.items():
        assert torch.equal(ours[name], value), name


def test_score_is_their_formula_on_the_base_scores_of_the_noisy_copies(fitted, cifar_model, cifar_batch):
    """A fitted ross_gen on 16 real images: GEN's confidence of each of the exact noisy copies, by hand, through
    their lines 130-136 with the fitted q; every component, and the score is the ``ross`` one."""
    det = fitted[0]["ross_gen"]
    x = cifar_batch[0][:16]
    theirs = their_ross(by_hand(det, cifar_model, x, det.noise(cifar_model, x, N)), det.q, det.lam)
    with torch.no_grad():
        ours, score = det.statistics(cifar_model, x), det.score(cifar_model, x, None)
    for name, value in theirs.items():
        torch.testing.assert_close(ours[name], value, rtol=1e-5, atol=1e-9)
    assert torch.equal(score, ours["ross"])
    above = theirs["median"] > det.q
    assert above.any() and (score[above] > theirs["median"][above]).all()  # the gate lifts every median above q


def mann_whitney(pos: np.ndarray, neg: np.ndarray) -> float:
    """AUROC (%) as the Mann-Whitney statistic, ties counted half: P(ID confidence > OOD confidence)."""
    pos, neg = np.asarray(pos)[:, None], np.asarray(neg)[None, :]
    return 100 * float(((pos > neg) + 0.5 * (pos == neg)).mean())


def test_ross_gen_is_their_score_on_openood_gens_scale(cifar_model, pack_set):
    """Issue 48, item 4: ``ross_gen`` at their Table 2's setting (sigma 0.05, lambda 0.01, n 25) against an
    independent ROSS on OpenOOD's summed GEN, on the same 24 + 24 CIFAR-10 / Tiny-ImageNet images and noise: the
    AUROC agrees within 0.1 point (the old pytorch-ood mean, GEN / 10, is the lambda-times-ten setting and differs)."""
    from advopenood.data.datasets import stack

    params = {"n": 25, "sigma": 0.05, "lam": 0.01, "val_size": VAL}
    fit = pack_set("cifar10", "cifar10_train_10k.npz", FIT_ROWS)
    det = fit_detectors(["ross_gen"], "pytorch-ood", cifar_model, fit, batch_size=64, device=CPU, seed=0,
                        params={"ross_gen": params}, progress=False).dets["ross_gen"]
    val = stack(fit_subset(fit, 0))[0][FIT_ROWS - VAL:]
    images = [stack(pack_set(name, path, 24))[0] for name, path in (("cifar10", "cifar10_test.npz"),
                                                                     ("tin", "tin_test.npz"))]

    def their(x: Tensor, q: float) -> Tensor:
        copies = by_hand(det, cifar_model, x, det.noise(cifar_model, x, 25))
        return their_ross(copies, q, 0.01)

    q = float(np.quantile(their(val, 0.0)["median"].numpy(), 0.05))
    assert det.q == pytest.approx(q, rel=1e-6)
    theirs = [their(x, q)["ross"].numpy() for x in images]
    with torch.no_grad():
        ours = [det.score(cifar_model, x, None).numpy() for x in images]
    assert abs(mann_whitney(*ours) - mann_whitney(*theirs)) < 0.1
    np.testing.assert_allclose(np.concatenate(ours), np.concatenate(theirs), rtol=1e-4)


# --------------------------------------------------------------------------------------------------------- fit


@pytest.mark.parametrize("name, first, rows", [("ross_gen", FIT_ROWS - VAL, FIT_ROWS),
                                               ("ross_knn", KNN_ROWS, KNN_ROWS + VAL),
                                               ("ross_gram", FIT_ROWS - VAL, FIT_ROWS)])
def test_q_is_the_quantile_of_the_validation_medians(fitted, cifar_model, name, first, rows):
    """q = np.quantile(medians of the val_size rows after the base detector's rows, 0.05), their setup line 112."""
    dets, x, _ = fitted
    det = dets[name]
    val = x[first:rows]
    medians = by_hand(det, cifar_model, val, det.noise(cifar_model, val, N)).median(dim=0).values
    assert det.q == pytest.approx(float(np.quantile(medians.numpy(), 0.05)), rel=1e-6, abs=1e-9)


def test_the_base_fits_on_the_rows_before_the_validation_rows(fitted, cifar_model):
    """ross_knn's KNN bank is exactly KNN fitted alone on the first fit_size rows (the validation rows after them
    never enter it), and a fit set of fit_size + val_size rows is enough (it once was cut to fit_size rows)."""
    dets, _, fit = fitted
    base = dets["ross_knn"].base
    alone = fit_detectors(["knn"], "pytorch-ood", cifar_model, fit, batch_size=64, device=CPU, seed=0,
                          params={"knn": {"fit_size": KNN_ROWS, "K": 5}}, progress=False).dets["knn"]
    assert base.bank.shape[0] == KNN_ROWS
    torch.testing.assert_close(base.bank, alone.bank, rtol=1e-5, atol=1e-6)
    assert dets["ross_knn"].fit_size == KNN_ROWS + VAL and dets["ross_gen"].fit_size is None
    small = fit_detectors(["ross_knn"], "pytorch-ood", cifar_model, fit, batch_size=64, device=CPU, seed=0,
                          params=PARAMS, progress=False)
    assert small.errors == {} and small.dets["ross_knn"].q == dets["ross_knn"].q


@pytest.mark.parametrize("name", ["ross_gen", "ross_gram"])
def test_fit_state_round_trip(fitted, cifar_model, cifar_batch, name):
    """q and the base's stored state (GRAM's bounds) restore the same detector; a base that stores no state (KNN)
    stores none for ROSS either (both refit from the fit pass)."""
    det = fitted[0][name]
    assert fitted[0]["ross_knn"].fit_state() is None
    fresh = create_detector(name, "pytorch-ood", PARAMS[name], seed=0)
    fresh.load_fit_state(cifar_model, det.fit_state())
    x = cifar_batch[0][:8]
    with torch.no_grad():
        assert fresh.q == det.q and torch.equal(fresh.score(cifar_model, x, None), det.score(cifar_model, x, None))


# ------------------------------------------------------------------------------------------------- noise, seeds


@pytest.mark.parametrize("fixed", [False, True])
def test_noise_is_sigma_in_normalised_units(fitted, cifar_model, cifar_batch, fixed):
    """Their noise_magnitude is in the network's normalised input units: in pixels, sigma * std per channel."""
    det = fitted[0]["ross_gen"]
    std = cifar_model.std.flatten().double()
    assert (std - 1).abs().min() > 0.1  # pixel units would be visibly different
    e = det.noise(cifar_model, cifar_batch[0][:16], 50, fixed=fixed).double() / det.sigma
    unit = (e / std.view(1, 1, -1, 1, 1)).transpose(0, 2).reshape(3, -1)
    np.testing.assert_allclose(unit.std(dim=1).numpy(), 1.0, atol=0.01)
    np.testing.assert_allclose(unit.mean(dim=1).numpy(), 0.0, atol=0.01)
    assert pixel_sigma(cifar_model, 0.1) == pytest.approx([0.1 * s for s in std.tolist()], rel=1e-6)


def test_scores_are_seeded(fitted, cifar_model, cifar_batch):
    """The same evaluation seed (derived or given) gives the same scores, whatever the batch split up to float
    rounding (1 / MAD amplifies the pass's last bits); another eval_seed and the attack stream give others."""
    det = fitted[0]["ross_gen"]
    x = cifar_batch[0][:16]
    state = det.fit_state()

    def scores(d) -> np.ndarray:
        with torch.no_grad():
            return d.score(cifar_model, x, None).numpy()

    def given(seed: int):
        twin = create_detector("ross_gen", "pytorch-ood", {**PARAMS["ross_gen"], "eval_seed": seed}, seed=0)
        twin.load_fit_state(cifar_model, state)
        return twin

    assert det.draw_seed() == stream_seed(0, "eval") and det.for_attack().draw_seed() == stream_seed(0, "attack")
    whole = scores(det)
    with torch.no_grad():
        split = np.concatenate([det.score(cifar_model, part, None).numpy() for part in x.split(5)])
    np.testing.assert_allclose(whole, split, rtol=1e-5)  # the same noise; the pass's batch size moves the last bits
    np.testing.assert_array_equal(whole, scores(given(det.evaluation_noise_seed())))
    assert np.abs(whole - scores(given(5))).max() > 1e-4
    assert np.abs(whole - scores(det.for_attack())).max() > 1e-4


@pytest.mark.parametrize("eot", [0, N])
def test_gradient_noise_is_fixed_without_eot_and_image_seeded_with_it(fitted, cifar_model, cifar_batch, eot,
                                                                        monkeypatch):
    """Without EOT every gradient call on a batch sees the same n copies (one deterministic objective); with EOT
    the copies are the attack stream's draws of the image: the same image the same, another image others."""
    det = fitted[0]["ross_gen"].for_attack().with_eot(eot)
    seen: list[Tensor] = []
    real = type(det).copies

    def spy(self, net, x, noise, grad):
        if grad:
            seen.append(noise.detach().clone())
        return real(self, net, x, noise, grad)

    monkeypatch.setattr(type(det), "copies", spy)
    for x in (cifar_batch[0][:4], cifar_batch[0][:4], cifar_batch[0][4:8]):
        det.grad_score(cifar_model, x.clone().requires_grad_(), None)
    first, again, other = seen
    assert first.shape[0] == N and torch.equal(first, again)
    assert torch.equal(first, other) == (eot == 0)
    assert torch.equal(first, det.noise(cifar_model, cifar_batch[0][:4], N)) == (eot > 0)


# ------------------------------------------------------------------------------------------------------ gradients


@pytest.mark.parametrize("surrogate", SURROGATES)
@pytest.mark.parametrize("eot", [0, N])
def test_gradients_are_finite_and_the_forward_value_is_the_score(fitted, cifar_model, cifar_batch, surrogate, eot):
    det = fitted[0]["ross_gen"].for_attack().with_eot(eot).with_surrogate(surrogate)
    x = cifar_batch[0][:8].clone().requires_grad_()
    value = det.grad_score(cifar_model, x, None)
    (grad,) = torch.autograd.grad(value.sum(), x)
    with torch.no_grad():
        torch.testing.assert_close(value.detach(), det.score(cifar_model, x.detach(), None), rtol=1e-12, atol=0)
    assert torch.isfinite(grad).all() and grad.abs().max() > 0


def test_an_unknown_surrogate_is_refused(fitted):
    with pytest.raises(UsageError, match="surrogate 'bad'.*valid choices: ross, median, log_gate"):
        fitted[0]["ross_gen"].with_surrogate("bad")


# ------------------------------------------------------------------------------------------------------ refusals


def _demo_config(folder: Path, detector_params: dict | None = None, **changes) -> str:
    cfg = yaml.safe_load((resources.files("advopenood.configs") / "demo.yaml").read_text())
    cfg.update({"attacks": ["adaptive_eot"], "detectors": ["msp", "ross_msp"], "evaluators": ["ood"], "analyses": [],
                "attack_params": {"adaptive_eot": {"steps": 2}},
                "detector_params": {"ross_msp": {"n": 3, "val_size": 32, **(detector_params or {})}}, **changes})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ross.yaml").write_text(yaml.safe_dump(cfg))
    return str(folder / "ross.yaml")


@pytest.mark.parametrize("params, flags, fragment", [
    ({"n": 2}, [], "n 2 for detector 'ross_msp'"),
    ({"n": 1}, [], "n 1 for detector 'ross_msp'"),
    ({"sigma": -0.1}, [], "sigma -0.1 for detector 'ross_msp'"),
    ({"lam": -1}, [], "lam -1 for detector 'ross_msp'"),
    ({"component": "foo"}, [], "component 'foo' for detector 'ross_msp'"),
    ({"val_size": 1}, [], "val_size 1 for detector 'ross_msp'"),
    ({}, ["--detectors", "ross_nosuch"], "unknown detector 'ross_nosuch'"),
    ({}, ["--attacks", "adaptive_eot_ross_gram_legacy"],  # GRAM as the paper ran it has no gradient
     "unknown attack 'adaptive_eot_ross_gram_legacy'; did you mean 'adaptive_eot_ross_gram'?"),
])
def test_bad_settings_are_refused_before_work_in_one_line(params, flags, fragment, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ADVOPENOOD_CACHE", str(tmp_path / "cache"))
    rc = main(["run", "--config", _demo_config(tmp_path / "cfg", params), *flags, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("advopenood: error:"), err
    assert fragment in err[0] and "valid choices" in err[0], err[0]
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


def test_val_size_beyond_the_fit_set_fails_only_ross(session_cache, tmp_path, capsys):
    """The fit set's size is known only once the run has read it: val_size >= the fit rows fails ross_msp's fit
    (exit 3, named in run.json with a one-line reason, its ood.csv cells empty with it), and msp's outputs stand."""
    config = _demo_config(tmp_path / "cfg", {"val_size": 100000}, attacks=["fgsm"], attack_params={})
    assert main(["run", "--config", config, "--out", str(tmp_path / "out"), "--quiet", "--limit", "8"]) == 3
    info = json.loads((tmp_path / "out" / "run.json").read_text())
    reason = info["detector_errors"]["ross_msp"]
    assert "val_size=100000" in reason and "valid choices" in reason and "\n" not in reason
    ood = pd.read_csv(tmp_path / "out" / "ood.csv")
    ross, msp = ood[ood.detector == "ross_msp"], ood[ood.detector == "msp"]
    assert ross.auroc.isna().all() and ross.error.str.contains("val_size=100000").all()
    assert len(msp) == len(ross) and msp.auroc.notna().all()


# ------------------------------------------------------------------------------------------------------ registry


@pytest.mark.parametrize("det", [*BUILTIN_DETECTORS, "gram_legacy", *THIRD_PARTY])
def test_every_detector_has_a_ross_twin_outside_all(det):
    names = set(registry.names("detectors"))
    twin = f"ross_{det}"
    assert twin in names and is_ross(registry.get("detectors", twin))
    assert twin not in registry.parse_names("detectors", "all")
    assert not {f"smoothed_{twin}", f"ross_smoothed_{det}", f"ross_{twin}"} & names
    assert not is_smoothed(registry.get("detectors", twin))  # the smoothed evaluator has no row for it
    assert is_smoothed(registry.get("detectors", f"smoothed_{det}"))
    assert is_differentiable(registry.get("detectors", twin)) == is_differentiable(registry.get("detectors", det))


def test_the_eot_and_plain_attacks_on_ross_exist():
    attacks = set(registry.names("attacks"))
    assert {"adaptive_eot_ross_msp", "adaptive_ood_eot_ross_msp", "robust_id_eot_ross_msp", "robust_ood_eot_ross_msp",
            "robust_apgd_id_eot_ross_msp", "adaptive_ross_msp"} <= attacks


def test_an_adaptive_attack_runs_every_surrogate_of_ross(cifar_model, pack_set):
    fit = pack_set("cifar10", "cifar10_train_10k.npz", 64)
    got = {}
    for name in ("adaptive_ross_msp", "adaptive_msp"):
        attack = bind_attack(build_attack(name, {"steps": 1}, input_size=32), cifar_model, fit, seed=0, batch_size=64,
                             device=CPU, detector_params={"ross_msp": {"n": 3, "val_size": 32}})
        got[name] = [getattr(t.detector, "surrogate", None) for t in attack.targets()]
    assert got == {"adaptive_ross_msp": list(SURROGATES), "adaptive_msp": [None]}


# ------------------------------------------------------------------------------------------------------ a run


@pytest.fixture(scope="module")
def ross_run(session_cache, tmp_path_factory) -> Path:
    """A demo run: msp and ross_msp (n 3, val_size 32) under ross_msp's EOT attack, the ood and the smoothed
    evaluators, 16 images."""
    folder = tmp_path_factory.mktemp("ross")
    out = folder / "run"
    config = _demo_config(folder, evaluators=["ood", "smoothed"])
    assert main(["run", "--config", config, "--out", str(out), "--quiet", "--limit", "16"]) == 0
    return out


def test_a_run_scores_ross_with_intervals_and_records_its_noise_seed(ross_run):
    info = json.loads((ross_run / "run.json").read_text())
    assert info["evaluation_noise_seed"] == {"ross_msp": stream_seed(info["seed"], "eval")}
    assert not info["detector_errors"] and not info["plugin_errors"]
    ood = pd.read_csv(ross_run / "ood.csv")
    rows = ood[ood.detector == "ross_msp"]
    assert set(rows.ood_set) == {"textures", "blobs", "inverted", "adaptive_eot_ross_msp"}
    assert (rows.auroc_lo <= rows.auroc).all() and (rows.auroc <= rows.auroc_hi).all()
    assert rows.ci.str.startswith("bootstrap-2000").all()  # "; at a bound: ..." where one is


def test_the_smoothed_table_has_no_ross_rows(ross_run):
    """ROSS draws the smoothed detectors' copies but is not their median: the smoothed evaluator once listed it
    with smoothed_<det>'s defaults (sigma 0.05, statistic median) and an empty inner detector."""
    assert not (ross_run / "table_smoothed.csv").exists()
