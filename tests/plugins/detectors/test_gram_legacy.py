"""``gram_legacy``: OpenOOD's GRAM before bdf6a55 (the one Lorenz et al. ran), transcribed.

The formulas on a map small enough to compute by hand, then the detector on the pack's ResNet-18 under protocol
``lorenz2024``, where the paper's GRAM scored PGD with AUROC 22.5 (the fixed GRAM: above 50).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from advopenood import registry
from advopenood.config import protocols
from advopenood.attacks.base import build_attack
from advopenood.data.datasets import limit_dataset, make_loader, stack
from advopenood.detection.bank import create_detector
from advopenood.detection.scoring import score_all
from advopenood.models.classifier import build_model
from advopenood_plugins.detectors.gram_legacy import GRAMLegacy, legacy_bounds, legacy_confidence, legacy_statistics

CPU = torch.device("cpu")
#: one channel-by-pixel map per sample (C = 2, HW = 2); rows are channels
A = [[1.0, 2.0], [0.0, 3.0]]
B = [[2.0, 0.0], [1.0, 1.0]]


def maps(*samples: list[list[float]]) -> list[torch.Tensor]:
    """One layer, ``B x 2 x 1 x 2``."""
    return [torch.tensor(samples)[:, :, None, :]]


def test_statistics_are_the_rowsums_of_the_powered_gram_matrix():
    """A: p=1, F F^T = [[5, 6], [6, 9]], rowsums 11, 15; p=2, F^2 = [[1, 4], [0, 9]], F^2 (F^2)^T = [[17, 36],
    [36, 81]], rowsums 53, 117, square roots."""
    (g,) = legacy_statistics(maps(A), [1, 2])
    assert g.shape == (1, 2, 2) and g.dtype == torch.float32
    assert g[0].flatten().tolist() == pytest.approx([11, 15, math.sqrt(53), math.sqrt(117)], rel=1e-6)


def test_bounds_are_scalars_over_every_channel_and_sample_of_a_class():
    """The flat-list bug: class 0 (A and B) gets one min and one max over both samples' channels, not one per
    channel. B: p=1, F F^T = [[4, 2], [2, 2]], rowsums 6, 4; p=2, F^2 = [[4, 0], [1, 1]], rowsums 20, 6."""
    stats = legacy_statistics(maps(A, B, A), [1, 2])
    mins, maxs = legacy_bounds(stats, torch.tensor([0, 0, 1]), 3)
    assert mins.shape == maxs.shape == (3, 1, 2) and mins.dtype == torch.float64
    assert mins[0, 0].tolist() == pytest.approx([4, math.sqrt(6)])
    assert maxs[0, 0].tolist() == pytest.approx([15, math.sqrt(117)])
    assert mins[1, 0].tolist() == pytest.approx([11, math.sqrt(53)])
    assert maxs[1, 0].tolist() == pytest.approx([15, math.sqrt(117)])
    assert torch.isinf(mins[2]).all() and torch.isinf(maxs[2]).all()  # no row: +inf / -inf, combined with min/max


@pytest.mark.parametrize("total, expected", [  # bounds [20, 30]; T = the channel sum, conf = dev / 50
    (26.0, 0.0),
    (10.0, (20 - 10) / (20 + 1e-6) / 50),
    (40.0, (40 - 30) / (30 + 1e-6) / 50),
])
def test_confidence_is_the_channel_sums_relative_excess_over_50_not_negated(total, expected):
    stats = [torch.tensor([[[total / 2, total / 2]]])]  # 1 sample, 1 power, 2 channels summing to ``total``
    conf = legacy_confidence(stats, torch.tensor([1]), torch.tensor([[[0.0]], [[20.0]]], dtype=torch.float64),
                             torch.tensor([[[0.0]], [[30.0]]], dtype=torch.float64))
    assert conf.tolist() == pytest.approx([expected], rel=1e-9, abs=1e-15)


def test_confidence_sums_layers_and_powers_against_the_predicted_class():
    """Sample A scored as class 1 with A's own bounds (p=1: [11, 15], p=2: [sqrt 53, sqrt 117]): T = 26 and
    sqrt 53 + sqrt 117, both above the max."""
    stats = legacy_statistics(maps(A), [1, 2])
    mins, maxs = legacy_bounds(stats, torch.tensor([1]), 2)
    t2, hi2 = math.sqrt(53) + math.sqrt(117), math.sqrt(117)
    expected = ((26 - 15) / (15 + 1e-6) + (t2 - hi2) / (hi2 + 1e-6)) / 50
    assert legacy_confidence(stats, torch.tensor([1]), mins, maxs).tolist() == pytest.approx([expected], rel=1e-6)


def test_registered_with_openood_powers_and_its_own_pass():
    cls = registry.get("detectors", "gram_legacy")
    assert cls is GRAMLegacy and cls.requires_fit and cls.own_pass and not cls.shared_fit
    det = create_detector("gram_legacy", "openood")  # OpenOOD has no pre-fix class: both backends run ours
    assert type(det) is GRAMLegacy and det.name == "gram_legacy" and det.params["powers"] == [1, 2, 3, 4, 5]


@pytest.fixture(scope="module")
def resnet18(data_root):
    """The pack's ResNet-18 (OpenOOD's ResNet18_32x32 layout; [0, 1] inputs, no normalisation)."""
    return build_model("resnet18_32x32", 10, data_root / "resnet18_32x32_cifar10.pt", mean=(0.0,) * 3, std=(1.0,) * 3)


def test_layers_are_openoods_feature_list(resnet18, cifar_batch):
    """OpenOOD's ResNet18_32x32 ``return_feature_list``: stem, layer1-3, layer4 average-pooled (5 maps)."""
    from advopenood_plugins.detectors.gram_legacy import feature_list

    logits, layers = feature_list(resnet18, cifar_batch[0][:2])
    assert [tuple(m.shape[1:]) for m in layers] == [(64, 32, 32), (64, 32, 32), (128, 16, 16), (256, 8, 8), (512, 1, 1)]
    assert torch.allclose(layers[-1].flatten(1), resnet18.features(cifar_batch[0][:2]))


def test_pgd_auroc_below_50_on_resnet18_under_lorenz2024(resnet18, pack_set):
    """The paper's GRAM on PGD: AUROC 22.50 (Table 4, CIFAR-10), below 50; the fixed GRAM above 50 on the same
    images. 8 ID images, PGD (the reference's foolbox defaults) on them, stored as 8-bit PNGs as the protocol
    does; both GRAMs fitted on 200 training images (measured: legacy 0.0, fixed 92.2; on 16 and 500: 0.0, 98.8)."""
    id_set = pack_set("cifar10", "cifar10_test.npz", 8)
    fit_set = pack_set("train", "cifar10_train_10k.npz", 200)
    x, y = stack(id_set)
    attack = build_attack("pgd", input_size=32, protocol="lorenz2024")
    x_adv = protocols.quantize(attack(resnet18, x, y, seed=0), protocols.get("lorenz2024").quantize)
    sets = {"id": lambda: make_loader(id_set, 8), "pgd": lambda: [(x_adv, y)]}
    result = score_all(["gram_legacy", "gram"], "pytorch-ood", resnet18, limit_dataset(fit_set, 200, 0), sets,
                       batch_size=64, device=CPU, seed=0, progress=False)
    assert result.errors == {}
    auroc = {}
    for name, scores in result.scores.items():  # OOD (every attacked image) positive, lower confidence = more OOD
        labels = np.r_[np.zeros(len(scores["id"])), np.ones(len(scores["pgd"]))]
        auroc[name] = 100 * roc_auc_score(labels, -np.r_[scores["id"], scores["pgd"]])
    assert auroc["gram_legacy"] < 50 < auroc["gram"], auroc
