"""``hekal_min_<det>`` / ``hekal_max_<det>``: ROSS's attacks as Hekal et al. 2026 ran them, on the pack's CIFAR-10
ResNet-20 and a couple of dozen real images."""
from __future__ import annotations

import pytest
import torch

from advopenood.attacks.base import build_attack
from advopenood.attacks.store import check_attack_output
from advopenood.cli.main import main
from advopenood_plugins.attacks.hekal import HekalAttack
from advopenood_plugins.kit.networks import normalisation
from conftest import pack_config

EPS = 16 / 255
FIT_ROWS = 200
ROSS = {"n": 3, "val_size": 32}


@pytest.fixture(scope="module")
def fit_set(pack_set):
    return pack_set("cifar10_train", "cifar10_train_10k.npz", FIT_ROWS)


@pytest.fixture(scope="module")
def images(cifar_batch, pack_set):
    from advopenood.data.datasets import stack

    ood = pack_set("texture", "texture_test.npz", 24)
    return {"min": (cifar_batch[0][:24], cifar_batch[1][:24]), "max": stack(ood, list(range(24)))}


def attack(cifar_model, fit_set, name: str, protocol: str = "strong", **params) -> HekalAttack:
    """``name`` built as a run builds it under ``protocol`` and bound to the fit rows (ROSS: n 3, val_size 32)."""
    built = build_attack(name, {"eps": EPS, **params}, input_size=32, protocol=protocol)
    return built.bind(cifar_model, fit_set, seed=0, batch_size=64, device="cpu",
                      detector_params=ROSS if "ross_" in name else {})


def test_the_normalised_ball_is_eps_std_per_channel_and_may_leave_the_pixel_range(cifar_model, fit_set, images):
    x, y = images["min"]
    a = attack(cifar_model, fit_set, "hekal_min_gen", "hekal2026", steps=3)
    x_adv = a(cifar_model, x, y, seed=0)
    _, std = normalisation(cifar_model, x)
    per_channel = (x_adv - x).abs().amax(dim=(0, 2, 3))
    assert (per_channel <= EPS * std.flatten() * (1 + 1e-4)).all()
    assert per_channel.max() > EPS * float(std.min())  # the channel with the largest std uses its wider ball
    assert ((x_adv < 0) | (x_adv > 1)).any()
    assert a.pixel_budget() == pytest.approx(EPS * float(std.max()))
    check_attack_output(a, x, x_adv)  # the store takes images outside [0, 1] from an unclipped attack
    with pytest.raises(ValueError, match="NaN"):
        check_attack_output(a, x, x_adv.clone().index_fill_(0, torch.tensor([0]), float("nan")))


def test_the_pixel_variant_stays_in_the_pixel_ball(cifar_model, fit_set, images):
    x, y = images["min"]
    a = attack(cifar_model, fit_set, "hekal_min_gen", steps=3)
    x_adv = a(cifar_model, x, y, seed=0)
    assert x_adv.min() >= 0 and x_adv.max() <= 1
    assert (x_adv - x).abs().max() <= EPS + 1e-6
    with pytest.raises(ValueError, match=r"outside \[0, 1\]"):
        check_attack_output(a, x, x_adv + 2)


@pytest.mark.parametrize("units, clip", [("normalised", False), ("pixel", True)])
def test_it_returns_the_last_iterate_of_foolbox_linf_pgd(cifar_model, fit_set, images, units, clip):
    """A hand loop of their patched ``run`` (random start, signed steps on the summed confidence, projection, clip to
    the bounds, the last iterate) with the same seed gives the attack's images."""
    x, y = images["min"]
    a = attack(cifar_model, fit_set, "hekal_min_gen", units=units, clip=clip, steps=4)
    got = a(cifar_model, x, y, seed=3)
    mean, std = normalisation(cifar_model, x)
    if units == "pixel":
        mean, std = torch.zeros_like(mean), torch.ones_like(std)
    lo, hi = (0 - mean) / std, (1 - mean) / std
    box = (lambda z: torch.maximum(torch.minimum(z, hi), lo)) if clip else (lambda z: z)
    target = a.target
    with torch.random.fork_rng():
        torch.manual_seed(3)
        z0 = (x - mean) / std
        z = box(z0 + (torch.rand(z0.shape) * (2 * EPS) - EPS))
        for _ in range(4):
            z = z.detach().requires_grad_(True)
            grad, = torch.autograd.grad(-target.confidence(z * std + mean).sum(), z)  # ascent on -c: PGD-Min
            z = box(z0 + (z.detach() + 0.01 / 0.3 * EPS * grad.sign() - z0).clamp(-EPS, EPS))
    torch.testing.assert_close(got, (z * std + mean).detach(), atol=1e-5, rtol=0)


def test_through_base_differentiates_the_base_detector(cifar_model, fit_set, images):
    x, _ = images["min"]
    grads = {}
    for name, through in (("hekal_min_ross_gen", "base"), ("hekal_min_gen", "self"), ("hekal_min_ross_gen", "self")):
        target = attack(cifar_model, fit_set, name, through=through).gradient_target
        xg = x[:8].clone().requires_grad_(True)
        grads[name, through], = torch.autograd.grad(target.confidence(xg).sum(), xg)
    torch.testing.assert_close(grads["hekal_min_ross_gen", "base"], grads["hekal_min_gen", "self"])
    assert not torch.allclose(grads["hekal_min_ross_gen", "self"], grads["hekal_min_gen", "self"])


@pytest.mark.parametrize("side", ["min", "max"])
def test_pgd_min_lowers_and_pgd_max_raises_the_confidence(cifar_model, fit_set, images, side):
    x, y = images[side]
    a = attack(cifar_model, fit_set, f"hekal_{side}_gen", steps=5)
    before, after = a.target.score(x), a.target.score(a(cifar_model, x, y, seed=0))
    assert (after.mean() < before.mean()) if side == "min" else (after.mean() > before.mean())


@pytest.mark.parametrize("protocol, want", [
    ("strong", {"units": "pixel", "clip": True, "through": "self", "steps": 40, "eps": 8 / 255}),
    ("hekal2026", {"units": "normalised", "clip": False, "through": "base", "steps": 40, "eps": 8 / 255}),
])
@pytest.mark.parametrize("name", ["hekal_min_ross_gen", "hekal_max_gen"])
def test_each_protocol_gives_its_defaults(protocol, want, name):
    params = build_attack(name, {}, input_size=32, protocol=protocol).params
    assert {k: params[k] for k in want} == want and params["rel_stepsize"] == pytest.approx(0.01 / 0.3)


@pytest.mark.parametrize("key, value", [("units", "foo"), ("through", "foo"), ("steps", 0)])
def test_a_bad_value_is_refused_in_one_line(data_root, tmp_path, capsys, key, value):
    cfg = pack_config(tmp_path / "cfg", data_root, {"attacks": ["hekal_min_gen"], "detectors": "gen",
                                                    "attack_params": {"hekal_min_gen": {key: value}}})
    assert main(["run", "--config", cfg, "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and key in err and "Traceback" not in err
