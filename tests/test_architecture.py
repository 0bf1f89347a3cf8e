"""The core's layout (issue 25): packages by stage with an import-layer contract, no import cycle, no module
over 500 lines, no raw config reads, and the import paths plugins use kept working."""
from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CORE = REPO / "advopenood"
MODULES = sorted(p for p in CORE.rglob("*.py"))


def test_the_import_layer_contract_holds():
    """``.importlinter``: each stage imports only the stages below it, the foundation none, the core no plugin."""
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint), "--config", str(REPO / ".importlinter")], cwd=REPO, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "0 broken" in done.stdout


def test_no_import_cycle_inside_the_core():
    import grimp

    graph = grimp.build_graph("advopenood")
    cycles = []
    for module in sorted(m for m in graph.modules if m.startswith("advopenood.")):
        for imported in graph.find_modules_directly_imported_by(module):
            if imported.startswith("advopenood.") and graph.find_shortest_chain(importer=imported, imported=module):
                cycles.append(f"{module} <-> {imported}")
    assert not cycles


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_core_module_over_500_lines(path):
    assert len(path.read_text().splitlines()) <= 500


PLUGIN_MODULES = sorted((REPO / "plugins").rglob("*.py"))


@pytest.mark.parametrize("path", MODULES + PLUGIN_MODULES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_function_over_60_lines(path):
    """Issue 32: no function (or method) over 60 lines, from its def to its last line, in the core or the
    plugins."""
    import ast

    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60]
    assert not long


@pytest.mark.parametrize("path", MODULES + PLUGIN_MODULES, ids=lambda p: str(p.relative_to(REPO)))
def test_nothing_reads_raw_config_dicts(path):
    """The run plan is read by attribute; ``cfg[...]`` / ``cfg.get(`` would be a raw config dict."""
    assert not re.search(r"\bcfg\[|\bcfg\.get\(|ctx\.config\b", path.read_text())


@pytest.mark.parametrize("module, names", [
    ("advopenood.registry", ["register", "get", "create", "names", "provide"]),
    ("advopenood.attacks.base", ["Attack", "build_attack", "default_eps", "foolbox_model", "frozen"]),
    ("advopenood.detectors", ["Postprocessor", "Outputs", "grad_outputs", "forward_outputs", "fit_detectors",
                              "score_all", "create_detector", "fit_subset", "Taps", "cuda_redirect"]),
    ("advopenood.capabilities", ["DifferentiableDetector", "DetectorAware", "Invertible", "AttackFamily",
                                 "CommandAnalysis", "Verifiable"]),
    ("advopenood.outputs.results", ["Results", "Section", "Table", "Paragraph", "Bullets", "Figure", "guarded", "as_written"]),
    ("advopenood.evaluation.context", ["RunContext", "CleanRecord"]),
    ("advopenood.io", ["save_figure", "write_csv"]),
])
def test_the_import_paths_plugins_use_keep_working(module, names):
    imported = importlib.import_module(module)
    assert [n for n in names if not hasattr(imported, n)] == []
