"""``advopenood verify RUN``: re-derive a run's tables from the files it wrote, and report every difference.

The run folder holds everything a table is computed from: ``scores/<detector>.npz`` (confidences per set, and
per adversarial set the ``<set>.success`` and ``<set>.positive`` masks of the images the detectors scored),
``run.json`` (config, protocol, seed, the attack sets' store paths and keys) and the store's shards. The core
re-derives ``asr.csv`` from the shards (Wilson's intervals as roots of their quadratic,
:func:`advopenood.evaluation.oracle.wilson`); every evaluator or analysis that ran and declares a ``verify`` hook
(:class:`advopenood.capabilities.Verifiable`) re-derives its own tables, every row the run's ``run.json`` and scores
imply (a missing row, an extra row and a missing table are differences, as a changed number is). Every claim of
``claims.json`` is re-rendered from its table (:mod:`advopenood.evaluation.verify_claims`), and the report from the
tables and ``run.json`` (:mod:`advopenood.evaluation.verify_report`): a sentence of the report that is no claim's
and no rendering of the run's files is a difference. Every entry of the folder is checked against the SHA-256
digests of its ``manifest.json`` (:func:`verify_files`; listed without following a link, a size checked before a
file is read: :mod:`advopenood.evaluation.runfiles`), and every shard of the store against its recorded checksum
(:func:`set_shards`). Hooks are written as separate code paths from the ones that wrote the tables, and take every
metric and interval from the one independent checker, :mod:`advopenood.evaluation.oracle` (other arithmetic, other
libraries where possible), so that a bug in one does not hide in both; no hook imports the code it checks.
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from tqdm.auto import tqdm

from advopenood.errors import UsageError
from advopenood.evaluation import oracle
from advopenood.evaluation.runfiles import (MAX_FILE_BYTES, RunFiles, Unreadable, as_csv_float, compare,  # noqa: F401
                                            read_npz, walk)
from advopenood.evaluation.verify_claims import verify_claims
from advopenood.evaluation.verify_report import verify_report
from advopenood.io import MANIFEST, OutputError, read_manifest, sha256_file


class Findings(NamedTuple):
    """What ``verify`` found: ``differences`` (a number, row or table that is not the re-derived one), ``files``
    (a file that differs from its digest in ``manifest.json``, is missing or is not listed, or a store shard that
    fails its checksum) and ``notes`` (what could not be checked, and why)."""

    differences: list[str]
    files: list[str]
    notes: list[str]


def verify_files(run: RunFiles, bar: Any = None) -> list[str]:
    """Every entry of the run folder against ``manifest.json`` (:func:`advopenood.io.commit_output` writes it last,
    with each file's SHA-256), listed without following a link (:func:`~advopenood.evaluation.runfiles.walk`): a
    file whose bytes differ from its digest, a listed file that is missing, a file the manifest does not list, and
    anything that is not a regular file (a link, a FIFO, a socket, a device: never opened) are each a finding; so
    are a file over :data:`~advopenood.evaluation.runfiles.MAX_FILE_BYTES` (its size is checked before it is read,
    and it is not read), a missing or unreadable manifest, and a score file of a detector the run scored that is
    missing. ``bar`` (a tqdm bar) counts the listed files as their digests are checked."""
    files, others = walk(run.path)
    listed, problem = None, run.problem(MANIFEST)
    if problem == "missing":
        problem = f"{MANIFEST}: missing; no file's digest can be checked"
    elif problem:
        problem = f"{MANIFEST}: {problem}; no file's digest can be checked"
    else:
        try:
            listed = read_manifest(run.path)
        except OutputError as exc:
            problem = f"{MANIFEST}: {exc}; no file's digest can be checked"
    lines = [f"scores/{d}.npz: missing (the run scored {d!r})" for d in run.scored
             if run.problem(f"scores/{d}.npz") == "missing" and f"scores/{d}.npz" not in (listed or {})]
    lines += [f"{rel}: {what}" for rel, what in others.items() if rel != MANIFEST]
    if listed is None:
        return lines + [problem]
    if bar is not None:
        bar.reset(total=len(listed))
    for rel, digest in sorted(listed.items()):
        if bar is not None:
            bar.update()
        if rel in others:
            continue
        if rel not in files:
            lines.append(f"{rel}: listed in {MANIFEST} but missing")
        elif files[rel] > MAX_FILE_BYTES:
            lines.append(f"{rel}: {files[rel]} bytes, over the bound of {MAX_FILE_BYTES} bytes of a file a run writes; "
                         "not read, so its digest is not checked")
        elif sha256_file(run.path / rel) != digest:
            lines.append(f"{rel}: its SHA-256 is not the one {MANIFEST} lists (the file changed after the run wrote it)")
    lines += [f"{rel}: not listed in {MANIFEST} (the run did not write it)" for rel in files
              if rel not in listed and rel != MANIFEST]
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


def verify_plugins(run: RunFiles, bar: Any = None) -> tuple[list[str], list[str]]:
    """``(differences, notes)`` of every evaluator and analysis the run names: its hook's findings; a plugin that
    ran but cannot be loaded here is a difference; one that failed or declares no hook is a note. ``bar`` (a tqdm
    bar) names the plugin whose tables are being re-derived."""
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
            if bar is not None:
                bar.set_postfix_str(f"re-deriving the tables of {label}")
            diffs += run_hook(obj, run, label)
    return diffs, notes


def named_files(lines: list[str]) -> set[str]:
    """The files that finding lines name first (``ood.csv: ...``)."""
    return {line.split(": ", 1)[0] for line in lines if ": " in line}


def verify_run(path: str | Path, progress: bool = False) -> Findings:
    """Every finding for a run folder: each entry against ``manifest.json``'s digests and each store shard against
    its checksum (``files``); every table re-derived by the core and by each plugin that ran and declares
    ``verify``, every claim and the report re-rendered (``differences``: changed numbers, missing and extra rows,
    missing tables, claims and sentences that are not the tables'); ``notes`` name what could not be checked and
    why. A folder that is not a run's (no ``run.json`` a run writes) is a UsageError (exit 2). With ``progress`` a
    bar on stderr counts the files checked, then names each stage."""
    run = RunFiles.open(path)
    with tqdm(desc="verify", unit="file", disable=not progress, leave=False) as bar:
        files = verify_files(run, bar)
        bar.set_postfix_str("the attack sets and claims")
        diffs, shards, notes = verify_asr(run)
        diffs += verify_masks(run) + verify_claims(run)
        plugin_diffs, plugin_notes = verify_plugins(run, bar)
        bar.set_postfix_str("the report")
        report_diffs, report_notes = verify_report(run, named_files(diffs + plugin_diffs + files + shards))
    return Findings(diffs + plugin_diffs + report_diffs, files + shards, notes + plugin_notes + report_notes)
