"""``advopenood verify RUN``: re-derive a run's tables from the files it wrote, and report every difference.

The run folder holds everything a table is computed from: ``scores/<detector>.npz`` (confidences per set, and
per adversarial set the ``<set>.success`` and ``<set>.positive`` masks of the images the detectors scored),
``run.json`` (config, protocol, seed, the attack sets' store paths and keys) and the store's shards. The core
re-derives ``asr.csv`` from the shards (Wilson's intervals as roots of their quadratic,
:func:`advopenood.evaluation.oracle.wilson`); every evaluator or analysis that ran and declares a ``verify`` hook
(:class:`advopenood.capabilities.Verifiable`) re-derives its own tables, every row the run's ``run.json`` and scores
imply (a missing row, an extra row and a missing table are differences, as a changed number is). Every file of the
folder is checked against the SHA-256 digests of its ``manifest.json`` (:func:`verify_files`), and every shard of
the store against its recorded checksum (:func:`set_shards`). Hooks are written as separate code
paths from the ones that wrote the tables, and take every metric and interval from the one independent checker,
:mod:`advopenood.evaluation.oracle` (other arithmetic, other libraries where possible), so that a bug in one does
not hide in both; no hook imports the code it checks.
"""
from __future__ import annotations

import hashlib
import json
import math
import zipfile
import zlib
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import numpy as np
import pandas as pd

from advopenood.config.schema import MAX_RESAMPLES
from advopenood.claims import STATED, Claim, read_claims
from advopenood.errors import UsageError
from advopenood.evaluation import oracle
from advopenood.evaluation.verify_first import check_first
from advopenood.io import MANIFEST, OutputError, files_under, read_manifest


class Unreadable(Exception):
    """A file a check needs is missing, or holds no table or column it must hold: a finding of ``verify`` (exit 1),
    not a traceback. The message names the file."""


class Findings(NamedTuple):
    """What ``verify`` found: ``differences`` (a number, row or table that is not the re-derived one), ``files``
    (a file that differs from its digest in ``manifest.json``, is missing or is not listed, or a store shard that
    fails its checksum) and ``notes`` (what could not be checked, and why)."""

    differences: list[str]
    files: list[str]
    notes: list[str]


@dataclass
class RunFiles:
    """The files of one run folder, read lazily. ``info`` is ``run.json``."""

    path: Path
    info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def open(cls, path: str | Path) -> RunFiles:
        """A run folder; a UsageError (exit 2) when it is not one."""
        folder = Path(path)
        info = folder / "run.json"
        if not folder.exists():
            raise UsageError(f"{str(folder)!r} does not exist; valid input: the --out of a run")
        if not info.is_file():
            raise UsageError(f"{str(folder)!r} is not a run folder (no run.json); valid input: the --out of a run")
        try:
            run = cls(folder, json.loads(info.read_text()))
        except (OSError, ValueError) as exc:
            raise UsageError(f"{str(info)!r} is not readable JSON ({exc})") from None
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
        return str(self.info.get("protocol", {}).get("name", "strong"))

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.info.get("config") or {})

    def table(self, name: str, needs: Sequence[str] = ()) -> pd.DataFrame:
        """A CSV of the run as written (empty cells are NaN); :class:`Unreadable` when it is missing, holds no CSV
        table (an emptied file) or lacks a column of ``needs``."""
        path = self.path / name
        if not path.is_file():
            raise Unreadable(f"{name}: missing (the run wrote it)")
        try:
            frame = pd.read_csv(path)
        except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
            raise Unreadable(f"{name}: cannot be read as a CSV table ({type(exc).__name__}: {exc})") from None
        absent = [c for c in needs if c not in frame.columns]
        if absent:
            raise Unreadable(f"{name}: column {absent[0]!r} is missing")
        return frame

    def has(self, name: str) -> bool:
        return (self.path / name).is_file()

    @cached_property
    def scored(self) -> list[str]:
        """The detectors the run scored: those ``run.json`` names (``detector_backends``: every detector it ran,
        less those that failed, ``detector_errors``) and those with a score file (a folder written by hand or
        before ``run.json`` named them)."""
        ran = self.info.get("detector_backends")
        named = [d for d in (ran if isinstance(ran, dict) else {}) if d not in (self.info.get("detector_errors") or {})]
        return sorted({*named, *(p.stem for p in (self.path / "scores").glob("*.npz"))})

    @property
    def errored(self) -> list[str]:
        """The detectors that failed in the run (their rows hold no numbers)."""
        return sorted(self.info.get("detector_errors") or {})

    @cached_property
    def detectors(self) -> list[str]:
        """Detectors the run scored whose score file is there (a missing one is a finding of :func:`verify_run`)."""
        return [d for d in self.scored if (self.path / "scores" / f"{d}.npz").is_file()]

    def scores(self, det: str) -> dict[str, np.ndarray]:
        """``scores/<det>.npz`` as a dict of arrays; :class:`Unreadable` when the file is missing."""
        path = self.path / "scores" / f"{det}.npz"
        if not path.is_file():
            raise Unreadable(f"scores/{det}.npz: missing (the run scored {det!r})")
        return read_npz(path)


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


def _same(want: Any, have: Any, atol: float) -> bool:
    """Whether a written cell holds the re-derived value: NaN for NaN; for numbers, the value as a CSV writes it
    (a re-derivation that lands within ``atol`` of a rounding boundary may round either way)."""
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
    ``keys``: a missing, extra or repeated row, a missing column, or a cell of ``columns`` whose written number is not the re-derived one as
    the CSV writes it (6 significant digits; ``atol`` is the arithmetic slack of the re-derivation)."""
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
            if not _same(want[k][col], have[k].get(col), atol):
                lines.append(f"{prefix}{dict(zip(keys, k))} {col}: written {have[k].get(col)!r}, "
                             f"re-derived {want[k][col]!r}")
    return sorted(lines)


def verify_files(run: RunFiles) -> list[str]:
    """Every file of the run folder against ``manifest.json`` (:func:`advopenood.io.commit_output` writes it last,
    with each file's SHA-256): a file whose bytes differ from its digest, a listed file that is missing, and a
    file the manifest does not list are each a finding; so are a missing or unreadable manifest, and a score file
    of a detector the run scored that is missing."""
    try:
        listed = read_manifest(run.path)
        problem = "" if listed is not None else f"{MANIFEST}: missing; no file's digest can be checked"
    except OutputError as exc:
        listed, problem = None, f"{MANIFEST}: {exc}; no file's digest can be checked"
    lines = [f"scores/{d}.npz: missing (the run scored {d!r})" for d in run.scored
             if d not in run.detectors and f"scores/{d}.npz" not in (listed or {})]
    if listed is None:
        return lines + [problem]
    present = set(files_under(run.path)) - {MANIFEST}
    for rel, digest in sorted(listed.items()):
        if rel not in present:
            lines.append(f"{rel}: listed in {MANIFEST} but missing")
        elif hashlib.sha256((run.path / rel).read_bytes()).hexdigest() != digest:
            lines.append(f"{rel}: its SHA-256 is not the one {MANIFEST} lists (the file changed after the run wrote it)")
    lines += [f"{rel}: not listed in {MANIFEST} (the run did not write it)" for rel in sorted(present - set(listed))]
    return lines


def _store_digests(folder: Path) -> dict[str, str]:
    """``shard file -> SHA-256`` from a store set's ``manifest.json``; empty when it cannot be read."""
    try:
        doc = json.loads((folder / "manifest.json").read_text())
        return {str(e["file"]): str(e["sha256"]) for e in doc["shards"]}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def set_shards(name: str, entry: dict[str, Any]) -> tuple[list[Path], list[str]]:
    """``(shards, findings)`` of one attack set of ``run.json``: the store's shards ``shard_00000.npz`` ... (as many
    as the run used), and one finding per shard that is missing or whose bytes fail its SHA-256 checksum (the
    store's ``manifest.json`` entry, else the ``.sha256`` beside it), naming the shard and the set."""
    folder = Path(entry["path"])
    count = int(entry.get("shards") or len(list(folder.glob("shard_*.npz"))))
    shards = [folder / f"shard_{i:05d}.npz" for i in range(count)]
    recorded = _store_digests(folder)
    lines = []
    for shard in shards:
        side = shard.with_name(shard.name + ".sha256")
        want = recorded.get(shard.name) or (side.read_text().strip() if side.is_file() else "")
        if not shard.is_file():
            lines.append(f"store shard {str(shard)!r} of set {name!r}: missing")
        elif hashlib.sha256(shard.read_bytes()).hexdigest() != want:
            lines.append(f"store shard {str(shard)!r} of set {name!r}: fails its SHA-256 checksum (it changed after "
                         "the run wrote it)")
    return shards, lines


def _asr_row(run: RunFiles, name: str, entry: dict[str, Any], shards: list[Path]) -> dict[str, Any]:
    """One row of ``asr.csv`` re-derived from a set's shards."""
    parts = []
    for shard in shards:
        try:
            parts.append(read_npz(shard, ("y", "clean_pred", "success", "linf", "l2")))
        except UsageError as exc:
            raise UsageError(f"set {name!r}: {exc}") from None
    rec = {c: np.concatenate([p[c] for p in parts]) for c in parts[0]}
    success = rec["success"].astype(bool)
    source = entry.get("source", "id")
    correct = rec["clean_pred"] == rec["y"] if source == "id" else np.ones(len(success), dtype=bool)
    plan = oracle.IntervalPlan.of(run.config)
    wilson = plan.method != "none"
    asr_lo, asr_hi = plan.wilson(int(success[correct].sum()), int(correct.sum()))
    all_lo, all_hi = plan.wilson(int(success.sum()), len(success))
    return {"attack": name, "n": len(success), "asr_lo": asr_lo, "asr_hi": asr_hi, "asr_all_lo": all_lo,
            "asr_all_hi": all_hi, "ci": "wilson" if wilson else "none",
            "asr": 100.0 * success[correct].sum() / correct.sum() if correct.any() else math.nan,
            "asr_all": 100.0 * success.sum() / len(success),
            "mean_linf": float(np.mean(rec["linf"][success])) if success.any() else math.nan,
            "mean_l2": float(np.mean(rec["l2"][success])) if success.any() else math.nan}


def verify_asr(run: RunFiles) -> tuple[list[str], list[str], list[str]]:
    """``(differences, shard findings, notes)`` of ``asr.csv`` re-derived from the stored shards' records (``asr``:
    success among clean-correct rows; ``asr_all``: success among all rows; norms averaged over successful rows):
    one row per attack set of ``run.json``; a set whose shards are all gone is a note, a missing or changed shard
    a finding (a set with a missing shard is not re-derived)."""
    rows, gone, found, notes = [], [], [], []
    for name, entry in (run.info.get("attacks") or {}).items():
        shards, lines = set_shards(name, entry)
        if not any(s.is_file() for s in shards):
            notes.append(f"asr.csv: set {name!r}: its shards are no longer in the store ({entry['path']}); "
                         "not re-derived")
            gone.append(name)
            continue
        found += lines
        if all(s.is_file() for s in shards):  # a shard that fails its checksum is read still: damaged, it is exit 2
            rows.append(_asr_row(run, name, entry, shards))
        else:
            gone.append(name)
    try:
        written = run.table("asr.csv")
    except Unreadable as exc:
        return [str(exc)], found, notes
    if "attack" in written.columns:
        written = written[~written["attack"].isin(gone)]
    columns = list(ASR_VALUES)
    if "clean_acc_lo" in written:  # runs before clean_acc had its interval in asr.csv lack the two columns
        lo, hi = clean_interval(run)
        rows = [{**r, "clean_acc_lo": lo, "clean_acc_hi": hi} for r in rows]
        columns += ["clean_acc_lo", "clean_acc_hi"]
    expected = pd.DataFrame(rows, columns=["attack"] + columns)
    return compare(expected, written, ["attack"], columns, atol=1e-4, table="asr.csv"), found, notes


def clean_interval(run: RunFiles) -> tuple[float, float]:
    """Wilson's interval on the clean accuracy from run.json (``clean_acc`` of ``data.id.n`` images), NaN under
    ``ci: none``."""
    n = int(((run.info.get("data") or {}).get("id") or {}).get("n") or 0)
    if not n:
        return math.nan, math.nan
    return oracle.IntervalPlan.of(run.config).wilson(round(float(run.info["clean_acc"]) * n / 100.0), n)


#: the columns of ``asr.csv`` that verify re-derives
ASR_VALUES = ["n", "asr", "asr_lo", "asr_hi", "asr_all", "asr_all_lo", "asr_all_hi", "ci", "mean_linf", "mean_l2"]


def verify_masks(run: RunFiles) -> list[str]:
    """Each saved ``<set>.positive`` mask follows the protocol's rule: every row under ``all`` or for an OOD->ID
    set, the ``<set>.success`` rows otherwise; a randomised detector (``run.json``'s ``evaluation_noise_seed``) has
    its ``<set>.select`` for every set."""
    rule = str(run.info.get("protocol", {}).get("ood_positives", "successful"))
    randomised = run.info.get("evaluation_noise_seed") or {}
    lines = []
    for det in run.detectors:
        arrays = run.scores(det)
        if det in randomised:
            sets = [k for k in arrays if not k.endswith((".success", ".positive", ".select"))]
            lines += [f"scores/{det}.npz: no {name}.select (a randomised detector's attack-stream confidences, on "
                      "which every worst case over sets chooses)" for name in sets if f"{name}.select" not in arrays]
        for name, entry in (run.info.get("attacks") or {}).items():
            if f"{name}.positive" not in arrays or f"{name}.success" not in arrays:
                lines.append(f"scores/{det}.npz: no {name}.positive or {name}.success mask")
                continue
            every = rule == "all" or entry.get("source", "id") != "id"
            want = np.ones_like(arrays[f"{name}.success"]) if every else arrays[f"{name}.success"]
            if not np.array_equal(arrays[f"{name}.positive"], want):
                lines.append(f"scores/{det}.npz: {name}.positive does not follow the protocol's rule {rule!r}")
    return lines


def _key_text(value: Any) -> str:
    return "" if pd.isna(value) else str(value)


def _key_matches(column: pd.Series, value: str) -> np.ndarray:
    """The rows whose key cell is ``value``: as text, or for a numeric column as the CSV writes the number (6
    significant digits: a claim may hold the number unrounded)."""
    text = column.map(_key_text).to_numpy() == value
    if not pd.api.types.is_numeric_dtype(column) or value == "":
        return text
    try:
        number = as_csv_float(float(value))
    except ValueError:
        return text
    return text | (column.astype(float).map(as_csv_float).to_numpy() == number)


def _claimed_cells(claim: Claim, row: pd.Series) -> tuple[float, float, float] | str:
    """``(number, lo, hi)`` the table's row says for the claim, in the order the claim states its pair (a swapped
    pair negates the difference and swaps its bounds); a reason when the claim's names are not the row's."""
    if claim.kind == "value":
        return tuple(float(row.get(c, math.nan)) for c in claim.columns)  # type: ignore[return-value]
    col_a, col_b, col_d, col_lo, col_hi = claim.columns
    d, lo, hi = (float(row[c]) for c in (col_d, col_lo, col_hi))
    pair = (str(row[col_a]), str(row[col_b]))
    if tuple(claim.names) == pair:
        return d, lo, hi
    if tuple(claim.names) == pair[::-1]:
        return -d, -hi, -lo
    return f"it names {', '.join(claim.names)}, the row {', '.join(pair)}"


def check_claim(run: RunFiles, claim: Claim, tables: dict[str, pd.DataFrame]) -> list[str]:
    """What is wrong with one claim against its table: the row it reads (exactly one), the numbers it quotes (the
    cells as written, of the order stated), its method and its test (:data:`advopenood.claims.TESTS`)."""
    if claim.table not in tables:
        if not run.has(claim.table):
            return [f"its table {claim.table} is missing"]
        try:
            tables[claim.table] = run.table(claim.table)
        except Unreadable as exc:
            return [str(exc)]
    table = tables[claim.table]
    if claim.kind == "first":
        try:
            return check_first(claim, table, run.table("ood.csv"))
        except (Unreadable, KeyError, ValueError, TypeError) as exc:
            return [f"paired.csv or ood.csv cannot be read for the claim ({type(exc).__name__}: {exc})"]
    mask = np.ones(len(table), dtype=bool)
    for column, value in claim.row:
        mask &= _key_matches(table[column], value) if column in table else False
    if mask.sum() != 1:
        return [f"{int(mask.sum())} rows of {claim.table} match {dict(claim.row)}"]
    row = table[mask].iloc[0]
    try:
        want = _claimed_cells(claim, row)
    except (KeyError, ValueError, TypeError) as exc:  # a cell that is not a number, a column that is gone
        return [f"{claim.table}'s row cannot be read as the claim's numbers ({type(exc).__name__}: {exc})"]
    if isinstance(want, str):
        return [want]
    lines = [f"its {what} {have!r} is not {claim.table}'s {cell!r}" for what, have, cell in
             zip(("number", "interval's lower end", "interval's upper end"), (claim.value, claim.lo, claim.hi), want)
             if not _same(have, cell, 1e-9)]  # the claim's number as the CSV would write it
    if "ci" in row and _key_text(row["ci"]) != claim.method:
        lines.append(f"its method {claim.method!r} is not {claim.table}'s {_key_text(row['ci'])!r}")
    lo, hi = want[1], want[2]
    if claim.kind == "difference" and not lo > 0:
        lines.append("it states a direction that the paired interval of the stated difference does not support")
    if claim.kind == "no_difference" and (lo > 0 or hi < 0):
        lines.append("it says no difference is shown where the paired interval excludes 0")
    return lines


def verify_claims(run: RunFiles) -> list[str]:
    """Every claim of ``claims.json`` (:mod:`advopenood.claims`) re-read from its table (:func:`check_claim`; its
    sentence must be the rendering of its numbers), and every sentence of ``report.md`` that states a comparison
    (:data:`advopenood.claims.STATED`) must be the sentence of one of them, word for word (a report may show a
    subset). One line per problem, naming the sentence."""
    data = read_claims(run.path)
    report = (run.path / "report.md").read_text() if run.has("report.md") else ""
    stated = {str(c.get("text", "")) for c in data["claims"]}
    lines = [f"report.md: {s!r}: not the sentence of any claim of claims.json (edited, or not rendered from one)"
             for s in (line[2:] for line in report.splitlines() if line.startswith("- "))
             if STATED.search(s) and s not in stated]
    tables: dict[str, pd.DataFrame] = {}
    for part, records in data.items():
        for raw in records:
            text = str(raw.get("text", ""))
            try:
                claim = Claim.from_dict(raw)
            except (KeyError, ValueError, TypeError) as exc:
                lines.append(f"claims.json: {text!r}: not a valid claim ({exc})")
                continue
            problems = check_claim(run, claim, tables)
            if claim.text != text:
                problems.append(f"its sentence is not the rendering of its numbers ({claim.text!r})")
            lines += [f"claims.json: {text!r}: {p}" for p in problems]
    return lines


def run_hook(obj: Any, run: RunFiles, label: str) -> list[str]:
    """A plugin's ``verify`` hook; a file it needs that is missing, or a table that lacks a column, a row or a
    number the run wrote (a KeyError, ValueError, ... of the hook), is a difference naming the plugin, not a
    traceback. A damaged npz file stays a UsageError (exit 2)."""
    try:
        return list(obj.verify(run))
    except UsageError:
        raise
    except Unreadable as exc:
        return [str(exc)]
    except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as exc:
        return [f"{label}: its tables cannot be re-derived from the files as they are ({type(exc).__name__}: "
                f"{exc}); a table or score file lacks what the run wrote"]


def verify_plugins(run: RunFiles) -> tuple[list[str], list[str]]:
    """``(differences, notes)`` of every evaluator and analysis the run names: its hook's findings; a plugin that
    ran but cannot be loaded here is a difference; one that failed or declares no hook is a note."""
    from advopenood import registry
    from advopenood.capabilities import is_verifiable

    diffs: list[str] = []
    notes: list[str] = []
    failed = run.info.get("plugin_errors") or {}
    for kind in ("evaluators", "analyses"):
        for name in run.config.get(kind) or []:
            singular = "evaluator" if kind == "evaluators" else "analysis"
            label = f"{singular} {name!r}"
            if f"{singular}:{name}" in failed:
                notes.append(f"{label} failed in the run ({failed[f'{singular}:{name}']}); it wrote no tables")
                continue
            try:
                obj = registry.get(kind, name)
            except UsageError:  # it ran and wrote tables: a hook that cannot be loaded leaves them unchecked
                diffs.append(f"{label} ran but cannot be loaded here; its tables cannot be re-derived")
                continue
            if not is_verifiable(obj):
                notes.append(f"{label} does not declare Verifiable; its tables are not re-derived")
                continue
            diffs += run_hook(obj, run, label)
    return diffs, notes


def verify_run(path: str | Path) -> Findings:
    """Every finding for a run folder: each file against ``manifest.json``'s digests and each store shard against
    its checksum (``files``); every table re-derived by the core and by each plugin that ran and declares
    ``verify`` (``differences``: changed numbers, missing and extra rows, missing tables); ``notes`` name what
    could not be checked and why."""
    run = RunFiles.open(path)
    files = verify_files(run)
    diffs, shards, notes = verify_asr(run)
    diffs += verify_masks(run) + verify_claims(run)
    plugin_diffs, plugin_notes = verify_plugins(run)
    return Findings(diffs + plugin_diffs, files + shards, notes + plugin_notes)
