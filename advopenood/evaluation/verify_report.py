"""``advopenood verify``'s check of the report: every sentence of ``report_sections.json`` is rendered again from
the run's tables with the writer's own code, and ``report.md`` and ``report.html`` again from those sections and
``run.json``; whatever the report holds that these renderings do not is a difference (a bullet, a paragraph or a
heading added or edited, anywhere, even with ``manifest.json`` written again for it).

Two steps, so that each difference is named once:

* The sections are re-derived (:func:`rederive_sections`): the core's attack success rates from ``asr.csv``
  (:func:`advopenood.outputs.report.asr_section`), each evaluator's and analysis' from its tables through its
  ``report_sections`` (a function ``report_sections(run) -> list[Section]`` set on the plugin: the builder its run
  uses; the ood evaluator has one), the "nothing to compute" sections from ``run.json``. Every sentence of the
  saved sections (titles, paragraphs, list items and captions, table and figure captions: the tables' cells are
  the CSVs', which the hooks re-derive) must be one of the re-derivation (:func:`compare_sentences`), and every
  claim a re-derived section shows must be in ``claims.json`` (:func:`claims_stated`), where
  :mod:`advopenood.evaluation.verify_claims` checks it against its table. A plugin without ``report_sections``
  keeps its saved sections (a note: their plain sentences are taken as saved; their claims are checked still).
* The report is rendered from ``run.json`` and the saved sections (:func:`advopenood.outputs.report.build_report`,
  :func:`~advopenood.outputs.report.to_markdown`, :func:`~advopenood.outputs.report.to_html`): the fixed text
  (headings, captions, explanatory paragraphs) is the writer's templates, never a list kept here. A line of
  ``report.md`` that the rendering does not hold is a difference naming it (a table row as a row), and so is a
  rendered line it lacks; ``report.html`` must be the rendering, its inline plots aside (each is a plot file of the
  folder, checked by its digest).
"""
from __future__ import annotations

import difflib
import os
import re
import warnings
from dataclasses import dataclass, field
from typing import Callable, Sequence

import pandas as pd

from advopenood import registry
from advopenood.claims import CLAIMS_FILE, STATED, parse_claims
from advopenood.errors import UsageError
from advopenood.evaluation.runfiles import RunFiles, Unreadable, walk
from advopenood.outputs.plots import PLOT_DIR
from advopenood.outputs.report import asr_section, build_report, to_html, to_markdown
from advopenood.outputs.results import (SECTIONS_FILE, Bullets, Figure, Paragraph, Section, Table, nothing_section,
                                        parse_sections)

#: the lines of one file that are named one by one; the rest are counted
MAX_LINES = 20
#: a plot inline in report.html: compared apart (each is a plot file of the folder, checked by its digest)
INLINE = re.compile(r'src="data:image/png;base64,[A-Za-z0-9+/=]*"')
#: what a plugin's section builder may raise on tables an edit left unreadable (a difference, never a traceback)
_BUILD_ERRORS = (Unreadable, KeyError, ValueError, TypeError, IndexError, AttributeError, OSError)


def _saved(run: RunFiles) -> tuple[list[Section] | None, list[str]]:
    """The sections of ``report_sections.json`` ([] without one), or None and the line that says why they cannot
    be read."""
    if run.problem(SECTIONS_FILE) == "missing":
        return [], []
    try:
        return parse_sections(run.text(SECTIONS_FILE), run.path), []
    except Unreadable as exc:
        return None, [f"{exc}; the report's sections cannot be compared"]
    except ValueError as exc:
        return None, [f"{SECTIONS_FILE}: {exc}; the report's sections cannot be compared"]


def _builder(kind: str, name: str) -> Callable[[RunFiles], list[Section]] | None:
    """The plugin's ``report_sections``, None when it declares none or cannot be loaded."""
    try:
        obj = registry.get(kind, name)
    except UsageError:
        return None
    build = getattr(obj, "report_sections", None)
    return build if callable(build) else None


@dataclass
class _Reading(RunFiles):
    """The run's files, recording the tables a section builder reads."""

    read: set[str] = field(default_factory=set)

    def table(self, name: str, needs: Sequence[str] = ()) -> pd.DataFrame:
        self.read.add(name)
        return super().table(name, needs)


@dataclass(frozen=True)
class Rederived:
    """The report's sections re-derived from the run's files (:func:`rederive_sections`): ``sections`` in the run's
    order, ``reads`` the tables each source's sections were built from, and the ``differences`` and ``notes`` of
    building them."""

    sections: list[Section]
    reads: dict[str, set[str]]
    differences: list[str]
    notes: list[str]


def rederive_sections(run: RunFiles, saved: list[Section]) -> Rederived:
    """The report's sections re-derived from the run's files (module docstring); ``saved`` stands in for a plugin
    that declares no ``report_sections`` (a note) or whose builder fails on the tables (a difference)."""
    sections: list[Section] = []
    reads: dict[str, set[str]] = {"core": {"asr.csv"}}
    diffs: list[str] = []
    notes: list[str] = []
    if run.has("asr.csv"):
        try:
            asr = run.table("asr.csv")
            sections += [asr_section(asr)] if len(asr) else []
        except _BUILD_ERRORS as exc:
            diffs.append(f"report: the attack success rates cannot be rendered from asr.csv ({type(exc).__name__}: "
                         f"{exc})")
    failed = run.info.get("plugin_errors") or {}
    nothing = run.info.get("nothing_computed") or {}
    for kind, singular in (("evaluators", "evaluator"), ("analyses", "analysis")):
        for name in run.config.get(kind) or []:
            label = f"{singular}:{name}"
            if label in failed:
                continue
            parts = [nothing_section(k, str(v)) for k, v in nothing.items() if k.startswith(f"{label}:")]
            own = [s for s in saved if s.source == name or s.source.startswith(f"{name}:")]
            build = _builder(kind, name)
            if label in nothing:
                sections += [nothing_section(label, str(nothing[label])), *parts]
                continue
            if build is None:
                sections += own
                notes.append(f"report: {singular} {name!r} declares no report_sections; the plain sentences of its "
                             "sections are taken as saved, unchecked against its tables (its claims are checked in "
                             "claims.json)")
                continue
            reading = _Reading(run.path, run.info)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    built = build(reading)
            except _BUILD_ERRORS as exc:
                diffs.append(f"report: the sections of {singular} {name!r} cannot be rendered from its tables "
                             f"({type(exc).__name__}: {exc})")
                sections += own
                continue
            reads[name] = reading.read
            sections += [Section(s.title, s.items, s.source or name, s.headline) for s in built] + parts
    return Rederived(sections, reads, diffs, notes)


def sentences(section: Section) -> list[str]:
    """The text of a section apart from its tables' cells: its title, paragraphs, list captions and items, table
    and figure captions."""
    texts = [section.title]
    for item in section.items:
        if isinstance(item, Paragraph):
            texts.append(item.text)
        elif isinstance(item, Bullets):
            texts += [item.caption, *item.items]
        elif isinstance(item, Table):
            texts += [item.caption, item.whole]
        elif isinstance(item, Figure):
            texts.append(item.label)
    return [t for t in texts if t]


def compare_sentences(saved: list[Section], sections: list[Section]) -> list[str]:
    """One line per sentence of the saved sections that their re-derivation does not hold (a section or a table it
    reads was edited), and per re-derived sentence the saved ones lack; tables' cells aside (the tables are the
    CSVs', which the hooks re-derive)."""
    have = [(s.title, t) for s in saved for t in sentences(s)]
    want = [(s.title, t) for s in sections for t in sentences(s)]
    lines = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, want, have, autojunk=False).get_opcodes():
        if tag in ("replace", "insert"):
            lines += [f"{SECTIONS_FILE}: section {title!r}: {text!r} is not a sentence the run's files render (the "
                      "section, or a table it reads, was edited)" for title, text in have[j1:j2]]
        elif tag == "delete":
            lines += [f"{SECTIONS_FILE}: section {title!r} lacks {text!r}, which the run's files render"
                      for title, text in want[i1:i2]]
    return _capped(lines, SECTIONS_FILE)


def claims_stated(saved: list[Section], sections: list[Section], run: RunFiles) -> list[str]:
    """A claim of a re-derived section whose sentence the saved report shows must be a claim of ``claims.json``
    (there :mod:`~advopenood.evaluation.verify_claims` checks it against its table, field for field): one line per
    such sentence that no claim of claims.json has, one in all when there is no claims.json (a claims.json that
    cannot be read is verify_claims' finding)."""
    shown = {t for s in saved for t in sentences(s)}
    stated = [(s, c) for s in sections for c in s.claims if c.text in shown]
    problem = run.problem(CLAIMS_FILE)
    if problem == "missing":
        return [f"{CLAIMS_FILE}: missing, so none of the {len(stated)} claims the report states is checked"] \
            if stated else []
    try:
        held = {c.get("text") for c in parse_claims(run.text(CLAIMS_FILE))["claims"]}
    except (Unreadable, ValueError):
        return []
    return [f"{CLAIMS_FILE}: lacks the claim {c.text!r} of the report's section {s.title!r} (re-derived from "
            f"{c.table})" for s, c in stated if c.text not in held]


def _capped(lines: list[str], what: str) -> list[str]:
    """The first :data:`MAX_LINES` lines and one that counts the rest."""
    rest = len(lines) - MAX_LINES
    return lines[:MAX_LINES] + ([f"{what}: and {rest} more line(s) that differ from the rendering"] if rest > 0 else [])


def compare_markdown(written: str, rendered: str) -> list[str]:
    """One line per line of ``report.md`` (``written``) that the rendering does not hold (a table row named as
    one), and per rendered line it lacks; blank lines aside."""
    want, have = rendered.splitlines(), written.splitlines()
    if len(have) > 4 * len(want) + 1000:  # no line-by-line comparison of a file that is mostly not the report
        return [f"report.md: {len(have)} lines, the report's rendering of the run's files {len(want)}: not the report"]
    lines = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, want, have, autojunk=False).get_opcodes():
        for line in (have[j1:j2] if tag in ("replace", "insert") else []):
            if not line.strip():
                continue
            if line.startswith("|"):
                lines.append(f"report.md: table row {line!r}: not a row of the report's tables as the run's files "
                             "render them")
                continue
            text = line[2:] if line.startswith("- ") else line
            kind = "a stated comparison" if STATED.search(text) else "a sentence"
            lines.append(f"report.md: {text!r}: not the sentence of any claim of claims.json, nor a line the report "
                         f"renders from the run's files ({kind} added or edited by hand)")
        lines += [f"report.md: {line!r} is missing (the report renders it from the run's files)"
                  for line in (want[i1:i2] if tag == "delete" else []) if line.strip()]
    return _capped(lines, "report.md")


def _unreadable_plots(run: RunFiles, saved: list[Section]) -> str:
    """Why the report cannot be rendered here ("" when it can): an entry under ``plots/`` that is not a regular
    file (the report would show and read it), or a saved figure that is not a file of the folder verify reads."""
    _, others = walk(run.path)
    odd = next((rel for rel in others if rel.startswith(f"{PLOT_DIR}/")), None)
    if odd is not None:
        return f"{odd} is {others[odd]}"
    for path in (p for s in saved for p in s.figures):
        rel = os.path.normpath(os.path.relpath(path, run.path)).replace(os.sep, "/")
        if rel.startswith("../") or os.path.isabs(rel):
            return f"figure {str(path)!r} lies outside the folder"
        if run.problem(rel):
            return f"figure {rel} is {run.problem(rel)}"
    return ""


def _unchanged(sections: list[Section], rederived: Rederived, changed: set[str]) -> tuple[list[Section], set[str]]:
    """The sections whose tables verify found as the run wrote them, and the sources of the others."""
    stale = {source for source, read in rederived.reads.items() if read & changed}
    root = lambda s: s.source.split(":")[0]  # noqa: E731  (a skipped part's section is its plugin's)
    return [s for s in sections if root(s) not in stale], stale


def verify_report(run: RunFiles, changed: set[str] = frozenset()) -> tuple[list[str], list[str]]:
    """``(differences, notes)`` of the report against its rendering from the run's files (module docstring); a
    folder without ``report.md`` (an attack-only run) has none. ``changed``: the files that other checks found
    not as the run wrote them; the sentences of a section built from one of them are not compared, nor is the
    report when ``run.json`` is one (a note: that file's difference is named already)."""
    if run.problem("report.md") == "missing":
        return [], []
    if "run.json" in changed:
        return [], ["report: not rendered again: run.json, which it renders, is not as the run wrote it"]
    saved, lines = _saved(run)
    if saved is None:
        return lines, []
    rederived = rederive_sections(run, saved)
    diffs, notes = list(rederived.differences), list(rederived.notes)
    sections, stale = _unchanged(rederived.sections, rederived, changed)
    kept = [s for s in saved if s.source.split(":")[0] not in stale]
    notes += [f"report: the sentences of {source!r}'s sections are not compared with their tables: "
              f"{', '.join(sorted(rederived.reads[source] & changed))} not as the run wrote them"
              for source in sorted(stale)]
    diffs += compare_sentences(kept, sections) + claims_stated(kept, sections, run)
    why = _unreadable_plots(run, saved)
    if why:
        return diffs, notes + [f"report.md and report.html are not rendered again: {why} (a file finding)"]
    blocks = build_report(run.path, run.info, saved)
    try:
        diffs += compare_markdown(run.text("report.md"), to_markdown(blocks, run.path))
    except Unreadable as exc:
        diffs.append(f"{exc}; it cannot be compared with its rendering")
    if run.has("report.html"):
        try:
            written, rendered = run.text("report.html"), to_html(blocks)
        except Unreadable as exc:
            return diffs + [f"{exc}; it cannot be compared with its rendering"], notes
        written, rendered = (INLINE.sub('src="data:image/png;base64,"', h) for h in (written, rendered))
        if written != rendered:
            at = len(os.path.commonprefix([written, rendered]))
            diffs.append(f"report.html: not the report's rendering of the run's files (the first difference at "
                         f"character {at}: {written[at:at + 80]!r})")
    return diffs, notes
