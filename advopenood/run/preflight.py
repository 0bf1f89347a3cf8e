"""Checks that run before any model, data or attack work: a run that cannot be right does not start.

:func:`preflight` takes the run plan (:class:`advopenood.config.plan.RunPlan`) and raises a one-line
:class:`~advopenood.errors.UsageError` (exit 2 in the CLI) for the first problem it finds, writing nothing:
the set names (safe as file names and keys, unique: :func:`check_names`), the device, the detector backend,
the output and cache folders, every data file (present, readable, the right dtype and layout from the file
headers; ``.npz`` CRCs, finite float pixels, every listed image's header, at least one image per set), the
checkpoint's presence, and ``recompute``'s names. Cheap checks come first, so most bad inputs fail before torch is
imported. :func:`advopenood.run.resolved.resolve` runs it on the validated plan, then builds each part of the run
once, which checks it: the model (:func:`load_checkpoint`), every attack and detector with its parameters, the
evaluators and analyses (:func:`build_plugins`). Nothing is constructed only to be checked.
"""
from __future__ import annotations

import importlib.util
import math
import os
import re
import stat
import zipfile
import zlib
from pathlib import Path
from typing import IO, Any

import numpy as np

from advopenood import registry
from advopenood.config.plan import RunPlan
from advopenood.data.specs import INTEGER_LABEL, IdxSpec, OpenOODSpec
from advopenood.errors import UsageError
from advopenood.io import MANIFEST, OutputError, changed_files, check_output_folder, os_path, resolve_output


def _writable(folder: Path) -> bool:
    """Writable by us, and (for root, who may write anywhere) not marked read-only by its mode bits."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return False
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return bool(folder.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    return True


def check_folder(path: Path, what: str) -> None:
    """``path`` is a folder or can be created as one, and we can write there."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{what} {str(path)!r} is a file; valid choices: a folder that exists or can be created")
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{what} {str(path)!r} cannot be created: {str(existing)!r} is a file")
    if not _writable(existing):
        raise UsageError(f"{what} {str(path)!r} is not writable (folder {str(existing)!r} is read-only); "
                         "valid choices: a writable folder")


def check_output(path: Path, overwrite: bool) -> Path:
    """The output folder is ours to write: new, empty, a previous run's (it has our manifest), or ``overwrite``;
    in every case a real folder or a link to one (:func:`advopenood.io.resolve_output`), without a symbolic link
    inside and without a manifest we did not write (:func:`advopenood.io.check_output_folder`), since a run
    deletes the files a previous run's manifest lists; a listed file changed since that run (or a folder or FIFO
    in its place: :func:`advopenood.io.changed_files`) needs ``overwrite`` (the run then keeps it,
    :func:`advopenood.io.commit_output`). Returns the folder's real path."""
    try:
        path = resolve_output(path)
    except OutputError as exc:
        raise UsageError(str(exc)) from None
    check_folder(path, "output folder")
    check_folder(path.parent, "folder of the output folder")
    try:
        check_output_folder(path)
        changed = changed_files(path)
    except OutputError as exc:
        raise UsageError(f"{exc}; valid choices: another --out, or remove it") from None
    if changed and not overwrite:
        more = f", and {len(changed) - 1} more" if len(changed) > 1 else ""
        raise UsageError(f"output folder {str(path)!r}: {changed[0]!r}{more} changed since the run that wrote it (its "
                         "SHA-256 differs from manifest.json's, or it is not a file any more), and a new run replaces "
                         "that run's files; valid choices: another --out, move the file away, or --overwrite (the "
                         "changed file is kept)")
    if not path.is_dir() or overwrite or (path / MANIFEST).is_file():
        return path
    foreign = sorted(p.name for p in path.iterdir() if not p.name.startswith("."))
    if foreign:
        raise UsageError(f"output folder {str(path)!r} holds files advopenood did not write (e.g. {foreign[0]!r}); "
                         "valid choices: a new or empty folder, a previous run's folder, or --overwrite")
    return path


def _npy_header(f: IO[bytes], name: str) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype from one ``.npy`` member's header; a ValueError naming the member when the header does not
    parse (numpy raises SyntaxError, tokenize errors and others on hand-edited text) or claims a negative size."""
    try:
        version = np.lib.format.read_magic(f)
        reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = reader(f)
    except Exception as exc:  # any failure to parse untrusted header text is the same finding
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"member {name!r}: its header does not parse ({type(exc).__name__}: {detail})") from None
    if any(int(d) < 0 for d in shape):
        raise ValueError(f"member {name!r}: its header claims shape {shape}, with a negative dimension")
    return tuple(int(d) for d in shape), dtype


def _npy_headers(path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Shape and dtype of each array in an ``.npz`` file, from the headers (no array is loaded); every member's
    CRC is checked and a header must parse and not claim more bytes than its member stores (ValueError otherwise;
    sizes in Python integers, which do not overflow)."""
    out = {}
    with zipfile.ZipFile(path) as zf:
        corrupt = zf.testzip()
        if corrupt is not None:
            raise ValueError(f"member {corrupt!r} fails its CRC check (the file is damaged)")
        for name in zf.namelist():
            if not name.endswith(".npy"):
                continue
            with zf.open(name) as f:
                shape, dtype = _npy_header(f, name)
                stored = zf.getinfo(name).file_size - f.tell()
            needed = math.prod(shape) * dtype.itemsize
            if not dtype.hasobject and stored < needed:
                raise ValueError(f"array {name[:-4]!r}: its header claims shape {shape} ({needed} bytes) but only "
                                 f"{stored} bytes are stored (a truncated or hand-edited file)")
            out[name[:-4]] = (shape, dtype)
    return out


def check_npz(path: Path, channels: int) -> None:
    """An image ``.npz``: ``x`` uint8 ``(N, H, W)`` or ``(N, H, W, C)`` with C in {1, 3}, ``y`` ``(N,)`` integers."""
    if not path.is_file():
        raise UsageError(f"data file {str(path)!r} not found; pass --data-root DIR holding the config's data files")
    try:
        heads = _npy_headers(path)
    except (OSError, zipfile.BadZipFile, zlib.error, ValueError) as exc:
        raise UsageError(f"data file {str(path)!r} is not a readable .npz ({type(exc).__name__}: {exc})") from None
    if "x" not in heads:
        raise UsageError(f"data file {str(path)!r} has no array 'x' (found {', '.join(heads) or 'none'}); "
                         "valid layout: x uint8 (N, H, W[, C]) and y (N,)")
    shape, dtype = heads["x"]
    expected = (f"expected x uint8 (or float in [0, 1]) of shape (N, H, W) or (N, H, W, C) with C in 1, 3 "
                f"(model in_channels {channels})")
    if dtype != np.uint8 and dtype.kind != "f":
        raise UsageError(f"data file {str(path)!r}: x has dtype {dtype}; {expected}")
    if len(shape) == 4 and shape[1] in (1, 3) and shape[3] not in (1, 3):
        raise UsageError(f"data file {str(path)!r}: x has shape {shape}, which is channels-first (NCHW); {expected}, "
                         f"e.g. {(shape[0], shape[2], shape[3], shape[1])}")
    if len(shape) not in (3, 4) or (len(shape) == 4 and shape[3] not in (1, 3)):
        raise UsageError(f"data file {str(path)!r}: x has shape {shape}; {expected}")
    if shape[0] == 0:
        raise UsageError(f"data file {str(path)!r} holds no images (x has shape {shape}); valid input: at least one "
                         "image")
    if dtype.kind == "f":
        with np.load(path) as d:
            x = d["x"]
        finite = np.isfinite(x.reshape(len(x), -1)).all(1)
        if not finite.all():
            raise UsageError(f"data file {str(path)!r}: image {int(np.argmin(finite))} holds NaN or infinite pixels "
                             f"({int((~finite).sum())} of {len(x)} images); {expected}")
        lo, hi = float(np.min(x)), float(np.max(x))
        if lo < 0.0 or hi > 1.0:
            raise UsageError(f"data file {str(path)!r}: float images outside [0, 1] (min {lo:.3g}, max {hi:.3g}); {expected}")
    if "y" in heads:
        y_shape, y_dtype = heads["y"]
        if y_shape != (shape[0],) or y_dtype.kind not in "iu":
            raise UsageError(f"data file {str(path)!r}: y has shape {y_shape} and dtype {y_dtype}; "
                             f"expected integer labels of shape ({shape[0]},)")


def _resolve(path: str, root: Path | None) -> Path:
    p = os_path(Path(path).expanduser())
    return p if p.is_absolute() or root is None else root / p


def check_npz_labels(path: Path, where: str, num_classes: int) -> None:
    """An ID ``.npz`` has labels ``y`` in the model's class range (only ``y`` is read)."""
    with np.load(path) as d:
        if "y" not in d.files:
            raise UsageError(f"data file {str(path)!r} ({where}) has no labels 'y'; an ID set needs integer labels "
                             f"0..{num_classes - 1} for every image")
        y = d["y"]
    check_labels(np.asarray(y), where, f"data file {str(path)!r}", num_classes)


def check_idx(spec: IdxSpec, root: Path | None, where: str, labelled: bool, num_classes: int) -> None:
    """An IDX pair: both files readable uint8 IDX arrays, as many labels as images, labels in range for ID sets."""
    from advopenood.data.datasets import read_idx

    arrays = []
    for key in ("images", "labels"):
        path = _resolve(getattr(spec, key), root)
        if not path.is_file() or not os.access(path, os.R_OK):
            raise UsageError(f"IDX file {str(path)!r} not found or unreadable; pass --data-root DIR holding it")
        try:
            arrays.append(read_idx(path))
        except (OSError, EOFError, ValueError) as exc:
            raise UsageError(f"IDX file {str(path)!r} ({where}) is not a readable IDX array ({exc})") from None
    images, labels = arrays
    if images.ndim not in (3, 4) or labels.ndim != 1 or len(labels) != len(images):
        raise UsageError(f"IDX files of {where}: images {images.shape} and labels {labels.shape}; valid: images "
                         "(N, H, W[, C]) and labels (N,)")
    if len(images) == 0:
        raise UsageError(f"IDX file {spec.images!r} ({where}) holds no images; valid input: at least one image")
    if labelled:
        check_labels(labels.astype(np.int64), where, f"IDX labels {spec.labels!r}", num_classes)


def check_labels(y: np.ndarray, where: str, what: str, num_classes: int) -> None:
    """The labels of an ID set (test or fit): present, integer, every one in ``[0, num_classes)``."""
    if len(y) == 0:
        raise UsageError(f"{what} {where} holds no images; valid input: at least one labelled image")
    bad = np.flatnonzero((y < 0) | (y >= num_classes))
    if len(bad):
        raise UsageError(f"{what} {where}: label {int(y[bad[0]])} at row {int(bad[0])} ({len(bad)} of {len(y)} labels) "
                         f"is outside the model's classes; valid labels: 0..{num_classes - 1} "
                         f"(model.num_classes {num_classes}; an ID set needs every image labelled)")


def imglist_rows(imglist: Path) -> list[tuple[str, str | None]]:
    """``(relative path, label text or None)`` of every non-empty line of an OpenOOD image list."""
    rows = []
    with open(imglist) as f:
        for line in f:
            parts = line.strip().split(" ", 1)
            if parts and parts[0]:
                rows.append((parts[0], parts[1].strip() if len(parts) > 1 else None))
    return rows


def check_imglist(root: Path, spec: OpenOODSpec, where: str, labelled: bool, num_classes: int) -> None:
    """An OpenOOD image list: readable, not empty, every listed image present; for an ID set, every line with
    an integer label in ``[0, num_classes)``."""
    lst, images = root / spec.imglist, root / spec.images
    for path in (lst, images):
        if not path.exists():
            raise UsageError(f"OpenOOD path {str(path)!r} not found; an OpenOOD data root holds "
                             "benchmark_imglist/<benchmark>/*.txt and images_classic/ or images_largescale/")
    try:
        rows = imglist_rows(lst)
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"image list {str(lst)!r} ({where}) is not a readable text file ({exc})") from None
    if not rows:
        raise UsageError(f"image list {str(lst)!r} ({where}) lists no image; valid lines: 'relative/path.png label'")
    missing = [rel for rel, _ in rows if not (images / rel).is_file()]
    if missing:
        raise UsageError(f"image {str(images / missing[0])!r} of {spec.imglist!r} ({where}) not found "
                         f"({len(missing)} of {len(rows)} listed images missing); the list's paths are relative to "
                         f"{str(images)!r} (OpenOOD's layout)")
    texts = [label for _, label in rows]
    bad = next((i for i, t in enumerate(texts) if (t is None and labelled)
                or (t is not None and not INTEGER_LABEL.fullmatch(t))), None)
    if bad is not None:
        valid = "an ID set needs one on every line" if labelled else "an OOD set may also give -1 or none"
        raise UsageError(f"image list {str(lst)!r} ({where}), line {bad + 1}: {rows[bad][0]!r} has label "
                         f"{texts[bad]!r}; valid labels: ASCII integers 0..{num_classes - 1} ({valid})")
    check_images(images, rows, f"{spec.imglist!r} ({where})")
    if labelled:
        check_labels(np.array([int(t) for t in texts]), where, f"image list {str(lst)!r}", num_classes)


def check_images(base: Path, rows: list[tuple[str, str | None]], where: str) -> None:
    """Every listed image opens as an image and passes PIL's ``verify`` (headers and chunk checksums, no decoding)."""
    from PIL import Image

    for line, (rel, _) in enumerate(rows, 1):
        try:
            with Image.open(base / rel) as img:
                img.verify()
        except (OSError, SyntaxError, ValueError, EOFError) as exc:
            text = " ".join(str(exc).split())[:120] or type(exc).__name__
            raise UsageError(f"image {str(base / rel)!r} (line {line} of {where}) is not a readable image "
                             f"({type(exc).__name__}: {text}); valid input: an intact PNG or JPEG file") from None


def check_data(plan: RunPlan) -> None:
    """Every data file the plan names is present and has the right layout; the ID test and fit sets carry
    labels in the model's class range."""
    data, root = plan.data, plan.data_root
    if root is not None and not root.is_dir():
        raise UsageError(f"data root {str(root)!r} is not a folder; pass --data-root DIR holding the config's data files")
    channels, classes = plan.model.in_channels, plan.model.num_classes
    specs = [("data.id", data.id, True)] + ([("data.fit", data.fit, True)] if data.fit else [])
    specs += [(f"data.ood[{i}]", s, False) for i, s in enumerate(data.ood)]
    for where, spec, labelled in specs:
        kind = spec.kind
        if kind == "npz":
            path = _resolve(spec.path, root)
            check_npz(path, channels)
            if labelled:
                check_npz_labels(path, where, classes)
        elif kind == "idx":
            check_idx(spec, root, where, labelled, classes)
        elif kind == "openood":
            if root is None:
                raise UsageError("an openood data entry needs data.root (or --data-root): OpenOOD's data/ folder")
            check_imglist(root, spec, where, labelled, classes)


def check_benchmark(plan: RunPlan) -> None:
    """A benchmark run's sets hold the benchmark's images (:func:`advopenood.config.benchmarks.check_images`: the
    index list's and the pixels' SHA-256), and its name and version are a shipped benchmark's."""
    if plan.benchmark is None:
        return
    from advopenood.config.benchmarks import by_key, check_images

    bench = by_key(plan.benchmark)
    if bench is None:
        raise UsageError(f"benchmark {plan.benchmark!r} is not a shipped benchmark's name@version; valid choices: "
                         "advopenood run --benchmark NAME (advopenood list benchmarks)")
    fixed = {"seed": (plan.seed, bench.seed), "protocol": (plan.protocol, bench.evaluation.protocol),
             "limit": (plan.limit, bench.of("id")[0].images),
             "data.fit_limit": (plan.data.fit_limit, bench.of("fit")[0].images),
             "data.ood": ([s.name for s in plan.data.ood], [s.name for s in bench.ood]),
             "ci.resamples": (plan.ci.resamples, bench.evaluation.ci_resamples), "attacks": (tuple(plan.attacks), ())}
    for key, (have, want) in fixed.items():
        if have != want:
            raise UsageError(f"benchmark {plan.benchmark!r}: {key} is {have!r}, not the benchmark's {want!r}; valid "
                             "choices: advopenood run --benchmark NAME, which sets it")
    check_images(bench, plan.data_root or Path("."))


def checkpoint_path(plan: RunPlan) -> Path | None:
    """The planned checkpoint, relative to the data root when relative; None when the model is trained."""
    if not plan.model.checkpoint:
        return None
    path = os_path(Path(plan.model.checkpoint).expanduser())
    return path if path.is_absolute() or plan.data_root is None else plan.data_root / path


def check_model(plan: RunPlan) -> None:
    """A checkpoint file is planned and present, or a training recipe is given; what the checkpoint holds is checked
    by loading it, once, when the run is resolved (:func:`load_checkpoint`)."""
    path = checkpoint_path(plan)
    if path is None and plan.model.train is None:
        raise UsageError("model has neither checkpoint nor train; valid choices: model.checkpoint: FILE "
                         "(relative to the data root) or model.train: {epochs, lr, batch}")
    if path is not None and not path.is_file():
        raise UsageError(f"checkpoint {str(path)!r} not found")


def load_checkpoint(plan: RunPlan) -> Any:
    """The run's classifier from its checkpoint on the plan's device, loaded once (``weights_only=True``, matching
    the architecture, finite weights: a one-line UsageError otherwise); None for a model trained on first use
    (the prepare stage trains it, :func:`advopenood.run.prepare.load_model`)."""
    path = checkpoint_path(plan)
    if path is None:
        return None
    from advopenood.models.classifier import build_from_config

    return build_from_config(plan.model, path, plan.device)


#: what a machine with a GPU torch can use as ``cuda`` has: NVIDIA's driver, or AMD's (ROCm's torch calls it cuda)
GPU_DRIVER_PATHS = ("/proc/driver/nvidia/gpus", "/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd")


def check_gpu_driver(device: str) -> None:
    """A ``cuda`` device on a machine with no GPU driver (none of :data:`GPU_DRIVER_PATHS`) is refused without
    importing torch; where a driver is present, :func:`check_runtime` asks torch (``torch.cuda.is_available``)."""
    if device.startswith("cuda") and not any(os.path.exists(p) for p in GPU_DRIVER_PATHS):
        raise UsageError(f"device {device!r} is not available on this machine (it has no NVIDIA or AMD GPU driver); "
                         "valid choices: cpu")


def check_paths(plan: RunPlan) -> None:
    """Every file and folder the plan names exists (the data root, each data file, the checkpoint): what
    :func:`check_data` and :func:`check_model` check first, in their words, without reading a file."""
    data, root = plan.data, plan.data_root
    if root is not None and not root.is_dir():
        raise UsageError(f"data root {str(root)!r} is not a folder; pass --data-root DIR holding the config's data files")
    for spec in [data.id, *([data.fit] if data.fit else []), *data.ood]:
        if spec.kind == "npz" and not _resolve(spec.path, root).is_file():
            raise UsageError(f"data file {str(_resolve(spec.path, root))!r} not found; pass --data-root DIR holding "
                             "the config's data files")
        if spec.kind == "idx":
            for path in (_resolve(spec.images, root), _resolve(spec.labels, root)):
                if not path.is_file() or not os.access(path, os.R_OK):
                    raise UsageError(f"IDX file {str(path)!r} not found or unreadable; pass --data-root DIR holding it")
    path = checkpoint_path(plan)
    if path is not None and not path.is_file():
        raise UsageError(f"checkpoint {str(path)!r} not found")


def precheck(plan: RunPlan, *, overwrite: bool = False) -> None:
    """The checks of :func:`preflight` that need no plugin, no torch and no file read, on a plan whose names are not
    resolved (:func:`advopenood.config.loading.check_config`): the output and cache folders, the files named, the
    GPU driver. The CLI runs them before torch loads; :func:`preflight` runs them again, in full."""
    check_output(plan.output, overwrite)
    check_folder(plan.cache, "cache folder")
    check_paths(plan)
    check_gpu_driver(plan.device)


def check_runtime(plan: RunPlan) -> None:
    """The device exists and an explicitly chosen detector backend is installed."""
    device = plan.device
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"device {device!r} is not available on this machine; valid choices: cpu")
    if plan.detectors and plan.detector_backend == "openood":
        from advopenood.detection.openood_backend import INSTALL_SECTION, resolve_backend

        if importlib.util.find_spec("openood") is None:
            raise UsageError(f"detector backend 'openood' needs OpenOOD, which is not installed (see "
                             f"{INSTALL_SECTION}); valid choices: --detector-backend pytorch-ood or auto")
        resolve_backend("openood")


def check_recompute(plan: RunPlan) -> None:
    """``recompute`` names a set or detector of the run."""
    known = [s.set_name for s in plan.attack_specs] + list(plan.detectors)
    for name in plan.recompute:
        if name != "all" and name not in known:
            raise UsageError(f"recompute: {name!r} is neither an attack set nor a detector of this run; valid choices: "
                             f"all, {', '.join(known) or 'none'}")


def build_plugins(plan: RunPlan) -> list[tuple[str, Any]]:
    """``(timing label, plugin)`` for every configured evaluator and analysis, constructed with its parameters
    before any work, so that a bad parameter stops the run before anything is computed."""
    plugins = []
    for kind, section, label in (("evaluators", "evaluator_params", "evaluator"),
                                 ("analyses", "analysis_params", "analysis")):
        plugins += [(f"{label}:{name}", registry.create(kind, name, **plan.params(section, name)))
                    for name in getattr(plan, kind)]
    return plugins


#: a set's name (it becomes file names, folder names and keys): a letter or digit, then letters, digits and ``._+@-``
SET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+@-]*")


def check_names(plan: RunPlan) -> None:
    """Every name that becomes a path or a key is safe (:data:`SET_NAME`: no ``/``, no leading dot, no absolute
    path) and unique (ignoring case) across the ID set (``data.dataset`` and ``data.id``'s name may agree), the
    natural OOD sets and the attack sets; ``id`` (the key of the ID set's scores: only the ID set may be named so)
    and ``<attack set>.success`` / ``.positive`` (its masks in ``scores/<detector>.npz``) are reserved."""
    from advopenood.data.datasets import dataset_name

    d = plan.data
    entries = [("data.dataset", d.dataset, "id")] if d.dataset is not None else []
    for key, spec, group in [("data.id", d.id, "id")] + [(f"data.ood[{i}]", s, "ood") for i, s in enumerate(d.ood)]:
        entries.append((f"{key}.name" + ("" if spec.name else " (unset: from its file or kind)"), dataset_name(spec),
                        group))
    entries += [(f"attack set of {s.attack!r} (an attacks entry's label, else its name)", s.set_name, "attack")
                for s in plan.attack_specs]
    reserved = {"id": "the ID set's scores"}
    for _, name, group in entries:
        if group == "attack":
            reserved.update({f"{name}.{mask}".lower(): f"the {mask} mask of attack set {name!r}"
                             for mask in ("success", "positive")})
    taken: dict[str, tuple[int, str, str]] = {}
    for i, (key, name, group) in enumerate(entries):
        listed = ", ".join(dict.fromkeys(str(e[1]) for j, e in enumerate(entries) if j != i)) or "none"
        if not SET_NAME.fullmatch(name):
            raise UsageError(f"{key}: {name!r} is not a valid set name (it becomes file names and keys); valid "
                             "choices: letters, digits and . _ + @ - starting with a letter or digit, e.g. "
                             f"{re.sub(r'[^A-Za-z0-9._+@-]', '_', name).lstrip('._+@-') or 'set1'!r}")
        if name.lower() in reserved and not (group == "id" and name.lower() == "id"):
            raise UsageError(f"{key}: {name!r} is reserved ({reserved[name.lower()]}); valid choices: any other "
                             f"name unique across the ID, OOD and attack sets (taken: {listed})")
        first = taken.setdefault(name.lower(), (i, key, group))
        if first[0] != i and not (group == "id" and first[2] == "id"):
            raise UsageError(f"{key}: {name!r} is also the name of {first[1]}; valid choices: a name unique across "
                             f"the ID, OOD and attack sets (give it a 'name' or 'label'; taken: {listed})")


def preflight(plan: RunPlan, *, overwrite: bool = False) -> Path:
    """All checks, cheapest first; the first failure raises a one-line UsageError and nothing is written. Returns
    the output folder's real path (:func:`advopenood.io.resolve_output`)."""
    check_names(plan)
    output = check_output(plan.output, overwrite)
    check_folder(plan.cache, "cache folder")
    for sub, what in (("adv", "attack store"), ("scores", "score cache"), ("models", "model cache"),
                      ("intervals", "interval store")):
        check_folder(plan.cache / sub, what)
    check_data(plan)
    check_benchmark(plan)
    check_runtime(plan)
    check_model(plan)
    check_recompute(plan)
    return output
