"""The plugin kit (``plugins/kit/``): the helpers several built-in plugins share, on the pack's ResNet-20 and real
CIFAR-10 images."""
from __future__ import annotations

import foolbox as fb
import pytest
import torch

from advopenood.attacks.base import frozen
from advopenood_plugins.kit.attacks import Best, rel_stepsize, run_foolbox
from advopenood_plugins.kit.detectors import classifier_head, pytorch_ood, straight_through, with_grad
from advopenood_plugins.kit.networks import normalisation

EPS = 8 / 255


@pytest.fixture(scope="module")
def batch(cifar_model, cifar_batch):
    x, y = cifar_batch
    return cifar_model.eval(), x[:16], y[:16]


def test_run_foolbox_returns_clipped_images_inside_the_budget(batch):
    net, x, y = batch
    with frozen(net):
        x_adv = run_foolbox(fb.attacks.FGSM(), net, x, y, EPS)
        clean, adv = net(x).argmax(1), net(x_adv).argmax(1)
    assert x_adv.shape == x.shape and 0 <= float(x_adv.min()) and float(x_adv.max()) <= 1
    assert float((x_adv - x).abs().max()) <= EPS + 1e-6
    assert int((clean != adv).sum()) > 0  # FGSM at 8/255 flips some predictions of the undefended ResNet-20


@pytest.mark.parametrize("params, expected", [
    ({"rel_stepsize": None, "steps": 10}, 0.25),  # Madry et al.'s 2.5 / steps
    ({"steps": 40}, 2.5 / 40),
    ({"rel_stepsize": 0.01 / 0.3, "steps": 40}, 0.01 / 0.3),
])
def test_rel_stepsize(params, expected):
    assert rel_stepsize(params) == pytest.approx(expected)


def test_best_keeps_a_successful_candidate_over_a_higher_value(batch):
    _, x, _ = batch
    best = Best(x[:3])
    first, second = x[3:6], x[6:9]
    best.update(first, torch.tensor([True, False, False]), torch.tensor([0.0, 1.0, 1.0]))
    best.update(second, torch.tensor([False, True, False]), torch.tensor([5.0, 0.0, 0.5]))
    assert torch.equal(best.x[0], first[0])   # successful stays over an unsuccessful higher value
    assert torch.equal(best.x[1], second[1])  # success wins over value
    assert torch.equal(best.x[2], first[2])   # both unsuccessful: the higher value
    assert best.success.tolist() == [True, True, False]


def test_the_detector_helpers_differentiate_what_scores(batch):
    """``with_grad`` drops pytorch-ood's no_grad, so the same RMD code gives a gradient; the classifier head
    gives the network's logits from its features; ``straight_through`` is the value forward, the surrogate's
    gradient backward."""
    net, x, y = batch
    with torch.no_grad():
        z = net.features(x)
        assert torch.allclose(classifier_head(net)(z), net(x), atol=1e-5)
    det = pytorch_ood().RMD(None).fit_features(z, y)
    leaf = z.clone().requires_grad_(True)
    assert not det.predict_features(leaf).requires_grad
    scored = with_grad(det.predict_features)(leaf)
    assert torch.allclose(scored, det.predict_features(z))
    scored.sum().backward()
    assert scored.requires_grad and leaf.grad is not None and bool(torch.isfinite(leaf.grad).all())
    value, surrogate = torch.tensor([3.0]), torch.tensor([1.0], requires_grad=True)
    out = straight_through(value, 2 * surrogate)
    out.backward()
    assert out.item() == 3.0 and surrogate.grad.item() == 2.0


def test_normalisation_maps_pixels_to_the_units_the_backbone_sees(batch):
    """The pack's ResNet-20 normalises inside: ``(x - mean) / std`` is what it feeds its backbone; a network without
    buffers gets zeros and ones."""
    net, x, _ = batch
    mean, std = normalisation(net, x)
    assert mean.shape == std.shape == (1, 3, 1, 1)
    torch.testing.assert_close(std.flatten(), net.std.flatten())
    torch.testing.assert_close((x - mean) / std, net.normalize(x))
    plain = torch.nn.Conv2d(3, 3, 1)
    zero, one = normalisation(plain, x)
    assert float(zero.abs().max()) == 0 and float((one - 1).abs().max()) == 0
