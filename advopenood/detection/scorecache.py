"""Detector work in the content-addressed store, like attack work.

Each (detector, set) score vector is stored as ``<cache>/scores/<detector>-<key>/<set key>.npy`` with a
SHA-256 sidecar, written by atomic rename. The detector key hashes everything that decides the scores: the
model weights, the detector's registry name, its effective parameters and resolved backend, the source
files of its class (and of the detector it wraps, ``wrapped``) and of the detector machinery, the fit data
(identity, rows, seed), the batch size, the library versions and, for a randomised detector
(:class:`~advopenood.capabilities.Randomised`), the seed of its evaluation noise. The set key hashes what the
images are: a
dataset's identity (file fingerprint and rows) or an adversarial set's store key and the view its readers get
(``quantize``). A re-run of the same config fits nothing and runs no network pass for detectors; a changed
parameter recomputes that detector only, from the stored fit pass and the stored outputs (logits, features) of
each scored set, without a network pass when the detector reads nothing else.
"""
from __future__ import annotations

import hashlib
import io
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from advopenood import io as aio
from advopenood.capabilities import is_randomised
from advopenood.provenance import canonical_key, library_versions, source_sha

#: the detector machinery whose source enters every detector and pass key (files beside this one)
MACHINERY = ("outputs.py", "postprocessor.py", "bank.py", "scoring.py", "openood_backend.py")


def machinery_sha() -> str:
    """SHA-256 over the source of the detector machinery (:data:`MACHINERY`), read as files, not imported."""
    h = hashlib.sha256()
    for name in MACHINERY:
        h.update((Path(__file__).parent / name).read_bytes())
    return h.hexdigest()


def detector_key(*, model_hash: str, name: str, backend: str, detector: Any, params: Mapping[str, Any],
                 fit_identity: Mapping[str, Any], seed: int, batch_size: int) -> str:
    """The key of one fitted detector's scores (see the module docstring)."""
    inner = getattr(detector, "inner", detector)
    code = [source_sha(inner), machinery_sha()]
    wrapped = getattr(detector, "wrapped", None)  # a detector wrapping another (smoothed_<det>): that one's code too
    if wrapped is not None:
        code.append(source_sha(getattr(wrapped, "inner", wrapped)))
    noise = {"evaluation_noise_seed": detector.evaluation_noise_seed()} if is_randomised(detector) else {}
    return canonical_key({"model": model_hash, "detector": name, "backend": backend, "params": dict(params),
                          "code": code, "fit": dict(fit_identity), **noise,
                          "seed": int(seed), "batch_size": int(batch_size), "versions": library_versions()})


def _pass_key(kind: str, data: str, identity: Mapping[str, Any], model_hash: str, model: Any, batch_size: int) -> str:
    """The key of one network pass's outputs over ``identity``'s images (stored under ``data``)."""
    return canonical_key({"kind": kind, "model": model_hash, "code": [source_sha(model), machinery_sha()],
                          data: dict(identity), "batch_size": int(batch_size), "versions": library_versions()})


def fit_pass_key(*, model_hash: str, model: Any, fit_identity: Mapping[str, Any], batch_size: int) -> str:
    """The key of the fit pass's outputs: the model's weights and class source, the fit rows (their identity
    records the seeded order), the batch size, the detector machinery's source and the library versions."""
    return _pass_key("fit-pass", "fit", fit_identity, model_hash, model, batch_size)


def set_pass_key(*, model_hash: str, model: Any, identity: Mapping[str, Any], batch_size: int) -> str:
    """The key of a scored set's shared-pass outputs (logits and features): as :func:`fit_pass_key`, with the
    set's identity (:func:`set_key`'s) in place of the fit rows."""
    return _pass_key("set-pass", "set", identity, model_hash, model, batch_size)


def set_key(identity: Mapping[str, Any]) -> str:
    """The key of a set of images from its identity (a dataset's, or an adversarial set's key and view)."""
    return canonical_key(dict(identity))[:32]


class ScoreCache:
    """Score vectors under ``root``: :meth:`load` returns None for a missing or corrupt entry. Opening the cache
    removes the temporary files a killed writer left (:func:`advopenood.io.sweep_temp_files`: ours only, older than
    any running writer's)."""

    def __init__(self, root: Path):
        self.root = aio.os_path(root)
        aio.sweep_temp_files(self.root, depth=2)

    def path(self, name: str, det_key: str, identity: Mapping[str, Any]) -> Path:
        return self.root / f"{name}-{det_key[:24]}" / f"{set_key(identity)}.npy"

    def load(self, name: str, det_key: str, identity: Mapping[str, Any]) -> np.ndarray | None:
        data = aio.read_checked(self.path(name, det_key, identity), "score file")
        return None if data is None else np.load(io.BytesIO(data))

    def save(self, name: str, det_key: str, identity: Mapping[str, Any], scores: np.ndarray) -> None:
        buf = io.BytesIO()
        np.save(buf, np.asarray(scores, dtype=np.float64))
        aio.write_checked(self.path(name, det_key, identity), buf.getvalue())

    def _fit_path(self, kind: str, key: str) -> Path:
        return self.root / "_fit" / f"{kind}-{key[:32]}.pt"

    def load_tensors(self, kind: str, key: str) -> dict[str, torch.Tensor] | None:
        """A dict of tensors saved by :meth:`save_tensors` (``kind``: ``fitpass``, ``setpass`` or
        ``state-<detector>``), or None when missing or corrupt."""
        data = aio.read_checked(self._fit_path(kind, key), "fit file")
        return None if data is None else torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)

    def save_tensors(self, kind: str, key: str, tensors: Mapping[str, torch.Tensor]) -> None:
        """Save tensors atomically, the checksum sidecar last (a crash in between leaves an entry that reads as missing)."""
        buf = io.BytesIO()
        torch.save({k: v.detach().cpu() for k, v in tensors.items()}, buf)
        aio.write_checked(self._fit_path(kind, key), buf.getvalue())

    def _part_dir(self, run_key: str) -> Path:
        return self.root / "_parts" / run_key[:32]

    def save_part(self, run_key: str, rank: int, obj: Mapping[str, Any]) -> None:
        """One rank's share of a sharded stage, atomically: plain data (dicts and lists of tensors, numbers and
        strings), which :meth:`load_parts` reads with ``weights_only=True``: no file of the store is unpickled."""
        buf = io.BytesIO()
        torch.save(dict(obj), buf)
        aio.atomic_write(self._part_dir(run_key) / f"rank{rank}.pt", lambda f: f.write(buf.getvalue()))

    def load_parts(self, run_key: str, world_size: int) -> list[dict[str, Any]]:
        """Every rank's share, in rank order (call after a barrier)."""
        return [torch.load(self._part_dir(run_key) / f"rank{r}.pt", map_location="cpu", weights_only=True)
                for r in range(world_size)]

    def drop_parts(self, run_key: str) -> None:
        shutil.rmtree(self._part_dir(run_key), ignore_errors=True)
