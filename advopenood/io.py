"""Atomic writes: every file appears whole or not at all (temporary file in the same folder + ``os.replace``)."""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import stat
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, IO

import numpy as np
import pandas as pd


def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return (stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IWGRP | stat.S_IROTH | stat.S_IWOTH) & ~mask


_DEFAULT_MODE = _umask_mode()


def atomic_write(path: Path, writer: Callable[[IO[bytes]], None]) -> None:
    """Call ``writer`` on a temporary file beside ``path``, fsync it, then rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            writer(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _DEFAULT_MODE)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode()))


def read_checked(path: Path, what: str) -> bytes | None:
    """The bytes of ``path`` when its ``.sha256`` sidecar matches; None when either is missing, and None with a
    warning when they disagree (the caller recomputes the entry)."""
    sidecar = path.with_name(path.name + ".sha256")
    if not path.is_file() or not sidecar.is_file():
        return None
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != sidecar.read_text().strip():
        warnings.warn(f"advopenood: {what} {path} does not match its checksum; recomputing it", stacklevel=3)
        return None
    return data


def write_checked(path: Path, data: bytes) -> None:
    """Write ``data`` atomically, then its checksum sidecar (a crash in between leaves an entry that reads as
    missing)."""
    atomic_write(path, lambda f: f.write(data))
    write_text(path.with_name(path.name + ".sha256"), hashlib.sha256(data).hexdigest() + "\n")


def write_json(path: Path, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_jsonable) + "\n")


def write_csv(path: Path, df: pd.DataFrame) -> None:
    write_text(path, df.to_csv(index=False, float_format="%.6g"))


def write_table(path: Path, df: pd.DataFrame) -> None:
    """Write a table by suffix: ``.csv``, ``.md`` (pipe table), ``.parquet`` or ``.json``."""
    path = Path(path)
    if path.suffix == ".md":
        write_text(path, markdown_table(df))
    elif path.suffix == ".parquet":
        atomic_write(path, lambda f: df.to_parquet(f, index=False))
    elif path.suffix == ".json":
        write_text(path, df.to_json(orient="records", indent=2))
    else:
        write_csv(path, df)


def save_figure(fig, path: Path, dpi: int = 120) -> None:
    """Save a matplotlib figure atomically as PNG and close it."""
    import matplotlib.pyplot as plt

    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=dpi, bbox_inches="tight"))
    plt.close(fig)


def markdown_table(df: pd.DataFrame, floatfmt: str = "{:.2f}") -> str:
    """A GitHub pipe table of ``df`` (floats to two decimals, NaN as an empty cell)."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "" if v != v else floatfmt.format(v)
        return str(v).replace("|", "\\|")

    cols = [str(c) if not isinstance(c, tuple) else " ".join(map(str, c)) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return dict(obj)
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)


MANIFEST = "manifest.json"


def staging_dir(out: Path) -> Path:
    """The folder a run writes into before its files replace the previous run's: ``.<out>.partial`` beside it."""
    out = Path(out)
    return out.parent / f".{out.name}.partial"


def begin_output(out: Path) -> Path:
    """A fresh, empty staging folder for ``out`` (a stale one of an interrupted run is removed first)."""
    stage = staging_dir(out)
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    return stage


def files_under(folder: Path) -> list[str]:
    """Relative posix paths of every file below ``folder``, sorted."""
    return sorted(p.relative_to(folder).as_posix() for p in Path(folder).rglob("*") if p.is_file())


def discard_output(stage: Path) -> None:
    """Remove a staging folder (a failed run's); the previous run's files in the output folder stay."""
    shutil.rmtree(stage, ignore_errors=True)


def commit_output(stage: Path, out: Path) -> list[str]:
    """Move a finished run's files from ``stage`` into ``out``; returns their relative paths.

    First the files that the previous run's ``manifest.json`` lists are removed (and folders they leave
    empty), then each new file is moved in with ``os.replace``, and ``manifest.json`` (this run's file list
    and their SHA-256) is written last. Files advopenood did not write (allowed with ``--overwrite``) stay.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    old = out / MANIFEST
    if old.is_file():
        for rel in json.loads(old.read_text()).get("files", {}):
            target = out / rel
            target.unlink(missing_ok=True)
            for parent in target.parents:
                if parent == out or not parent.is_dir() or any(parent.iterdir()):
                    break
                parent.rmdir()
    files = files_under(stage)
    digests = {}
    for rel in files:
        src, dst = stage / rel, out / rel
        digests[rel] = hashlib.sha256(src.read_bytes()).hexdigest()
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dst)
    write_json(old, {"files": digests})
    shutil.rmtree(stage, ignore_errors=True)
    return files


def write_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """``np.savez`` (uncompressed) written atomically."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    data = buf.getvalue()
    atomic_write(path, lambda f: f.write(data))
