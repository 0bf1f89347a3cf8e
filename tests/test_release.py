"""The 0.2.0 release: one version (``advopenood/VERSION``, ``setup.py``, ``CHANGELOG.md``), one compatibility table
(:data:`advopenood.deprecated.TABLE`) that ``CHANGELOG.md`` renders exactly, one ``DeprecationWarning`` per old
path naming the new one and the version that removes it, and a plugin of the last round that still runs."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pandas as pd
import pytest

import advopenood
import advopenood.plugin
import advopenood_plugins  # noqa: F401  (adds the built-ins' former paths to the table)
from advopenood.deprecated import TABLE
from conftest import pack_config

REPO = Path(__file__).resolve().parents[1]
CHANGELOG = REPO / "CHANGELOG.md"
#: how CHANGELOG.md names each kind of row
KIND = {"module": "module", "names": "names it held", "function": "function"}
#: one row of the Deprecated table: | `old` | what | `new`, `new` | removed in |
ROW = re.compile(r"^\| `([\w.]+)` \| ([a-z ]+) \| ((?:`[\w.]+`(?:, )?)+) \| ([\d.]+) \|$")
#: a DeprecationWarning as Python prints it
WARNING = re.compile(r"DeprecationWarning: (\S+) is deprecated, use (\S+); \1 is removed in advopenood ([\d.]+)")


def section(title: str) -> str:
    """The text of ``### title`` under the newest release of CHANGELOG.md."""
    release = CHANGELOG.read_text().split("\n## [")[2]  # [0]: the preamble, [1]: Unreleased
    return release.split(f"### {title}\n", 1)[1].split("\n### ", 1)[0]


def test_one_version_for_the_package_setup_and_the_changelog():
    newest = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d\d-\d\d$", CHANGELOG.read_text(), flags=re.M)[0]
    assert advopenood.__version__ == newest == "0.2.0"
    assert 'version=VERSION' in (REPO / "setup.py").read_text()  # setup.py reads advopenood/VERSION
    headings = re.findall(r"^### (\w+)$", CHANGELOG.read_text().split("\n## [")[2], flags=re.M)
    assert headings == ["Added", "Changed", "Deprecated", "Removed", "Fixed"]


def test_the_changelog_lists_exactly_the_compatibility_table():
    rows = [ROW.match(line) for line in section("Deprecated").splitlines() if line.startswith("| `")]
    assert all(rows)
    listed = [(m[1], m[2], tuple(re.findall(r"`([\w.]+)`", m[3])), m[4]) for m in rows]
    assert listed == [(r.old, KIND[r.kind], r.new, r.removed_in) for r in TABLE.values()]
    assert len(TABLE) == 49 and {r.removed_in for r in TABLE.values()} == {"0.3.0"}


def caught(statement: str) -> list[str]:
    """Every DeprecationWarning ``statement`` gives (none hidden by a filter)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        exec(statement, {})
    return [str(w.message) for w in seen if issubclass(w.category, DeprecationWarning)]


@pytest.mark.parametrize("statement, old, new", [
    ("from advopenood.data import stack", "advopenood.data.stack", "advopenood.plugin.stack"),
    ("from advopenood.detectors import vim_dim", "advopenood.detectors.vim_dim", "advopenood.plugin.vim_dim"),
    ("from advopenood_plugins.detectors import MSP", "advopenood_plugins.detectors.MSP",
     "advopenood_plugins.detectors.logits.MSP"),
], ids=["data", "detectors", "plugin-detectors"])
def test_a_name_a_package_held_warns_once_naming_its_new_path_and_the_removal(statement, old, new):
    """``from <package> import <name>``: importlib's look-up of the name does not warn, the read does (the old
    code warned twice, naming no version)."""
    assert caught(statement) == [f"{old} is deprecated, use {new}; {old} is removed in advopenood 0.3.0"]


def test_an_old_module_warns_once_per_name_and_names_the_public_module():
    sys.modules.pop("advopenood.protocols", None)
    assert caught("from advopenood.protocols import get, PROTOCOLS\nimport advopenood.protocols as p\np.get") == [
        "advopenood.protocols.get is deprecated, use advopenood.plugin.get_protocol; advopenood.protocols.get is "
        "removed in advopenood 0.3.0",
        "advopenood.protocols.PROTOCOLS is deprecated, use advopenood.plugin.PROTOCOLS; advopenood.protocols.PROTOCOLS "
        "is removed in advopenood 0.3.0"]
    sys.modules.pop("advopenood.metrics", None)
    namespace: dict = {}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        exec("from advopenood.metrics import *", namespace)
    assert [str(w.message) for w in seen if issubclass(w.category, DeprecationWarning)] == [
        "advopenood.metrics is deprecated, use advopenood.plugin (the names a plugin needs) or "
        "advopenood.evaluation.metrics; advopenood.metrics is removed in advopenood 0.3.0"]
    assert namespace["ood_metrics"] is advopenood.plugin.ood_metrics


#: an evaluator of the last round: every advopenood import but the current ``advopenood.outputs`` is an old path
LAST_ROUND = '''"""AUROC of each detector on each natural OOD set, written against the paths before 0.2.0."""
import pandas as pd

from advopenood.data import stack  # noqa: F401  (a name the module advopenood.data held)
from advopenood.metrics import ood_metrics
from advopenood.outputs import Paragraph, Results, Section
from advopenood.protocols import get
from advopenood.report import fmt


class LastRound:
    """AUROC per detector and natural OOD set (an evaluator of the last round)."""

    def __call__(self, ctx):
        rows = [{"detector": det, "ood_set": name, "auroc": ood_metrics(sets["id"], sets[name])["auroc"],
                 "protocol": get(ctx.protocol).name}
                for det, sets in ctx.scores.items() for name in ctx.ood_sets]
        table = pd.DataFrame(rows)
        return Results(tables={"lastround.csv": table}, sections=[Section("Last round", [
            Paragraph(f"Mean AUROC {fmt(float(table.auroc.mean()))}.")])])
'''
#: the old paths the evaluator reads -> the new path its one warning names
OLD_PATHS = {"advopenood.data.stack": "advopenood.plugin.stack",
             "advopenood.metrics.ood_metrics": "advopenood.plugin.ood_metrics",
             "advopenood.protocols.get": "advopenood.plugin.get_protocol",
             "advopenood.report.fmt": "advopenood.plugin.fmt"}


def test_a_plugin_of_the_last_round_runs_with_one_warning_per_old_path(tmp_path, data_root, session_cache):
    """Installed as a third party installs (a distribution with an entry point on the path), the evaluator runs
    in a real ``advopenood run --limit 8`` and agrees with ood.csv; each old path warns once (every warning shown)."""
    site = tmp_path / "site"
    (site / "zz_lastround-1.0.dist-info").mkdir(parents=True)
    (site / "zz_lastround.py").write_text(LAST_ROUND)
    (site / "zz_lastround-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: zz-lastround\n"
                                                                   "Version: 1.0\n")
    (site / "zz_lastround-1.0.dist-info" / "entry_points.txt").write_text(
        "[advopenood.evaluators]\nlastround = zz_lastround:LastRound\n")
    config = pack_config(tmp_path / "cfg", data_root, {"evaluators": ["ood", "lastround"]})
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
           "PYTHONWARNINGS": "always::DeprecationWarning"}
    done = subprocess.run([sys.executable, "-m", "advopenood.cli", "run", "--config", config, "--limit", "8",
                           "--out", str(out), "--quiet"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    ours = list(WARNING.finditer(done.stderr))
    assert sorted((m[1], m[2], m[3]) for m in ours) == sorted((old, new, "0.3.0") for old, new in OLD_PATHS.items())
    mine = pd.read_csv(out / "lastround.csv").set_index(["detector", "ood_set"])
    ood = pd.read_csv(out / "ood.csv").set_index(["detector", "ood_set"])
    assert len(mine) == 1 and (mine.protocol == "strong").all()
    assert mine.auroc.to_numpy() == pytest.approx(ood.loc[mine.index, "auroc"].to_numpy(), abs=1e-3)
