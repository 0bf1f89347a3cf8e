"""Data files the run relies on are checked before any model is built: labels, layouts, listed images
(issue 24, item 12). Each case is refused with exit code 2 in one line, no traceback."""
from __future__ import annotations

import gzip
import io
import struct
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import yaml
from PIL import Image

from advopenood.cli.main import main


def _npz(folder: Path, name: str, n: int = 6, labels: np.ndarray | None | str = "ok") -> str:
    x = np.random.default_rng(0).integers(0, 256, size=(n, 16, 16), dtype=np.uint8)
    arrays = {"x": x}
    if isinstance(labels, str):
        arrays["y"] = np.arange(n) % 10
    elif labels is not None:
        arrays["y"] = labels
    np.savez(folder / name, **arrays)
    return name


def _imglist(folder: Path, lines: list[str], n_images: int = 4) -> str:
    images = folder / "images_classic" / "set"
    images.mkdir(parents=True, exist_ok=True)
    for i in range(n_images):
        Image.fromarray(np.full((16, 16), 40 * i, dtype=np.uint8)).save(images / f"{i}.png")
    lst = folder / "benchmark_imglist" / "t" / "test_set.txt"
    lst.parent.mkdir(parents=True, exist_ok=True)
    lst.write_text("\n".join(lines) + "\n")
    return "benchmark_imglist/t/test_set.txt"


def _idx(folder: Path, n_images: int, n_labels: int) -> dict:
    def write(name: str, arr: np.ndarray) -> str:
        with gzip.open(folder / name, "wb") as f:
            f.write(struct.pack(">HBB", 0, 8, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.tobytes())
        return name

    return {"kind": "idx", "images": write("img.gz", np.zeros((n_images, 16, 16), np.uint8)),
            "labels": write("lab.gz", (np.arange(n_labels) % 10).astype(np.uint8))}


def _npz_bytes(folder: Path, name: str, members: dict[str, tuple[np.ndarray, tuple[int, ...]]]) -> str:
    """An npz written member by member: each array's bytes under a header that claims the given shape."""
    with zipfile.ZipFile(folder / name, "w") as zf:
        for key, (arr, shape) in members.items():
            buf = io.BytesIO()
            np.lib.format.write_array_header_1_0(buf, {"descr": np.lib.format.dtype_to_descr(arr.dtype),
                                                       "fortran_order": False, "shape": shape})
            zf.writestr(f"{key}.npy", buf.getvalue() + arr.tobytes())
    return name


def _bad_crc_npz(folder: Path, name: str) -> str:
    """An npz one byte of whose image data was changed after it was written (its stored CRC no longer matches)."""
    np.savez(folder / name, x=np.full((6, 16, 16), 77, np.uint8), y=np.arange(6))
    data = (folder / name).read_bytes()
    at = data.index(b"M" * 256) + 100
    (folder / name).write_bytes(data[:at] + b"N" + data[at + 1:])
    return name


def _raw_npz(folder: Path, name: str, x_npy: bytes) -> str:
    """An npz whose ``x.npy`` member is ``x_npy`` as given (a hand-crafted header), with 6 good labels."""
    labels = io.BytesIO()
    np.save(labels, np.arange(6))
    with zipfile.ZipFile(folder / name, "w") as zf:
        zf.writestr("x.npy", x_npy)
        zf.writestr("y.npy", labels.getvalue())
    return name


def _npy_header(text: str) -> bytes:
    """A version 1.0 ``.npy`` header holding ``text`` (padded as numpy pads), followed by 1,536 bytes of pixels."""
    raw = text.encode("latin1")
    raw += b" " * (-(10 + len(raw) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(raw).to_bytes(2, "little") + raw + bytes(1536)


def _float_npz(folder: Path, name: str, bad: float) -> str:
    x = np.random.default_rng(0).random((6, 16, 16), dtype=np.float32)
    x[3, 5, 7] = bad
    np.savez(folder / name, x=x, y=np.arange(6))
    return name


def _broken_png(folder: Path, lines: list[str], keep: int | None) -> str:
    """An image list whose ``set/1.png`` is cut to its first ``keep`` bytes (None: replaced by text)."""
    rel = _imglist(folder, lines)
    png = folder / "images_classic" / "set" / "1.png"
    png.write_bytes(png.read_bytes()[:keep] if keep is not None else b"not an image")
    return rel


def _base(folder: Path) -> dict:
    return {"name": "pf", "out": str(folder / "out"), "cache_dir": str(folder / "cache"),
            "model": {"arch": "democnn", "num_classes": 10, "in_channels": 1, "input_size": 16,
                      "train": {"epochs": 1}},
            "data": {"root": str(folder), "id": {"kind": "npz", "path": _npz(folder, "id.npz")}},
            "attacks": ["fgsm"], "detectors": "msp", "analyses": []}


def _id_entry(entry: Callable[[Path], dict]) -> Callable[[Path, dict], None]:
    return lambda folder, cfg: cfg["data"].update(id=entry(folder))


def _ood_entry(entry: Callable[[Path], dict]) -> Callable[[Path, dict], None]:
    return lambda folder, cfg: cfg["data"].update(ood=[entry(folder)])


CASES = {
    "id label 10 of 10 classes": (
        _id_entry(lambda f: {"kind": "npz", "path": _npz(f, "a.npz", labels=np.array([0, 1, 10, 2, 3, 4]))}),
        "label 10 at row 2"),
    "id label -1": (
        _id_entry(lambda f: {"kind": "npz", "path": _npz(f, "a.npz", labels=np.array([0, -1, 1, 2, 3, 4]))}),
        "label -1 at row 1"),
    "id set without labels": (
        _id_entry(lambda f: {"kind": "npz", "path": _npz(f, "a.npz", labels=None)}), "has no labels 'y'"),
    "fit label out of range": (
        lambda f, cfg: cfg["data"].update(fit={"kind": "npz", "path": _npz(f, "fit.npz",
                                                                           labels=np.array([0, 1, 2, 3, 4, 12]))}),
        "data.fit"),
    "imglist id line without label": (
        _id_entry(lambda f: {"kind": "openood", "imglist": _imglist(f, ["set/0.png 1", "set/1.png"])}),
        "line 2"),
    "imglist id label out of range": (
        _id_entry(lambda f: {"kind": "openood", "imglist": _imglist(f, ["set/0.png 1", "set/1.png 11"])}),
        "label 11 at row 1"),
    "imglist image missing after the first": (
        _id_entry(lambda f: {"kind": "openood", "imglist": _imglist(f, ["set/0.png 1", "set/9.png 2"])}),
        "1 of 2 listed images missing"),
    "imglist empty": (
        _id_entry(lambda f: {"kind": "openood", "imglist": _imglist(f, [""])}), "lists no image"),
    "ood imglist image missing": (
        lambda f, cfg: cfg["data"].update(ood=[{"kind": "openood", "imglist": _imglist(f, ["set/7.png -1"])}]),
        "data.ood[0]"),
    "idx labels fewer than images": (_id_entry(lambda f: _idx(f, 6, 5)), "images (6, 16, 16) and labels (5,)"),
    # issue 30, items 15 and 17: numbers never checked, tracebacks where one line is due, empty OOD sets
    "float id image with NaN": (_id_entry(lambda f: {"kind": "npz", "path": _float_npz(f, "a.npz", np.nan)}),
                                "image 3 holds NaN or infinite pixels"),
    "float ood image with NaN": (_ood_entry(lambda f: {"kind": "npz", "path": _float_npz(f, "o.npz", np.nan)}),
                                 "image 3 holds NaN or infinite pixels"),
    "npz with a bad CRC": (_id_entry(lambda f: {"kind": "npz", "path": _bad_crc_npz(f, "a.npz")}),
                           "'x.npy' fails its CRC check"),
    "npz header claims more rows than stored": (
        _id_entry(lambda f: {"kind": "npz", "path": _npz_bytes(f, "a.npz", {
            "x": (np.zeros((6, 16, 16), np.uint8), (12, 16, 16)), "y": (np.arange(12), (12,))})}),
        "claims shape (12, 16, 16) (3072 bytes) but only 1536 bytes are stored"),
    # issue 39, item 9: a size that overflows int64 (2**32 * 2**32 * 16 = 0 mod 2**64) and headers that do not parse
    "npz header claims a huge shape": (
        _id_entry(lambda f: {"kind": "npz", "path": _raw_npz(f, "a.npz", _npy_header(
            "{'descr': '|u1', 'fortran_order': False, 'shape': (4294967296, 4294967296, 16), }"))}),
        "claims shape (4294967296, 4294967296, 16) (295147905179352825856 bytes) but only 1536 bytes are stored"),
    "npz header that does not parse": (
        _id_entry(lambda f: {"kind": "npz", "path": _raw_npz(f, "a.npz", _npy_header(
            "{'descr': '|u1', 'fortran_order': False, 'shape': (6, 16, 16) garbage"))}),
        "a.npz' is not a readable .npz"),
    "npz header with a bad magic string": (
        _id_entry(lambda f: {"kind": "npz", "path": _raw_npz(f, "a.npz", b"NOTNUMPY" + bytes(1600))}),
        "a.npz' is not a readable .npz"),
    "npz header with a negative dimension": (
        _id_entry(lambda f: {"kind": "npz", "path": _raw_npz(f, "a.npz", _npy_header(
            "{'descr': '|u1', 'fortran_order': False, 'shape': (6, -16, 16), }"))}),
        "a.npz' is not a readable .npz"),
    "ood npz with 0 images": (_ood_entry(lambda f: {"kind": "npz", "path": _npz(f, "o.npz", n=0, labels=None)}),
                              "holds no images"),
    "ood idx with 0 images": (_ood_entry(lambda f: _idx(f, 0, 0)), "holds no images"),
    "imglist id label superscript two": (
        _id_entry(lambda f: {"kind": "openood", "imglist": _imglist(f, ["set/0.png 1", "set/1.png \u00b2"])}),
        "line 2: 'set/1.png' has label '\u00b2'"),
    "imglist id label double minus": (
        _id_entry(lambda f: {"kind": "openood", "imglist": _imglist(f, ["set/0.png --3", "set/1.png 1"])}),
        "line 1: 'set/0.png' has label '--3'"),
    "imglist ood label superscript two": (
        _ood_entry(lambda f: {"kind": "openood", "imglist": _imglist(f, ["set/0.png -1", "set/1.png \u00b2"])}),
        "line 2: 'set/1.png' has label '\u00b2'"),
    "imglist id png truncated": (
        _id_entry(lambda f: {"kind": "openood", "imglist": _broken_png(f, ["set/0.png 1", "set/1.png 2"], 60)}),
        "(line 2 of 'benchmark_imglist/t/test_set.txt' (data.id)) is not a readable image"),
    "imglist ood file not an image": (
        _ood_entry(lambda f: {"kind": "openood", "imglist": _broken_png(f, ["set/1.png -1"], None)}),
        "(line 1 of 'benchmark_imglist/t/test_set.txt' (data.ood[0])) is not a readable image"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_malformed_data_is_refused_before_any_model_is_built(case, tmp_path, capsys, monkeypatch):
    import advopenood.models.classifier as models
    import advopenood.models.training as training

    def built(*args, **kwargs):
        raise AssertionError("a model was built before the data was checked")

    monkeypatch.setattr(models, "build_model", built)
    monkeypatch.setattr(training, "trained_model", built)
    cfg = _base(tmp_path)
    edit, message = CASES[case]
    edit(tmp_path, cfg)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    rc = main(["run", "--config", str(path), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_ood_sets_need_no_labels(tmp_path):
    """Unlabelled natural OOD sets (label -1 or none) pass the check."""
    from advopenood.config.loading import validate
    from advopenood.run.preflight import check_data

    cfg = _base(tmp_path)
    cfg["data"]["ood"] = [{"kind": "npz", "path": _npz(tmp_path, "o.npz", labels=None), "name": "o"},
                          {"kind": "openood", "imglist": _imglist(tmp_path, ["set/0.png -1", "set/1.png"]),
                           "name": "l"}]
    check_data(validate(cfg))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_checkpoint_with_non_finite_weights_is_refused(bad, data_root, tmp_path, capsys):
    """The pack's ResNet-20 with one weight set to NaN or inf is refused in one line (issue 30, item 15)."""
    import torch

    state = torch.load(data_root / "resnet20_cifar10.pt", weights_only=True)
    state["layer2.1.conv1.weight"][0, 0, 0, 0] = bad
    torch.save(state, tmp_path / "broken.pt")
    cfg = {"name": "pf", "out": str(tmp_path / "out"), "cache_dir": str(tmp_path / "cache"),
           "model": {"arch": "resnet20", "num_classes": 10, "checkpoint": str(tmp_path / "broken.pt")},
           "data": {"root": str(data_root), "id": {"kind": "npz", "path": "cifar10_test.npz"}},
           "attacks": ["fgsm"], "detectors": "msp", "analyses": []}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    rc = main(["run", "--config", str(tmp_path / "cfg.yaml"), "--quiet", "--limit", "8"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "holds NaN or infinite weights (1 of " in err and "layer2.1.conv1.weight" in err
    assert not (tmp_path / "out").exists()
