"""``tables.tex``: a run's tables as LaTeX to paste into a paper, by pandas' own writer
(:meth:`pandas.DataFrame.to_latex`, booktabs rules), with the report's fixed decimals per column and budgets as
``k/255`` where they are a whole number of grey values.

By default (``--latex headline``) it holds the headline tables: the report's headline sections' tables (e.g. AUROC
per detector and set, split into groups of at most :data:`MAX_COLUMNS` sets so that each fits the page's width)
and the core's ``asr.csv``; ``--latex all`` adds every other CSV of the run. A table of more than
:data:`PAGE_ROWS` rows is a ``longtable`` (it breaks across pages); every other one is a ``table`` float that fits
one page (scaled to the text width when it has more than :data:`WIDE_COLUMNS` columns).
"""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from advopenood import io as aio
from advopenood.outputs.names import displayed
from advopenood.outputs.report import eps_label, format_column
from advopenood.outputs.results import Table, read_sections

LATEX_FILE = "tables.tex"
#: LaTeX modes: the headline tables only, or every CSV too
MODES = ("headline", "all")
#: rows a ``table`` float holds on one page (``\small``); a longer table is a ``longtable``
PAGE_ROWS = 40
#: set columns per headline table (besides the detector column), so that a table fits the page's width
MAX_COLUMNS = 4
#: a ``table`` float with more columns than this is scaled to the text width (``\resizebox``)
WIDE_COLUMNS = 8
#: the core's own table, in the headline tables
CORE_TABLES = ("asr.csv",)
_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
            "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def escape(text: str) -> str:
    """``text`` with LaTeX's special characters escaped."""
    return "".join(_SPECIAL.get(c, c) for c in text)


def _column(name: str, values: list) -> list[str]:
    """A column's cells: an ``eps`` column as budgets (``16/255``, empty for none), others with the column's
    decimals (:func:`advopenood.outputs.report.format_column`)."""
    if name == "eps" or name.endswith("_eps"):
        return [eps_label(v) for v in values]
    return format_column(values)


def latex_table(table: pd.DataFrame, name: str, caption: str = "") -> str:
    """``table`` (a CSV as read back) as LaTeX: numbers right-aligned with their column's decimals, text
    left-aligned and escaped, ``caption`` (default ``name``) as the caption and ``tab:<name>`` as the label; a
    ``longtable`` over :data:`PAGE_ROWS` rows, else a ``table`` float (scaled to the text width with more than
    :data:`WIDE_COLUMNS` columns)."""
    table = displayed(table)  # the report's one spelling of every name
    cells = pd.DataFrame({str(c): _column(str(c), table.iloc[:, i].tolist()) for i, c in enumerate(table.columns)})
    align = "".join("r" if pd.api.types.is_numeric_dtype(table.iloc[:, i]) else "l" for i in range(table.shape[1]))
    label = "tab:" + re.sub(r"[^A-Za-z0-9]+", "-", name.removesuffix(".csv")).strip("-")
    long = len(table) > PAGE_ROWS
    text = cells.to_latex(index=False, escape=True, column_format=align or "l", caption=escape(caption or name),
                          label=label, position=None if long else "htbp", longtable=long)
    if long:
        return text
    if table.shape[1] > WIDE_COLUMNS:
        text = text.replace("\\end{tabular}", "\\end{tabular}}", 1)
        return text.replace("\\begin{tabular}", "\\resizebox{\\linewidth}{!}{%\n\\begin{tabular}", 1)
    return text.replace("\\begin{tabular}", "\\small\n\\begin{tabular}", 1)


def headline_tables(out_dir: Path) -> list[str]:
    """The report's headline sections' tables as LaTeX, each split into groups of :data:`MAX_COLUMNS` columns after
    its first."""
    parts = []
    for section in read_sections(out_dir):
        if not section.headline:
            continue
        tables = [i for i in section.items if isinstance(i, Table)]
        for k, item in enumerate(tables):
            frame = item.frame.reset_index() if item.frame.index.name is not None else item.frame
            if frame.empty:  # nothing scored (a run without detectors): no headline table to set
                continue
            body = list(frame.columns[1:])
            chunks = [body[i:i + MAX_COLUMNS] for i in range(0, len(body), MAX_COLUMNS)] or [[]]
            for j, chunk in enumerate(chunks):
                part = frame[[frame.columns[0], *chunk]].astype(str)
                which = f" ({j + 1} of {len(chunks)})" if len(chunks) > 1 else ""
                parts.append(latex_table(part, f"headline-{k + 1}-{j + 1}",
                                         f"{section.title}: {item.caption}{which}").rstrip())
    return parts


def write_latex(out_dir: Path, mode: str = "headline") -> Path:
    """Write ``tables.tex`` (atomically) into ``out_dir``: the headline tables, then, with ``mode`` ``all``, every
    other CSV under it in path order."""
    out_dir = Path(out_dir)
    parts = ["% advopenood: this run's tables (pandas DataFrame.to_latex); "
             + ("every CSV." if mode == "all" else "the headline tables (advopenood run --latex all adds every CSV).")
             + "\n% Needs \\usepackage{booktabs}, \\usepackage{longtable} and \\usepackage{graphicx}; cells hold the CSVs' numbers with a "
               "fixed number of decimals per column.", *headline_tables(out_dir)]
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
    aio.write_text(target, "\n\n".join(parts) + "\n")
    return target
