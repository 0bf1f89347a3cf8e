"""Dataset readers on real data: .npz, OpenOOD's image-list layout, torchvision by name, the demo sets."""
from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest
import torch
from PIL import Image

from advopenood.data.datasets import build_dataset, limit_dataset, stack
from advopenood.errors import UsageError


def test_npz_reader_matches_raw_pixels(data_root, cifar_test):
    raw = np.load(data_root / "cifar10_test.npz")
    x, y = stack(cifar_test, [0, 5])
    assert torch.equal(x[1], torch.from_numpy(raw["x"][5]).permute(2, 0, 1).float() / 255)
    assert y.tolist() == raw["y"][[0, 5]].tolist()
    assert cifar_test.identity()["n"] == 10000


def test_grey_data_becomes_three_channels_at_model_size(data_root):
    ds = build_dataset({"kind": "npz", "path": "mnist_test.npz", "name": "mnist"}, data_root, 3, 32)
    x, _ = ds[0]
    assert x.shape == (3, 32, 32) and torch.equal(x[0], x[2]) and 0 <= x.min() and x.max() <= 1


def test_openood_layout_reads_the_same_images(tmp_path, data_root, cifar_test):
    raw = np.load(data_root / "cifar10_test.npz")
    (tmp_path / "images_classic" / "cifar10" / "test").mkdir(parents=True)
    (tmp_path / "benchmark_imglist" / "cifar10").mkdir(parents=True)
    lines = []
    for i in range(6):
        Image.fromarray(raw["x"][i]).save(tmp_path / "images_classic" / "cifar10" / "test" / f"{i}.png")
        lines.append(f"cifar10/test/{i}.png {raw['y'][i]}")
    (tmp_path / "benchmark_imglist" / "cifar10" / "test_cifar10.txt").write_text("\n".join(lines) + "\n")
    ds = build_dataset({"kind": "openood", "imglist": "benchmark_imglist/cifar10/test_cifar10.txt", "name": "cifar10"},
                       tmp_path, 3, 32)
    x, y = stack(ds)
    ref_x, ref_y = stack(cifar_test, list(range(6)))
    assert torch.equal(x, ref_x) and torch.equal(y, ref_y)


def _write_idx(path, array: np.ndarray) -> None:
    header = struct.pack(">HBB", 0, 8, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_torchvision_dataset_by_name(tmp_path, data_root):
    raw = np.load(data_root / "mnist_test.npz")
    folder = tmp_path / "MNIST" / "raw"
    folder.mkdir(parents=True)
    for prefix in ("train", "t10k"):
        _write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", raw["x"][:50])
        _write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", raw["y"][:50])
        with gzip.open(folder / f"{prefix}-images-idx3-ubyte.gz") as src:
            (folder / f"{prefix}-images-idx3-ubyte").write_bytes(src.read())
        with gzip.open(folder / f"{prefix}-labels-idx1-ubyte.gz") as src:
            (folder / f"{prefix}-labels-idx1-ubyte").write_bytes(src.read())
    ds = build_dataset({"kind": "torchvision", "dataset": "MNIST", "name": "mnist"}, tmp_path, 1, 28)
    x, y = stack(ds, [3])
    assert torch.equal(x[0, 0], torch.from_numpy(raw["x"][3]).float() / 255) and y.item() == raw["y"][3]


def test_torchvision_missing_files_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="MNIST"):
        build_dataset({"kind": "torchvision", "dataset": "MNIST", "name": "mnist"}, tmp_path, 1, 28)


def test_demo_digits_need_nothing_but_the_install():
    train = build_dataset({"kind": "demo", "name": "digits", "split": "train"}, None, 1, 16)
    test = build_dataset({"kind": "demo", "name": "digits", "split": "test"}, None, 1, 16)
    assert len(train) + len(test) == 1797 and train[0][0].shape == (1, 16, 16)


@pytest.mark.parametrize("name, n", [("textures", 400), ("blobs", 400), ("inverted", 540), ("noise", 400)])
def test_demo_ood_sets_need_nothing_but_the_install(name, n):
    ds = build_dataset({"kind": "demo", "name": name}, None, 1, 16)
    x, y = stack(ds)
    assert len(ds) == n and x.shape[1:] == (1, 16, 16) and (y == -1).all()
    assert 0 <= x.min() < x.max() <= 1 and x.std() > 0.05


def test_inverted_demo_set_is_the_test_digits_dark_on_light():
    digits, _ = stack(build_dataset({"kind": "demo", "name": "digits", "split": "test"}, None, 1, 8))
    inverted, _ = stack(build_dataset({"kind": "demo", "name": "inverted"}, None, 1, 8))
    assert torch.allclose(inverted, 1 - digits, atol=1e-6)


def test_float_images_outside_unit_range_are_rejected(tmp_path):
    np.savez(tmp_path / "bad.npz", x=np.full((4, 8, 8, 3), 1.7, dtype=np.float32), y=np.zeros(4, dtype=np.int64))
    with pytest.raises(UsageError, match=r"outside \[0, 1\]"):
        build_dataset({"kind": "npz", "path": "bad.npz", "name": "bad"}, tmp_path, 3, 8)


def test_limit_is_a_seeded_reproducible_subset(cifar_test):
    a, b = limit_dataset(cifar_test, 20, 0), limit_dataset(cifar_test, 20, 0)
    assert (a.indices == b.indices).all() and len(a) == 20
    assert not (limit_dataset(cifar_test, 20, 1).indices == a.indices).all()
    assert a.identity()["indices"] != limit_dataset(cifar_test, 20, 1).identity()["indices"]


def test_idx_reader_matches_the_arrays(tmp_path, data_root):
    raw = np.load(data_root / "fashionmnist_test.npz")
    _write_idx(tmp_path / "img.gz", raw["x"][:20])
    _write_idx(tmp_path / "lab.gz", raw["y"][:20])
    ds = build_dataset({"kind": "idx", "images": "img.gz", "labels": "lab.gz", "name": "fm"}, tmp_path, 1, 28)
    x, y = stack(ds, [7])
    assert torch.equal(x[0, 0], torch.from_numpy(raw["x"][7]).float() / 255) and y.item() == raw["y"][7]
    with pytest.raises(UsageError, match="lab2.gz"):
        build_dataset({"kind": "idx", "images": "img.gz", "labels": "lab2.gz"}, tmp_path, 1, 28)


@pytest.mark.parametrize("dtype, lo, hi, warned", [
    (np.uint8, 0, 1, True), (np.uint8, 0, 15, True), (np.uint8, 100, 115, True), (np.uint8, 0, 16, False),
    (np.uint8, 0, 255, False), (np.float32, 0.0, 1 / 255, True), (np.float32, 0.2, 0.9, False)])
def test_a_set_whose_pixels_span_a_small_share_of_their_range_is_named(dtype, lo, hi, warned):
    """Issue 39 item 6: the rule is max - min under 1/16 of the type's range (uint8 16 levels, float 1/16)."""
    from advopenood.data.datasets import ArrayDataset, range_warning

    x = np.full((4, 8, 8), lo, dtype=dtype)
    x[1, 2, 3] = hi
    ds = ArrayDataset(x, np.zeros(4), "masks", "sha", 3, 8)
    assert bool(range_warning(ds)) is warned


def test_a_binarised_uint8_set_is_warned_about_in_the_report_run_json_and_stderr(data_root, tmp_path, capsys):
    """The pack's Textures binarised to uint8 0/1 (a mask saved as uint8) as the OOD set: the run goes ahead
    (it may be meant), and says so on stderr, in run.json's ``warnings`` and in the report; CIFAR-10 is not named."""
    import json

    from advopenood.cli.main import main

    from conftest import pack_config

    raw = np.load(data_root / "texture_test.npz")
    np.savez(tmp_path / "masks.npz", x=(raw["x"][:16] > 127).astype(np.uint8), y=raw["y"][:16])
    cfg = pack_config(tmp_path / "work", data_root, {
        "data.ood": [{"kind": "npz", "path": str(tmp_path / "masks.npz"), "name": "masks"}],
        "attacks": [], "ci": {"method": "none"}})
    out = tmp_path / "out"
    assert main(["run", "--config", cfg, "--out", str(out), "--cache-dir", str(tmp_path / "cache"), "--quiet"]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warned) == 1 and "'masks'" in warned[0] and "span only 0 to 1," in warned[0], warned
    info = json.loads((out / "run.json").read_text())
    assert len(info["warnings"]) == 1 and "'masks'" in info["warnings"][0] and "cifar10" not in info["warnings"][0]
    assert info["warnings"][0] in (out / "report.md").read_text()
