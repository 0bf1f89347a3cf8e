"""The 0.3.0 release: one version (``advopenood/VERSION``, ``setup.py``, ``CHANGELOG.md``), the paths 0.2.0
deprecated removed as its table said (:data:`advopenood.deprecated.TABLE`, the table of removals, which
``CHANGELOG.md`` renders exactly under *Removed*), every removed path failing in one line that names its new path,
a plugin of the last release (written against the public API) running without a warning, and a plugin that imports
a removed path failing alone, stated in the run's outputs."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pandas as pd
import pytest

import advopenood
import advopenood_plugins  # noqa: F401  (adds the built-ins' removed paths to the table)
from advopenood.deprecated import TABLE
from conftest import pack_config

REPO = Path(__file__).resolve().parents[1]
CHANGELOG = REPO / "CHANGELOG.md"
VERSION = "0.3.0"
#: how CHANGELOG.md names each kind of row
KIND = {"module": "module", "names": "names it held", "function": "function"}
#: a row of a path table: | `old` | what | `new`, `new` | (removed in |)
ROW = re.compile(r"^\| `([\w.]+)` \| ([a-z ]+) \| ((?:`[\w.]+`(?:, )?)+) \|(?: ([\d.]+) \|)?$")
#: Keep a Changelog's headings, in its order
HEADINGS = ["Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"]


def releases() -> dict[str, str]:
    """CHANGELOG.md's sections by heading (``Unreleased``, ``0.3.0 - <date>``, ...), newest first."""
    parts = CHANGELOG.read_text().split("\n## [")[1:]
    return {part.split("\n", 1)[0].replace("]", ""): part for part in parts}


def newest() -> tuple[str, str]:
    """The heading and text of the section that holds this version's entries: ``[Unreleased]`` until the release
    renames it ``[0.3.0] - <date>``; after it, the work for the next version goes under a new ``[Unreleased]`` above
    it."""
    sections = releases()
    released = [h for h in sections if h.startswith(f"{VERSION} - ")]
    heading = released[0] if released else next(iter(sections))
    return heading, sections[heading]


def rows(text: str, title: str) -> list[tuple[str, str, tuple[str, ...], str | None]]:
    """The path table under ``### title`` of a release's text: (old, what, new paths, removed in)."""
    if f"### {title}\n" not in text:
        return []
    block = text.split(f"### {title}\n", 1)[1].split("\n### ", 1)[0]
    found = [ROW.match(line) for line in block.splitlines() if line.startswith("| `")]
    assert all(found), block
    return [(m[1], m[2], tuple(re.findall(r"`([\w.]+)`", m[3])), m[4]) for m in found]


def test_one_version_for_the_package_setup_and_the_changelog():
    heading, text = newest()
    assert advopenood.__version__ == VERSION
    assert heading == "Unreleased" or re.fullmatch(rf"{re.escape(VERSION)} - \d{{4}}-\d\d-\d\d", heading), heading
    sections = list(releases())  # newest first: at most one [Unreleased] (the next version's work) above it
    assert sections.index(heading) == int(sections[0] == "Unreleased" != heading), sections[:3]
    assert sections[sections.index(heading) + 1] == "0.2.0 - 2026-11-27"  # the release before
    assert 'version=VERSION' in (REPO / "setup.py").read_text()  # setup.py reads advopenood/VERSION
    headings = re.findall(r"^### (\w+)$", text, flags=re.M)
    assert "Removed" in headings and headings == [h for h in HEADINGS if h in headings]


def test_the_changelog_lists_exactly_the_removal_table():
    """*Removed* of this version lists every row of the table; together with what it still deprecates (none) they
    are exactly the paths 0.2.0 deprecated, each of which 0.2.0 said goes in 0.3.0."""
    _, text = newest()
    assert rows(text, "Removed") == [(r.old, KIND[r.kind], r.new, None) for r in TABLE.values()]
    assert {r.removed_in for r in TABLE.values()} == {VERSION}
    kept = rows(text, "Deprecated")
    deprecated = rows(releases()["0.2.0 - 2026-11-27"], "Deprecated")
    assert {old for old, *_ in deprecated} == set(TABLE) | {old for old, *_ in kept}
    assert len(TABLE) == 49 and {when for *_, when in deprecated} == {VERSION} and not kept


#: a name each removed package held -> the path its message names
NAMES = {
    "advopenood.config": ("cache_dir", "advopenood.config.plan.cache_dir"),
    "advopenood.data": ("stack", "advopenood.plugin.stack"),
    "advopenood.models": ("build_model", "advopenood.plugin.build_model"),
    "advopenood.detectors": ("vim_dim", "advopenood.plugin.vim_dim"),
    "advopenood.outputs": ("parse_sections", "advopenood.outputs.results.parse_sections"),
    "advopenood.cli": ("build_parser", "advopenood.cli.main.build_parser"),
    "advopenood_plugins.attacks": ("FGSM", "advopenood_plugins.attacks.standard.FGSM"),
    "advopenood_plugins.detectors": ("MSP", "advopenood_plugins.detectors.logits.MSP"),
}


def ours(seen: list[warnings.WarningMessage]) -> list[str]:
    """The DeprecationWarnings of advopenood among ``seen`` (not those of the libraries it imports)."""
    return [str(w.message) for w in seen if issubclass(w.category, DeprecationWarning) and "advopenood" in
            str(w.message)]


def failure(statement: str) -> Exception:
    """The exception ``statement`` raises (no DeprecationWarning of advopenood on the way)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises((ImportError, AttributeError)) as raised:
            exec(statement, {})
    assert ours(seen) == []
    return raised.value


def test_every_removed_path_fails_in_one_line_naming_its_new_path():
    """A removed module does not import; a name a package held is not read, in an import or as an attribute
    (``hasattr`` stays False); the removed function is gone. Each message names the new path and 0.3.0."""
    assert {old for old, row in TABLE.items() if row.kind == "names"} == set(NAMES)
    for old, row in TABLE.items():
        if row.kind == "module":
            raised = failure(f"import {old}")
            assert isinstance(raised, ModuleNotFoundError) and raised.name == old
            assert str(raised).startswith(f"{old} was removed in {VERSION}; use ") and "\n" not in str(raised)
            assert all(module in str(raised) for module in row.new), str(raised)
        elif row.kind == "names":
            name, new = NAMES[old]
            said = f"{old}.{name} was removed in {VERSION}; use {new}"
            assert type(failure(f"from {old} import {name}")) is ImportError
            assert str(failure(f"from {old} import {name}")) == str(failure(f"import {old}\n{old}.{name}")) == said
            assert not hasattr(sys.modules[old], name)
        else:
            module, _, name = old.rpartition(".")
            assert str(failure(f"from {module} import {name}")) == f"{old} was removed in {VERSION}; use {row.new[0]}"
    raised = failure("from advopenood.protocols import get")
    assert str(raised) == ("advopenood.protocols was removed in 0.3.0; use advopenood.plugin (Protocol, PROTOCOLS, "
                           "get_protocol for get; the rest is in advopenood.config.protocols)")
    assert "cannot import name 'nothing' from 'advopenood.data'" in str(failure("from advopenood.data import nothing"))


#: what the example plugin (tests/thirdparty_plugin) imported at the last two releases: 0.1.0 (0ed7694^, before
#: advopenood.plugin) and 0.2.0 (a7998b0)
RELEASED_IMPORTS = {
    "0.1.0": ["from advopenood.attacks import Attack", "from advopenood.capabilities import DifferentiableDetector",
              "from advopenood.context import RunContext", "from advopenood.detectors import Outputs, Postprocessor",
              "from advopenood.io import save_figure",
              "from advopenood.outputs import Bullets, Figure, Paragraph, Results, Section, Table"],
    "0.2.0": ["from advopenood.plugin import Attack", "from advopenood.plugin import Bullets, Figure, Paragraph, "
              "Results, RunContext, Section, Table, save_figure",
              "from advopenood.plugin import DifferentiableDetector, Outputs, Postprocessor"],
}


@pytest.mark.parametrize("release", list(RELEASED_IMPORTS))
def test_the_plugins_of_the_last_two_releases_still_import(release):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        exec("\n".join(RELEASED_IMPORTS[release]), {})
    assert ours(seen) == []


#: an evaluator of the last release, written against its public API (advopenood.plugin only)
LAST_RELEASE = '''"""AUROC of each detector on each natural OOD set, written against the 0.2.0 public API."""
import pandas as pd

from advopenood.plugin import Paragraph, Results, Section, fmt, get_protocol, ood_metrics, stack  # noqa: F401


class LastRelease:
    """AUROC per detector and natural OOD set (an evaluator of the last release)."""

    def __call__(self, ctx):
        rows = [{"detector": det, "ood_set": name, "auroc": ood_metrics(sets["id"], sets[name])["auroc"],
                 "protocol": get_protocol(ctx.protocol).name}
                for det, sets in ctx.scores.items() for name in ctx.ood_sets]
        table = pd.DataFrame(rows)
        return Results(tables={"lastrelease.csv": table}, sections=[Section("Last release", [
            Paragraph(f"Mean AUROC {fmt(float(table.auroc.mean()))}.")])])
'''
#: an evaluator written against a path 0.3.0 removed (installed, not selected by the run)
REMOVED_PATH = '''from advopenood.metrics import ood_metrics


class OldRound:
    """An evaluator of a round before 0.2.0."""
'''


def install(site: Path, dist: str, module: str, source: str, entry: str) -> None:
    """A distribution installed in ``site`` as a third party installs one: its module and an evaluator entry point."""
    info = site / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (site / f"{module}.py").write_text(source)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[advopenood.evaluators]\n{entry}\n")


def test_a_plugin_of_the_last_release_runs_and_one_on_a_removed_path_fails_alone(tmp_path, data_root,
                                                                                 session_cache):
    """In a real ``advopenood run --limit 8`` (every warning shown): the last release's evaluator runs, agrees with
    ood.csv and gives no DeprecationWarning; the package importing ``advopenood.metrics`` fails to load in one line
    naming the new path, and the run goes on without it (exit 0: it selects none of its plugins), stating it in run.json's warnings, the report
    and stderr."""
    site = tmp_path / "site"
    install(site, "zz-lastrelease", "zz_lastrelease", LAST_RELEASE, "lastrelease = zz_lastrelease:LastRelease")
    install(site, "zz-oldround", "zz_oldround", REMOVED_PATH, "oldround = zz_oldround:OldRound")
    config = pack_config(tmp_path / "cfg", data_root, {"evaluators": ["ood", "lastrelease"]})
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
           "PYTHONWARNINGS": "always::DeprecationWarning"}
    done = subprocess.run([sys.executable, "-m", "advopenood.cli", "run", "--config", config, "--limit", "8",
                           "--out", str(out), "--quiet"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not re.search(r"DeprecationWarning: .*advopenood", done.stderr), done.stderr
    said = ("its evaluators entry point oldround = zz_oldround:OldRound failed to load: ModuleNotFoundError: "
            "advopenood.metrics was removed in 0.3.0; use advopenood.plugin (")
    line = f"plugin package zz-oldround not loaded (the run selects none of its plugins): {said}"
    info = json.loads((out / "run.json").read_text())
    assert not info["plugin_errors"] and any(w.startswith(line) for w in info["warnings"]), info["warnings"]
    assert f"- {line}" in (out / "report.md").read_text()
    assert f"advopenood: warning: {line}" in done.stderr
    mine = pd.read_csv(out / "lastrelease.csv").set_index(["detector", "ood_set"])
    ood = pd.read_csv(out / "ood.csv").set_index(["detector", "ood_set"])
    assert len(mine) == 1 and (mine.protocol == "strong").all()
    assert mine.auroc.to_numpy() == pytest.approx(ood.loc[mine.index, "auroc"].to_numpy(), abs=1e-3)
