"""Docs that stay true (issue 50, item 10): a figure README.md or a docs page quotes from a run is followed by an
HTML comment that names the recorded file and the cell it comes from, ``98.9 %<!-- recorded: demo/asr.csv clean_acc
attack=fgsm -->`` (files under ``benchmarks/recorded/``); each is read back and must equal the quoted figure at the
decimals quoted. ``range(column)`` quotes ``min-max`` over the selected rows; a key takes ``a,b,c`` for several
values. The summary block of docs/cli.md is the recorded demo's stdout."""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
RECORDED = REPO / "benchmarks" / "recorded"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
#: a quoted figure (``98.9``, ``98.9 %``, ``14.1-27.2``) and its reference
QUOTE = re.compile(r"(?P<figure>-?\d[\d,]*(?:\.\d+)?(?:-\d[\d,]*(?:\.\d+)?)?)(?: %)?<!-- recorded: (?P<file>\S+) "
                   r"(?P<what>\S+)(?P<keys>(?: [\w.]+=\S+)*) -->")


def quotes() -> list[tuple[str, re.Match]]:
    """``(page, match)`` of every referenced figure in README.md and docs/."""
    return [(page.relative_to(REPO).as_posix(), m) for page in PAGES for m in QUOTE.finditer(page.read_text())]


def recorded(match: re.Match) -> list[float]:
    """The recorded values the reference names: one cell, or the ``[min, max]`` of ``range(column)``."""
    table = pd.read_csv(RECORDED / match["file"], keep_default_na=False)
    rows = pd.Series(True, index=table.index)
    for key in match["keys"].split():
        column, values = key.split("=", 1)
        rows &= table[column].astype(str).isin(values.split(","))
    chosen = table[rows]
    assert len(chosen), f"no row of {match['file']} has{match['keys']}"
    what = match["what"]
    if what.startswith("range(") and what.endswith(")"):
        column = chosen[what[6:-1]].astype(float)
        return [column.min(), column.max()]
    values = chosen[what].astype(float).unique()
    assert len(values) == 1, f"{match['file']} {what}{match['keys']} is not one value: {values}"
    return [float(values[0])]


def test_the_docs_quote_their_run_figures_with_a_reference():
    """The statements issue 50 found stale are quoted with their reference (and the stale figures are gone)."""
    found = {(m["file"], m["what"], m["keys"].strip()) for _, m in quotes()}
    assert {("demo/asr.csv", "clean_acc", "attack=fgsm"), ("demo/asr.csv", "asr", "attack=mpgd"),
            ("demo/ood.csv", "range(auroc)", "attack=pgd detector=msp,mls,ebo,odin,gen,nnguide")} <= found
    readme = (REPO / "README.md").read_text()
    assert "99.3 %" not in readme and "94.8 %" not in readme and "(18-30)" not in readme


@pytest.mark.parametrize("page, match", quotes(), ids=lambda x: x if isinstance(x, str) else x["what"])
def test_every_quoted_figure_is_the_recorded_one(page, match):
    """Each figure equals its recorded value rounded to the quoted decimals (a range: both ends)."""
    figure = match["figure"].replace(",", "")
    parts = re.split(r"(?<=\d)-", figure)
    values = recorded(match)
    assert len(parts) == len(values), (page, match[0])
    for text, value in zip(parts, values):
        places = len(text.split(".")[1]) if "." in text else 0
        assert float(text) == pytest.approx(round(value, places), abs=1e-9), (page, match[0], value)


def test_the_cli_pages_summary_is_the_recorded_demos_stdout():
    """docs/cli.md's example summary is the recorded demo's stdout, line for line; the interval method it names is
    the one the recorded ood.csv holds."""
    page = (REPO / "docs" / "cli.md").read_text()
    block = page.split("advopenood: report: ", 1)[1].split("```", 1)[0]
    stdout = (RECORDED / "demo" / "stdout.txt").read_text()
    assert "advopenood: report: " + block == stdout
    method = pd.read_csv(RECORDED / "demo" / "ood.csv")["ci"].unique()
    assert list(method) == ["bootstrap-2000"] and "bootstrap-2000, ood.csv" in stdout
    clean = pd.read_csv(RECORDED / "demo" / "asr.csv")["clean_acc"].iloc[0]
    assert f"{clean:.1f} %" in stdout.splitlines()[1]


def test_the_readmes_protocol_list_is_every_protocol():
    from advopenood.config.protocols import PROTOCOLS

    row = next(line for line in (REPO / "README.md").read_text().splitlines() if "protocols (`" in line)
    listed = re.findall(r"`(\w+)`", row.split("protocols (", 1)[1].split(")", 1)[0])
    assert sorted(listed) == sorted(PROTOCOLS)


def test_the_refusal_times_quoted_are_the_recorded_benchmarks():
    """docs/cli.md and benchmarks/README.md quote bench_refusals.py's recorded SUMMARY: its case count and its
    slowest and median CPU times."""
    summary = (RECORDED / "bench_refusals.txt").read_text().split("SUMMARY refusals: ", 1)[1]
    cases = re.match(r"(\d+) cases", summary)[1]
    slowest, median = re.search(r"cpu: slowest '[^']+' ([\d.]+) s, median ([\d.]+) s", summary).groups()
    assert "0 not a one-line exit 2" in summary
    for page in ("docs/cli.md", "benchmarks/README.md"):
        text = (REPO / page).read_text()
        assert f"{cases} " in text and f"{slowest} s" in text and f"median {median} s" in text, page
