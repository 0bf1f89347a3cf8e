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
from typing import IO, Any, Callable

import numpy as np
import pandas as pd

from advopenood.errors import UsageError


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


def save_figure(fig, path: Path, dpi: int = 120, colors: int = 256) -> None:
    """Save a matplotlib figure atomically as PNG and close it. The PNG holds a palette of ``colors`` colours
    (Pillow's median cut): plots and colour maps look the same at about a third of the bytes, which keeps
    ``report.html`` (plots inline) small."""
    import matplotlib.pyplot as plt
    from PIL import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    image = Image.open(buffer).convert("RGB").quantize(colors, method=Image.Quantize.MEDIANCUT)
    atomic_write(path, lambda f: image.save(f, format="PNG", optimize=True))


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
MANIFEST_MARK = "advopenood_manifest"
"""The key that marks a ``manifest.json`` as one advopenood wrote (its value: the format version)."""


class OutputError(UsageError):
    """The output folder cannot be used safely: a foreign or malformed manifest, a symbolic link inside it, or
    another run holding it. The message is one line; the preflight turns it into a UsageError (exit 2)."""


def safe_relpath(rel: object) -> bool:
    """``rel`` is a plain relative POSIX path below its folder: non-empty, not absolute, no ``..``, ``.`` or empty
    part, no backslash, drive or NUL. Only such paths are ever read from a manifest."""
    if not isinstance(rel, str) or not rel or "\\" in rel or "\0" in rel or rel.startswith("/"):
        return False
    if len(rel) > 1 and rel[1] == ":":  # a Windows drive
        return False
    return all(part not in ("", ".", "..") for part in rel.split("/"))


def read_manifest(out: Path) -> dict[str, str] | None:
    """The file list (relative path -> SHA-256) of the manifest in ``out``; None when there is none.

    Raises :class:`OutputError` when ``manifest.json`` is not ours: unreadable, not a JSON object with our mark
    (or the unmarked ``{"files": {path: sha256}}`` of earlier versions), or listing a path that is absolute,
    climbs with ``..`` or is otherwise not a plain relative path."""
    path = Path(out) / MANIFEST
    if not path.exists() and not path.is_symlink():
        return None
    if path.is_symlink() or not path.is_file():
        raise OutputError(f"{str(path)!r} is not a regular file advopenood wrote")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise OutputError(f"{str(path)!r} is not readable JSON ({type(exc).__name__})") from None
    legacy = isinstance(doc, dict) and set(doc) == {"files"}
    if not isinstance(doc, dict) or not (legacy or doc.get(MANIFEST_MARK) == 1):
        raise OutputError(f"{str(path)!r} was not written by advopenood (no {MANIFEST_MARK!r} mark)")
    files = doc.get("files")
    if not isinstance(files, dict) or not all(isinstance(v, str) and len(v) == 64 for v in files.values()):
        raise OutputError(f"{str(path)!r} is malformed ('files' is not a map of paths to SHA-256 digests)")
    bad = next((rel for rel in files if not safe_relpath(rel)), None)
    if bad is not None:
        raise OutputError(f"{str(path)!r} lists {bad!r}, which is not a plain relative path inside the folder")
    return files


def symlinks_under(folder: Path) -> list[str]:
    """Relative paths of the symbolic links below ``folder`` (links are listed, never followed)."""
    found = []
    for root, dirs, files in os.walk(folder, followlinks=False):
        for name in dirs + files:
            p = Path(root) / name
            if p.is_symlink():
                found.append(p.relative_to(folder).as_posix())
    return sorted(found)


def check_output_folder(out: Path) -> None:
    """Raise :class:`OutputError` unless ``out`` is safe to commit into: no symbolic link below it (advopenood
    never writes or deletes through one) and no manifest that is not ours."""
    out = Path(out)
    if not out.is_dir():
        return
    links = symlinks_under(out)
    if links:
        raise OutputError(f"output folder {str(out)!r} holds a symbolic link {links[0]!r}; advopenood never "
                          "writes or deletes through links in its output folder")
    read_manifest(out)


def _inside(out: Path, rel: str) -> Path | None:
    """``out / rel`` when no part of it below ``out`` is a symbolic link and its real path lies inside ``out``."""
    target, root = out, os.path.realpath(out)
    for part in rel.split("/"):
        target = target / part
        if target.is_symlink():
            return None
    real = os.path.realpath(target)
    return target if real.startswith(root + os.sep) else None


class OutputLock:
    """An exclusive lock on an output folder for the whole run: ``.<out>.lock`` beside it, held with ``flock``
    (released by the kernel if the process dies). A second run on the same folder is refused at once."""

    def __init__(self, out: Path) -> None:
        out = Path(out)
        self.path = out.parent / f".{out.name}.lock"
        self.fd: int | None = None

    def __enter__(self) -> "OutputLock":
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise OutputError(f"output folder {str(self.path.parent / self.path.name[1:-5])!r} is in use by "
                                  f"another advopenood run (pid {holder}); wait for it to finish or choose another "
                                  "--out") from None
            try:  # the file we locked must still be the one at the path (a releasing run unlinks it)
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.write(fd, str(os.getpid()).encode())
                self.fd = fd
                return self
            os.close(fd)

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self.fd)
            self.fd = None


def staging_prefix(out: Path) -> str:
    """The name prefix of ``out``'s staging folders: ``.<out>.partial``."""
    return f".{Path(out).name}.partial"


def staging_dir(out: Path) -> Path:
    """Deprecated: a run no longer has one staging folder (each process stages in its own, see
    :func:`begin_output`). Returns ``.<out>.partial`` beside ``out``, the prefix of every staging folder's path;
    use :func:`staging_dirs` for the folders that exist."""
    warnings.warn("advopenood.io.staging_dir is deprecated: each run stages in its own folder; use "
                  "advopenood.io.staging_dirs(out)", DeprecationWarning, stacklevel=2)
    return Path(out).parent / staging_prefix(out)


def staging_dirs(out: Path) -> list[Path]:
    """Every staging folder of ``out`` that exists (a running run's, or ones interrupted runs left)."""
    out = Path(out)
    return sorted(p for p in out.parent.glob(staging_prefix(out) + "*") if p.is_dir() and not p.is_symlink())


def begin_output(out: Path) -> Path:
    """A fresh staging folder of this process for ``out``, ``.<out>.partial-<pid>-<random>`` beside it. Called
    under :class:`OutputLock`, so other staging folders of ``out`` are interrupted runs' and are removed first."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in staging_dirs(out):
        shutil.rmtree(stale, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{staging_prefix(out)}-{os.getpid()}-", dir=out.parent))


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
    and their SHA-256) is written last. Only regular files whose real path lies inside ``out``, reached through
    no symbolic link, listed by a manifest that is ours (:func:`read_manifest`), are ever deleted; a new file
    whose path would pass through a link is refused (:class:`OutputError`). Files advopenood did not write
    (allowed with ``--overwrite``) stay.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = files_under(stage)
    blocked = next((rel for rel in files if _inside(out, rel) is None), None)
    if blocked is not None:
        raise OutputError(f"output folder {str(out)!r}: {blocked!r} would be written through a symbolic link")
    for rel in read_manifest(out) or {}:
        target = _inside(out, rel)
        if target is None or target.is_symlink() or not target.is_file():
            continue
        target.unlink()
        for parent in target.parents:
            if parent == out or not parent.is_dir() or parent.is_symlink() or any(parent.iterdir()):
                break
            parent.rmdir()
    digests = {}
    for rel in files:
        src, dst = stage / rel, out / rel
        digests[rel] = hashlib.sha256(src.read_bytes()).hexdigest()
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dst)
    write_json(out / MANIFEST, {MANIFEST_MARK: 1, "files": digests})
    shutil.rmtree(stage, ignore_errors=True)
    return files


def write_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """``np.savez`` (uncompressed) written atomically."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    data = buf.getvalue()
    atomic_write(path, lambda f: f.write(data))
