"""``advopenood leaderboard``: the robust-OOD leaderboard, one static page per benchmark, built from entries
(:mod:`advopenood.run.entries`), every cell checkable against its run folder.

**Rows** are cells ``(benchmark@version, model checkpoint SHA-256, detector, detector parameters)``; a table holds
the entries of one benchmark and version only. The first entry given for a cell is its row; every further entry of
the cell (another run folder: an *external evaluation*, e.g. with more attacks) can only lower it: per OOD set the
page shows the row's own robust AUROC and the **best known**, the lowest robust AUROC any entry of the cell found,
and marks the row ``unreliable`` where the best known lies below the row's 95 % interval (RobustBench's rule, Croce
et al. 2021).

**Rank ranges** (per OOD set, by robust AUROC, best first; :func:`rank_ranges`): the rows share images (the
benchmark fixes them, by digest), so every pair is tested paired: the bootstrap of ``AUROC_a - AUROC_b`` with one
draw of ID and OOD indices applied to every row's per-image worst case
(:func:`advopenood.evaluation.intervals.paired_replicates`, key ``leaderboard|<set>``, the benchmark's seed and
resamples; the worst cases re-derived from each run folder's score files by the ``robust_auroc`` evaluator's
``worst_cases``), its two-sided p-value Holm-adjusted over all the set's pairs, as the headline ranks detectors. A
row's rank runs from 1 + the rows shown better to the rows - the rows shown worse (``1-4``: any place of these; ``2``:
that place); overlapping intervals are no test. Below the runs' ``min_conclusive`` images a side no rank is stated
(``no rank (16 + 16 images)``). A row whose per-image worst case is not available, or does not hold the same images
as the others', is ``not compared``.

**Bad input** (one line each, exit 2; with ``--verify`` exit 1; every other entry is kept): an entry that cannot be
read, of an unknown benchmark or version, whose run folder is missing or is not the one it was written from (the
manifest digest), two entries of one cell with different image digests. ``--verify`` runs
:func:`advopenood.evaluation.verify.verify_run` on each run folder and re-derives each entry from it
(:func:`~advopenood.run.entries.entry_of`), naming the first field that differs; building the page runs the first
of the two (an entry whose run folder fails it is refused, exit 2).
"""
from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from advopenood import io as aio
from advopenood.config.benchmarks import Benchmark, by_key
from advopenood.errors import UsageError
from advopenood.run.entries import ENTRIES, entry_of, manifest_digest

#: the rank of an entry whose per-image worst case is not available
NOT_COMPARED = "not compared"


@dataclass
class Loaded:
    """One entry as read: its file, its run folder, the entry and its benchmark."""

    path: Path
    folder: Path
    entry: dict[str, Any]
    bench: Benchmark

    @property
    def cell(self) -> tuple[str, str, str, str]:
        """The leaderboard cell the entry is of."""
        e = self.entry
        return (self.bench.key, str(e["model"]["checkpoint_sha256"]), str(e["detector"]["name"]),
                json.dumps(e["detector"]["params"], sort_keys=True))


@dataclass
class Board:
    """Entries by benchmark and the lines of what was refused."""

    rows: dict[str, dict[tuple, list[Loaded]]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def entry_files(paths: list[str]) -> list[tuple[Path, Path | None]]:
    """``(entry file, its run folder)`` of each argument: a run folder gives its ``entries/*.json``; an entry file
    ``<run>/entries/<det>.json`` its run folder, any other entry file the folder beside it named by its
    ``run.folder`` (None when the file gives no name)."""
    out: list[tuple[Path, Path | None]] = []
    for text in paths:
        path = Path(text)
        if path.is_dir():
            out += [(p, path) for p in sorted((path / ENTRIES).glob("*.json"))] or [(path / ENTRIES, path)]
        elif path.parent.name == ENTRIES:
            out.append((path, path.parent.parent))
        else:
            out.append((path, None))
    return out


def _read(path: Path, folder: Path | None) -> tuple[dict[str, Any], Path, Benchmark]:
    """An entry, its run folder and its benchmark; a UsageError naming what is wrong (module docstring)."""
    if not path.is_file():
        raise UsageError(f"{str(path)!r} is not an entry file (nor a run folder holding entries/)")
    try:
        entry = json.loads(path.read_text())
        key = f"{entry['benchmark']['name']}@{entry['benchmark']['version']}"
        name = str(entry["run"]["folder"])
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{str(path)!r} is not an advopenood entry ({type(exc).__name__}: {exc})") from None
    bench = by_key(key)
    if bench is None:
        raise UsageError(f"{str(path)!r} is of benchmark {key!r}, not a shipped benchmark's name and version "
                         "(advopenood list benchmarks)")
    folder = folder if folder is not None else path.parent / name
    listed = aio.read_manifest(folder) if folder.is_dir() else None
    if listed is None:
        raise UsageError(f"{str(path)!r}: its run folder {str(folder)!r} is missing (or holds no manifest.json); an "
                         "entry counts only beside the run folder it was written from")
    if manifest_digest(listed) != entry["run"]["manifest_digest"]:
        raise UsageError(f"{str(path)!r}: run folder {str(folder)!r} is not the one the entry was written from (its "
                         "manifest digest differs)")
    return entry, folder, bench


def load(paths: list[str]) -> Board:
    """Every entry of ``paths`` by benchmark and cell; each bad one is a line of ``problems`` and left out."""
    board, seen = Board(), set()
    for path, folder in entry_files(paths):
        if path.resolve() in seen:  # given twice (a run folder and its entry file): one entry
            continue
        seen.add(path.resolve())
        try:
            entry, run, bench = _read(path, folder)
        except UsageError as exc:
            board.problems.append(str(exc))
            continue
        got = Loaded(path, run, entry, bench)
        cells = board.rows.setdefault(bench.key, {})
        first = cells.get(got.cell)
        if first and first[0].entry.get("images") != entry.get("images"):
            board.problems.append(f"{str(path)!r}: cell {label(got)} has an entry from {str(first[0].folder)!r} with "
                                  "other image digests; the second is left out")
            continue
        cells.setdefault(got.cell, []).append(got)
    return board


def label(got: Loaded) -> str:
    """``model / detector @ benchmark`` of an entry, for messages."""
    return f"{got.entry['model']['name']} / {got.entry['detector']['name']} @ {got.bench.key}"


def differences(want: Any, have: Any, where: str = "") -> list[str]:
    """The fields where ``have`` (the entry) differs from ``want`` (re-derived), as dotted paths with both values;
    numbers compare equal within 1e-9."""
    if isinstance(want, dict) and isinstance(have, dict):
        return [line for k in sorted(set(want) | set(have), key=str)
                for line in differences(want.get(k), have.get(k), f"{where}.{k}" if where else str(k))]
    if isinstance(want, list) and isinstance(have, list) and len(want) == len(have):
        return [line for i, (a, b) in enumerate(zip(want, have)) for line in differences(a, b, f"{where}[{i}]")]
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (want, have))
    if numbers and math.isclose(float(want), float(have), rel_tol=1e-9, abs_tol=1e-9):
        return []
    return [] if want == have else [f"{where}: entry {have!r}, run folder {want!r}"]


def verify_entries(board: Board, fields: bool = True) -> list[tuple[Loaded, str]]:
    """Per entry, ``advopenood verify`` of its run folder (once per folder) and, with ``fields``, its re-derivation
    from it; per entry that fails, one line naming the entry, the cell and the first field or finding."""
    from advopenood.evaluation.verify import verify_run

    found, checked = [], {}
    for cells in board.rows.values():
        for entries in cells.values():
            for got in entries:
                if got.folder not in checked:
                    checked[got.folder] = verify_run(got.folder)
                run = checked[got.folder]
                files = [f for f in run.files if f"{ENTRIES}/" not in f]  # an entry is checked field by field below
                if run.differences or files:
                    first = (run.differences or files)[0]
                    found.append((got, f"{str(got.path)!r}: cell {label(got)}: run folder {str(got.folder)!r} fails "
                                       f"advopenood verify: {first}"))
                    continue
                if not fields:
                    continue
                want = entry_of(got.folder, got.entry["detector"]["name"], aio.read_manifest(got.folder) or {},
                                got.entry["run"]["folder"])
                diff = differences(want, got.entry)
                if diff:
                    found.append((got, f"{str(got.path)!r}: cell {label(got)}: {diff[0]}"
                                       + (f" (and {len(diff) - 1} more field(s))" if len(diff) > 1 else "")))
    return found


def _worst(got: Loaded, ood_set: str, cache: dict[Path, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """The entry's per-image worst case on ``ood_set`` from its run folder's score files (None: not available)."""
    if got.folder not in cache:
        from advopenood import registry
        from advopenood.evaluation.runfiles import RunFiles

        try:
            cache[got.folder] = registry.get("evaluators", "robust_auroc").worst_cases(RunFiles.open(got.folder))
        except (UsageError, OSError, KeyError, ValueError):  # a run folder the hook cannot read: "not compared"
            cache[got.folder] = {}
    return cache[got.folder].get((got.entry["detector"]["name"], ood_set, f"{got.bench.threat.value:.6g}"))


def rank_ranges(values: list[float], arrays: list[tuple[np.ndarray, np.ndarray]], seed: int, key: str,
                resamples: int) -> list[tuple[int, int]]:
    """Each row's ``(best, worst)`` rank by ``values`` (higher first) from paired tests on the rows' per-image worst
    cases ``(ID side, OOD side)``, all on the same images (module docstring): one draw of ID and OOD indices for
    every row (:func:`advopenood.evaluation.intervals.paired_replicates`, key ``key``), the two-sided bootstrap
    p-value of each pair's AUROC difference (:func:`~advopenood.evaluation.intervals.bootstrap_p`), Holm-adjusted
    over every pair (:func:`~advopenood.evaluation.intervals.holm`); a pair is shown apart when its adjusted p-value
    is below ``1 - LEVEL``. ``best`` = 1 + the rows shown better, ``worst`` = the rows - the rows shown worse (the
    rule the built-in OOD evaluator's headline applies to ``paired.csv``'s ``p_holm``). A ValueError when the rows do
    not hold the same number of images."""
    from advopenood.evaluation.intervals import LEVEL, bootstrap_p, holm, paired_replicates

    reps = [r["auroc"] for r in paired_replicates(arrays, seed, key, resamples, metrics=("auroc",))]
    pairs = [(a, b) for a in range(len(values)) for b in range(a + 1, len(values))]
    adjusted = holm([bootstrap_p(reps[a] - reps[b]) for a, b in pairs])
    better, worse = [0] * len(values), [0] * len(values)
    for (a, b), p in zip(pairs, adjusted):
        if p < 1 - LEVEL and values[a] != values[b]:
            high, low = (a, b) if values[a] > values[b] else (b, a)
            better[low] += 1
            worse[high] += 1
    return [(1 + better[i], len(values) - worse[i]) for i in range(len(values))]


def rank_label(best: int, worst: int) -> str:
    """A rank range as the page and its exports write it: ``3`` (one place), ``1-4`` (any of these)."""
    return str(best) if best == worst else f"{best}-{worst}"


def min_conclusive(got: Loaded) -> int:
    """The sample size below which the entry's run states no rank (its ``run.json`` ``sample.min_conclusive``,
    :data:`advopenood.evaluation.metrics.MIN_CONCLUSIVE` where it names none)."""
    from advopenood.evaluation.metrics import MIN_CONCLUSIVE

    try:
        sample = json.loads((got.folder / "run.json").read_text()).get("sample") or {}
    except (OSError, ValueError):
        sample = {}
    return int(sample.get("min_conclusive") or MIN_CONCLUSIVE)


def paired_ranks(rows: list[Loaded], ood_set: str, bench: Benchmark, cache: dict[Path, Any]) -> list[Any]:
    """Each row's rank range on ``ood_set`` by its own robust AUROC (:func:`rank_ranges`, key
    ``leaderboard|<set>``, the benchmark's seed and resamples; :func:`rank_label`); ``not compared`` without its
    worst case or where the rows' worst cases do not hold the same images; ``no rank (<n_id> + <n_ood> images)``
    for every compared row when the rows hold fewer images a side than their runs' ``min_conclusive``; empty
    without a value."""
    values = [(own(r, ood_set) or {}).get("robust_auroc") for r in rows]
    arrays = [_worst(r, ood_set, cache) for r in rows]
    ranks: list[Any] = ["" if v is None else NOT_COMPARED for v in values]
    kept = [i for i, v in enumerate(values) if v is not None and arrays[i] is not None]
    if not kept:
        return ranks
    n_id, n_ood = min(len(arrays[i][0]) for i in kept), min(len(arrays[i][1]) for i in kept)
    if min(n_id, n_ood) < max(min_conclusive(rows[i]) for i in kept):
        for i in kept:
            ranks[i] = f"no rank ({n_id} + {n_ood} images)"
        return ranks
    try:
        got = rank_ranges([float(values[i]) for i in kept], [arrays[i] for i in kept], bench.seed,
                          f"leaderboard|{ood_set}", bench.evaluation.ci_resamples)
    except ValueError:  # the worst cases do not hold the same images: nothing to pair
        return ranks
    for i, (best, worst) in zip(kept, got):
        ranks[i] = rank_label(best, worst)
    return ranks


def own(got: Loaded, ood_set: str) -> dict[str, Any] | None:
    """The entry's robust row on ``ood_set``."""
    return (got.entry.get("robust") or {}).get(ood_set)


def interval(row: dict[str, Any] | None, metric: str) -> str:
    """``value [lo, hi]`` with one decimal ("" without a value)."""
    if not row or row.get(metric) is None:
        return ""
    lo, hi = row.get(f"{metric}_lo"), row.get(f"{metric}_hi")
    return f"{row[metric]:.1f}" + ("" if lo is None or hi is None else f" [{lo:.1f}, {hi:.1f}]")


def table(bench: Benchmark, cells: dict[tuple, list[Loaded]], cache: dict[Path, Any]) -> pd.DataFrame:
    """One benchmark's table: a row per cell (its first entry), the columns of the module docstring."""
    firsts = [entries[0] for entries in cells.values()]
    records: list[dict[str, Any]] = [{} for _ in firsts]
    for rec, got in zip(records, firsts):
        m, clean = got.entry["model"], got.entry.get("clean") or {}
        rec.update({"model": m["name"], "checkpoint": m.get("checkpoint") or "",
                    "detector": got.entry["detector"]["name"], "clean accuracy": interval(m, "clean_acc")})
        for group in ("near", "far"):
            if (clean.get(group) or {}).get(f"{group}_auroc") is not None:
                rec[f"clean AUROC {group}"] = interval(clean[group], f"{group}_auroc")
    for s in bench.ood:
        ranks = paired_ranks(firsts, s.name, bench, cache)
        for rec, got, rank, entries in zip(records, firsts, ranks, cells.values()):
            row = own(got, s.name)
            flags = []
            found = [own(e, s.name)["robust_auroc"] for e in entries if (own(e, s.name) or {}).get("robust_auroc")
                     is not None]
            best = min(found) if found else None
            if row and best is not None and row.get("robust_auroc_lo") is not None and best < row["robust_auroc_lo"]:
                flags.append("unreliable")
            if row and row.get("masking_suspected"):
                flags.append("masking suspected")
            if row is None:
                flags.append("no robust row")
            rec.update({f"{s.name} rank": rank, f"{s.name} robust AUROC": interval(row, "robust_auroc"),
                        f"{s.name} best known": "" if best is None else f"{best:.1f}",
                        f"{s.name} ID-only": interval(row, "id_attacked_auroc"),
                        f"{s.name} OOD-only": interval(row, "ood_attacked_auroc"),
                        f"{s.name} evaluations": len(entries)})
            rec["flags"] = ", ".join(filter(None, [rec.get("flags", ""), *(f"{s.name}: {f}" for f in flags)]))
    for rec, got in zip(records, firsts):
        rec["wall s"] = "" if got.entry.get("wall_s") is None else f"{got.entry['wall_s']:.0f}"
        rec["run"] = got.entry["run"]["folder"]
    return pd.DataFrame(records)


SCRIPT = """
function sortBy(th){const t=th.closest('table'),i=[...th.parentNode.children].indexOf(th),b=t.tBodies[0];
const up=th.dataset.dir!=='asc';th.parentNode.querySelectorAll('th').forEach(h=>delete h.dataset.dir);
th.dataset.dir=up?'asc':'desc';const key=r=>{const s=r.children[i].textContent.trim(),n=parseFloat(s);
return isNaN(n)?s:n;};[...b.rows].sort((x,y)=>{const a=key(x),c=key(y);
const o=(typeof a===typeof c)?(a<c?-1:a>c?1:0):(typeof a==='number'?-1:1);return up?o:-o;})
.forEach(r=>b.appendChild(r));}
function filterRows(box){const q=box.value.toLowerCase();
document.querySelectorAll('#board tbody tr').forEach(r=>{r.hidden=!r.textContent.toLowerCase().includes(q);});}
document.querySelectorAll('#board th').forEach(th=>th.addEventListener('click',()=>sortBy(th)));
document.getElementById('filter').addEventListener('input',e=>filterRows(e.target));
"""
STYLE = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
         "padding:3px 6px;font-size:13px}th{cursor:pointer;background:#eee}th[data-dir=asc]::after{content:' \\25B2'}"
         "th[data-dir=desc]::after{content:' \\25BC'}")


def page(bench: Benchmark, frame: pd.DataFrame) -> str:
    """The self-contained HTML page of one benchmark: the table, sortable (click a heading) and filterable in the
    browser, no server, no external file."""
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r) + "</tr>"
                   for r in frame.itertuples(index=False))
    esc = html.escape
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{esc(bench.key)} robust-OOD "
            f"leaderboard</title><style>{STYLE}</style></head><body>\n<h1>{esc(bench.key)}</h1>\n"
            f"<p>{esc(bench.summary())}</p>\n<p>Robust AUROC (%) of the per-image worst case over the standard "
            "ensemble, both sides attacked, with its 95 % interval; <em>rank</em>: the range of places the entry can "
            "take (1-3: any of the first three) by paired bootstrap tests on the benchmark's images, Holm-adjusted "
            "over every pair of the set; <em>not compared</em>: no shared images to pair; <em>no rank</em>: fewer "
            "images than the runs' min_conclusive; <em>best known</em>: the lowest robust AUROC any entry of the "
            "cell found; <em>unreliable</em>: the best known lies below the entry's interval. How to add an entry: "
            "docs/leaderboard.md.</p>\n<p><label>Filter: <input id=\"filter\" type=\"search\"></label></p>\n"
            f"<table id=\"board\"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>\n"
            f"<script>{SCRIPT}</script>\n</body></html>\n")


def write_site(board: Board, out: Path) -> list[Path]:
    """Per benchmark ``<name>-<version>.html``, ``.csv``, ``.md`` and ``.tex`` under ``out``, and ``index.html``
    linking them; the pages written."""
    from advopenood.outputs.latex import latex_table

    out.mkdir(parents=True, exist_ok=True)
    cache: dict[Path, Any] = {}
    pages = []
    for key in sorted(board.rows):
        bench = by_key(key)
        assert bench is not None  # load() kept shipped benchmarks only
        frame = table(bench, board.rows[key], cache)
        stem = f"{bench.name}-{bench.version}"
        aio.write_text(out / f"{stem}.html", page(bench, frame))
        aio.write_csv(out / f"{stem}.csv", frame)
        aio.write_text(out / f"{stem}.md", f"# {key}\n\n{bench.summary()}\n\n{aio.markdown_table(frame)}\n")
        aio.write_text(out / f"{stem}.tex", latex_table(frame.astype(str), stem, f"{key} robust-OOD leaderboard"))
        pages.append(out / f"{stem}.html")
    links = "".join(f"<li><a href=\"{p.name}\">{html.escape(p.stem)}</a></li>" for p in pages)
    aio.write_text(out / "index.html", "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>"
                   "advopenood robust-OOD leaderboard</title></head><body><h1>Robust-OOD leaderboard</h1><p>One table "
                   f"per benchmark and version.</p><ul>{links}</ul></body></html>\n")
    return pages


def drop(board: Board, failed: list[tuple[Loaded, str]]) -> None:
    """``board`` without the entries that failed verification (a cell left empty goes too)."""
    gone = {id(got) for got, _ in failed}
    for key, cells in board.rows.items():
        board.rows[key] = {cell: kept for cell, entries in cells.items()
                           if (kept := [e for e in entries if id(e) not in gone])}


def cmd_leaderboard(paths: list[str], out: str, verify: bool = False) -> int:
    """The command: each refused entry one line on stderr; every entry's run folder passes ``advopenood verify``
    (:func:`verify_entries`). ``--verify``: each entry re-derived from it too, every finding one line, exit 1 on any
    (bad entries included), no page; else the site of the entries that passed, exit 2 when an entry was refused or
    its run folder failed (the others are on the page)."""
    import sys

    board = load(paths)
    for line in board.problems:
        print(f"advopenood: error: {line}", file=sys.stderr)
    found = verify_entries(board, fields=verify)
    if verify:
        for _, line in found:
            print(f"advopenood leaderboard: DIFFERENCE: {line}")
        n = sum(len(e) for cells in board.rows.values() for e in cells.values())
        print(f"advopenood leaderboard: {n} entr{'y' if n == 1 else 'ies'} checked, {len(found)} difference(s), "
              f"{len(board.problems)} refused")
        return 1 if found or board.problems else 0
    for _, line in found:
        print(f"advopenood: error: {line} (left out of the page)", file=sys.stderr)
    drop(board, found)
    board.problems += [line for _, line in found]
    pages = write_site(board, Path(out))
    for p in pages:
        print(f"advopenood: wrote {p}")
    return 2 if board.problems else 0
