"""Bootstrap replicates in the store, like attacks and scores: a re-run that reads its scores back resamples nothing.

Each bootstrap request of :class:`advopenood.evaluation.intervals.IntervalPolicy` (one cell, or paired cells resampled
with the same draws) is stored as ``<cache>/intervals/<key>.npz`` with a SHA-256 sidecar, written by atomic rename
(:func:`advopenood.io.write_checked`). The key (:meth:`IntervalStore.key`) hashes everything that decides the
replicates: the cell key that seeds the draws, the method, the resample count, the run seed, the metrics, the
SHA-256 of every score array exactly as the kernel reads it (float64 bytes, in order), the source of the kernel
(``intervals.py``) and NumPy's version (its generator's stream). Any change of a score or a setting is another key:
nothing stale is read. A corrupt or malformed entry is said on stderr and recomputed, never served. The replicates
are stored rather than only their ``lo`` / ``hi``: a group mean's interval and a paired difference's are percentiles
of the replicates, so every interval of a re-run derives from the stored ones.
"""
from __future__ import annotations

import hashlib
import io
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from advopenood import io as aio
from advopenood.provenance import canonical_key

#: the folder under the run's cache (``plan.cache``)
FOLDER = "intervals"


def array_digest(values: np.ndarray) -> str:
    """SHA-256 of a score array as the kernel reads it: float64, flattened, its length and bytes."""
    flat = np.ascontiguousarray(np.asarray(values, dtype=np.float64).ravel())
    return hashlib.sha256(len(flat).to_bytes(8, "little") + flat.tobytes()).hexdigest()


def kernel_sha() -> str:
    """SHA-256 of the bootstrap kernel's source (``intervals.py`` beside this file), read as a file."""
    return hashlib.sha256((Path(__file__).parent / "intervals.py").read_bytes()).hexdigest()


@dataclass
class IntervalStore:
    """Replicates under ``root``; ``read`` / ``computed`` count this process's hits and misses (``run.json``'s
    ``interval_work``). Opening it removes the temporary files a killed writer left (ours only)."""

    root: Path
    read: int = 0
    computed: int = 0
    _salt: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        self.root = aio.os_path(self.root)
        aio.sweep_temp_files(self.root, depth=0)
        self._salt = canonical_key({"kernel": kernel_sha(), "numpy": np.__version__})

    def key(self, cell_key: str, method: str, resamples: int, seed: int, metrics: Sequence[str],
            cells: Iterable[tuple[np.ndarray, np.ndarray]]) -> str:
        """The entry's key (module docstring)."""
        scores = [[array_digest(conf_id), array_digest(conf_ood)] for conf_id, conf_ood in cells]
        return canonical_key({"cell": cell_key, "method": method, "resamples": int(resamples), "seed": int(seed),
                              "metrics": list(metrics), "scores": scores, "code": self._salt})

    def path(self, key: str) -> Path:
        return self.root / f"{key[:40]}.npz"

    def load(self, key: str, cells: int, metrics: Sequence[str], resamples: int
             ) -> list[dict[str, np.ndarray]] | None:
        """The stored replicates of ``cells`` cells (``{metric: (resamples,)}`` each), or None when missing, corrupt
        or not of that shape (said on stderr: the caller recomputes them)."""
        path = self.path(key)
        data = aio.read_checked(path, "interval file")
        if data is None:
            return None
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as npz:
                got = [{m: np.array(npz[f"{i}.{m}"], dtype=np.float64) for m in metrics} for i in range(cells)]
        except (KeyError, ValueError, OSError, zipfile.BadZipFile) as exc:
            return self._bad(path, f"unreadable ({exc})")
        if any(v.shape != (resamples,) for part in got for v in part.values()):
            return self._bad(path, "not of the run's resample count")
        self.read += 1
        return got

    def _bad(self, path: Path, why: str) -> None:
        print(f"advopenood: interval file {path} is {why}; recomputing it", file=sys.stderr)
        return None

    def save(self, key: str, replicates: list[dict[str, np.ndarray]]) -> None:
        """Store the replicates atomically, the checksum sidecar last."""
        buf = io.BytesIO()
        np.savez(buf, **{f"{i}.{m}": np.asarray(v, dtype=np.float64) for i, part in enumerate(replicates)
                         for m, v in part.items()})
        aio.write_checked(self.path(key), buf.getvalue())
        self.computed += 1

    @property
    def work(self) -> dict[str, int]:
        """``{"computed": ..., "read": ...}``: bootstrap requests resampled vs read back in this process."""
        return {"computed": self.computed, "read": self.read}
