"""What an evaluator or analysis hands back to the core: tables, figures and report sections.

A plugin is called as ``plugin(ctx)`` and returns a :class:`Results` (a plain ``dict`` of file name ->
DataFrame is read as ``Results(tables=...)``):

* ``tables``: file name under the run's output folder -> DataFrame; the core writes each atomically by its
  suffix (``.csv``, ``.md``, ``.json``, ``.parquet``; a CSV without a ``protocol`` column gets the run's).
* ``figures``: the files the plugin wrote itself under the output folder (plots through
  :func:`advopenood.io.save_figure` into ``ctx.plot_dir``); the core checks they exist.
* ``sections``: the plugin's part of the report, each a :class:`Section` (a title and an ordered list of
  :class:`Paragraph`, :class:`Table`, :class:`Bullets` and :class:`Figure` items) whose text the plugin
  generates from its own numbers.

The core never reads a plugin's files to build the report: it saves every run's sections in
``report_sections.json`` (figure paths relative to the output folder) and renders ``report.md`` /
``report.html`` from that file (:func:`advopenood.outputs.report.write_report`), so a report can be rendered again from
an output folder alone.
"""
from __future__ import annotations

import io
import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Union

import pandas as pd

from advopenood import io as aio
from advopenood.claims import Claim

SECTIONS_FILE = "report_sections.json"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Paragraph:
    """A paragraph of plain text."""

    text: str


@dataclass(frozen=True)
class Bullets:
    """A bulleted list (the readings of a table, one sentence each); ``caption`` introduces it when given. An item
    may be a :class:`~advopenood.claims.Claim`: its sentence is shown (:attr:`Claim.text`) and the claim is kept in
    ``claims``, which the core writes to ``claims.json`` for ``advopenood verify``."""

    items: tuple[str, ...]
    caption: str = ""
    claims: tuple[Claim, ...] = ()

    def __init__(self, items: Any, caption: str = "") -> None:
        items = list(items)
        object.__setattr__(self, "items", tuple(s.text if isinstance(s, Claim) else str(s) for s in items))
        object.__setattr__(self, "caption", caption)
        object.__setattr__(self, "claims", tuple(s for s in items if isinstance(s, Claim)))


@dataclass(frozen=True, eq=False)
class Table:
    """A table shown as is (cells formatted by the renderer); a named index becomes the first column. ``whole``:
    the file (relative to the output folder, a CSV) that holds all of it; a long table with one is shown as its
    first rows (the plugin orders them, top first) and a link (:data:`advopenood.outputs.report.MAX_ROWS`)."""

    frame: pd.DataFrame
    caption: str = ""
    whole: str = ""


@dataclass(frozen=True)
class Figure:
    """An image file under the run's output folder (PNG); ``caption`` defaults to the file's stem."""

    path: Path
    caption: str = ""

    @property
    def label(self) -> str:
        return self.caption or Path(self.path).stem.replace("_", " ")


Item = Union[Paragraph, Bullets, Table, Figure]


@dataclass(frozen=True)
class Section:
    """One ``##`` section of the report: ``title`` and its ``items`` in display order; ``source`` names the
    plugin that made it (set by the core). A ``headline`` section opens the report (the first screen); the others
    follow it, folded in the HTML."""

    title: str
    items: tuple[Item, ...] = ()
    source: str = ""
    headline: bool = False

    def __init__(self, title: str, items: Any = (), source: str = "", headline: bool = False) -> None:
        object.__setattr__(self, "title", str(title))
        object.__setattr__(self, "items", tuple(items))
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "headline", bool(headline))
        bad = [type(i).__name__ for i in self.items if not isinstance(i, (Paragraph, Bullets, Table, Figure))]
        if bad:
            raise TypeError(f"section {title!r} holds a {bad[0]}; valid items: Paragraph, Bullets, Table, Figure")

    @property
    def figures(self) -> list[Path]:
        return [Path(i.path) for i in self.items if isinstance(i, Figure)]

    @property
    def claims(self) -> list[Claim]:
        """The claims among the section's bullets, in order."""
        return [c for i in self.items if isinstance(i, Bullets) for c in i.claims]


@dataclass
class Results:
    """What one evaluator or analysis returns (see the module docstring)."""

    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    figures: list[Path] = field(default_factory=list)
    sections: list[Section] = field(default_factory=list)
    #: why the plugin has nothing to compute in this run (e.g. the attacks it needs); when it returns no table,
    #: figure or section the core states this in the report, on stderr and in ``run.json`` (``nothing_computed``)
    empty_reason: str = ""
    #: parts of the plugin's work that had nothing to compute while the rest did (part -> why, e.g. an ensemble
    #: with one attack to combine): stated like a plugin with nothing to compute, as ``<label>:<part>``
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        """Whether there is no table, figure or section."""
        return not (self.tables or self.figures or self.sections)

    def __getitem__(self, fname: str) -> pd.DataFrame:
        """The table written as ``fname`` (``outputs["ood.csv"]``)."""
        return self.tables[fname]

    def __contains__(self, fname: object) -> bool:
        return fname in self.tables


def as_results(result: Results | Mapping[str, pd.DataFrame] | None) -> Results:
    """A plugin's return value as :class:`Results` (a mapping is its tables; None is nothing)."""
    if isinstance(result, Results):
        return result
    if result is None:
        return Results()
    if isinstance(result, Mapping):
        return Results(tables=dict(result))
    raise TypeError(f"a plugin returned {type(result).__name__}; valid choices: Results or dict[str, DataFrame]")


def nothing_section(label: str, reason: str) -> Section:
    """The core's section for a plugin (``evaluator:<name>``) that returned nothing: what it had to compute with."""
    kind, _, name = label.partition(":")
    return Section(f"{name}: nothing to compute", [Paragraph(
        f"The {kind} {name} ran but had nothing to compute in this run, so it wrote no table: {reason}.")],
        source=name)


def guarded(title: str, make: Callable[[], list[Section]]) -> list[Section]:
    """``make()``; a table with unexpected content gives one section with a one-line note (and a warning)
    instead of losing the run's report."""
    try:
        return make()
    except (KeyError, ValueError, TypeError, IndexError, AttributeError) as exc:
        warnings.warn(f"advopenood: report section {title!r} left out: {exc!r}", stacklevel=2)
        return [Section(title, [Paragraph(f"This section could not be rendered: {exc!r}.")])]


def as_written(table: pd.DataFrame, protocol: str | None = None) -> pd.DataFrame:
    """``table`` as its CSV reads back (:func:`write_tables`: 6 significant digits, the run's ``protocol`` added
    when absent): a section built from it shows exactly what the CSV holds."""
    if protocol is not None and "protocol" not in table.columns:
        table = table.assign(protocol=protocol)
    try:
        return pd.read_csv(io.StringIO(table.infer_objects().to_csv(index=False, float_format="%.6g")))
    except pd.errors.EmptyDataError:
        return pd.DataFrame()


def write_tables(out: Path, tables: Mapping[str, pd.DataFrame], protocol: str) -> list[Path]:
    """Write each table atomically under ``out`` by suffix; a CSV or Markdown table without ``protocol`` gets the
    run's, so a table pasted from either says how it was made."""
    written = []
    for fname, table in tables.items():
        path = Path(out) / fname
        if fname.endswith((".csv", ".md")) and "protocol" not in table.columns:
            table = table.assign(protocol=protocol)
        aio.write_table(path, table)
        written.append(path)
    return written


def collect(out: Path, result: Results | Mapping[str, pd.DataFrame] | None, protocol: str, source: str) -> list[Section]:
    """Write a plugin's tables, check its figures exist under ``out``, and return its sections tagged with
    ``source``."""
    outputs = as_results(result)
    write_tables(out, outputs.tables, protocol)
    for path in [*outputs.figures, *(p for s in outputs.sections for p in s.figures)]:
        if not (Path(out) / relative(path, out)).is_file():
            raise FileNotFoundError(f"plugin {source!r} lists figure {path} but did not write it")
    return [Section(s.title, s.items, s.source or source, s.headline) for s in outputs.sections]


# ------------------------------------------------------------------------------------ report_sections.json

def relative(path: Path, out: Path) -> str:
    """``path`` relative to the output folder ``out`` (posix); a ValueError when it lies outside.

    A relative ``path`` is read from the working directory when that puts it under ``out`` (a figure written to
    ``ctx.plot_dir`` of a run whose ``--out`` is relative, as in ``--out runs/demo``), else as relative to ``out``.
    """
    path = Path(path)
    if not path.is_absolute() and not path.resolve().is_relative_to(Path(out).resolve()):
        return path.as_posix()
    try:
        return path.resolve().relative_to(Path(out).resolve()).as_posix()
    except ValueError:
        raise ValueError(f"figure {path} is not under the run's output folder {out}") from None


def _cell(value: Any) -> Any:
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _table_dict(frame: pd.DataFrame) -> dict[str, Any]:
    if frame.index.name is not None:
        frame = frame.reset_index()
    return {"columns": [str(c) for c in frame.columns],
            "rows": [[_cell(v) for v in row] for row in frame.itertuples(index=False, name=None)]}


def item_to_dict(item: Item, out: Path) -> dict[str, Any]:
    """One item as JSON (figures relative to ``out``)."""
    if isinstance(item, Paragraph):
        return {"kind": "paragraph", "text": item.text}
    if isinstance(item, Bullets):
        return {"kind": "bullets", "items": list(item.items), "caption": item.caption}
    if isinstance(item, Table):
        return {"kind": "table", "caption": item.caption, **({"whole": item.whole} if item.whole else {}),
                **_table_dict(item.frame)}
    return {"kind": "figure", "path": relative(item.path, out), "caption": item.label}


def item_from_dict(data: Mapping[str, Any], out: Path) -> Item:
    """The inverse of :func:`item_to_dict` (figure paths resolved under ``out``)."""
    kind = data.get("kind")
    if kind == "paragraph":
        return Paragraph(str(data["text"]))
    if kind == "bullets":
        return Bullets(data["items"], str(data.get("caption", "")))
    if kind == "table":
        frame = pd.DataFrame(data["rows"], columns=data["columns"], dtype=object)
        return Table(frame, str(data.get("caption", "")), str(data.get("whole", "")))
    if kind == "figure":
        return Figure(Path(out) / str(data["path"]), str(data.get("caption", "")))
    raise ValueError(f"unknown report item kind {kind!r}; valid choices: paragraph, bullets, table, figure")


def write_sections(out: Path, sections: list[Section]) -> Path:
    """Save ``sections`` as ``<out>/report_sections.json`` (atomically)."""
    path = Path(out) / SECTIONS_FILE
    aio.write_json(path, {"format": FORMAT_VERSION, "sections": [
        {"title": s.title, "source": s.source, **({"headline": True} if s.headline else {}),
         "items": [item_to_dict(i, out) for i in s.items]} for s in sections]})
    return path


def parse_sections(text: str, out: Path) -> list[Section]:
    """The sections of a ``report_sections.json``'s ``text`` (figures resolved under ``out``); a ValueError with one
    line that says what is wrong when it is not the file a run writes."""
    try:
        data = json.loads(text)
        sections = data["sections"]
        return [Section(s["title"], [item_from_dict(i, out) for i in s.get("items", [])], s.get("source", ""),
                        bool(s.get("headline", False))) for s in sections]
    except ValueError as exc:
        raise ValueError(f"not the file a run writes ({exc})") from None
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not the file a run writes ({type(exc).__name__}: {exc})") from None


def read_sections(out: Path) -> list[Section]:
    """The sections saved in ``<out>/report_sections.json`` (:func:`parse_sections`), [] when there is none."""
    path = Path(out) / SECTIONS_FILE
    if not path.is_file():
        return []
    return parse_sections(path.read_text(), out)
