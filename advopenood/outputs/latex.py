"""``tables.tex``: a run's tables as LaTeX to paste into a paper: ``booktabs`` rules, numbers in ``siunitx``
``S`` columns (aligned on the decimal point, the report's fixed decimals per column), budgets as ``k/255`` where
they are a whole number of grey values.

By default (``--latex headline``) it holds the headline tables (the report's headline sections' tables, e.g. AUROC
per detector and set) and the core's ``asr.csv``; ``--latex all`` adds every other CSV of the run. Every float fits
the ``\\linewidth`` of a one-column and of a two-column ``article`` (a column of :data:`COLUMN_PT` points) at its
own size, never scaled: an estimate with its 95 % interval is a two-line cell (the estimate, then ``[lo, hi]`` and
any rank below it in ``\\footnotesize``; a CSV's ``x``, ``x_lo``, ``x_hi`` are one such cell), a column that holds
one value in every row goes into the caption, and a table wider than a column is split into several floats by
columns (the row keys repeated), one longer than :data:`PAGE_ROWS` rows into several by rows (no ``longtable``,
which a two-column document refuses). ``tests/test_latex.py`` compiles the demo's with pdflatex.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from advopenood import io as aio
from advopenood.outputs.names import displayed
from advopenood.outputs.report import eps_label, format_column
from advopenood.outputs.results import Table, read_sections

LATEX_FILE = "tables.tex"
#: LaTeX modes: the headline tables only, or every CSV too
MODES = ("headline", "all")
#: data rows a float holds (a longer table is split into several floats by rows)
PAGE_ROWS = 40
#: the narrowest ``\linewidth`` a float must fit, in points: a column of a two-column ``article`` at 10 pt
#: ((410 pt - 10 pt) / 2); a one-column one's is 345 pt
COLUMN_PT = 200.0
#: estimated widths, in points per character, of a cell's text in ``\small`` and ``\footnotesize`` (Computer
#: Modern's digits are half an em; a little over, so that an estimate errs on the wide side)
SMALL_PT, FOOTNOTE_PT = 4.6, 3.8
#: the space between columns, each side (``\tabcolsep``), in points
TABCOLSEP_PT = 4.0
#: a text column wider than this (points) is set in a ``p`` column of this width, its names broken after ``_`` and
#: ``-`` (a robust run's ``robust_apgd_aux_ood_<detector>-<set>`` would not leave room for a number beside it)
WRAP_PT = 80.0
#: floats between two ``\clearpage`` in a file of more: LaTeX holds at most 18 floats it has not placed ("Too many
#: unprocessed floats"), and a run with many sets has more
FLUSH_FLOATS = 10
#: the core's own table, in the headline tables
CORE_TABLES = ("asr.csv",)
_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
            "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}
#: a headline cell: an estimate, its interval and anything after it (a rank), e.g. ``97.3 [96.1, 98.3] #7-12``
_INTERVAL = re.compile(r"^\s*(?P<est>-?\d+(?:\.\d+)?)?\s*\[(?P<lo>-?\d+(?:\.\d+)?), (?P<hi>-?\d+(?:\.\d+)?)\]"
                       r"\s*(?P<rest>.*?)\s*$")
_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?$")


def escape(text: str) -> str:
    """``text`` with LaTeX's special characters escaped."""
    return "".join(_SPECIAL.get(c, c) for c in text)


def _column(name: str, values: list) -> list[str]:
    """A column's cells: an ``eps`` column as budgets (``16/255``, empty for none), others with the column's
    decimals (:func:`advopenood.outputs.report.format_column`)."""
    if name == "eps" or name.endswith("_eps"):
        return [eps_label(v) for v in values]
    return format_column(values)


@dataclass
class Column:
    r"""One column of a float: its header and, per row, the first line (``main``, a number where ``numeric``; beside
    it ``rank``, in a column of its own) and the second (``below``: an interval, ``\footnotesize``, across both;
    empty for a one-line column)."""

    header: str
    main: list[str]
    below: list[str] = field(default_factory=list)
    numeric: bool = False
    rank: list[str] = field(default_factory=list)

    @property
    def wraps(self) -> bool:
        """Whether it is a text column wider than :data:`WRAP_PT`, set in a ``p`` column of that width."""
        return not self.numeric and not self.below and max(map(len, [self.header, *self.main])) * SMALL_PT > WRAP_PT

    def width(self) -> float:
        """Its estimated width in points, the space between columns included."""
        if self.wraps:
            return WRAP_PT + 2 * TABCOLSEP_PT
        first = max([len(self.header) * SMALL_PT] + [len(c) * SMALL_PT + len(r) * FOOTNOTE_PT
                                                     for c, r in zip(self.main, self.rank or [""] * len(self.main))])
        return max(first, max((len(c) for c in self.below), default=0) * FOOTNOTE_PT) + 2 * TABCOLSEP_PT

    def spec(self) -> str:
        """Its column type: ``S`` sized to its numbers (``table-format``), with an ``l`` for the rank beside it;
        else ``l``, or a ragged-right ``p`` column of :data:`WRAP_PT` for a wide text column."""
        if self.wraps:
            return f">{{\\raggedright\\arraybackslash}}p{{{WRAP_PT:g}pt}}"
        if not self.numeric:
            return "l"
        numbers = [c for c in self.main if _NUMBER.match(c)]
        whole = max((len(c.split(".")[0].lstrip("-")) for c in numbers), default=1)
        places = max((len(c.split(".")[1]) if "." in c else 0 for c in numbers), default=0)
        sign = "-" if any(c.startswith("-") for c in numbers) else ""
        spec = f"S[table-format={sign}{whole}.{places}]" if places else f"S[table-format={sign}{whole}]"
        return spec + (r"@{\,}l" if self.rank else "")

    def head(self) -> str:
        """Its header cell (across the rank's column too)."""
        if self.rank:
            return f"\\multicolumn{{2}}{{c}}{{{escape(self.header)}}}"
        return f"{{{escape(self.header)}}}" if self.numeric else self._breakable(escape(self.header))

    def _breakable(self, text: str) -> str:
        """``text`` (LaTeX) with a break allowed after every ``_`` and ``-`` in a column that :attr:`wraps`."""
        return text.replace(r"\_", r"\_\allowbreak{}").replace("-", r"-\allowbreak{}") if self.wraps else text

    def cell(self, row: int, second: bool = False) -> str:
        """Row ``row``'s first line (or ``second``), as LaTeX: in an ``S`` column, text in braces."""
        if second:
            text = self.below[row] if self.below else ""
            small = f"{{\\footnotesize {escape(text)}}}" if text else ("{}" if self.numeric else "")
            return f"\\multicolumn{{2}}{{c}}{small}" if self.rank else small
        text = self.main[row]
        first = (text if _NUMBER.match(text) else f"{{{escape(text)}}}") if self.numeric else escape(text)
        first = self._breakable(first) if not self.numeric else first
        if self.rank:
            first += f" & {{\\footnotesize {escape(self.rank[row])}}}" if self.rank[row] else " &"
        return first


def _columns(table: pd.DataFrame) -> list[Column]:
    """``table``'s columns as :class:`Column`: a CSV's ``x``, ``x_lo``, ``x_hi`` as one interval column; a column of
    headline cells (``97.3 [96.1, 98.3] #7``) as estimates with their ranks beside them and their intervals below; every number with its column's
    decimals."""
    names = [str(c) for c in table.columns]
    cells = {n: _column(n, table[c].tolist()) for n, c in zip(names, table.columns)}
    numeric = {n: pd.api.types.is_numeric_dtype(table[c]) and n != "eps" and not n.endswith("_eps")
               for n, c in zip(names, table.columns)}
    out, used = [], set()
    for n in names:
        if n in used:
            continue
        lo, hi = f"{n}_lo", f"{n}_hi"
        if numeric[n] and lo in cells and hi in cells:
            used |= {lo, hi}
            rows = len(table)
            joint = format_column([*table[n].tolist(), *table[lo].tolist(), *table[hi].tolist()])  # one decimals
            est, los, his = joint[:rows], joint[rows:2 * rows], joint[2 * rows:]
            out.append(Column(n, est, [f"[{a}, {b}]" if a or b else "" for a, b in zip(los, his)], True))
            continue
        parsed = [_INTERVAL.match(v) for v in cells[n]]
        if not numeric[n] and any(parsed) and all(m or not v.strip() for m, v in zip(parsed, cells[n])):
            out.append(Column(n, [m["est"] or "" if m else "" for m in parsed],
                              [f"[{m['lo']}, {m['hi']}]" if m else "" for m in parsed], True,
                              [m["rest"] if m else "" for m in parsed] if any(m and m["rest"] for m in parsed) else []))
            continue
        out.append(Column(n, cells[n], numeric=numeric[n]))
    return out


def _float(columns: list[Column], rows: range, caption: str, label: str) -> str:
    r"""One ``table`` float of ``columns`` over ``rows``: ``\small``, booktabs, two lines per row where a column
    holds an interval."""
    two = any(c.below for c in columns)
    head = " & ".join(c.head() for c in columns)
    lines = []
    for i in rows:
        lines.append(" & ".join(c.cell(i) for c in columns) + r" \\")
        if two:
            lines.append(" & ".join(c.cell(i, True) for c in columns) + r" \\[2pt]")
    return "\n".join([r"\begin{table}[htbp]", r"\centering", r"\small", f"\\setlength{{\\tabcolsep}}{{{TABCOLSEP_PT:g}pt}}",
                      f"\\caption{{{escape(caption)}}}", f"\\label{{{label}}}",
                      f"\\begin{{tabular}}{{{''.join(c.spec() for c in columns)}}}", r"\toprule", head + r" \\",
                      r"\midrule", *lines, r"\bottomrule", r"\end{tabular}", r"\end{table}"])


def latex_table(table: pd.DataFrame, name: str, caption: str = "", keys: int | None = None) -> str:
    """``table`` (a CSV as read back, or a headline table) as LaTeX floats that each fit :data:`COLUMN_PT`:
    columns that hold one value go into the caption (default ``name``); the first ``keys`` columns (default: the
    leading text columns, at least one) start every float; the rest are split into floats by width, and rows into
    floats of :data:`PAGE_ROWS`. Labels ``tab:<name>``, then ``-2``, ``-3``, ... for the further floats."""
    label = "tab:" + re.sub(r"[^A-Za-z0-9]+", "-", name.removesuffix(".csv")).strip("-")
    columns = _columns(displayed(table))  # the report's one spelling of every name
    constant = [c for c in columns if len(table) > 1 and not c.below and len(set(c.main)) == 1 and c.main[0]]
    varying = [c for c in columns if c not in constant] or columns[:1]
    if keys is None:
        keys = next((i for i, c in enumerate(varying) if c.numeric or c.below), len(varying))
    key_cols, rest = varying[:max(1, keys)], varying[max(1, keys):]
    room = COLUMN_PT - sum(c.width() for c in key_cols)
    chunks: list[list[Column]] = [[]]
    for c in rest:
        if chunks[-1] and sum(x.width() for x in chunks[-1]) + c.width() > room:
            chunks.append([])
        chunks[-1].append(c)
    blocks = [range(i, min(i + PAGE_ROWS, len(table))) for i in range(0, len(table), PAGE_ROWS)] or [range(0)]
    fixed = "; ".join(f"{c.header} {c.main[0]}" for c in constant)
    title = (caption or name) + (f" ({fixed})" if fixed else "")
    parts, n = [], len(chunks) * len(blocks)
    for j, chunk in enumerate(chunks):
        for k, rows in enumerate(blocks):
            which = []
            if len(chunks) > 1:
                which.append(f"columns {j + 1} of {len(chunks)}")
            if len(blocks) > 1:
                which.append(f"rows {rows.start + 1}-{rows.stop} of {len(table)}")
            number = j * len(blocks) + k
            parts.append(_float(key_cols + chunk, rows, title + (f", {', '.join(which)}" if which else ""),
                                label + (f"-{number + 1}" if number else "")))
    return "\n\n".join(parts) if n else ""


def headline_tables(out_dir: Path, lead: str | None = None) -> list[str]:
    """The report's headline sections' tables as LaTeX (:func:`latex_table`: the leading text columns, e.g. the
    detector, the row key; the rest split into floats that fit a column); the section titled ``lead`` (the one that
    opens the report, run.json's ``lead``) first."""
    parts = []
    for section in sorted(read_sections(out_dir), key=lambda s: s.title != lead):
        if not section.headline:
            continue
        tables = [i for i in section.items if isinstance(i, Table)]
        for k, item in enumerate(tables):
            frame = item.frame.reset_index() if item.frame.index.name is not None else item.frame
            if frame.empty:  # nothing scored (a run without detectors): no headline table to set
                continue
            parts.append(latex_table(frame.astype(str), f"headline-{k + 1}", f"{section.title}: {item.caption}")
                         .rstrip())
    return parts


def flush_floats(text: str) -> str:
    """``text`` with a ``\\clearpage`` before every :data:`FLUSH_FLOATS`-th float after the first, where it holds more
    than :data:`FLUSH_FLOATS`."""
    floats = text.split("\\begin{table}")
    if len(floats) - 1 <= FLUSH_FLOATS:
        return text
    return floats[0] + "".join(("\\clearpage % place the floats so far (LaTeX holds at most 18)\n\n"
                                if i and i % FLUSH_FLOATS == 0 else "") + "\\begin{table}" + f
                               for i, f in enumerate(floats[1:]))


def write_latex(out_dir: Path, mode: str = "headline", lead: str | None = None) -> Path:
    """Write ``tables.tex`` (atomically) into ``out_dir``: the headline tables (the ``lead`` section's first, as the
    report opens on it), then, with ``mode`` ``all``, every other CSV under it in path order."""
    out_dir = Path(out_dir)
    parts = ["% advopenood: this run's tables; "
             + ("every CSV." if mode == "all" else "the headline tables (advopenood run --latex all adds every CSV).")
             + "\n% Needs \\usepackage{booktabs} and \\usepackage{siunitx}; cells hold the CSVs' numbers with a fixed "
               "number of decimals per column; each float fits a column of a two-column article.",
             *headline_tables(out_dir, lead)]
    for path in sorted(out_dir.rglob("*.csv")):
        name = path.relative_to(out_dir).as_posix()
        if mode != "all" and name not in CORE_TABLES:
            continue
        try:
            table = pd.read_csv(path)
        except pd.errors.EmptyDataError:
            parts.append(f"% {name}: no columns")
            continue
        parts.append(latex_table(table, name).rstrip())
    target = out_dir / LATEX_FILE
    aio.write_text(target, flush_floats("\n\n".join(parts) + "\n"))
    return target
