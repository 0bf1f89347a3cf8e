"""The output folder's commit, step by step (:func:`advopenood.io.commit_output`, which states the output
invariant): what a path holds (links never followed, files by SHA-256), the kept name of what is in the way, and
the swap itself, renames and ``mkdir`` calls that are undone in reverse order when one fails."""
from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

from advopenood.errors import STORAGE_ERRNOS, StorageError


class CommitError(StorageError):
    """A commit that could not complete (a read-only subfolder, a full disk, any failed rename or ``mkdir``). It
    was undone, so the output folder holds the previous outputs as they were; the message is one line (exit 3)."""


def sha256_file(path: Path) -> str:
    """The SHA-256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def parents(rel: str) -> list[str]:
    """The folders above ``rel`` below its root, outermost first: ``a/b/c`` -> ``a``, ``a/b``."""
    parts = rel.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def lstat(path: Path) -> os.stat_result | None:
    """``os.lstat`` (a link is not followed); None when nothing is there (or a folder above is not one)."""
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def entry(out: Path, rel: str) -> os.stat_result | None:
    """``os.lstat`` of ``out / rel`` when every folder above it below ``out`` is a real folder (no link); None when
    it is missing, reached through a link or a non-folder, or cannot be looked at."""
    try:
        for parent in parents(rel):
            if not stat.S_ISDIR(os.lstat(out / parent).st_mode):
                return None
        return os.lstat(out / rel)
    except OSError:
        return None


def unchanged(out: Path, rel: str, digest: str) -> bool:
    """``out / rel`` is still the file a run wrote: a regular file reached through no link, of SHA-256 ``digest``.
    Only such files are ever removed or replaced."""
    st = entry(out, rel)
    if st is None or not stat.S_ISREG(st.st_mode):
        return False
    try:
        return sha256_file(out / rel) == digest
    except OSError:
        return False


def emptied(out: Path, rel: str, ours_folders: set[str]) -> bool:
    """The folder ``out / rel`` held only the previous run's files (now moved away): it and every folder below it
    are folders the previous run wrote into, and nothing but folders is left. A user's own folder is never one."""
    if rel not in ours_folders:
        return False
    for item in os.scandir(out / rel):
        if not item.is_dir(follow_symlinks=False) or not emptied(out, f"{rel}/{item.name}", ours_folders):
            return False
    return True


#: the tag of a kept name by what the thing in the way is (a regular file's is its digest)
KEPT_TAGS = {stat.S_IFDIR: "folder", stat.S_IFLNK: "link", stat.S_IFIFO: "fifo"}


def kept_name(out: Path, rel: str, st: os.stat_result, planned: set[str]) -> str:
    """A name beside ``rel`` that nothing has, nor will have in this commit (``planned``): ``<name>.kept-<8 hex
    digits of its SHA-256>`` for a file, ``<name>.kept-folder``, ``-link``, ``-fifo`` or ``-other`` for anything
    else, with ``-2``, ``-3``, ... added where that name is taken (an earlier kept copy is never replaced)."""
    tag = KEPT_TAGS.get(stat.S_IFMT(st.st_mode), "other")
    if stat.S_ISREG(st.st_mode):
        try:
            tag = sha256_file(out / rel)[:8]
        except OSError:  # unreadable: kept all the same, under a name that needs no reading
            tag = "file"
    base = f"{rel}.kept-{tag}"
    candidate, n = base, 1
    while candidate in planned or os.path.lexists(out / candidate):
        n += 1
        candidate = f"{base}-{n}"
    return candidate


class Swap:
    """The commit's steps in ``out``, each a rename or a ``mkdir``, recorded so that :meth:`undo` reverses them.
    The previous run's files are moved, numbered, into ``.<out>.replaced-<random>`` beside ``out`` (the staging
    folder's file system), which only :meth:`finish` deletes."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.trash: Path | None = None
        self.done: list[tuple[Path | None, Path]] = []  # (from, to) of each rename; (None, folder) of each mkdir

    def swap_in(self, stage: Path, files: list[str], ours: set[str]) -> dict[str, str]:
        """Put ``stage``'s ``files`` in place: first the previous run's unchanged files (``ours``) that no new file
        replaces go, then, parents first, each folder the new files need and each new file, what is in the way
        renamed to its :func:`kept_name` (a folder that held only ``ours`` goes instead), then the folders the
        removed files left empty. Returns what was renamed (path -> kept path)."""
        ours_folders = {parent for rel in ours for parent in parents(rel)}
        needed = {parent for rel in files for parent in parents(rel)}
        planned, removed, moved = needed | set(files), sorted(ours - set(files)), {}
        for rel in removed:
            self.discard(self.out / rel)
        for rel in sorted(planned, key=lambda r: (r.count("/"), r)):  # a folder before what goes in it
            path, st = self.out / rel, lstat(self.out / rel)
            if rel in needed:
                if st is None or not stat.S_ISDIR(st.st_mode):
                    if st is not None:
                        moved[rel] = self.set_aside(rel, st, planned)
                    self.mkdir(path)
            elif rel in ours:
                self.replace(stage / rel, path)
            else:
                if st is not None and stat.S_ISDIR(st.st_mode) and emptied(self.out, rel, ours_folders):
                    self.discard(path)
                elif st is not None:
                    moved[rel] = self.set_aside(rel, st, planned)
                self.move(stage / rel, path)
        for rel in sorted({p for r in removed for p in parents(r)} - needed, key=lambda r: -r.count("/")):
            st = lstat(self.out / rel)  # deepest first: a parent may empty in turn
            if st is not None and stat.S_ISDIR(st.st_mode) and not os.listdir(self.out / rel):
                self.discard(self.out / rel)
        return moved

    def _spare(self) -> Path:
        if self.trash is None:
            self.trash = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.replaced-", dir=self.out.parent))
        return self.trash / str(len(self.done))

    def move(self, src: Path, dst: Path) -> None:
        os.replace(src, dst)
        self.done.append((src, dst))

    def mkdir(self, path: Path) -> None:
        os.mkdir(path)
        self.done.append((None, path))

    def discard(self, path: Path) -> None:
        """Move a file or folder of the previous run's out of the way."""
        self.move(path, self._spare())

    def set_aside(self, rel: str, st: os.stat_result, planned: set[str]) -> str:
        """Rename what is in the way at ``rel`` (not the previous run's) to its :func:`kept_name`; that name."""
        aside = kept_name(self.out, rel, st, planned)
        self.move(self.out / rel, self.out / aside)
        return aside

    def replace(self, new: Path, old: Path) -> None:
        """Put ``new`` in the place of the previous run's file ``old``: one ``os.replace`` after a hard link to
        ``old`` is kept for the undo; where the file system has no hard links, ``old`` is moved away first."""
        spare = self._spare()
        try:
            os.link(old, spare, follow_symlinks=False)
        except OSError:
            self.discard(old)
        else:
            self.done.append((old, spare))  # undone as a rename back, like a moved file
        self.move(new, old)

    def undo(self) -> list[str]:
        """Reverse every step done, last first; the paths whose step could not be reversed. The folder of the
        previous run's files moved away is removed only when every step was reversed."""
        failed = []
        for src, dst in reversed(self.done):
            try:
                if src is None:
                    os.rmdir(dst)
                else:
                    os.replace(dst, src)
            except OSError as exc:
                failed.append(f"{str(src or dst)!r} ({exc.strerror or type(exc).__name__})")
        self.done.clear()
        if not failed:
            self.finish()
        return failed

    def finish(self) -> None:
        """Delete the previous run's files moved away (after the commit, or an undo that put everything back)."""
        if self.trash is not None:
            shutil.rmtree(self.trash, ignore_errors=True)
            self.trash = None


def commit_error(out: Path, exc: OSError, swap: Swap) -> CommitError:
    """The commit stopped at ``exc``: undo its steps; the one line that says where it stopped and what is left."""
    trash = swap.trash
    failed = swap.undo()
    what = STORAGE_ERRNOS.get(exc.errno or 0) or exc.strerror or type(exc).__name__
    code = f" ({errno.errorcode[exc.errno]})" if exc.errno in errno.errorcode else ""
    at = f" at {exc.filename!r}" if exc.filename else ""
    head = f"output folder {str(out)!r}: the commit stopped: {what}{code}{at}"
    if failed:
        where = f"; the previous run's files it moved away are in {str(trash)!r}" if trash is not None else ""
        return CommitError(f"{head}; undoing it failed for {len(failed)} path(s) (first: {failed[0]}), so the "
                           f"folder may mix two runs' files{where}; nothing was deleted")
    advice = COMMIT_ADVICE.get(exc.errno or 0, "fix the cause")
    return CommitError(f"{head}; it was undone: the previous outputs are as they were and nothing of this run was "
                       f"committed (the store keeps every finished shard); {advice} and run the same command again")


#: what to do about a commit that stopped, by its errno (the rest: "fix the cause")
COMMIT_ADVICE = {errno.ENOSPC: "free space", errno.EDQUOT: "free space (or raise the quota)",
                 errno.EROFS: "make the folder writable", errno.EACCES: "make the folder writable",
                 errno.EPERM: "make the folder writable",
                 errno.EXDEV: "keep the output folder on one file system (a mount inside it cannot take a rename)"}
