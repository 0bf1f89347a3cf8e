"""The built-in plugins' layout (issue 32): one place per plugin, each kind's modules listed once and named by the
entry points, every plugin registered by a module an entry point names, no private
name imported across modules, and every former module path kept as a re-export that warns."""
from __future__ import annotations

import ast
import importlib
import sys
import warnings
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import advopenood_plugins
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


#: a former module path -> names that code written against it imported
FORMER_NAMES = {
    "advopenood_plugins.attacks": ["FGSM", "PGD", "rel_stepsize"],
    "advopenood_plugins.detectors": ["MSP", "EBO", "gram_statistics", "nnguide_bank_size", "straight_through"],
    "advopenood_plugins.mead_attacks": ["OBJECTIVES", "attack_name", "MEAD_EPS"],
    "advopenood_plugins.adaptive": ["AdaptiveAttack", "EOTAttack", "is_eot", "rel_stepsize"],
    "advopenood_plugins.autoattack": ["AdaptiveAPGD", "aa_seed"],
    "advopenood_plugins.robust_attacks": ["EOT_PREFIXES", "PREFIXES", "robust_class"],
    "advopenood_plugins.gram_legacy": ["GRAMLegacy", "feature_list", "legacy_statistics"],
    "advopenood_plugins.smoothed": ["is_smoothed", "noise_draws", "stream_seed", "EOT_PREFIXES", "eot_name",
                                    "SmoothedEvaluator", "read_smoothed"],
    "advopenood_plugins.ood_eval": ["metric_row", "leaderboard", "set_groups", "read_ood", "ood_plots",
                                    "with_positives", "OODEvaluator"],
    "advopenood_plugins.leaderboard_json": ["openood_entries"],
    "advopenood_plugins.paired": ["MAX_ALL_PAIRS", "detector_pairs", "paired_table", "tie_ranks"],
    "advopenood_plugins.levels": ["Levels", "CRITERIA", "plot_levels"],
    "advopenood_plugins.robust_auroc": ["COLUMNS", "ROBUST_METRICS", "robust_table"],
    "advopenood_plugins.robust_paired": ["robust_paired_table"],
    "advopenood_plugins.mead": ["SetInfo", "set_info", "worst_case_scores"],
    "advopenood_plugins.multiattack": ["MULTI_COLUMNS", "attack_label"],
    "advopenood_plugins.bintest": ["run_bintest", "BinarizationTest", "read_bintest", "bintest_section"],
    "advopenood_plugins.gradcam": ["CamExtractor", "read_gradcam"],
    "advopenood_plugins.transfer": ["TransferAnalysis", "read_transfer", "transfer_asr", "plan"],
    "advopenood_plugins.transfer_adversary": ["CWCNN", "train_mixed", "fraction_rows"],
    "advopenood_plugins.verify_ood": ["verify", "rederive_bounds", "ci_plan"],
    "advopenood_plugins.verify_paired": ["verify_paired", "pairs_of"],
    "advopenood_plugins.verify_mead": ["verify_mead", "worst_case", "row_bounds"],
    "advopenood_plugins.verify_multiattack": ["verify_multiattack"],
    "advopenood_plugins.verify_robust": ["verify_robust", "verify_levels", "rederive_robust"],
    "advopenood_plugins.verify_robust_paired": ["verify_robust_paired"],
    "advopenood_plugins.verify_smoothed": ["verify"],
    "advopenood_plugins.verify_transfer": ["verify"],
}


def test_every_former_module_path_is_covered():
    assert set(FORMER_NAMES) == set(advopenood_plugins.MOVED) | set(advopenood_plugins.FORMER)


@pytest.mark.parametrize("module, names", FORMER_NAMES.items(), ids=list(FORMER_NAMES))
def test_a_former_plugin_module_path_imports_with_a_deprecation_warning(module, names):
    """Imported afresh, an old flat module warns and gives the very objects of the modules that hold them now; a
    kind's package (once a module) warns when one of the names it held is read."""
    targets = advopenood_plugins.MOVED.get(module) or advopenood_plugins.FORMER[module]
    if module in advopenood_plugins.MOVED:
        sys.modules.pop(module, None)
    with pytest.warns(DeprecationWarning, match=rf"{module}\S* is deprecated, use advopenood_plugins\."):
        imported = __import__(module, fromlist=names)
        found = {name: getattr(imported, name) for name in names}
    for name, obj in found.items():
        assert any(getattr(importlib.import_module(t), name, None) is obj for t in targets), name


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
