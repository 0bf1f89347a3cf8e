"""OpenOOD v1.5's ImageNet layout at 224 px, end to end, without ImageNet.

Each test builds, in a temporary folder, a tiny OpenOOD ``data/`` root for the ImageNet-200 benchmark exactly as
OpenOOD lays it out (``benchmark_imglist/imagenet200/*.txt`` with ``relative/path label`` lines, JPEG files
under ``images_largescale/`` and, for Textures, ``images_classic/``): 3 classes x 8 train and 3 x 4 test images,
4 images per near/far/csid set. The models are *randomly initialised* small networks (torchvision ResNet-18 and
Swin-T, timm ResNet-10t) saved as checkpoints: these tests are about plumbing at 224 px (the
layout, the groups, the leaderboard, the feature and GRAM rules, the Grad-CAM reshape), for which the pack has
no equivalent; the detection numbers of random networks mean nothing and are not asserted.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from advopenood.config.loading import validate
from advopenood.errors import UsageError
from advopenood.models.classifier import build_model
from advopenood.data.benchmarks import BENCHMARKS, natural_group

CLASSES, TRAIN_PER_CLASS, TEST_PER_CLASS, OOD_PER_SET = 3, 8, 4, 4


def _write_jpegs(folder: Path, n: int, rng: np.random.Generator, tint: int) -> list[str]:
    """``n`` JPEGs of a few sizes (so resize-and-crop is exercised), smooth colour fields tinted by ``tint``."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for i in range(n):
        h, w = [(256, 320), (300, 256), (224, 224)][i % 3]
        coarse = rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)
        coarse[..., tint % 3] = 255
        Image.fromarray(coarse).resize((w, h), Image.BILINEAR).save(folder / f"{i}.JPEG", quality=90)
        names.append(f"{i}.JPEG")
    return names


def make_imagenet200_root(root: Path) -> Path:
    """A miniature OpenOOD data root with every list file the ImageNet-200 benchmark reads."""
    bench, rng = BENCHMARKS["imagenet200"], np.random.default_rng(0)
    lists: dict[str, list[str]] = {}
    for split, per_class in (("train", TRAIN_PER_CLASS), ("test", TEST_PER_CLASS)):
        images, imglist = bench[split]
        lines = []
        for c in range(CLASSES):
            rel = f"imagenet_1k/{split}/n{c:08d}"
            lines += [f"{rel}/{f} {c}" for f in _write_jpegs(root / images / rel, per_class, rng, c)]
        lists[imglist] = lines
    for group in ("near", "far", "csid"):
        for name, (images, imglist) in bench[group].items():
            rel = f"{name}/test"
            labels = [str(i % CLASSES) if group == "csid" else "-1" for i in range(OOD_PER_SET)]
            files = _write_jpegs(root / images / rel, OOD_PER_SET, rng, 7)
            lists[imglist] = [f"{rel}/{f} {lab}" for f, lab in zip(files, labels)]
    for imglist, lines in lists.items():
        (root / imglist).parent.mkdir(parents=True, exist_ok=True)
        (root / imglist).write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture(scope="module")
def openood_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_imagenet200_root(tmp_path_factory.mktemp("openood_data"))


def _checkpoint(root: Path, arch: str) -> str:
    """A randomly initialised ``arch`` (seed 0) saved as a plain state dict under ``root/checkpoints``."""
    torch.manual_seed(0)
    model = build_model(arch, CLASSES, input_size=224)
    path = root / "checkpoints" / f"{arch.replace(':', '_')}.pt"
    path.parent.mkdir(exist_ok=True)
    torch.save(model.backbone.checkpoint_module.state_dict(), path)
    return str(path.relative_to(root))


def _config(root: Path, arch: str, out: Path, cache: Path, **extra) -> dict:
    return {"name": "layout", "seed": 0, "batch_size": 8, "out": str(out), "cache_dir": str(cache),
            "model": {"arch": arch, "checkpoint": _checkpoint(root, arch), "num_classes": CLASSES, "input_size": 224},
            "data": {"root": str(root), "benchmark": "imagenet200"}, "attacks": ["fgsm"],
            "detectors": "msp,ebo,mds,gram", "detector_backend": "pytorch-ood", "evaluators": ["ood"], **extra}


def test_benchmark_expands_to_openoods_lists(openood_root):
    cfg = validate({"model": {"arch": "resnet18", "num_classes": CLASSES, "input_size": 224},
                    "data": {"root": str(openood_root), "benchmark": "imagenet200"}})
    data = cfg.data
    assert data.dataset == "imagenet200"
    assert data.id.imglist == "benchmark_imglist/imagenet200/test_imagenet200.txt"
    assert data.fit.imglist == "benchmark_imglist/imagenet200/train_imagenet200.txt"
    groups = {o.name: o.group for o in data.ood}
    assert groups == {"ssb_hard": "near", "ninco": "near", "inaturalist": "far", "textures": "far",
                      "openimage_o": "far", "imagenet_v2": "csid", "imagenet_c": "csid", "imagenet_r": "csid"}
    assert {o.name: o.images for o in data.ood}["textures"] == "images_classic"
    assert {o.name: o.pre_size for o in data.ood}["imagenet_c"] is None  # read as stored, as OpenOOD


@pytest.mark.parametrize("dataset, name, group", [
    ("cifar10", "cifar100", "near"), ("cifar10", "tin", "near"), ("cifar10", "mnist", "far"),
    ("cifar10", "svhn", "far"), ("cifar10", "texture", "far"), ("cifar10", "places365", "far"),
    ("cifar10", "fashionmnist", "other"), ("cifar100", "cifar10", "near"), ("imagenet", "imagenet_es", "csid"),
    ("imagenet200", "ssb_hard", "near"), ("digits", "textures", "other")])
def test_natural_groups_follow_openood(dataset, name, group):
    assert natural_group(dataset, name) == group


@pytest.mark.parametrize("breakage, message", [
    (lambda r: (r / "benchmark_imglist/imagenet200/test_ninco.txt").unlink(), "test_ninco.txt"),
    (lambda r: (r / "images_classic").rename(r / "images_old"), "images_classic"),
    (lambda r: next((r / "images_largescale/ssb_hard/test").iterdir()).unlink(), "ssb_hard"),
])
def test_preflight_refuses_a_broken_layout_in_one_line(tmp_path, breakage, message):
    from advopenood.run.pipeline import run

    root = make_imagenet200_root(tmp_path / "data")
    cfg = validate(_config(root, "timm:resnet10t", tmp_path / "out", tmp_path / "cache"))
    breakage(root)
    with pytest.raises(UsageError) as err:
        run(cfg, progress=False)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


def test_missing_checkpoint_is_one_line(openood_root, tmp_path):
    from advopenood.run.preflight import preflight

    cfg = _config(openood_root, "swin_t", tmp_path / "out", tmp_path / "cache")
    cfg["model"]["checkpoint"] = "checkpoints/absent.pth"
    with pytest.raises(UsageError, match="absent.pth' not found"):
        preflight(validate(cfg))


#: the analyses of each architecture's one run: Grad-CAM where its layer is not torchvision's last block (a
#: transformer's token layer, timm's last ``feature_info`` module)
ANALYSES = {"resnet18": [], "swin_t": ["gradcam"], "timm:resnet10t": ["gradcam"]}


@pytest.fixture(scope="module")
def layout_run(openood_root, tmp_path_factory):
    """``layout_run(arch)``: the 224 px pipeline of ``arch`` (the four detectors, FGSM, every group, the analyses
    of :data:`ANALYSES`), run once for the module: its context and its output folder."""
    from advopenood.run.pipeline import run

    done: dict[str, tuple] = {}

    def get(arch: str) -> tuple:
        if arch not in done:
            folder = tmp_path_factory.mktemp("layout_" + arch.replace(":", "_"))
            cfg = _config(openood_root, arch, folder / "out", folder / "cache", analyses=ANALYSES[arch])
            done[arch] = run(validate(cfg), progress=False), folder / "out"
        return done[arch]

    return get


@pytest.mark.parametrize("arch, n_taps", [("resnet18", None), ("swin_t", 4), ("timm:resnet10t", 5)])
def test_pipeline_at_224px(layout_run, arch, n_taps):
    from advopenood.detection.outputs import Taps

    ctx, out = layout_run(arch)
    if n_taps is not None:  # the declared GRAM rule: stage outputs, not every conv
        assert len(Taps(ctx.model).layers) == n_taps
    ood = pd.read_csv(out / "ood.csv")
    assert set(ood.group) == {"near", "far", "csid", "adversarial"}
    assert set(ood[ood.group == "adversarial"].ood_set) == {"fgsm"}
    assert set(ood[ood.group == "csid"].ood_set) == {"imagenet_v2", "imagenet_c", "imagenet_r"}
    natural = ood[ood.attack == "none"]
    assert (natural.n_ood == OOD_PER_SET).all() and (ood.n_id == CLASSES * TEST_PER_CLASS).all()
    assert natural[["auroc", "fpr95"]].notna().all().all(), natural[natural.auroc.isna()].error.tolist()
    board = pd.read_csv(out / "leaderboard.csv")
    assert list(board.detector) == ["msp", "ebo", "mds", "gram"]
    assert (board.n_near == 2).all() and (board.n_far == 3).all() and (board.n_adv == 1).all()
    for det, part in natural.groupby("detector"):  # OpenOOD's nearood / farood rows: the mean over the group
        row = board.set_index("detector").loc[det]
        assert math.isclose(row.near_auroc, part[part.group == "near"].auroc.mean(), abs_tol=1e-3)
        assert math.isclose(row.far_fpr95, part[part.group == "far"].fpr95.mean(), abs_tol=1e-3)
    assert np.allclose(board.id_acc, ctx.clean.accuracy)
    fsood = pd.read_csv(out / "fsood.csv")
    assert set(fsood.group) == {"near", "far"} and (fsood.n_id == CLASSES * TEST_PER_CLASS + 3 * OOD_PER_SET).all()
    assert board[["csid_acc", "fsood_near_auroc", "fsood_far_fpr95"]].notna().all().all()
    assert board[["fsood_near_auroc_lo", "fsood_far_fpr95_hi", "near_auroc_lo"]].notna().all().all()
    assert (fsood.auroc_lo <= fsood.auroc).all() and (fsood.auroc <= fsood.auroc_hi).all()
    info = json.loads((out / "run.json").read_text())
    assert info["precision"]["amp_active"] is False


def test_amp_is_a_stated_no_op_on_the_cpu():
    from advopenood.models.classifier import set_precision, weights_hash

    model = build_model("timm:resnet10t", CLASSES, input_size=224)
    before = weights_hash(model)
    record = set_precision(model, "cpu", amp=True, channels_last=True)
    assert not record["amp_active"] and not record["channels_last_active"] and "no-op on the CPU" in record["note"]
    assert weights_hash(model) == before and model.autocast_dtype is None


@pytest.mark.parametrize("arch", ["swin_t", "timm:resnet10t"])
def test_gradcam_on_transformer_and_timm(layout_run, arch):
    """Grad-CAM maps every ID image and its FGSM twin on a transformer's token layer and on a timm network's last
    stage (read from the architecture's pipeline run)."""
    cam = pd.read_csv(layout_run(arch)[1] / "gradcam.csv")
    assert len(cam) == CLASSES * TEST_PER_CLASS
    assert cam[["l2", "ssim"]].notna().all().all() and cam.l2.between(0, 1).all()


def test_vit_tokens_reach_gradcam_on_the_grid():
    """ViT-B/16: the class token is dropped and the 196 patch tokens sit on the 14 x 14 grid."""
    from advopenood.models.backbones import tokens_to_grid

    tokens = torch.arange(2 * 197 * 5, dtype=torch.float32).reshape(2, 197, 5)
    grid = tokens_to_grid(tokens)
    assert grid.shape == (2, 5, 14, 14)
    assert torch.equal(grid[1, :, 0, 1], tokens[1, 2])  # patch 1 (token 2) at row 0, column 1


def test_own_entries_inherit_the_benchmarks_preprocessing():
    """Entries that replace a benchmark's keep OpenOOD's resize-and-centre-crop unless they say otherwise
    (issue 24, item 14)."""
    from advopenood.config.schema import DataSection

    own = {"kind": "openood", "imglist": "benchmark_imglist/imagenet200/test_mine.txt", "name": "mine"}
    data = DataSection.model_validate({
        "benchmark": "imagenet200", "id": own,
        "ood": [{"kind": "npz", "path": "arr.npz", "name": "arr"}, {**own, "name": "raw", "pre_size": None},
                {**own, "name": "big", "pre_size": 512}]}).model_dump()
    assert data["id"]["pre_size"] == 256 and data["fit"]["pre_size"] == 256
    assert {o["name"]: o["pre_size"] for o in data["ood"]} == {"arr": 256, "raw": None, "big": 512}


def test_pre_size_crops_an_npz_set_like_openood(tmp_path):
    """An npz entry with pre_size: shorter side resized, then the centre crop (not the whole image squashed)."""
    from advopenood.data.datasets import build_dataset

    x = np.zeros((1, 40, 80, 3), dtype=np.uint8)
    x[:, :, 16:64] = 255  # a white band over the middle 60 % of the width
    np.savez(tmp_path / "wide.npz", x=x, y=np.zeros(1, dtype=np.int64))
    cropped = build_dataset({"kind": "npz", "path": "wide.npz", "pre_size": 32}, tmp_path, 3, 32)[0][0]
    squashed = build_dataset({"kind": "npz", "path": "wide.npz"}, tmp_path, 3, 32)[0][0]
    assert cropped.min() > 0.99  # the centre 32x32 of the 32x64 resize lies inside the band
    assert squashed[:, :, :4].max() < 0.01 and squashed[:, :, 14:18].min() > 0.99  # black margins kept
