"""Atomic writes: every file appears whole or not at all (temporary file in the same folder + ``os.replace``); the
output folder's commit (:func:`commit_output`), which keeps the output invariant: a run removes or replaces only
the files it wrote that are unchanged, and a commit is all or nothing."""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import stat
import tempfile
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable

import numpy as np

from advopenood import deprecated
from advopenood.errors import UsageError
# advopenood.io.CommitError and advopenood.io.sha256_file are these
from advopenood.swap import CommitError, Swap, commit_error, entry, lstat, sha256_file, unchanged

if TYPE_CHECKING:  # pandas loads where a table is written, not where a config is checked
    import pandas as pd


def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return (stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IWGRP | stat.S_IROTH | stat.S_IWOTH) & ~mask


_DEFAULT_MODE = _umask_mode()


def _synced_temp(path: Path, writer: Callable[[IO[bytes]], None]) -> Path:
    """``writer`` on a temporary file beside ``path`` (``.<name>.<random>.tmp``, :data:`TEMP_NAME`), flushed and
    synced; its path. It is removed when anything fails, and an OSError without a file name (a ``write`` on a full
    disk) is raised with ``path`` as its file name, so that the message says where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            writer(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _DEFAULT_MODE)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        if exc.errno is not None and exc.filename is None:
            raise OSError(exc.errno, exc.strerror or os.strerror(exc.errno), str(path)) from exc
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def atomic_write(path: Path, writer: Callable[[IO[bytes]], None]) -> None:
    """Call ``writer`` on a synced temporary file beside ``path`` (:func:`_synced_temp`), then rename it over
    ``path``: the file appears whole or not at all."""
    path = Path(path)
    tmp = _synced_temp(path, writer)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


#: the name of :func:`atomic_write`'s temporary file: ``.<name>.<8 characters of tempfile's alphabet>.tmp``
TEMP_NAME = re.compile(r"\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp")
#: a temporary file older than this (seconds since its last write) is no writer's any more: a writer's file is
#: written in one go from bytes in memory, so its mtime is at most seconds old while it is held
STALE_TEMP_SECONDS = 3600.0


def sweep_temp_files(folder: Path, *, older_than: float = STALE_TEMP_SECONDS, depth: int = 2,
                     only: str | None = None) -> list[Path]:
    """Remove the temporary files that an interrupted :func:`atomic_write` (kill -9, power loss) left in
    ``folder`` and its subfolders down to ``depth``; returns them.

    Only regular files named as ours (:data:`TEMP_NAME`; with ``only``, temporary files of that one name) whose
    last write is more than ``older_than`` seconds ago are removed; ``older_than=0`` is for a caller that holds
    the lock every writer of the folder takes. Links are never followed or removed."""
    removed: list[Path] = []
    folder = Path(folder)
    if depth < 0 or folder.is_symlink() or not folder.is_dir():
        return removed
    now = time.time()
    try:
        entries = list(os.scandir(folder))
    except OSError:  # unreadable: nothing of ours to find there (the preflight checks the folders a run writes)
        return removed
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            removed += sweep_temp_files(entry.path, older_than=older_than, depth=depth - 1, only=only)
            continue
        m = TEMP_NAME.fullmatch(entry.name)
        if m is None or (only is not None and m["name"] != only) or not entry.is_file(follow_symlinks=False):
            continue
        with contextlib.suppress(FileNotFoundError):
            if now - entry.stat(follow_symlinks=False).st_mtime >= older_than:
                os.unlink(entry.path)
                removed.append(Path(entry.path))
    return removed


def os_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as the operating system spells it. Text that the file-system encoding cannot encode (a UTF-8
    name from a config file, read as UTF-8, under the C locale without Python's UTF-8 mode) stands for its UTF-8
    bytes, the name such a file has on disk; anything else is returned as it is."""
    text = os.fspath(path)
    try:
        os.fsencode(text)
    except UnicodeEncodeError:
        return Path(os.fsdecode(text.encode("utf-8", "surrogateescape")))
    return Path(text)


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
    """``df`` as CSV, numbers to 6 significant digits; a column of numbers held as objects (a concatenation with
    an empty frame) is written as numbers too, so that one number reads the same in every table."""
    write_text(path, df.infer_objects().to_csv(index=False, float_format="%.6g"))


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
    (the unmarked ``{"files": {path: sha256}}`` of earlier versions included: anyone can write that shape), or
    listing a path that is absolute, climbs with ``..`` or is otherwise not a plain relative path."""
    path = Path(out) / MANIFEST
    if not path.exists() and not path.is_symlink():
        return None
    if path.is_symlink() or not path.is_file():
        raise OutputError(f"{str(path)!r} is not a regular file advopenood wrote")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise OutputError(f"{str(path)!r} is not readable JSON ({type(exc).__name__})") from None
    if isinstance(doc, dict) and set(doc) == {"files"}:
        raise OutputError(f"{str(path)!r} was not written by advopenood (no {MANIFEST_MARK!r} mark: an earlier "
                          "version's or another tool's {'files': ...}), so the files it lists are not deleted")
    if not isinstance(doc, dict) or doc.get(MANIFEST_MARK) != 1:
        raise OutputError(f"{str(path)!r} was not written by advopenood (no {MANIFEST_MARK!r} mark)")
    files = doc.get("files")
    if not isinstance(files, dict) or not all(isinstance(v, str) and len(v) == 64 for v in files.values()):
        raise OutputError(f"{str(path)!r} is malformed ('files' is not a map of paths to SHA-256 digests)")
    bad = next((rel for rel in files if not safe_relpath(rel)), None)
    if bad is not None:
        raise OutputError(f"{str(path)!r} lists {bad!r}, which is not a plain relative path inside the folder")
    return files


def changed_files(out: Path, listed: Mapping[str, str] | None = None) -> list[str]:
    """The paths of ``out``'s manifest (or ``listed``) that hold something other than the file the run wrote: a
    regular file whose SHA-256 differs from the manifest's (edited since), or a folder, FIFO or other non-file put
    in its place (replaced). A run never removes them. A path that is missing, a link, or reached through a link
    or a non-folder is not one (:func:`check_output_folder` refuses links)."""
    out = Path(out)
    listed = read_manifest(out) if listed is None else listed
    changed = []
    for rel, digest in (listed or {}).items():
        st = entry(out, rel)
        if st is not None and not stat.S_ISLNK(st.st_mode) and not unchanged(out, rel, digest):
            changed.append(rel)
    return sorted(changed)


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


def resolve_output(out: Path) -> Path:
    """The real path of the output folder ``out``: every symbolic link in it followed (a link to a folder is
    fine), so that two names of one folder are one folder (one lock, one staging place beside the real folder).
    Raises :class:`OutputError` when a link in the path leads nowhere (dangling, or a loop), or ``out`` is a link
    to something that is not a folder."""
    out = os_path(Path(out).expanduser())
    for part in [out, *out.parents]:
        if part.is_symlink() and not part.exists():
            raise OutputError(f"output folder {str(out)!r}: {str(part)!r} is a symbolic link to "
                              f"{os.readlink(part)!r}, which does not exist (or loops); valid choices: create the "
                              "folder it points to, or pass a real folder as --out")
    if out.is_symlink() and not out.is_dir():
        raise OutputError(f"output folder {str(out)!r} is a symbolic link to {os.readlink(out)!r}, which is not a "
                          "folder; valid choices: a folder, or a link to one")
    return Path(os.path.realpath(out))


class OutputLock:
    """An exclusive lock on an output folder for the whole run: ``.<out>.lock`` beside it, held with ``flock``
    (released by the kernel if the process dies). A second run on the same folder is refused at once. The lock is
    taken on the folder's real path (:func:`resolve_output`), so a run through a symbolic link and a run through
    the folder's own name share it."""

    def __init__(self, out: Path) -> None:
        out = resolve_output(out)
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


def staging_dirs(out: Path) -> list[Path]:
    """Every staging folder of ``out`` that exists (a running run's, or ones interrupted runs left)."""
    out = Path(out)
    return sorted(p for p in out.parent.glob(staging_prefix(out) + "*") if p.is_dir() and not p.is_symlink())


def __getattr__(name: str) -> Any:
    """``staging_dir`` (removed in 0.3.0: a run stages in one folder per process) fails naming
    :func:`staging_dirs`."""
    raise deprecated.removed(__name__, name)


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


def commit_output(stage: Path, out: Path, kept: dict[str, str] | None = None) -> list[str]:
    """Move a finished run's files from ``stage`` into ``out``; returns their relative paths.

    The output invariant (docs/concepts.md, "Output files"): a run removes or replaces only the files that the
    previous run's ``manifest.json`` (ours: :func:`read_manifest`) lists and that are still what it wrote: regular
    files reached through no symbolic link, with the SHA-256 listed (:func:`advopenood.swap.unchanged`); the one
    other file it removes is an interrupted commit's ``.manifest.json.<random>.tmp``. Everything else in ``out`` (a
    file changed since, a file, folder, link or FIFO advopenood did not write, an earlier ``.kept-*`` copy) stays
    byte-identical where it is or, where it is in the way of a new file or of a folder the new files need, is
    renamed in its folder to a name nothing has (:func:`advopenood.swap.kept_name`: an existing kept copy is never
    replaced) and recorded in ``kept`` (path -> kept path), which the CLI prints on stderr. Folders that the
    removed files leave empty go too (never a folder of the user's that the previous run did not write into).

    All or nothing: this run's ``manifest.json`` is written first to a temporary file (the one write that needs
    space), then every step is a rename or a ``mkdir`` (:class:`advopenood.swap.Swap`): the previous run's files
    are moved into ``.<out>.replaced-<random>`` beside ``out``, not deleted; a file whose new namesake replaces it
    is kept there as a hard link, so that one ``os.replace`` swaps the two where the file system has hard links;
    the manifest is renamed into place last. When any step fails, the steps done are undone in reverse order and
    :class:`CommitError` is raised (one line, exit 3): the folder is as it was. Only a finished commit deletes
    anything: the previous run's files moved away, and the staging folder.
    """
    stage, out = Path(stage), Path(out)
    files = files_under(stage)
    listed = read_manifest(out) if out.is_dir() else None
    swap = Swap(out)
    manifest: Path | None = None
    try:
        if lstat(out) is None:
            swap.mkdir(out)
        sweep_temp_files(out, older_than=0, depth=0, only=MANIFEST)  # an interrupted commit's; we hold the lock
        manifest = _prepared(out / MANIFEST, {MANIFEST_MARK: 1,
                                              "files": {rel: sha256_file(stage / rel) for rel in files}})
        ours = {rel for rel, digest in (listed or {}).items() if unchanged(out, rel, digest)}
        moved = swap.swap_in(stage, files, ours)
        os.replace(manifest, out / MANIFEST)  # the commit: nothing after it can fail
    except OSError as exc:
        raise commit_error(out, exc, swap) from exc
    finally:
        if manifest is not None:
            manifest.unlink(missing_ok=True)
    if kept is not None:
        kept.update(moved)
    swap.finish()
    shutil.rmtree(stage, ignore_errors=True)
    return files


def _prepared(path: Path, doc: Any) -> Path:
    """``doc`` as JSON in a synced temporary file beside ``path`` (named as :func:`atomic_write`'s), to be renamed
    over ``path`` later: the write that needs space, done before anything it replaces is moved."""
    data = (json.dumps(doc, indent=2, sort_keys=True, default=_jsonable) + "\n").encode()
    return _synced_temp(path, lambda f: f.write(data))


def write_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """``np.savez`` (uncompressed) written atomically."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    data = buf.getvalue()
    atomic_write(path, lambda f: f.write(data))
