"""Docs that stay true (issue 50, item 10): a figure README.md or a docs page quotes from a run is followed by an
HTML comment that names the recorded file and the cell it comes from, ``98.9 %<!-- recorded: demo/asr.csv clean_acc
attack=fgsm -->`` (files under ``benchmarks/recorded/``); each is read back and must equal the quoted figure at the
decimals quoted. ``range(column)`` quotes ``min-max`` over the selected rows; a key takes ``a,b,c`` for several
values; a JSON file (a committed run's ``run.json``, path from the repository) takes a dotted key. The summary block
of docs/cli.md is the recorded demo's stdout. A figure of a run the repository keeps no output of is a dated
measurement (:data:`MEASURED`): its day, command and commit are checked."""
from __future__ import annotations

import json
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
    """The recorded values the reference names: one cell, or the ``[min, max]`` of ``range(column)``; in a JSON file
    (a committed run's ``run.json``) the value at a dotted key path. The file lies under ``benchmarks/recorded/``, or
    is a committed run's (``benchmarks/leaderboard/runs/...``, relative to the repository)."""
    path = RECORDED / match["file"] if (RECORDED / match["file"]).is_file() else REPO / match["file"]
    if path.suffix == ".json":
        value = json.loads(path.read_text())
        for key in match["what"].split("."):
            value = value[key]
        return [float(value)]
    table = pd.read_csv(path, keep_default_na=False)
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


#: a dated historical measurement: a figure the repository holds no recorded file of, followed (in its sentence, or
#: after a table's caption) by ``<!-- measured: 2026-11-27 COMMAND -->``, the day it was measured (or first stated)
#: and what measured it: ``python benchmarks/<script>.py ...``, ``python -m pytest <test file>``, ``python -c ...``,
#: ``python - (the code below)``, ``advopenood <subcommand> ...`` or ``.ci/run``, optionally ``at <commit>`` (the
#: checkout it ran on)
MEASURED = re.compile(r"<!-- measured: (?P<date>\d{4}-\d{2}-\d{2}) (?P<command>.+?)(?: at (?P<commit>[0-9a-f]{7,40}))? -->")


def measured() -> list[tuple[str, re.Match]]:
    """``(page, match)`` of every dated measurement in README.md and docs/."""
    return [(page.relative_to(REPO).as_posix(), m) for page in PAGES for m in MEASURED.finditer(page.read_text())]


def test_the_run_figures_without_a_recorded_file_are_dated_measurements():
    """The timings and figures of runs the repository keeps no output of carry their date and command (issue 50,
    item 10): the demo's time and its bootstrap's share, the test suite's time, the adaptive attacks' AUROCs and
    costs, the robust AUROCs of MSP and MDS, the plan lines of docs/cli.md, the leaderboard runs' wall times, the
    binarization test's and the transfer analysis' figures, the backends' and the smoothed detectors' AUROCs, the
    robust model's AutoAttack accuracies, the intervals' and verify's costs, the ROSS audit's run times."""
    found = {(page, m["command"].split()[0 if m["command"].startswith((".ci", "advopenood")) else 1]) for page, m in
             measured()}
    assert {("README.md", ".ci/run"), ("README.md", "advopenood"), ("README.md", "benchmarks/bench_adaptive.py"),
            ("docs/getting-started.md", "advopenood"), ("docs/attacks.md", "benchmarks/bench_adaptive.py"),
            ("docs/evaluators.md", "advopenood"), ("docs/cli.md", "advopenood"),
            ("docs/leaderboard.md", "advopenood"), ("docs/analyses.md", "benchmarks/bench_bintest.py"),
            ("docs/analyses.md", "advopenood"), ("docs/detectors.md", "advopenood"), ("docs/models.md", "advopenood"),
            ("docs/models.md", "-"), ("docs/troubleshooting.md", "advopenood"), ("docs/evaluators.md", "-m"),
            ("docs/attacks.md", "benchmarks/bench_attack_cost.py"), ("docs/cli.md", "benchmarks/bench_refusals.py"),
            ("docs/concepts.md", "advopenood"), ("docs/concepts.md", "benchmarks/bench_intervals.py"),
            ("docs/ross-audit.md", "benchmarks/ross_audit.py"), ("docs/ross-audit.md", "benchmarks/gpu_suite.py")
            } <= found, found


@pytest.mark.parametrize("page, match", measured(), ids=lambda x: x if isinstance(x, str) else x["date"])
def test_every_dated_measurement_names_a_real_day_and_command(page, match):
    """A dated measurement's day is a real one of this project (2026, not after today), its command one that exists
    (a benchmark script of the repository, a subcommand of ``advopenood``, ``.ci/run``) and its commit, where named,
    one of the repository's history (where the checkout has one)."""
    import datetime
    import shutil
    import subprocess

    from advopenood.cli.main import commands

    day = datetime.date.fromisoformat(match["date"])
    assert datetime.date(2026, 1, 1) <= day <= datetime.date.today(), (page, match[0])
    words = match["command"].split()
    if words[:3] == ["python", "-m", "pytest"]:
        assert (REPO / words[3]).exists(), (page, match[0])  # a test file, or the tests folder
    elif words[0] == "python" and words[1] in ("-c", "-"):
        assert len(words) > 2, (page, match[0])  # the code, or where the page shows it
    elif words[0] == "python":
        assert (REPO / words[1]).is_file(), (page, match[0])
    elif words[0] == "advopenood":
        assert words[1] in commands(store_index=False), (page, match[0])
    else:
        assert words == [".ci/run"] and (REPO / ".ci" / "run").is_file(), (page, match[0])
    if match["commit"] and (REPO / ".git").exists() and shutil.which("git"):
        known = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", match["commit"] + "^{commit}"],
                               capture_output=True)
        assert known.returncode == 0, f"{page}: commit {match['commit']} is not in the repository's history"


def test_the_demo_time_is_one_figure_everywhere():
    """README.md, docs/getting-started.md and docs/cli.md quote the demo's time as the CLI's help does
    (``advopenood.cli.main.DEMO_TIME``), the figure benchmarks/README.md's demo row dates."""
    from advopenood.cli.main import DEMO_TIME

    for page in ("README.md", "docs/getting-started.md", "docs/cli.md"):
        assert DEMO_TIME in (REPO / page).read_text(), page
    row = next(line for line in (REPO / "benchmarks" / "README.md").read_text().splitlines()
               if line.startswith("| `advopenood demo --out DIR`"))
    assert f"**{DEMO_TIME}**" in row and "2026-11-27" in row


def test_the_demos_story_holds_in_the_recorded_run():
    """README.md and docs/getting-started.md: "most detectors separate the natural OOD sets (AUROC above 80), while
    PGD ... pushes MSP, MLS, EBO, ODIN and GEN below chance": most natural cells of the recorded demo's ood.csv are
    above 80, and PGD's AUROC of each detector named is below 50."""
    table = pd.read_csv(RECORDED / "demo" / "ood.csv")
    natural = table[table["attack"] == "none"]
    assert (natural["auroc"] > 80).mean() > 0.5
    pgd = table[table["attack"] == "pgd"].set_index("detector")["auroc"]
    for page in ("README.md", "docs/getting-started.md"):
        text = " ".join((REPO / page).read_text().split())
        assert "most detectors separate the natural OOD sets (AUROC above 80)" in text, page
        names = re.search(r"pushes ((?:\w+, )+(?:and )?\w+(?: and \w+)?) (?:far )?below chance", text)[1]
        for name in re.split(r", (?:and )?| and ", names):
            assert pgd[name.lower()] < 50, (page, name)


#: a timing a page states (``45 s``, ``2 min``, ``24 min 41 s``, ``1.4-6.6 s``); not a formula's ``min(``, not a rate
TIMING = re.compile(r"(?<![\w./-])\d+(?:[.,]\d+)?(?:-\d+(?:\.\d+)?)? ?(?:s|min|minutes|h|hours)\b(?! ?/)(?!\()")
#: pages left out of the timing check: none (docs/ross-audit.md's timings are dated measurements since issue 50, item
#: 10)
UNCHECKED: set[str] = set()


def test_every_timing_a_page_states_is_recorded_or_dated():
    """Every paragraph (code blocks aside) of README.md and docs/ that states a timing carries a recorded reference
    or a dated measurement, or states the demo's time as ``DEMO_TIME`` (checked above): a new timing cannot enter
    the docs unguarded."""
    from advopenood.cli.main import DEMO_TIME

    bare = []
    for page in PAGES:
        name = page.relative_to(REPO).as_posix()
        if name in UNCHECKED:
            continue
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for paragraph in re.split(r"\n\s*\n", text):
            said = TIMING.findall(paragraph.replace(DEMO_TIME, ""))
            if said and "<!-- measured: " not in paragraph and "<!-- recorded: " not in paragraph:
                bare.append(f"{name}: {said} in {' '.join(paragraph.split())[:120]!r}")
    assert not bare, "\n".join(bare)
