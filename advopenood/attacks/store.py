"""Content-addressed, sharded, resumable store of adversarial datasets.

A set lives in ``<cache>/<attack>-<key>/``, where ``key`` hashes the model weights, the dataset identity
(what the images are, :meth:`identity` of the dataset) and row indices, the attack name and parameters, the
attack's code (:func:`code_identity`: its source files and distribution version), the seed, the shard size and
the library versions.
Each shard ``shard_00000.npz`` (uncompressed, float32, float-exact) holds ``x_adv`` (N x C x H x W) and the
per-sample record (``index, y, clean_pred, adv_pred, success, linf, l2``); its SHA-256 sits beside it in
``shard_00000.npz.sha256``. Both are written by atomic rename, so an interrupted run leaves whole shards
only and resumes at the first missing one; a shard whose checksum does not match is regenerated with a
warning. Each shard is generated under a file lock, so concurrent runs (or ranks) never write the same
shard twice at once. An attack's output is checked before its shard is written (:func:`check_attack_output`:
shape, finite, [0, 1] unless the attack leaves that range (``Attack.in_range``), within the budget), so no
impossible image enters the store. Shard ``i`` is attacked
with the seed ``derive_seed(seed, i)``, so a resumed or distributed run equals an uninterrupted one bit for bit.

``<cache>/costs.json`` keeps each attack's measured seconds per image (:func:`cost_key`: the attack and its
parameters but the budget, the model, the device type), from the last run that generated shards of it, so that a
later run can say up front how long its attacks may take (:meth:`AdvStore.cost`, :meth:`AdvStore.pending`). It is
an estimate, never a set's data: a file that does not read as such is one warning (the estimates are unavailable),
its valid entries are kept, and it is rewritten whole (under a lock, by atomic rename) when a cost is recorded,
after the set's manifest, so no finished set is lost to it. The
progress bar of a set names the set and counts images (a set read whole from the store has none); inside a shard a
bar of its own counts the attack's iterations or queries (:func:`shard_progress`).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal

import numpy as np
import pandas as pd
import torch
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from advopenood import io as aio
from advopenood.attacks.base import Attack, counting_steps
from advopenood.data.datasets import stack
from advopenood.errors import storage_error
from advopenood.provenance import (
    canonical_key,
    code_identity,
    derive_seed,
    library_versions,
)

COSTS_FILE = "costs.json"
RECORD_COLUMNS = ("index", "y", "clean_pred", "adv_pred", "success", "linf", "l2")
#: a bounded attack's per-image perturbation may exceed ``eps`` by this much (relative, absolute): float rounding
BUDGET_RTOL, BUDGET_ATOL = 1e-3, 1e-6
#: the per-image size of a flattened perturbation under each attack norm the budget check knows
NORMS = {"linf": lambda d: d.abs().amax(1), "l2": lambda d: d.norm(dim=1), "l1": lambda d: d.abs().sum(1)}


def _valid_cost(entry: Any) -> bool:
    """Whether a ``costs.json`` entry is one :meth:`AdvStore._record_cost` writes (a finite, non-negative
    ``seconds_per_image``)."""
    seconds = entry.get("seconds_per_image") if isinstance(entry, dict) else None
    return isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and math.isfinite(seconds) \
        and seconds >= 0


class AttackOutputError(ValueError):
    """An attack returned images that cannot be its adversarial examples (shape, NaN, range or budget)."""


def shard_record(ds: Dataset, rows: np.ndarray, model: torch.nn.Module, attack: Attack, seed: int,
                 device: torch.device) -> dict[str, np.ndarray]:
    """The arrays of one shard: ``rows`` of ``ds`` attacked with ``seed`` (the output checked by
    :func:`check_attack_output`), the clean and adversarial predictions, the attack's own success and each image's
    Linf and L2 perturbation; everything a shard costs but writing it (the attack stage's probe times this)."""
    x, y = stack(ds, rows)
    x, y = x.to(device), y.to(device)
    x_adv = attack(model, x, y, seed=seed)
    check_attack_output(attack, x, x_adv)
    with torch.no_grad():
        clean_pred = model(x).argmax(1)
        adv_pred = model(x_adv).argmax(1)
    delta = (x_adv - x).flatten(1)
    return {
        "x_adv": x_adv.float().cpu().numpy(),
        "index": np.asarray(rows),
        "y": y.cpu().numpy(),
        "clean_pred": clean_pred.cpu().numpy(),
        "adv_pred": adv_pred.cpu().numpy(),
        "success": attack.succeeded(model, x_adv, y, adv_pred).cpu().numpy(),
        "linf": delta.abs().amax(1).float().cpu().numpy(),
        "l2": delta.norm(dim=1).float().cpu().numpy(),
    }


def check_attack_output(attack: Attack, x: torch.Tensor, x_adv: Any) -> None:
    """Raise :class:`AttackOutputError` unless ``x_adv`` has ``x``'s shape, is finite, lies in [0, 1] (for an attack
    whose :attr:`~advopenood.attacks.base.Attack.in_range`) and, for a bounded attack of a known norm (:data:`NORMS`),
    every image's perturbation is within its pixel budget (``Attack.pixel_budget``: ``eps`` unless its ball is set
    in other units; times ``1 + BUDGET_RTOL``, plus ``BUDGET_ATOL``); minimal-perturbation attacks (``bounded =
    False``) have no budget."""
    who = f"attack {attack.name!r}"
    if not isinstance(x_adv, torch.Tensor) or x_adv.shape != x.shape:
        shape = tuple(x_adv.shape) if isinstance(x_adv, torch.Tensor) else type(x_adv).__name__
        raise AttackOutputError(f"{who} returned {shape} for input images of shape {tuple(x.shape)}")
    flat = x_adv.detach().flatten(1).float()
    finite = flat.isfinite().all(1)
    if not finite.all():
        raise AttackOutputError(f"{who} returned NaN or infinite pixels in {int((~finite).sum())} of {len(flat)} "
                                f"images (first: row {int((~finite).nonzero()[0])})")
    lo, hi = float(flat.min()), float(flat.max())
    if attack.in_range and (lo < 0.0 or hi > 1.0):
        raise AttackOutputError(f"{who} returned pixels outside [0, 1] (min {lo:.4g}, max {hi:.4g})")
    eps, size = attack.pixel_budget(), NORMS.get(attack.norm)
    if not attack.bounded or eps is None or size is None:
        return
    norms = size(flat - x.detach().flatten(1).float())
    over = norms > float(eps) * (1 + BUDGET_RTOL) + BUDGET_ATOL
    if over.any():
        raise AttackOutputError(f"{who} returned perturbations beyond its budget: {attack.norm} norm up to "
                                f"{float(norms.max()):.4g} > eps {float(eps):.4g} in {int(over.sum())} of {len(flat)} "
                                "images")


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


#: how adversarial images reach the detectors: as stored (float32) or truncated to 8 bits (ToPILImage)
Quantize = Literal["none", "uint8_trunc"]


def quantize(x: torch.Tensor, mode: Quantize) -> torch.Tensor:
    """Images as the detectors see them under ``mode``.

    ``uint8_trunc`` reproduces the paper's storage: ``ToPILImage`` turns a float image into bytes with
    ``pic.mul(255).byte()`` (truncation toward zero, in float32) and ``ToTensor`` reads the PNG back as
    ``byte / 255``. ``none`` returns ``x`` unchanged.
    """
    if mode == "none":
        return x
    import torch

    return x.float().mul(255).to(torch.uint8).to(torch.float32).div(255)


@dataclass
class AdvSet:
    """A complete adversarial set on disk: per-sample records in memory, images streamed shard by shard."""

    attack: str
    norm: str
    eps: float | None
    params: dict[str, Any]
    key: str
    path: Path
    shards: list[Path]
    stats: dict[str, Any] = field(default_factory=dict)
    set_name: str = ""
    #: the attacked images: ``"id"`` (row i = ID test row i) or the natural OOD set's name (OOD->ID attacks)
    source: str = "id"
    #: how readers see the stored float images (:func:`advopenood.config.protocols.quantize`): ``none`` or ``uint8_trunc``
    quantize: str = "none"
    #: per-row success of the images as the detectors see them (:attr:`quantize` applied), set by the run when
    #: quantization is on (:meth:`see`); None = the stored ``success`` (the float images are what is seen)
    seen: np.ndarray | None = None
    _records: pd.DataFrame | None = None

    def __post_init__(self) -> None:
        self.set_name = self.set_name or self.attack

    @property
    def records(self) -> pd.DataFrame:
        """One row per sample: ``index, y, clean_pred, adv_pred, success, linf, l2`` (success = adv_pred != y,
        or the attack's own criterion, :meth:`advopenood.attacks.base.Attack.succeeded`)."""
        if self._records is None:
            parts = []
            for shard in self.shards:
                with np.load(shard) as d:
                    parts.append(pd.DataFrame({c: d[c] for c in RECORD_COLUMNS}))
            self._records = pd.concat(parts, ignore_index=True)
        return self._records

    def __len__(self) -> int:
        return len(self.records)

    @property
    def seen_success(self) -> np.ndarray:
        """Per-row success of the images the detectors score: :attr:`seen` when quantization is on, else the
        stored ``success`` (``adv_pred != y``, or the attack's own criterion)."""
        return self.seen if self.seen is not None else self.records["success"].to_numpy(dtype=bool)

    @torch.no_grad()
    def see(self, model: torch.nn.Module, attack: Attack, batch_size: int, device: torch.device) -> None:
        """Recompute success on the images as the detectors see them (:attr:`quantize`): the stored float image
        may be adversarial while its 8-bit truncation is not. A no-op without quantization."""
        if self.quantize == "none":
            self.seen = None
            return
        parts = []
        for x, y in self.iter_batches(batch_size):
            x, y = x.to(device), y.to(device)
            pred = model(x).argmax(1)
            parts.append(attack.succeeded(model, x, y, pred).cpu().numpy().astype(bool))
        self.seen = np.concatenate(parts) if parts else np.zeros(0, dtype=bool)

    def iter_batches(self, batch_size: int, mask: np.ndarray | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield ``(x_adv, y)`` batches in sample order, reading one shard at a time; ``mask`` selects rows.
        Images pass through the set's :attr:`quantize` view."""
        offset = 0
        buf_x: list[torch.Tensor] = []
        buf_y: list[torch.Tensor] = []
        for shard in self.shards:
            with np.load(shard) as d:
                x, y = quantize(torch.from_numpy(d["x_adv"]), self.quantize), torch.from_numpy(d["y"])
            n = len(y)
            if mask is not None:
                keep = torch.from_numpy(np.asarray(mask[offset:offset + n], dtype=bool))
                x, y = x[keep], y[keep]
            offset += n
            buf_x.append(x)
            buf_y.append(y)
            while sum(len(b) for b in buf_y) >= batch_size:
                bx, by = torch.cat(buf_x), torch.cat(buf_y)
                yield bx[:batch_size], by[:batch_size]
                buf_x, buf_y = [bx[batch_size:]], [by[batch_size:]]
        if buf_y and sum(len(b) for b in buf_y):
            yield torch.cat(buf_x), torch.cat(buf_y)

    def load(self, rows: np.ndarray) -> torch.Tensor:
        """Adversarial images of the given row positions (0-based positions in ``records``), through :attr:`quantize`."""
        rows = np.asarray(rows, dtype=np.int64)
        out, offset = [None] * len(rows), 0
        for shard in self.shards:
            with np.load(shard) as d:
                n = len(d["y"])
                hit = np.nonzero((rows >= offset) & (rows < offset + n))[0]
                if len(hit):
                    x = d["x_adv"]
                    for h in hit:
                        out[h] = torch.from_numpy(x[rows[h] - offset].copy())
            offset += n
        return quantize(torch.stack(out), self.quantize)


def cost_key(attack: Attack, model_hash: str, device: torch.device | str) -> str:
    """What an attack's time per image depends on: its name and parameters but ``eps``, the model, the device
    type."""
    params = {k: v for k, v in attack.params.items() if k != "eps"}
    return canonical_key({"attack": attack.name, "params": params, "model": model_hash,
                          "device": torch.device(device).type})[:24]


#: tqdm's unit for what a shard's bar counts
UNITS = {"iterations": "it", "steps": "step", "queries": "query", "model passes": "pass"}


@contextlib.contextmanager
def shard_progress(model: torch.nn.Module, attack: Attack, bar: Any, shard: str, label: str,
                   images: int | None = None) -> Iterator[None]:
    """Progress inside a shard of ``images`` images while the block attacks it: a bar of its own that counts the
    attack's iterations or queries against the planned total (an attack that declares ``counts_steps``:
    :func:`advopenood.attacks.base.count_step`, :meth:`~advopenood.attacks.base.Attack.planned_steps`), else the
    model's forward passes; when the shard ends the set's ``bar`` shows the count in its postfix (``k of n`` where
    the attack stopped early, every image fooled)."""
    planned = attack.planned_steps(images=images, classes=getattr(model, "num_classes", None))
    total, unit = planned if planned else (None, "model passes")
    inner = tqdm(total=total, desc=f"attack {label} {shard}, {unit}", unit=UNITS[unit], disable=bar.disable,
                 leave=False)
    done = [0]

    def report(n: int) -> None:
        done[0] += n
        inner.update(n)

    handle = None if planned else model.register_forward_hook(lambda *_: report(1))
    try:
        with counting_steps(report) if planned else contextlib.nullcontext():
            yield
    finally:
        if handle is not None:
            handle.remove()
        inner.close()
        count = f"{done[0]} of {total}" if planned and done[0] < total else str(done[0])
        bar.set_postfix_str(f"{shard}, {count} {unit}", refresh=False)


class AdvStore:
    """Generates and finds adversarial sets under ``root`` (see the module docstring for the layout).

    Opening the store removes the temporary files that a writer killed mid-write (kill -9, power loss) left in
    it: only ours (:data:`advopenood.io.TEMP_NAME`), only when no running writer can hold them (older than
    :data:`advopenood.io.STALE_TEMP_SECONDS`); a shard's own ones go whatever their age once its lock is held."""

    def __init__(self, root: Path, shard_size: int = 256):
        self.root = aio.os_path(Path(root).expanduser())
        self.shard_size = int(shard_size)
        self._costs_warned = False
        aio.sweep_temp_files(self.root, depth=1)

    def spec(self, model_hash: str, data_identity: dict[str, Any], attack: Attack, seed: int) -> dict[str, Any]:
        spec = {"model": model_hash, "data": data_identity, "attack": attack.name, "params": attack.params,
                "seed": int(seed), "shard_size": self.shard_size, "versions": library_versions(),
                "code": code_identity(type(attack))}
        return {**spec, "context": attack.context} if attack.context else spec

    def path_for(self, attack: Attack, key: str) -> Path:
        return self.root / f"{attack.name}-{key[:16]}"

    def generate(self, ds: Dataset, model: torch.nn.Module, attack: Attack, *, model_hash: str, seed: int,
                 device: torch.device, rank: int = 0, world_size: int = 1, progress: bool = True,
                 recompute: bool = False, label: str = "") -> AdvSet:
        """Attack every row of ``ds`` (shards ``i`` with ``i % world_size == rank``), reusing valid shards unless
        ``recompute`` (then every shard is generated again and replaces the stored one). The progress bar is named
        ``attack <label>`` (the set's name; default the attack's) and counts images."""
        spec = self.spec(model_hash, ds.identity(), attack, seed)
        key = canonical_key(spec)
        path = self.path_for(attack, key)
        path.mkdir(parents=True, exist_ok=True)
        if not (path / "spec.json").exists():
            aio.write_json(path / "spec.json", spec)
        n_shards = (len(ds) + self.shard_size - 1) // self.shard_size
        mine = [i for i in range(n_shards) if i % world_size == rank]
        generated = reused = regenerated = 0
        start = time.perf_counter()
        stored = not recompute and all(self._stored(path, i) for i in mine)  # read from the store: no bar
        bar = tqdm(total=sum(self._rows(i, len(ds)) for i in mine), desc=f"attack {label or attack.name}",
                   unit="img", disable=not progress or stored, leave=False)
        work = [0.0, 0]  # seconds and images of the shards generated here
        for i in mine:
            shard = self._shard_path(path, i)
            state = self._check(shard)
            if state == "ok" and not recompute:
                reused += 1
                bar.update(self._rows(i, len(ds)))
                continue
            with self._lock(shard):  # every writer of this shard holds the lock: its temporary files are stale
                for name in (shard.name, shard.name + ".sha256"):
                    aio.sweep_temp_files(path, older_than=0, depth=0, only=name)
                state = self._check(shard, warn=not recompute)
                if state == "ok" and not recompute:
                    reused += 1
                    bar.update(self._rows(i, len(ds)))
                    continue
                regenerated += state == "corrupt"
                t = time.perf_counter()
                with shard_progress(model, attack, bar, f"shard {mine.index(i) + 1}/{len(mine)}", label or attack.name,
                                    self._rows(i, len(ds))):
                    self._write_shard(shard, ds, model, attack, i, seed, device)
                work = [work[0] + time.perf_counter() - t, work[1] + self._rows(i, len(ds))]
                generated += 1
                bar.update(self._rows(i, len(ds)))
        bar.refresh()  # the final count is shown once whatever the refresh interval (a log keeps it)
        bar.close()
        shards = [self._shard_path(path, i) for i in range(n_shards)]
        stats = {"shards": n_shards, "generated": generated, "reused": reused, "regenerated": regenerated,
                 "recomputed": bool(recompute), "seconds": round(time.perf_counter() - start, 3)}
        if rank == 0 and world_size == 1:
            self.write_manifest(path, spec, shards)
        if rank == 0 and work[1]:
            self._record_cost(cost_key(attack, model_hash, device), attack.name, *work)
        return AdvSet(attack.name, attack.norm, attack.params.get("eps"), dict(attack.params), key, path, shards, stats)

    def _rows(self, i: int, n: int) -> int:
        """The number of images in shard ``i`` of a set of ``n``."""
        return max(0, min(self.shard_size, n - i * self.shard_size))

    def pending(self, ds: Dataset, attack: Attack, *, model_hash: str, seed: int, recompute: bool = False) -> int:
        """How many images of ``ds`` :meth:`generate` would attack: those of shards not yet stored (a shard and its
        checksum present counts as stored; its checksum is read when generating)."""
        path = self.path_for(attack, canonical_key(self.spec(model_hash, ds.identity(), attack, seed)))
        n_shards = (len(ds) + self.shard_size - 1) // self.shard_size
        return sum(self._rows(i, len(ds)) for i in range(n_shards) if recompute or not self._stored(path, i))

    def _stored(self, path: Path, i: int) -> bool:
        """Whether shard ``i`` of the set at ``path`` and its checksum are present (read when generating)."""
        shard = self._shard_path(path, i)
        return shard.exists() and (path / (shard.name + ".sha256")).exists()

    def cost(self, attack: Attack, model_hash: str, device: torch.device | str) -> float | None:
        """Seconds per image that generating ``attack``'s shards took on this model and device type in the last
        run that did (``costs.json``); None when none did."""
        entry = self._costs().get(cost_key(attack, model_hash, device))
        return float(entry["seconds_per_image"]) if entry else None

    def _costs(self) -> dict[str, Any]:
        """The valid entries of ``costs.json`` (key -> ``{attack, seconds_per_image, images}``, the seconds a
        finite number >= 0); none when it is missing. A file that is not such a mapping, or holds entries that are
        not, is one warning per store (the estimates it held are unavailable)."""
        path = self.root / COSTS_FILE
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            self._warn_costs(path, f"cannot be read as JSON ({type(exc).__name__})")
            return {}
        if not isinstance(raw, dict):
            self._warn_costs(path, f"is a JSON {type(raw).__name__}, not a mapping of costs")
            return {}
        valid = {key: entry for key, entry in raw.items() if _valid_cost(entry)}
        if len(valid) < len(raw):
            self._warn_costs(path, f"has malformed entries ({len(raw) - len(valid)} of {len(raw)})")
        return valid

    def _warn_costs(self, path: Path, problem: str) -> None:
        if not self._costs_warned:
            self._costs_warned = True
            warnings.warn(f"advopenood: {path} {problem}: the attack time estimates it held are unavailable; it is "
                          "rewritten with its valid entries when a run records a cost", stacklevel=3)

    def _record_cost(self, key: str, attack: str, seconds: float, images: int) -> None:
        """Add one measured cost to ``costs.json``: read, changed and rewritten (atomically) under its lock, so
        concurrent runs keep each other's entries. A file that cannot be written is a warning (an estimate is
        lost, no set), except a full, read-only or over-quota file system, the run's failure."""
        path = self.root / COSTS_FILE
        try:
            with self._lock(path):
                costs = self._costs()
                costs[key] = {"attack": attack, "seconds_per_image": seconds / images, "images": images}
                aio.write_json(path, costs)
        except OSError as exc:
            if storage_error(exc) is not None:
                raise
            warnings.warn(f"advopenood: the cost of attack {attack!r} was not recorded in {path}: {exc}", stacklevel=2)

    def finalize(self, adv: AdvSet) -> None:
        """Write the manifest of a set that several ranks generated (rank 0, after a barrier)."""
        spec = json.loads((adv.path / "spec.json").read_text())
        self.write_manifest(adv.path, spec, adv.shards)

    def write_manifest(self, path: Path, spec: dict[str, Any], shards: list[Path]) -> None:
        """Record every shard's checksum once the set is complete (rank 0 after all ranks finished)."""
        missing = [s.name for s in shards if self._check(s) != "ok"]
        if missing:
            raise RuntimeError(f"cannot write manifest for {path}: shards missing or corrupt: {', '.join(missing[:5])}")
        entries = [{"file": s.name, "sha256": (s.parent / (s.name + ".sha256")).read_text().strip()} for s in shards]
        aio.write_json(path / "manifest.json", {"spec": spec, "shards": entries})

    def _write_shard(self, shard: Path, ds: Dataset, model: torch.nn.Module, attack: Attack, i: int, seed: int,
                     device: torch.device) -> None:
        rows = np.arange(i * self.shard_size, min((i + 1) * self.shard_size, len(ds)))
        buf = io.BytesIO()
        np.savez(buf, **shard_record(ds, rows, model, attack, derive_seed(seed, i), device))
        aio.write_checked(shard, buf.getvalue())

    @staticmethod
    def _shard_path(path: Path, i: int) -> Path:
        return path / f"shard_{i:05d}.npz"

    @staticmethod
    def _check(shard: Path, warn: bool = False) -> str:
        """``ok``, ``missing`` (no shard or no checksum yet) or ``corrupt`` (checksum mismatch)."""
        side = shard.parent / (shard.name + ".sha256")
        if not shard.exists() or not side.exists():
            return "missing"
        if _sha256_bytes(shard.read_bytes()) == side.read_text().strip():
            return "ok"
        if warn:
            warnings.warn(f"advopenood: shard {shard} does not match its checksum; regenerating it", stacklevel=3)
        return "corrupt"

    @staticmethod
    @contextlib.contextmanager
    def _lock(shard: Path) -> Iterator[None]:
        with open(shard.parent / (shard.name + ".lock"), "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
