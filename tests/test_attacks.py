"""The four built-in attacks on the real CIFAR ResNet-20: budgets, bounds, the mPGD patch, determinism."""
from __future__ import annotations

import pytest
import torch

from advopenood import registry
from advopenood.errors import UsageError


def make(name: str, size: int = 32, **params):
    cls = registry.get("attacks", name)
    return cls(**{**cls.defaults(size), **params})


def success_rate(model, x, x_adv, y) -> float:
    with torch.no_grad():
        ok = model(x).argmax(1) == y
        return float((model(x_adv).argmax(1) != y)[ok].float().mean())


@pytest.mark.parametrize("name", ["fgsm", "pgd", "mpgd", "df"])
def test_attack_stays_in_image_range_and_budget(cifar_model, cifar_batch, name):
    x, y = cifar_batch
    x, y = x[:16], y[:16]
    attack = make(name, steps=10) if name in ("pgd", "mpgd", "df") else make(name)
    x_adv = attack(cifar_model, x, y, seed=0)
    assert x_adv.shape == x.shape and x_adv.dtype == torch.float32
    assert x_adv.min() >= 0.0 and x_adv.max() <= 1.0
    if attack.bounded:
        assert (x_adv - x).abs().max() <= attack.params["eps"] + 1e-6
    assert success_rate(cifar_model, x, x_adv, y) > 0.5


def test_paper_defaults():
    assert make("pgd").params["eps"] == pytest.approx(8 / 255)
    assert make("pgd", 224).params["eps"] == pytest.approx(4 / 255)
    assert make("mpgd").params["patch"] == 8 and make("mpgd", 224).params["patch"] == 60
    assert make("mpgd").params["eps"] == 1.0
    assert make("df").params["eps"] is None and make("df").params["overshoot"] == 0.02


def test_pgd_beats_fgsm_and_reaches_paper_asr(cifar_model, cifar_batch):
    x, y = cifar_batch
    fgsm = success_rate(cifar_model, x, make("fgsm")(cifar_model, x, y, seed=0), y)
    pgd = success_rate(cifar_model, x, make("pgd")(cifar_model, x, y, seed=0), y)
    assert pgd >= 0.99 and pgd >= fgsm


def test_masked_pgd_perturbs_only_one_patch(cifar_model, cifar_batch):
    x, y = cifar_batch
    x, y = x[:16], y[:16]
    attack = make("mpgd", steps=5, patch=8)
    x_adv = attack(cifar_model, x, y, seed=3)
    changed = (x_adv - x).abs().amax(1) > 0
    for mask in changed:
        rows, cols = torch.nonzero(mask, as_tuple=True)
        assert len(rows) > 0
        assert rows.max() - rows.min() < 8 and cols.max() - cols.min() < 8
    assert (changed.flatten(1).sum(1) <= 64).all()


def test_same_seed_same_examples_other_seed_other_patch(cifar_model, cifar_batch):
    x, y = cifar_batch
    x, y = x[:8], y[:8]
    attack = make("mpgd", steps=3)
    a, b, c = (attack(cifar_model, x, y, seed=s) for s in (1, 1, 2))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_attack_restores_model_state(cifar_model, cifar_batch):
    x, y = cifar_batch
    flags = [p.requires_grad for p in cifar_model.parameters()]
    make("fgsm")(cifar_model, x[:4], y[:4], seed=0)
    assert [p.requires_grad for p in cifar_model.parameters()] == flags and not cifar_model.training


@pytest.mark.parametrize("params, fragment", [({"eps": 0.0}, "eps 0.0"), ({"eps": 1.5}, "eps 1.5"),
                                              ({"stepz": 3}, "'stepz'")])
def test_bad_attack_parameters_name_the_value(params, fragment):
    with pytest.raises(UsageError, match="valid choices") as err:
        make("pgd", **params)
    assert fragment in str(err.value)


def test_unknown_attack_lists_choices():
    with pytest.raises(UsageError) as err:
        registry.get("attacks", "cw")
    assert "'cw'" in str(err.value) and all(n in str(err.value) for n in ("fgsm", "pgd", "df", "mpgd"))
