"""The core's and the plugins' layout (issue 25, 32, 51): packages by stage with an import-layer contract, no import
cycle in the core or the plugins, no module over 500 lines, no function over 60, no raw config reads (each rule
checked here, once, over every module), and the import paths plugins use kept working."""
from __future__ import annotations

import ast
import configparser
import importlib
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

REPO = Path(__file__).resolve().parents[1]
CORE = REPO / "advopenood"
MODULES = sorted(p for p in CORE.rglob("*.py"))


def test_the_import_layer_contract_holds():
    """``.importlinter``: each stage imports only the stages below it, the foundation none, the core no plugin, a
    built-in plugin no module of the core but ``advopenood.plugin``."""
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint), "--config", str(REPO / ".importlinter")], cwd=REPO, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "0 broken" in done.stdout



def test_the_built_ins_reach_the_core_through_the_public_api_only():
    """Issue 51, item 3: the contract ``public-api`` (kept, above) forbids the built-in plugins every module of the
    core but ``advopenood.plugin``, a module added later included."""
    config = configparser.ConfigParser()
    config.read(REPO / ".importlinter")
    forbidden = set(config["importlinter:contract:public-api"]["forbidden_modules"].split())
    core = {f"advopenood.{p.stem}" for p in CORE.iterdir()
            if not p.name.startswith("__") and (p.suffix == ".py" or (p / "__init__.py").is_file())}
    assert forbidden == core - {"advopenood.plugin"}

def test_no_import_cycle_in_the_core_or_the_plugins():
    """Issue 51, item 5: no module of the core or of the built-in plugins imports (directly) a module that imports
    it back (at any depth); the plugins' robust_auroc verify modules once did."""
    import grimp

    graph = grimp.build_graph("advopenood", "advopenood_plugins")
    ours = ("advopenood.", "advopenood_plugins.")
    cycles = []
    for module in sorted(m for m in graph.modules if m.startswith(ours)):
        for imported in graph.find_modules_directly_imported_by(module):
            if imported.startswith(ours) and graph.find_shortest_chain(importer=imported, imported=module):
                cycles.append(f"{module} <-> {imported}")
    assert not cycles


PLUGIN_MODULES = sorted((REPO / "plugins").rglob("*.py"))


def _offenders(paths: list[Path], find: Callable[[str], list[str]]) -> list[str]:
    """``path: finding`` for every finding of ``find`` (a module's text -> what breaks the rule) in ``paths``: each
    rule below is one test over every module, not one test per module."""
    return [f"{path.relative_to(REPO)}: {found}" for path in paths for found in find(path.read_text())]


def test_no_module_over_500_lines():
    """Issue 25 (the core) and 32 (the plugins): no module over 500 lines; checked here only."""
    assert _offenders(MODULES + PLUGIN_MODULES, lambda text: [f"{n} lines" for n in [len(text.splitlines())]
                                                              if n > 500]) == []


def _long_functions(text: str) -> list[str]:
    return [f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
            for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60]


def test_no_function_over_60_lines():
    """Issue 32: no function (or method) over 60 lines, from its def to its last line, in the core or the
    plugins; checked here only."""
    assert _offenders(MODULES + PLUGIN_MODULES, _long_functions) == []


def test_nothing_reads_raw_config_dicts():
    """The run plan is read by attribute; ``cfg[...]`` / ``cfg.get(`` would be a raw config dict."""
    raw = re.compile(r"\bcfg\[|\bcfg\.get\(|ctx\.config\b")
    assert _offenders(MODULES + PLUGIN_MODULES, lambda text: [m.group(0) for m in raw.finditer(text)]) == []


def test_the_rules_report_what_breaks_them():
    """The checks above find what they look for (a rule over every module must not pass by reading nothing)."""
    assert _long_functions("def f():\n" + "    x = 1\n" * 60) == ["f (61 lines, line 1)"]
    assert _long_functions("def f():\n" + "    x = 1\n" * 59) == []
    assert len(MODULES) > 50 and len(PLUGIN_MODULES) > 50


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
