"""Dataset readers: ``.npz`` arrays, OpenOOD's image-list layout, torchvision datasets, and the demo data.

Every dataset yields ``(image, label)`` with ``image`` a float32 ``C x H x W`` tensor in [0, 1], already
converted to the model's channel count and input size. ``identity()`` describes the data for the
content-addressed store (name, source fingerprint, length, and the view the model gets: :func:`model_view`), so
a changed file or a changed input size, channel count or resizing gives a new cache key.
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from advopenood.data.specs import INTEGER_LABEL, DataSpec, TorchvisionSpec, as_data_spec
from advopenood.errors import UsageError
from advopenood.io import os_path, sha256_file

DATASET_KINDS = ("npz", "idx", "openood", "torchvision", "demo")
DEMO_SETS = ("digits", "textures", "blobs", "inverted", "noise")
TORCHVISION_SETS = ("CIFAR10", "CIFAR100", "MNIST", "FashionMNIST", "SVHN")


def to_model_input(x: torch.Tensor, channels: int, size: int) -> torch.Tensor:
    """Batch ``N x C x H x W`` in [0, 1] -> the model's channel count (grey <-> RGB) and square size (bilinear)."""
    if x.shape[1] != channels:
        x = x.mean(1, keepdim=True) if channels == 1 else x.expand(-1, channels, -1, -1)
    if x.shape[-1] != size or x.shape[-2] != size:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=True).clamp(0, 1)
    return x.contiguous()


def model_view(channels: int, size: int, pre_size: int | None) -> dict[str, Any]:
    """The settings that turn a dataset's stored images into the tensors the model sees, for its identity: the
    channel count, the input size and the resize-and-crop size. A change to any of them gives the dataset another
    identity, so stored attacks, scores and trained models are computed again, never served for the old view."""
    view: dict[str, Any] = {"channels": int(channels), "size": int(size)}
    if pre_size is not None:
        view["pre_size"] = int(pre_size)
    return view


def resize_crop(t: torch.Tensor, pre_size: int, size: int) -> torch.Tensor:
    """OpenOOD's test preprocessing on a ``C x H x W`` tensor in [0, 1]: the shorter side resized to ``pre_size``
    (bilinear, antialiased), then a centre crop of ``size``."""
    import torchvision.transforms.functional as TF

    t = TF.resize(t, pre_size, TF.InterpolationMode.BILINEAR, antialias=True)
    return TF.center_crop(t, [size, size]).clamp(0, 1)


#: a set whose pixels span less than this share of their type's range (uint8: 0-255, float: [0, 1]) is named in a
#: warning (:func:`range_warning`): max - min under 16 for uint8
SMALL_RANGE = 1 / 16


def range_warning(ds: Dataset) -> str:
    """A one-line warning when the pixels of the rows a run uses span less than :data:`SMALL_RANGE` of their
    type's range, e.g. a mask or a binarised set saved as uint8 0 and 1, which the model sees as near-black images
    (``/ 255``); "" otherwise, and for image-file sets (their decoded pixels are not held)."""
    base, rows = (ds.base, ds.indices) if isinstance(ds, Subset) else (ds, None)
    if not isinstance(base, ArrayDataset) or len(ds) == 0:
        return ""
    x = base.x if rows is None else base.x[rows]
    full = 255.0 if x.dtype == np.uint8 else 1.0
    lo, hi = float(np.min(x)), float(np.max(x))
    if hi - lo >= SMALL_RANGE * full:
        return ""
    if x.dtype == np.uint8:
        return (f"set {ds.name!r}: its uint8 pixels span only {lo:g} to {hi:g}, under 1/16 of 0 to 255; a mask or "
                "binarised set saved as uint8 0/1 reaches the model as near-black images (pixel / 255): scale it to "
                "0-255, or check that this is the set you mean")
    return (f"set {ds.name!r}: its {x.dtype} pixels span only {lo:.3g} to {hi:.3g}, under 1/16 of 0 to 1; the model "
            "sees nearly one grey level: check that this is the set you mean")


class ArrayDataset(Dataset):
    """Images held as a uint8 (or [0, 1] float) array ``N x H x W [x C]`` with integer labels."""

    def __init__(self, x: np.ndarray, y: np.ndarray, name: str, fingerprint: str, channels: int, size: int,
                 pre_size: int | None = None):
        if len(x) != len(y):
            raise UsageError(f"dataset {name!r}: {len(x)} images but {len(y)} labels")
        if x.dtype != np.uint8:
            lo, hi = float(np.min(x)), float(np.max(x))
            if not (0.0 <= lo and hi <= 1.0):  # NaN compares false: NaN pixels are refused too
                raise UsageError(f"dataset {name!r} has float images outside [0, 1] or not finite (min {lo:.3g}, "
                                 f"max {hi:.3g}); valid inputs: uint8 pixels or floats in [0, 1] (normalisation "
                                 "lives in the model)")
        self.x, self.y = x, np.asarray(y, dtype=np.int64)
        self.name, self.fingerprint, self.channels, self.size = name, fingerprint, channels, size
        self.pre_size = pre_size

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        img = self.x[i]
        t = torch.tensor(np.asarray(img))  # a copy: IDX arrays are read-only buffers
        t = t.float() / 255.0 if img.dtype == np.uint8 else t.float()
        t = t[None] if t.ndim == 2 else t.permute(2, 0, 1)
        if self.pre_size is not None:
            t = resize_crop(t, self.pre_size, self.size)
        return to_model_input(t[None], self.channels, self.size)[0], int(self.y[i])

    def identity(self) -> dict[str, Any]:
        """The array's SHA-256, its length and the view the model gets (:func:`model_view`)."""
        return {"name": self.name, "source": self.fingerprint, "n": len(self),
                **model_view(self.channels, self.size, self.pre_size)}


def images_fingerprint(base: Path, rels: list[str], how: str = "stat") -> str:
    """SHA-256 over every listed image file (in list order): its path and, with ``how="stat"``, its size and
    modification time in nanoseconds (cheap: one ``stat`` per file; a copied tree gets new times, so its sets are
    computed again, never served stale), or with ``how="content"`` the SHA-256 of its bytes. A listed file that
    is missing enters as ``missing``."""
    h = hashlib.sha256(how.encode())
    for rel in rels:
        path = base / rel
        try:
            if how == "content":
                part = sha256_file(path)
            else:
                st = path.stat()
                part = f"{st.st_size}:{st.st_mtime_ns}"
        except OSError:
            part = "missing"
        h.update(f"{rel}\0{part}\n".encode())
    return h.hexdigest()


class ImglistDataset(Dataset):
    """OpenOOD's layout: ``<root>/benchmark_imglist/.../*.txt`` lines ``relative/path.png label``, images under
    ``<root>/<images>/`` (``images_classic`` for CIFAR-size benchmarks, ``images_largescale`` for ImageNet).

    With ``pre_size``, images get OpenOOD's test preprocessing (``TestStandardPreProcessor``): the shorter side
    resized to ``pre_size`` (bilinear, PIL), then a centre crop of the input size; without it, the whole image
    is resized to the input size."""

    def __init__(self, root: Path, imglist: str, images: str, name: str, channels: int, size: int,
                 pre_size: int | None = None, image_identity: str = "stat"):
        list_path = root / imglist
        if not list_path.is_file():
            raise UsageError(f"image list {str(list_path)!r} not found; an OpenOOD data root holds "
                             "benchmark_imglist/<benchmark>/*.txt and images_classic/ or images_largescale/")
        self.base = root / images
        if not self.base.is_dir():
            raise UsageError(f"image folder {str(self.base)!r} not found; valid choices: images_classic, images_largescale")
        self.items = []
        for line in list_path.read_text().splitlines():
            parts = line.strip().split(" ", 1)
            if parts and parts[0]:
                label = parts[1].strip() if len(parts) > 1 else "-1"
                self.items.append((parts[0], int(label) if INTEGER_LABEL.fullmatch(label) else -1))
        self.name, self.channels, self.size, self.pre_size = name, channels, size, pre_size
        self.fingerprint = sha256_file(list_path)
        self.images_fingerprint = images_fingerprint(self.base, [rel for rel, _ in self.items], image_identity)
        self.image_identity = image_identity

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        rel, label = self.items[i]
        with Image.open(self.base / rel) as im:
            im = im.convert("RGB" if self.channels == 3 else "L")
            if self.pre_size is not None:
                import torchvision.transforms.functional as TF

                im = TF.center_crop(TF.resize(im, self.pre_size, TF.InterpolationMode.BILINEAR), self.size)
            arr = np.asarray(im)
        t = torch.from_numpy(arr.copy()).float() / 255.0
        t = t[None] if t.ndim == 2 else t.permute(2, 0, 1)
        return to_model_input(t[None], self.channels, self.size)[0], label

    def identity(self) -> dict[str, Any]:
        """The list file's SHA-256 and what the listed images are (:func:`images_fingerprint`), so that other
        images behind an unchanged list get other keys."""
        return {"name": self.name, "source": self.fingerprint, "n": len(self),
                "images": {self.image_identity: self.images_fingerprint},
                **model_view(self.channels, self.size, self.pre_size)}


class Subset(Dataset):
    """The rows ``indices`` of a dataset; its identity records them."""

    def __init__(self, base: Dataset, indices: np.ndarray):
        self.base, self.indices = base, np.asarray(indices, dtype=np.int64)
        self.name = base.name

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        return self.base[int(self.indices[i])]

    def identity(self) -> dict[str, Any]:
        ident = dict(self.base.identity())
        ident["indices"] = hashlib.sha256(self.indices.tobytes()).hexdigest()[:16]
        ident["n"] = len(self)
        return ident


@lru_cache(maxsize=4)
def _load_npz(path: str) -> tuple[np.ndarray, np.ndarray, str]:
    with np.load(path) as d:
        if "x" not in d.files:
            raise UsageError(f"{path!r} has no array 'x'; an .npz dataset holds x (uint8 NHWC or NHW) and y")
        x = d["x"]
        y = d["y"] if "y" in d.files else np.full(len(x), -1, dtype=np.int64)
    return x, y, sha256_file(Path(path))


def read_idx(path: Path) -> np.ndarray:
    """An IDX array file (MNIST's format), gzip-compressed or not: big-endian header, then uint8 data."""
    import gzip
    import struct

    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        zero, dtype, ndim = struct.unpack(">HBB", f.read(4))
        if zero != 0 or dtype != 0x08:
            raise UsageError(f"{str(path)!r} is not a uint8 IDX file; valid inputs: MNIST-style *-idx[13]-ubyte[.gz]")
        shape = struct.unpack(f">{ndim}I", f.read(4 * ndim))
        return np.frombuffer(f.read(), dtype=np.uint8).reshape(shape)


def _demo_digits(split: str) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled 8x8 digits (1,797 images), as uint8 in [0, 255]; 70/30 split by a fixed shuffle."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = np.clip(d.images * (255.0 / 16.0), 0, 255).round().astype(np.uint8)
    order = seeded_prefix(len(x), None, 0, sort=False)
    cut = int(0.7 * len(x))
    idx = order[:cut] if split == "train" else order[cut:]
    return x[idx], d.target[idx].astype(np.int64)


def _demo_textures(n: int = 400) -> tuple[np.ndarray, np.ndarray]:
    """Random 128x128 crops of scikit-image's bundled grey textures and photos, block-averaged to 16x16
    (far-OOD for digits: texture fills the frame)."""
    import skimage.data as sd

    sources = [sd.brick(), sd.grass(), sd.gravel(), sd.camera(), sd.text(), sd.moon()]
    rng = np.random.default_rng(1)
    crops = []
    for i in range(n):
        img = sources[i % len(sources)]
        r, c = rng.integers(0, img.shape[0] - 128), rng.integers(0, img.shape[1] - 128)
        crops.append(img[r:r + 128, c:c + 128].reshape(16, 8, 16, 8).mean(axis=(1, 3)))
    return np.stack(crops).round().astype(np.uint8), np.full(n, -1, dtype=np.int64)


def _demo_blobs(n: int = 400) -> tuple[np.ndarray, np.ndarray]:
    """Smooth random blobs: uniform 4x4 noise upsampled (bilinear) to 16x16 grey."""
    coarse = torch.from_numpy(np.random.default_rng(3).random((n, 1, 4, 4), dtype=np.float32))
    fine = F.interpolate(coarse, size=(16, 16), mode="bilinear", align_corners=False)[:, 0]
    return (fine.numpy() * 255).round().astype(np.uint8), np.full(n, -1, dtype=np.int64)


def _demo_inverted() -> tuple[np.ndarray, np.ndarray]:
    """The digits' test split with black and white swapped (light background, dark strokes)."""
    x, _ = _demo_digits("test")
    return 255 - x, np.full(len(x), -1, dtype=np.int64)


def _demo_noise(n: int = 400) -> tuple[np.ndarray, np.ndarray]:
    """Uniform noise images, 16x16 grey."""
    rng = np.random.default_rng(2)
    return rng.integers(0, 256, size=(n, 16, 16), dtype=np.uint8), np.full(n, -1, dtype=np.int64)


def dataset_name(spec: DataSpec | Mapping[str, Any]) -> str:
    """The name a data entry's set gets in outputs: ``name`` (a demo set: ``name_as``, else the set's name, with
    the split for the digits), else the stem of its file or image list, else its kind."""
    spec = as_data_spec(spec)
    if spec.kind == "demo":
        which = spec.name or "digits"
        return spec.name_as or (which if which != "digits" else f"digits_{spec.split}")
    source = {"npz": getattr(spec, "path", None), "openood": getattr(spec, "imglist", None)}.get(spec.kind) or spec.kind
    return spec.name or Path(str(source)).stem


def build_dataset(spec: DataSpec | Mapping[str, Any], root: Path | None, channels: int, size: int,
                  image_identity: str = "stat") -> Dataset:
    """Build one dataset from a data entry (a typed spec, or a mapping such as ``{"kind": "npz", "path": ...}``,
    validated the same way); ``image_identity`` says how an image list's images enter its identity
    (:func:`images_fingerprint`)."""
    spec = as_data_spec(spec)
    name = dataset_name(spec)
    if spec.kind == "npz":
        path = _resolve(spec.path, root)
        if not path.is_file():
            raise UsageError(f"data file {str(path)!r} not found (data root {str(root)!r}); "
                             "pass --data-root DIR holding the .npz files named in the config")
        x, y, fp = _load_npz(str(path))
        return ArrayDataset(x, y, name, fp, channels, size, spec.pre_size)
    if spec.kind == "idx":
        paths = [_resolve(spec.images, root), _resolve(spec.labels, root)]
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise UsageError(f"IDX file {missing[0]!r} not found; pass --data-root DIR holding the config's files")
        fp = hashlib.sha256("".join(sha256_file(p) for p in paths).encode()).hexdigest()
        return ArrayDataset(read_idx(paths[0]), read_idx(paths[1]).astype(np.int64), name, fp, channels, size)
    if spec.kind == "openood":
        if root is None or not root.is_dir():
            raise UsageError(f"OpenOOD data root {str(root)!r} not found; pass --data-root DIR (OpenOOD's data/ folder)")
        return ImglistDataset(root, spec.imglist, spec.images, name, channels, size, spec.pre_size, image_identity)
    if spec.kind == "torchvision":
        return _torchvision_dataset(spec, root, name, channels, size)
    makers: dict[str, Callable[[], tuple[np.ndarray, np.ndarray]]] = {
        "digits": lambda: _demo_digits(spec.split),
        "textures": _demo_textures,
        "blobs": _demo_blobs,
        "inverted": _demo_inverted,
        "noise": _demo_noise,
    }
    which = spec.name or "digits"
    if which not in makers:
        raise UsageError(f"unknown demo dataset {which!r}; valid choices: {', '.join(DEMO_SETS)}")
    x, y = makers[which]()
    fp = hashlib.sha256(x.tobytes() + y.tobytes()).hexdigest()
    return ArrayDataset(x, y, name, fp, channels, size)


def _torchvision_dataset(spec: TorchvisionSpec, root: Path | None, name: str, channels: int, size: int) -> Dataset:
    """A torchvision dataset by name, read from ``root``; downloads only when ``download: true`` and online."""
    import torchvision

    tv_name = spec.dataset or name
    if tv_name not in TORCHVISION_SETS:
        raise UsageError(f"unknown torchvision dataset {tv_name!r}; valid choices: {', '.join(TORCHVISION_SETS)}")
    kwargs = {"split": spec.split or "test"} if tv_name == "SVHN" else {"train": spec.split == "train"}
    try:
        ds = getattr(torchvision.datasets, tv_name)(str(root or "."), download=spec.download, **kwargs)
    except RuntimeError as exc:
        raise UsageError(f"torchvision dataset {tv_name!r} not found under {str(root)!r} ({exc}); "
                         "pass --data-root DIR holding it, or set download: true on an online machine") from None
    x = np.asarray(ds.data.numpy() if torch.is_tensor(ds.data) else ds.data)
    if tv_name == "SVHN":
        x = x.transpose(0, 2, 3, 1)
    y = np.asarray(getattr(ds, "targets", getattr(ds, "labels", None)))
    x, y = x.astype(np.uint8), np.asarray(y, dtype=np.int64)
    fp = hashlib.sha256(f"torchvision:{tv_name}:".encode() + x.tobytes() + y.tobytes()).hexdigest()
    return ArrayDataset(x, y, name, fp, channels, size)


def _resolve(path: str, root: Path | None) -> Path:
    """A data path from the config as the OS spells it (:func:`advopenood.io.os_path`), relative to ``root``."""
    p = os_path(Path(path).expanduser())
    return p if p.is_absolute() or root is None else root / p


def seeded_prefix(n: int, k: int | None, seed: int, *, sort: bool = True) -> np.ndarray:
    """The first ``k`` rows (all ``n`` when None) of the seeded permutation of ``range(n)``
    (``np.random.default_rng(seed).permutation(n)``), sorted unless ``sort`` is False.

    Every seeded row selection uses this one permutation per ``(n, seed)``, so a smaller ``k`` selects a subset
    of a larger one, and results do not depend on which caller drew the rows.
    """
    order = np.random.default_rng(seed).permutation(n)
    if k is not None:
        order = order[:min(int(k), n)]
    return np.sort(order) if sort else order


def limit_dataset(ds: Dataset, limit: int | None, seed: int) -> Dataset:
    """The first ``limit`` rows of a seeded permutation (:func:`seeded_prefix`; stratification-free,
    reproducible), or ``ds`` itself."""
    if limit is None or limit >= len(ds):
        return ds
    return Subset(ds, seeded_prefix(len(ds), limit, seed))


def make_loader(ds: Dataset, batch_size: int, workers: int = 0) -> DataLoader:
    """Deterministic, unshuffled loader."""
    return DataLoader(ds, batch_size=batch_size, shuffle=False, num_workers=workers)


def stack(ds: Dataset, indices: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Materialise rows of a dataset as ``(x, y)`` tensors (for one shard or a small set)."""
    idx = range(len(ds)) if indices is None else indices
    items = [ds[int(i)] for i in idx]
    return torch.stack([it[0] for it in items]), torch.tensor([it[1] for it in items], dtype=torch.long)
