"""Data files the run relies on are checked before any model is built: labels, layouts, listed images
(issue 24, item 12). Each case is refused with exit code 2 in one line, no traceback."""
from __future__ import annotations

import gzip
import struct
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import yaml
from PIL import Image

from advopenood.cli import main


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


def _base(folder: Path) -> dict:
    return {"name": "pf", "out": str(folder / "out"), "cache_dir": str(folder / "cache"),
            "model": {"arch": "democnn", "num_classes": 10, "in_channels": 1, "input_size": 16,
                      "train": {"epochs": 1}},
            "data": {"root": str(folder), "id": {"kind": "npz", "path": _npz(folder, "id.npz")}},
            "attacks": ["fgsm"], "detectors": "msp", "analyses": []}


def _id_entry(entry: Callable[[Path], dict]) -> Callable[[Path, dict], None]:
    return lambda folder, cfg: cfg["data"].update(id=entry(folder))


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
}


@pytest.mark.parametrize("case", list(CASES))
def test_malformed_data_is_refused_before_any_model_is_built(case, tmp_path, capsys, monkeypatch):
    import advopenood.models as models
    import advopenood.training as training

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
    from advopenood.config import validate
    from advopenood.preflight import check_data

    cfg = _base(tmp_path)
    cfg["data"]["ood"] = [{"kind": "npz", "path": _npz(tmp_path, "o.npz", labels=None), "name": "o"},
                          {"kind": "openood", "imglist": _imglist(tmp_path, ["set/0.png -1", "set/1.png"]),
                           "name": "l"}]
    check_data(validate(cfg))
