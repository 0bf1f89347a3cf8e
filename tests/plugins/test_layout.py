"""The built-in plugins' layout (issue 32): one place per plugin, each kind's modules listed once and named by the
entry points, every plugin registered by a module an entry point names, no private
name imported across modules, and the new paths importing without a warning (the former module paths were removed in
0.3.0: tests/test_release.py)."""
from __future__ import annotations

import ast
import importlib
import warnings
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from advopenood import registry

REPO = Path(__file__).resolve().parents[2]
PLUGINS = sorted((REPO / "plugins").rglob("*.py"))


def builtin_entry_points(kind: str) -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group=f"advopenood.{kind}")
            if ep.value.startswith("advopenood_plugins.")}


@pytest.mark.parametrize("kind", registry.KINDS)
def test_each_kind_lists_its_modules_and_the_entry_points_name_them(kind):
    modules = importlib.import_module(f"advopenood_plugins.{kind}").MODULES
    leaf = "" if kind in ("attacks", "detectors") else ".plugin"
    assert builtin_entry_points(kind) == {m: f"advopenood_plugins.{kind}.{m}{leaf}" for m in modules}
    for module in modules:
        assert (REPO / "plugins" / kind / (f"{module}.py" if not leaf else f"{module}/plugin.py")).is_file()


@pytest.mark.parametrize("kind", registry.KINDS)
def test_every_built_in_plugin_registers_from_a_module_an_entry_point_names(kind):
    """No plugin exists only because another module imported its module (as ``levels`` did, through ``ood_eval``)."""
    named = {value for k in registry.KINDS for value in builtin_entry_points(k).values()}
    built_in = {name: e.source for name, e in registry.entries(kind).items()
                if e.source.startswith("advopenood_plugins")}
    assert built_in and {name: src for name, src in built_in.items() if src not in named} == {}


def test_no_plugin_imports_a_private_name():
    """What plugins share is public, in the kit or the core: never another module's ``_name`` (one test over every
    plugin module; the 500-line rule is tests/test_architecture.py's)."""
    private = [f"{path.relative_to(REPO)}: {node.module}.{alias.name}" for path in PLUGINS
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("advopenood")
               for alias in node.names if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert private == []


@pytest.mark.parametrize("statement", [
    "from advopenood_plugins.detectors import BUILTIN_DETECTORS",
    "from advopenood_plugins.detectors.logits import MSP",
    "from advopenood_plugins.evaluators.ood.plugin import metric_row",
    "import advopenood_plugins.analyses.transfer.plugin",
])
def test_the_new_paths_do_not_warn(statement):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        exec(statement, {})
