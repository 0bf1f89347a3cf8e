"""The model wrapper: checkpoints load (and mismatches are refused), OpenOOD's network interface holds."""
from __future__ import annotations

import pytest
import torch

from advopenood.data.datasets import stack
from advopenood.errors import UsageError
from advopenood.models.classifier import build_model, weights_hash


def test_pretrained_resnet20_accuracy(cifar_model, cifar_test):
    x, y = stack(cifar_test, list(range(500)))
    with torch.no_grad():
        acc = (cifar_model(x).argmax(1) == y).float().mean().item()
    assert acc > 0.85


def test_original_checkpoint_with_module_prefix_loads(data_root, cifar_batch):
    model = build_model("resnet20", 10, data_root / "resnet20_cifar10_original.th")
    x, y = cifar_batch
    with torch.no_grad():
        assert (model(x).argmax(1) == y).float().mean() > 0.6


def test_mismatched_checkpoint_names_arch_and_choices(data_root):
    with pytest.raises(UsageError, match="does not match architecture 'resnet18_32x32'.*valid choices: resnet20"):
        build_model("resnet18_32x32", 10, data_root / "resnet20_cifar10.pt")
    with pytest.raises(UsageError, match="unknown architecture 'vgg'"):
        build_model("vgg", 10)


def test_openood_interface(cifar_model, cifar_batch):
    x = cifar_batch[0][:4]
    with torch.no_grad():
        logits = cifar_model(x)
        l2, feat = cifar_model(x, return_feature=True)
        l3, maps = cifar_model(x, return_feature_list=True)
        assert torch.equal(logits, l2) and torch.equal(logits, l3) and feat.shape == (4, 64)
        assert maps[-2].shape == (4, 64, 8, 8) and torch.equal(maps[-1].flatten(1), feat)
        w, b = cifar_model.get_fc()
        assert torch.allclose(torch.from_numpy(w) @ feat.T + torch.from_numpy(b)[:, None], logits.T, atol=1e-4)
        clipped = cifar_model.forward_threshold(x, threshold=0.1)
        assert torch.allclose(clipped, cifar_model.fc(feat.clip(max=0.1)))
        assert cifar_model.intermediate_forward(x, 3).shape == (4, 64, 8, 8)
    assert cifar_model.last_block is cifar_model.backbone.layer3


def test_openood_resnet18_checkpoint_round_trip(tmp_path):
    torch.manual_seed(0)
    src = build_model("resnet18_32x32", 10)
    torch.save({"module." + k: v for k, v in src.backbone.state_dict().items()}, tmp_path / "best.ckpt")
    dst = build_model("resnet18_32x32", 10, tmp_path / "best.ckpt")
    assert weights_hash(src) == weights_hash(dst)
    assert {"fc.weight", "layer4.1.conv2.weight", "layer2.0.shortcut.0.weight"} <= set(dst.backbone.state_dict())


def test_weights_hash_tracks_weights(cifar_model):
    other = build_model("resnet20", 10)
    assert weights_hash(cifar_model) != weights_hash(other) and len(weights_hash(other)) == 64


def test_a_freshly_trained_model_hashes_like_its_cached_copy(tmp_path):
    """The first run (trains) and a later one (loads) key their adversarial sets by the same weights hash."""
    from advopenood.models.demo import demo_model

    first = demo_model(tmp_path, progress=False)
    assert weights_hash(first) == weights_hash(demo_model(tmp_path, progress=False))


def test_trained_weights_come_from_the_seed_alone(demo_net, tmp_path):
    """A fresh cache gives the session's demo weights whatever drew from torch's generator before (the key
    holds the seed, so it must determine the weights), and a run that trains leaves the caller's generator where
    a run that loads the cached weights leaves it."""
    from advopenood.models.demo import demo_model

    torch.manual_seed(2)
    torch.rand(1000)
    trained = demo_model(tmp_path, progress=False)
    after_training = torch.get_rng_state()
    torch.manual_seed(2)
    torch.rand(1000)
    demo_model(tmp_path, progress=False)
    assert weights_hash(trained) == weights_hash(demo_net)
    assert torch.equal(torch.get_rng_state(), after_training)
