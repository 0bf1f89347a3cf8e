"""The files of a run folder as ``advopenood verify`` reads them (:class:`RunFiles`), and the helpers its checks
share: reading a table, a text or an npz file the run wrote, and comparing re-derived rows with written ones.

Verify reads only what a run writes: a regular file, reached without a link, of at most :data:`MAX_FILE_BYTES`
(:func:`entry_problem`, checked with ``lstat`` before anything is opened, so that a FIFO never blocks and a
sparse file of gigabytes is never read). Anything else in the folder is a file finding
(:func:`advopenood.evaluation.verify.verify_files`, which lists the folder with :func:`walk`), and a check that
needs it finds it :class:`Unreadable`. ``run.json`` is the folder's record: one that is not a JSON object of the
shape a run writes (:func:`info_problem`) is refused in one line (a UsageError, exit 2).
"""
from __future__ import annotations

import json
import math
import os
import stat
import zipfile
import zlib
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from advopenood.claims import json_type
from advopenood.config.schema import MAX_RESAMPLES
from advopenood.errors import UsageError

if TYPE_CHECKING:  # pandas loads where a table is read: `advopenood verify` refuses a folder before it does
    import pandas as pd

#: the largest file of a run folder that verify reads or hashes (256 MiB): no file a run writes comes near it (its
#: largest, ``report.html`` with its plots inline or a score file of a large benchmark, hold a few MiB)
MAX_FILE_BYTES = 256 << 20
#: what a folder entry that is neither a regular file nor a folder is, by its ``lstat`` mode
_SPECIAL = ((stat.S_ISLNK, "a symbolic link (verify follows no link; a run writes none)"),
            (stat.S_ISFIFO, "a FIFO, not a regular file (not opened; a run writes none)"),
            (stat.S_ISSOCK, "a socket, not a regular file (not opened; a run writes none)"),
            (stat.S_ISCHR, "a device, not a regular file (not opened; a run writes none)"),
            (stat.S_ISBLK, "a device, not a regular file (not opened; a run writes none)"))
#: the fields of run.json that verify reads, and the JSON type each must have when present (null: absent)
_INFO_OBJECTS = ("protocol", "attacks", "data", "detector_backends", "detector_errors", "plugin_errors",
                 "evaluation_noise_seed", "nothing_computed", "timings_s", "sample", "model")
_INFO_LISTS = ("warnings", "notes", "plugin_overrides")
_CONFIG_NAMES = ("evaluators", "analyses", "detectors")


class Unreadable(Exception):
    """A file a check needs is missing, or holds no table or column it must hold: a finding of ``verify`` (exit 1),
    not a traceback. The message names the file."""


def _special(mode: int) -> str:
    """What an ``lstat`` mode that is no regular file or folder is ("" for those two)."""
    return next((what for test, what in _SPECIAL if test(mode)), "")


def entry_problem(root: Path, rel: str) -> str:
    """Why ``root/rel`` is not a file verify reads ("" when it is one): missing, a link on the way (checked part by
    part with ``lstat``, nothing is opened), a folder, a FIFO or another special file, or over
    :data:`MAX_FILE_BYTES`."""
    path, parts = Path(root), rel.split("/")
    for i, part in enumerate(parts):
        path = path / part
        try:
            mode = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return "missing"
        except OSError as exc:
            return f"cannot be read ({exc.strerror})"
        last = i == len(parts) - 1
        if stat.S_ISDIR(mode.st_mode):
            if last:
                return "a folder, not a file"
            continue
        if not last and not stat.S_ISLNK(mode.st_mode):
            return "missing"
        if _special(mode.st_mode):
            return ("" if last else f"under {'/'.join(parts[:i + 1])!r}, ") + _special(mode.st_mode)
        if mode.st_size > MAX_FILE_BYTES:
            return f"{mode.st_size} bytes, over the bound of {MAX_FILE_BYTES} bytes of a file a run writes (not read)"
    return ""


def is_folder(root: Path, rel: str) -> bool:
    """Whether ``root/rel`` is a folder reached without a link."""
    path = Path(root)
    for part in rel.split("/"):
        path = path / part
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                return False
        except OSError:
            return False
    return True


def walk(root: Path) -> tuple[dict[str, int], dict[str, str]]:
    """``(files, others)`` below ``root`` without following a link: each regular file's relative posix path and
    size, and what every other entry is (a link, a FIFO, a socket, a device: :func:`entry_problem`'s words); links
    and special files are listed, never opened or entered."""
    files: dict[str, int] = {}
    others: dict[str, str] = {}
    todo = [Path(root)]
    while todo:
        folder = todo.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError as exc:
            others[folder.relative_to(root).as_posix()] = f"a folder that cannot be listed ({exc.strerror})"
            continue
        for entry in entries:
            rel = Path(entry.path).relative_to(root).as_posix()
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISDIR(mode):
                todo.append(Path(entry.path))
            elif stat.S_ISREG(mode):
                files[rel] = entry.stat(follow_symlinks=False).st_size
            else:
                others[rel] = _special(mode)
    return dict(sorted(files.items())), dict(sorted(others.items()))


def info_problem(info: Any) -> str:
    """Why a parsed ``run.json`` is not one a run writes ("" when it is): not an object with a ``config`` object,
    or a field verify reads of another type (an object, a list, a name where another is expected: a name list of
    the config holding a list or an object, an attack set that is no object with its store ``path``)."""
    if not isinstance(info, dict) or not isinstance(info.get("config"), dict):
        return (f"holds {json_type(info)}, not the object with a 'config' object that a run writes (a folder of "
                "another tool, or an edited file)" if not isinstance(info, dict) else
                f"has 'config' {json_type(info.get('config'))}, not the object a run writes (a folder of another "
                "tool, or an edited file)")
    for key in _INFO_OBJECTS:
        if info.get(key) is not None and not isinstance(info[key], dict):
            return f"has {key!r} {json_type(info[key])}; valid: an object"
    for key in _INFO_LISTS:
        if info.get(key) is not None and not isinstance(info[key], list):
            return f"has {key!r} {json_type(info[key])}; valid: a list"
    config = info["config"]
    for key in _CONFIG_NAMES:
        names = config.get(key)
        if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
            bad = next((n for n in names if not isinstance(n, str)), names) if isinstance(names, list) else names
            return f"has config.{key} holding {json_type(bad)} where a name is expected; valid: a list of names"
    for key in ("ci", "evaluator_params", "analysis_params", "detector_params", "data"):
        if config.get(key) is not None and not isinstance(config[key], dict):
            return f"has config.{key} {json_type(config[key])}; valid: an object"
    for name, entry in (info.get("attacks") or {}).items():
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str) or \
                not isinstance(entry.get("shards", 0) or 0, int) or not isinstance(entry.get("source", "id"), str):
            return f"has attack set {name!r} {json_type(entry)} without its store path; valid: an object as a run " \
                   "writes it ('path': the set's folder, 'shards': a count, 'source': id or ood)"
    clean = info.get("clean_acc")
    if clean is not None and (isinstance(clean, bool) or not isinstance(clean, (int, float))):
        return f"has clean_acc {json_type(clean)}; valid: a number"
    return ""


@dataclass
class RunFiles:
    """The files of one run folder, read lazily. ``info`` is ``run.json``."""

    path: Path
    info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def open(cls, path: str | Path) -> RunFiles:
        """A run folder; a UsageError (exit 2, one line) when it is not one: no folder, no ``run.json`` that is a
        regular file verify reads, or one that is not the JSON object a run writes (:func:`info_problem`)."""
        folder = Path(path)
        info = folder / "run.json"
        if not folder.is_dir():
            raise UsageError(f"{str(folder)!r} does not exist; valid input: the --out of a run" if not folder.exists()
                             else f"{str(folder)!r} is not a folder; valid input: the --out of a run")
        problem = entry_problem(folder, "run.json")
        if problem == "missing":
            raise UsageError(f"{str(folder)!r} is not a run folder (no run.json); valid input: the --out of a run")
        if problem:
            raise UsageError(f"{str(info)!r} is {problem}; valid input: the --out of a run")
        try:
            data = json.loads(info.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise UsageError(f"{str(info)!r} is not readable JSON ({exc})") from None
        problem = info_problem(data)
        if problem:
            raise UsageError(f"{str(info)!r} {problem}; valid input: the --out of a run")
        run = cls(folder, data)
        run.check_resamples()
        return run

    def check_resamples(self) -> None:
        """A UsageError (exit 2) when ``run.json``'s ``ci.resamples`` is not an integer from 0 to
        :data:`~advopenood.config.schema.MAX_RESAMPLES`: no run writes one, and re-deriving it could not end."""
        ci = self.config.get("ci") or {}
        resamples = ci.get("resamples", 0) if isinstance(ci, dict) else None
        if isinstance(resamples, bool) or not isinstance(resamples, int) or not 0 <= resamples <= MAX_RESAMPLES:
            raise UsageError(f"{str(self.path / 'run.json')!r}: config.ci.resamples is {resamples!r}; valid: an "
                             f"integer from 100 to {MAX_RESAMPLES} (a run never writes another; the file was edited)")

    @property
    def protocol(self) -> str:
        return str((self.info.get("protocol") or {}).get("name", "strong"))

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.info.get("config") or {})

    def problem(self, name: str) -> str:
        """Why the run's file ``name`` (a relative posix path) is not one verify reads ("" when it is,
        :func:`entry_problem`)."""
        return entry_problem(self.path, name)

    def has(self, name: str) -> bool:
        """Whether ``name`` is a file verify reads (a regular file, reached without a link, within the bound)."""
        return not self.problem(name)

    def text(self, name: str) -> str:
        """A text file of the run (UTF-8); :class:`Unreadable` when it is not one verify reads or not UTF-8."""
        problem = self.problem(name)
        if problem:
            raise Unreadable(f"{name}: {problem}")
        try:
            return (self.path / name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise Unreadable(f"{name}: cannot be read as text ({type(exc).__name__}: {exc})") from None

    def table(self, name: str, needs: Sequence[str] = ()) -> pd.DataFrame:
        """A CSV of the run as written (empty cells are NaN); :class:`Unreadable` when it is missing, not a file
        verify reads (:meth:`problem`), holds no CSV table (an emptied file) or lacks a column of ``needs``."""
        import pandas as pd

        problem = self.problem(name)
        if problem:
            raise Unreadable(f"{name}: missing (the run wrote it)" if problem == "missing" else f"{name}: {problem}")
        try:
            frame = pd.read_csv(self.path / name)
        except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
            raise Unreadable(f"{name}: cannot be read as a CSV table ({type(exc).__name__}: {exc})") from None
        absent = [c for c in needs if c not in frame.columns]
        if absent:
            raise Unreadable(f"{name}: column {absent[0]!r} is missing")
        return frame

    @cached_property
    def scored(self) -> list[str]:
        """The detectors the run scored: those ``run.json`` names (``detector_backends``: every detector it ran,
        less those that failed, ``detector_errors``) and those with a score file (a folder written by hand or
        before ``run.json`` named them)."""
        ran = self.info.get("detector_backends")
        named = [d for d in (ran if isinstance(ran, dict) else {}) if d not in (self.info.get("detector_errors") or {})]
        files = [p.stem for p in (self.path / "scores").glob("*.npz")] if is_folder(self.path, "scores") else []
        return sorted({*named, *files})

    @property
    def errored(self) -> list[str]:
        """The detectors that failed in the run (their rows hold no numbers)."""
        return sorted(self.info.get("detector_errors") or {})

    @cached_property
    def detectors(self) -> list[str]:
        """Detectors the run scored whose score file verify reads (a missing one is a finding of
        :func:`~advopenood.evaluation.verify.verify_files`, and so is a link, a FIFO or an oversized one)."""
        return [d for d in self.scored if self.has(f"scores/{d}.npz")]

    def scores(self, det: str) -> dict[str, np.ndarray]:
        """``scores/<det>.npz`` as a dict of arrays; :class:`Unreadable` when the file is missing or not one verify
        reads."""
        problem = self.problem(f"scores/{det}.npz")
        if problem:
            raise Unreadable(f"scores/{det}.npz: " + (f"missing (the run scored {det!r})" if problem == "missing"
                                                      else problem))
        return read_npz(self.path / "scores" / f"{det}.npz")


def read_npz(path: Path, keys: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """The arrays (``keys``, default all) of an npz file a run wrote, without pickles; a UsageError (exit 2) naming the
    file when it is truncated or damaged: nothing can be re-derived from it."""
    try:
        with np.load(path) as d:
            return {k: d[k] for k in (d.files if keys is None else keys)}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as exc:
        raise UsageError(f"{str(path)!r} cannot be read ({type(exc).__name__}: {exc}): it is truncated or damaged; "
                         "valid input: a run folder and store as the run wrote them (run it again)") from None


def as_csv_float(value: float) -> float:
    """A float as the run's CSVs hold it: 6 significant digits (``%.6g``, :func:`advopenood.io.write_csv`)."""
    return float(f"{value:.6g}")


def same_cell(want: Any, have: Any, atol: float) -> bool:
    """Whether a written cell holds the re-derived value: NaN for NaN; for numbers, the value as a CSV writes it
    (a re-derivation that lands within ``atol`` of a rounding boundary may round either way)."""
    import pandas as pd

    w_na, h_na = pd.isna(want), pd.isna(have)
    if w_na or h_na:
        return bool(w_na and h_na)
    if isinstance(want, (int, float, np.number)) and isinstance(have, (int, float, np.number)):
        w, h = float(want), float(have)
        return h in {as_csv_float(w), as_csv_float(w - atol), as_csv_float(w + atol)} or \
            math.isclose(w, h, rel_tol=0.0, abs_tol=atol)
    return str(want) == str(have)


def compare(expected: pd.DataFrame, written: pd.DataFrame, keys: list[str], columns: list[str],
            atol: float = 1e-9, table: str = "") -> list[str]:
    """One line per difference between re-derived rows ``expected`` and the ``written`` table, matched on
    ``keys``: a missing, extra or repeated row, a missing column, or a cell of ``columns`` whose written number is
    not the re-derived one as the CSV writes it (6 significant digits; ``atol`` is the arithmetic slack of the
    re-derivation)."""
    import pandas as pd

    prefix = f"{table}: " if table else ""
    lines = [f"{prefix}column {c!r} is missing" for c in keys + columns if c not in written.columns]
    if any(c not in written.columns for c in keys):
        return lines
    columns = [c for c in columns if c in written.columns]
    key = lambda r: tuple("" if pd.isna(r[k]) else str(r[k]) for k in keys)  # noqa: E731
    want = {key(r): r for r in expected.to_dict("records")}
    have = {key(r): r for r in written.to_dict("records")}
    seen = Counter(key(r) for r in written.to_dict("records"))
    lines += [f"{prefix}row {dict(zip(keys, k))} is written {n} times" for k, n in seen.items() if n > 1]
    lines += [f"{prefix}row {dict(zip(keys, k))} is missing" for k in want if k not in have]
    lines += [f"{prefix}row {dict(zip(keys, k))} is not derivable from the run's files" for k in have if k not in want]
    for k in want.keys() & have.keys():
        for col in columns:
            if not same_cell(want[k][col], have[k].get(col), atol):
                lines.append(f"{prefix}{dict(zip(keys, k))} {col}: written {have[k].get(col)!r}, "
                             f"re-derived {want[k][col]!r}")
    return sorted(lines)


def key_text(value: Any) -> str:
    """A key cell as text (``""`` for a missing one)."""
    import pandas as pd

    return "" if pd.isna(value) else str(value)


def key_matches(column: pd.Series, value: str) -> np.ndarray:
    """The rows whose key cell is ``value``: as text, or for a numeric column as the CSV writes the number (6
    significant digits: a claim may hold the number unrounded)."""
    import pandas as pd

    text = column.map(key_text).to_numpy() == value
    if not pd.api.types.is_numeric_dtype(column) or value == "":
        return text
    try:
        number = as_csv_float(float(value))
    except ValueError:
        return text
    return text | (column.astype(float).map(as_csv_float).to_numpy() == number)
