"""``tables.tex``: every CSV table of a run as one LaTeX ``table`` each, by pandas' own writer
(:meth:`pandas.DataFrame.to_latex`, booktabs rules), with the report's fixed decimals per column, to paste into a
paper."""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from advopenood import io as aio
from advopenood.outputs.report import format_column

LATEX_FILE = "tables.tex"
_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
            "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def escape(text: str) -> str:
    """``text`` with LaTeX's special characters escaped."""
    return "".join(_SPECIAL.get(c, c) for c in text)


def latex_table(table: pd.DataFrame, name: str) -> str:
    """``table`` (a CSV as read back) as a LaTeX ``table``: numbers right-aligned with their column's decimals
    (:func:`advopenood.outputs.report.format_column`), text left-aligned and escaped, ``name`` as the caption and
    ``tab:<name>`` as the label."""
    cells = pd.DataFrame({str(c): format_column(table.iloc[:, i].tolist()) for i, c in enumerate(table.columns)})
    align = "".join("r" if pd.api.types.is_numeric_dtype(table.iloc[:, i]) else "l" for i in range(table.shape[1]))
    label = "tab:" + re.sub(r"[^A-Za-z0-9]+", "-", name.removesuffix(".csv")).strip("-")
    return cells.to_latex(index=False, escape=True, column_format=align or "l", caption=escape(name), label=label,
                          position="htbp")


def write_latex(out_dir: Path) -> Path:
    """Write ``tables.tex`` (atomically) into ``out_dir``: one ``table`` per CSV under it, in path order."""
    out_dir = Path(out_dir)
    parts = ["% advopenood: every CSV table of this run, one table each (pandas DataFrame.to_latex).\n"
             "% Needs \\usepackage{booktabs}; cells hold the CSVs' numbers with a fixed number of decimals per column."]
    for path in sorted(out_dir.rglob("*.csv")):
        name = path.relative_to(out_dir).as_posix()
        try:
            table = pd.read_csv(path)
        except pd.errors.EmptyDataError:
            parts.append(f"% {name}: no columns")
            continue
        parts.append(latex_table(table, name).rstrip())
    target = out_dir / LATEX_FILE
    aio.write_text(target, "\n\n".join(parts) + "\n")
    return target
