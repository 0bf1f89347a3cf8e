"""OpenOOD v1.5's benchmark layouts: which image lists and folders each benchmark reads, and how it groups them.

Transcribed from OpenOOD's ``openood/evaluation_api/datasets.py`` (``DATA_INFO``) and
``openood/evaluation_api/preprocessor.py`` (``default_preprocessing_dict``). A data root is OpenOOD's ``data/``
folder, as ``scripts/download/download.py`` fills it: ``benchmark_imglist/<benchmark>/*.txt`` (lines
``relative/path label``) and the images under ``images_classic/`` or ``images_largescale/``.

Groups, as OpenOOD's ``Evaluator`` uses them:

* ``near`` / ``far``: near-OOD and far-OOD test sets (``eval_ood`` reports each set and the group mean);
* ``csid``: covariate-shifted ID sets (same classes, shifted images); ``eval_ood(fsood=True)`` counts them as ID
  ("full-spectrum OOD"), and ``eval_acc('csid')`` is the accuracy over the ID test set and every csid set.

CIFAR-10's csid set (``cifar10c``) is in ``DATA_INFO`` but not in the download script's ``benchmarks_dict``, so
a data root filled by ``download.py --dataset_mode benchmark`` lacks it: it is read only when ``data.groups``
names ``csid`` explicitly.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GROUPS = ("near", "far", "csid")
#: the group of a natural OOD set outside OpenOOD v1.5's benchmark for its ID set (left out of near/far means)
OTHER = "other"
#: the group of an adversarial set in ood.csv
ADVERSARIAL = "adversarial"

CLASSIC, LARGE = "images_classic", "images_largescale"

#: benchmark -> num_classes, input size, OpenOOD's resize-before-crop size, normalisation, and the lists per split
BENCHMARKS: dict[str, dict[str, Any]] = {
    "cifar10": {
        "num_classes": 10, "img_size": 32, "pre_size": 32,
        "mean": (0.4914, 0.4822, 0.4465), "std": (0.2470, 0.2435, 0.2616),
        "train": (CLASSIC, "benchmark_imglist/cifar10/train_cifar10.txt"),
        "test": (CLASSIC, "benchmark_imglist/cifar10/test_cifar10.txt"),
        "near": {"cifar100": (CLASSIC, "benchmark_imglist/cifar10/test_cifar100.txt"),
                 "tin": (CLASSIC, "benchmark_imglist/cifar10/test_tin.txt")},
        "far": {"mnist": (CLASSIC, "benchmark_imglist/cifar10/test_mnist.txt"),
                "svhn": (CLASSIC, "benchmark_imglist/cifar10/test_svhn.txt"),
                "texture": (CLASSIC, "benchmark_imglist/cifar10/test_texture.txt"),
                "places365": (CLASSIC, "benchmark_imglist/cifar10/test_places365.txt")},
        "csid": {"cifar10c": (CLASSIC, "benchmark_imglist/cifar10/test_cifar10c.txt")},
        "default_groups": ("near", "far"),
    },
    "cifar100": {
        "num_classes": 100, "img_size": 32, "pre_size": 32,
        "mean": (0.5071, 0.4867, 0.4408), "std": (0.2675, 0.2565, 0.2761),
        "train": (CLASSIC, "benchmark_imglist/cifar100/train_cifar100.txt"),
        "test": (CLASSIC, "benchmark_imglist/cifar100/test_cifar100.txt"),
        "near": {"cifar10": (CLASSIC, "benchmark_imglist/cifar100/test_cifar10.txt"),
                 "tin": (CLASSIC, "benchmark_imglist/cifar100/test_tin.txt")},
        "far": {"mnist": (CLASSIC, "benchmark_imglist/cifar100/test_mnist.txt"),
                "svhn": (CLASSIC, "benchmark_imglist/cifar100/test_svhn.txt"),
                "texture": (CLASSIC, "benchmark_imglist/cifar100/test_texture.txt"),
                "places365": (CLASSIC, "benchmark_imglist/cifar100/test_places365.txt")},
        "csid": {},
        "default_groups": ("near", "far"),
    },
    "imagenet200": {
        "num_classes": 200, "img_size": 224, "pre_size": 256,
        "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225),
        "train": (LARGE, "benchmark_imglist/imagenet200/train_imagenet200.txt"),
        "test": (LARGE, "benchmark_imglist/imagenet200/test_imagenet200.txt"),
        "near": {"ssb_hard": (LARGE, "benchmark_imglist/imagenet200/test_ssb_hard.txt"),
                 "ninco": (LARGE, "benchmark_imglist/imagenet200/test_ninco.txt")},
        "far": {"inaturalist": (LARGE, "benchmark_imglist/imagenet200/test_inaturalist.txt"),
                "textures": (CLASSIC, "benchmark_imglist/imagenet200/test_textures.txt"),
                "openimage_o": (LARGE, "benchmark_imglist/imagenet200/test_openimage_o.txt")},
        "csid": {"imagenet_v2": (LARGE, "benchmark_imglist/imagenet200/test_imagenet200_v2.txt"),
                 "imagenet_c": (LARGE, "benchmark_imglist/imagenet200/test_imagenet200_c.txt"),
                 "imagenet_r": (LARGE, "benchmark_imglist/imagenet200/test_imagenet200_r.txt")},
        "default_groups": ("near", "far", "csid"),
    },
    "imagenet": {
        "num_classes": 1000, "img_size": 224, "pre_size": 256,
        "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225),
        "train": (LARGE, "benchmark_imglist/imagenet/train_imagenet.txt"),
        "test": (LARGE, "benchmark_imglist/imagenet/test_imagenet.txt"),
        "near": {"ssb_hard": (LARGE, "benchmark_imglist/imagenet/test_ssb_hard.txt"),
                 "ninco": (LARGE, "benchmark_imglist/imagenet/test_ninco.txt")},
        "far": {"inaturalist": (LARGE, "benchmark_imglist/imagenet/test_inaturalist.txt"),
                "textures": (CLASSIC, "benchmark_imglist/imagenet/test_textures.txt"),
                "openimage_o": (LARGE, "benchmark_imglist/imagenet/test_openimage_o.txt")},
        "csid": {"imagenet_v2": (LARGE, "benchmark_imglist/imagenet/test_imagenet_v2.txt"),
                 "imagenet_c": (LARGE, "benchmark_imglist/imagenet/test_imagenet_c.txt"),
                 "imagenet_r": (LARGE, "benchmark_imglist/imagenet/test_imagenet_r.txt"),
                 "imagenet_es": (LARGE, "benchmark_imglist/imagenet/test_imagenet_es.txt")},
        "default_groups": ("near", "far", "csid"),
    },
}
#: sets OpenOOD reads without its resize-and-crop (``ImageNetCPreProcessor``: the files are already 224 px)
NO_RESIZE = frozenset({"imagenet_c"})


def natural_group(dataset: str | None, set_name: str) -> str:
    """The OpenOOD v1.5 group (``near``, ``far``, ``csid``) of a natural set named ``set_name`` when the ID set is
    ``dataset`` (``data.dataset``); :data:`OTHER` when OpenOOD's benchmark for that ID set does not list it."""
    bench = BENCHMARKS.get(str(dataset or "").lower())
    if bench is not None:
        for group in GROUPS:
            if set_name in bench[group]:
                return group
    return OTHER


def _entry(images: str, imglist: str, name: str, pre_size: int | None, group: str | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"kind": "openood", "imglist": imglist, "images": images, "name": name}
    if pre_size is not None:
        entry["pre_size"] = pre_size
    if group is not None:
        entry["group"] = group
    return entry


def expand(data: Mapping[str, Any]) -> dict[str, Any]:
    """A ``data`` section with ``benchmark`` -> the same section with OpenOOD's ``id``, ``fit`` (ID train list)
    and ``ood`` entries filled in where the section does not give them; ``dataset`` defaults to the benchmark.

    OOD entries come in OpenOOD's order: near, far, then csid, each with its ``group``; ``groups`` picks which
    (default: those OpenOOD's download script ships for the benchmark). Every entry is an ``openood`` image
    list with OpenOOD's test preprocessing (resize the shorter side to ``pre_size``, centre-crop to the input
    size), except ImageNet-C, which OpenOOD reads as stored. The section's own ``id`` / ``fit`` / ``ood`` entries
    (``openood`` or ``npz``) inherit the benchmark's ``pre_size`` unless they set ``pre_size`` themselves
    (``pre_size: null``: resize the whole image to the input size).
    """
    out = dict(data)
    bench = BENCHMARKS[str(data["benchmark"])]
    groups = tuple(data.get("groups") or bench["default_groups"])
    pre = bench["pre_size"]
    name = str(data["benchmark"])
    out["dataset"] = data.get("dataset") or name
    out["id"] = _inherit(data["id"], pre) if data.get("id") else _entry(*bench["test"], name, pre)
    out["fit"] = _inherit(data["fit"], pre) if data.get("fit") else _entry(*bench["train"], f"{name}_train", pre)
    if data.get("ood"):
        out["ood"] = [_inherit(entry, pre) for entry in data["ood"]]
    else:
        out["ood"] = [_entry(images, imglist, set_name, None if set_name in NO_RESIZE else pre, group)
                      for group in GROUPS if group in groups
                      for set_name, (images, imglist) in bench[group].items()]
    return out


#: entry kinds that take ``pre_size``
PRE_SIZED = ("openood", "npz")


def _inherit(entry: Any, pre_size: int | None) -> Any:
    """A user's data entry with the benchmark's ``pre_size`` when it takes one and does not set its own."""
    if not isinstance(entry, Mapping) or entry.get("kind") not in PRE_SIZED or "pre_size" in entry \
            or pre_size is None:
        return entry
    return {**entry, "pre_size": pre_size}
