"""The four built-in attacks on the real CIFAR ResNet-20: budgets, bounds, the mPGD patch, determinism,
and the ``lorenz2024`` protocol's settings (the paper's reference code)."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from advopenood import registry
from advopenood.attacks import Attack
from advopenood.errors import UsageError


def make(name: str, size: int = 32, protocol: str = "strong", **params):
    cls = registry.get("attacks", name)
    return cls(**{**cls.defaults(size), **cls.protocol_defaults(protocol, size), **params})


def reference_masked_pgd_verbatim(model, input_image, target_class, epsilon, alpha, num_steps, patch_size, x, y):
    """OpenOOD's ``masked_pgd_attack`` (openood/attacks/patch_attacks/masked_pgd.py) with the random position
    ``(x, y)`` passed in (the original draws it with ``random.randint``) and ``model.model.zero_grad()`` dropped
    (our parameters take no gradient); everything else as published."""
    perturbed_image = input_image.clone().detach().requires_grad_(True)
    for _ in range(num_steps):
        perturbed_image.requires_grad = True
        output = model(perturbed_image)
        loss = nn.CrossEntropyLoss()(output, target_class)
        perturbed_image.grad = None
        loss.backward()
        with torch.no_grad():
            perturbed_image[:, :, x:x+patch_size, y:y+patch_size] += alpha * perturbed_image.grad[:, :, x:x+patch_size, y:y+patch_size].sign()
            perturbed_image[:, :, x:x+patch_size, y:y+patch_size] = torch.clamp(perturbed_image[:, :, x:x+patch_size, y:y+patch_size], input_image[:, :, x:x+patch_size, y:y+patch_size] - epsilon, input_image[:, :, x:x+patch_size, y:y+patch_size] + epsilon)
            perturbed_image = torch.clamp(perturbed_image, 0, 1).detach_()
    return perturbed_image


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


def test_paper_budgets_and_patch_sizes():
    assert make("pgd").params["eps"] == pytest.approx(8 / 255)
    assert make("pgd", 224).params["eps"] == pytest.approx(4 / 255)
    assert make("mpgd").params["patch"] == 8 and make("mpgd", 224).params["patch"] == 60
    assert make("mpgd").params["eps"] == 1.0
    assert make("df").params["eps"] is None and make("df").params["overshoot"] == 0.02


LORENZ = [  # (attack, input size, expected lorenz2024 parameters): foolbox 3.3 defaults and the reference mPGD
    ("fgsm", 32, {"eps": 8 / 255}),
    ("fgsm", 224, {"eps": 4 / 255}),
    ("pgd", 32, {"eps": 8 / 255, "steps": 40, "rel_stepsize": 0.01 / 0.3, "abs_stepsize": None, "random_start": True}),
    ("pgd", 224, {"eps": 4 / 255, "steps": 40, "rel_stepsize": 0.01 / 0.3, "abs_stepsize": None, "random_start": True}),
    ("df", 32, {"eps": None, "steps": 50, "candidates": 10, "overshoot": 0.02}),
    ("mpgd", 32, {"variant": "reference", "eps": 1.0, "patch": 8, "steps": 40, "abs_stepsize": 0.01,
                  "random_start": False, "group": 200}),
    ("mpgd", 224, {"variant": "reference", "eps": 1.0, "patch": 60, "steps": 40, "abs_stepsize": 0.01,
                   "random_start": False, "group": 200}),
]


@pytest.mark.parametrize("name, size, expected", LORENZ)
def test_lorenz2024_protocol_defaults(name, size, expected):
    params = make(name, size, protocol="lorenz2024").params
    assert {k: params[k] for k in expected} == pytest.approx(expected)


def test_lorenz2024_pgd_step_is_foolbox_default():
    import foolbox as fb

    assert make("pgd", protocol="lorenz2024").params["rel_stepsize"] == fb.attacks.LinfPGD().rel_stepsize
    assert make("pgd").params["rel_stepsize"] is None  # strong (ours): 2.5 * eps / steps


@pytest.mark.parametrize("name", ["fgsm", "pgd", "df", "mpgd", "mim"])
def test_other_protocols_set_nothing(name):
    cls = registry.get("attacks", name)
    assert cls.protocol_defaults("strong", 32) == {} and cls.protocol_defaults("mahmood2021", 32) == {}


@pytest.mark.parametrize("name, threat", [("fgsm", "linf"), ("pgd", "linf"), ("mim", "linf"), ("df", "l2"),
                                          ("mpgd", "patch")])
def test_threat_types(name, threat):
    assert registry.get("attacks", name).threat == threat


def test_every_registered_attack_has_a_threat_type():
    classes = {name: registry.get("attacks", name) for name in registry.names("attacks")}
    threats = {name: c.threat for name, c in classes.items() if isinstance(c, type) and issubclass(c, Attack)}
    assert len(threats) > 30 and set(threats.values()) == {"linf", "l2", "l1", "patch"}, threats


def test_threat_defaults_to_norm_for_third_party_attacks():
    class L2Thing(Attack):
        norm = "l2"

    class Patchy(Attack):
        threat = "patch"

    class SubPatchy(Patchy):
        norm = "l2"

    assert (L2Thing.threat, Patchy.threat, SubPatchy.threat) == ("l2", "patch", "patch")
    assert L2Thing.protocol_defaults("lorenz2024", 32) == {}


def test_reference_mpgd_matches_the_published_loop(cifar_model, cifar_batch):
    x, y = cifar_batch
    x, y = x[:12], y[:12]
    attack = make("mpgd", protocol="lorenz2024", steps=6)
    ours = attack(cifar_model, x, y, seed=5)
    changed = ((ours - x).abs().amax(dim=(0, 1)) > 0).nonzero()
    row, col = (int(v) for v in changed.min(0).values)
    assert (changed.max(0).values - changed.min(0).values).tolist() == [7, 7]  # the union covers one 8x8 patch
    published = reference_masked_pgd_verbatim(cifar_model, x, y, 1, 0.01, 6, 8, row, col)
    assert torch.equal(ours, published)


def test_reference_mpgd_one_patch_per_group_no_random_start(cifar_model, cifar_batch):
    x, y = cifar_batch
    x, y = x[:24], y[:24]
    attack = make("mpgd", protocol="lorenz2024", steps=3, group=8)
    a, b = attack(cifar_model, x, y, seed=1), attack(cifar_model, x, y, seed=1)
    assert torch.equal(a, b)  # no random start: the seed only draws the positions
    delta = (a - x).abs()
    assert delta.max() <= 3 * 0.01 + 1e-6  # three steps of 0.01
    regions = [(delta[g:g + 8].amax(dim=(0, 1)) > 0).nonzero() for g in (0, 8, 16)]
    boxes = [(tuple(r.min(0).values.tolist()), tuple((r.max(0).values - r.min(0).values).tolist())) for r in regions]
    assert all(size == (7, 7) for _, size in boxes)
    assert len({corner for corner, _ in boxes}) > 1  # groups draw their own positions
    for g, (corner, _) in zip((0, 8, 16), boxes):
        outside = torch.ones_like(delta[g:g + 8], dtype=torch.bool)
        outside[..., corner[0]:corner[0] + 8, corner[1]:corner[1] + 8] = False
        assert delta[g:g + 8][outside].max() == 0


def test_mpgd_position_seed_moves_the_patch_on_the_same_images(cifar_model, cifar_batch):
    """``position_seed`` redraws the patch position for the same images and call seed; the same seed repeats it."""
    x, y = cifar_batch
    x, y = x[:8], y[:8]
    run = lambda s: make("mpgd", protocol="lorenz2024", steps=2, position_seed=s)(cifar_model, x, y, seed=3)
    corner = lambda a: tuple(((a - x).abs().amax(dim=(0, 1)) > 0).nonzero().min(0).values.tolist())
    adv = {s: run(s) for s in (None, 0, 1, 2)}
    assert torch.equal(adv[1], run(1))
    assert len({corner(a) for a in adv.values()}) > 1


def test_reference_mpgd_asr_on_trained_resnet20(cifar_model, cifar_batch):
    x, y = cifar_batch
    x, y = x[:48], y[:48]
    attack = make("mpgd", protocol="lorenz2024")
    x_adv = attack(cifar_model, x, y, seed=0)
    changed = (x_adv - x).abs().amax(1) > 0
    rows, cols = changed.any(0).nonzero(as_tuple=True)
    assert rows.max() - rows.min() == 7 and cols.max() - cols.min() == 7  # one patch for the whole batch
    assert (changed.flatten(1).sum(1) <= 64).all()
    assert success_rate(cifar_model, x, x_adv, y) > 0


@pytest.mark.parametrize("params, fragment", [({"variant": "foolbox"}, "'foolbox'"), ({"group": 0}, "group 0"),
                                              ({"patch": 0}, "patch 0"), ({"random_start": True}, "random_start")])
def test_bad_mpgd_parameters_name_the_value(params, fragment):
    with pytest.raises(UsageError, match="valid choices") as err:
        make("mpgd", protocol="lorenz2024", **params)
    assert fragment in str(err.value)


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
        registry.get("attacks", "eot_pgd")
    assert "'eot_pgd'" in str(err.value) and all(n in str(err.value) for n in ("fgsm", "pgd", "df", "mpgd"))
