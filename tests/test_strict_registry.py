"""One room per plugin (issue 32, item 2): a name is registered once unless a plugin declares that it overrides
another (recorded in run.json and the report), a plugin package that fails to load is named instead of "unknown",
what exists never depends on the order entry points load in, and the public plugin API stays: every name in
``advopenood.plugin``; a package written against a path 0.3.0 removed fails to load, named in one line."""
from __future__ import annotations

import ast
import importlib
import itertools
import json
import sys
import warnings
from importlib.metadata import EntryPoint, EntryPoints, version
from pathlib import Path

import numpy as np
import pytest

from conftest import pack_config
from advopenood import plugin_registry, registry
from advopenood.cli.main import main
from advopenood.errors import UsageError

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "tests" / "thirdparty_plugin" / "advopenood_example"
#: how a message names the installed advopenood distribution (its version is the release's, advopenood/VERSION)
DIST = f"advopenood=={version('advopenood')}"


@pytest.fixture()
def fresh(empty_registry, monkeypatch):
    """An empty registry for the test (no plugin discovered yet, no entry point, no family)."""
    monkeypatch.setattr(plugin_registry, "_DISTS", {})
    return empty_registry


@pytest.fixture()
def installed(fresh_registry, monkeypatch):
    """The registry as the installed plugins made it, copied for the test: changes to it end with the test. The
    entry points load again on the next look-up (modules already imported register nothing new)."""
    monkeypatch.setattr(plugin_registry, "_DISTS", dict(plugin_registry._DISTS))
    fresh_registry.discovered.clear()
    return fresh_registry


def plugin(module: str, name: str = "Plugin", **attrs) -> type:
    """A detector class defined in ``module``."""
    return type(name, (), {"__module__": module, "__qualname__": name, "__doc__": f"{name} of {module}.", **attrs})


# --------------------------------------------------------------------------------------------- duplicates

def _subclass_of_an_override() -> tuple[type, type]:
    base = plugin("pkg_one.detectors", "Base", overrides=True)
    return plugin("pkg_zero.detectors", "Held"), type("Sub", (base,), {"__module__": "pkg_two.detectors"})


@pytest.mark.parametrize("make, error", [
    (lambda: (plugin("pkg_one.detectors"), plugin("pkg_two.detectors")),
     "declare overrides = True on the one that replaces"),
    (lambda: (plugin("pkg_one.detectors", overrides=True), plugin("pkg_two.detectors", overrides=True)),
     "both declare overrides = True"),
    (_subclass_of_an_override, "declare overrides = True on the one that replaces"),
], ids=["neither-overrides", "both-override", "override-is-not-inherited"])
def test_a_second_plugin_under_a_taken_name_is_one_line_naming_both(fresh, make, error):
    """Registering is no error (a package's other plugins still register); the name is unusable: its look-up is
    the clash's one line."""
    first, second = make()
    registry.register("detectors", "zzdup")(first)
    registry.register("detectors", "zzdup")(second)
    registry.register("detectors", "zzother")(plugin("pkg_two.detectors", "Other"))
    with pytest.raises(UsageError) as caught:
        registry.get("detectors", "zzdup")
    message = str(caught.value)
    assert "\n" not in message and error in message
    assert message.startswith("detector 'zzdup' is registered twice, by ")
    assert first.__module__ in message and second.__module__ in message
    assert registry.clashes()["detectors"] == {"zzdup": message} and registry.names("detectors") == ["zzother"]


def test_the_same_plugin_registered_again_is_no_duplicate(fresh):
    """The same object twice (an entry point naming a class its module's decorator registered), or its module
    imported afresh (a new class object of the same definition): one entry, no error, no override."""
    first = plugin("pkg_one.detectors")
    registry.register("detectors", "zzsame")(first)
    registry.register("detectors", "zzsame")(first)
    reloaded = plugin("pkg_one.detectors")
    registry.register("detectors", "zzsame")(reloaded)
    assert registry.get("detectors", "zzsame") is reloaded and registry.overrides() == []


@pytest.mark.parametrize("override_first", [False, True], ids=["override-registers-last", "override-registers-first"])
def test_a_declared_override_holds_the_name_in_either_order_and_is_recorded(fresh, override_first):
    original, replacement = plugin("pkg_one.detectors"), plugin("pkg_two.detectors", overrides=True)
    for obj in ((replacement, original) if override_first else (original, replacement)):
        registry.register("detectors", "zzover")(obj)
    assert registry.get("detectors", "zzover") is replacement
    assert registry.overrides() == [{"kind": "detectors", "name": "zzover", "plugin": "pkg_two.detectors",
                                     "replaces": "pkg_one.detectors"}]


# --------------------------------------------------------------------------------------- fake packages

def make_dist(site: Path, dist: str, modules: dict[str, str], entry_points: dict[str, list[str]]) -> None:
    """A package installed in ``site``: its modules and a ``dist-info`` with its entry points."""
    for module, source in modules.items():
        (site / f"{module}.py").write_text(source)
    info = site / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("".join(f"[{group}]\n" + "".join(f"{line}\n" for line in lines)
                                                   for group, lines in entry_points.items()))


BROKEN = "from advopenood import no_such_api\n"
LEGACY = '''from advopenood.protocols import PROTOCOLS


class Legacy:
    """Names the protocols, through the module path of an earlier version."""

    def __call__(self, ctx):
        return {}
'''


@pytest.fixture()
def site(tmp_path, monkeypatch):
    """A folder on ``sys.path`` for fake installed packages; their modules are forgotten afterwards."""
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    yield folder
    for module in [m for m in sys.modules if m.startswith("zz_")]:
        del sys.modules[module]


@pytest.mark.parametrize("argv", [
    ["run", "--evaluator", "zzfoo"],
    ["run", "--evaluator", "zzbroken"],
    ["run", "--detectors", "all"],
    ["list", "evaluators"],
], ids=["unknown-name", "the-entry-points-name", "all", "list"])
def test_a_plugin_package_that_fails_to_load_is_named_not_unknown(installed, site, tmp_path, capsys, data_root, argv):
    make_dist(site, "zz-broken-plugin", {"zz_broken": BROKEN},
              {"advopenood.evaluators": ["zzbroken = zz_broken:Evaluator"]})
    if argv[0] == "run":
        argv = [*argv, "--config", pack_config(tmp_path / "cfg", data_root), "--out", str(tmp_path / "out")]
    with pytest.warns(UserWarning, match="could not load plugin 'zzbroken'"):
        assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("advopenood: error: plugin package zz-broken-plugin failed to load: "
                                               "ImportError: cannot import name 'no_such_api' from 'advopenood'")
    assert "unknown evaluator" not in err[0] and not (tmp_path / "out").exists()
    if "zzbroken" in argv:
        assert "evaluator 'zzbroken' is an entry point of zz-broken-plugin" in err[0]
    assert registry.get("evaluators", "ood")  # the plugins that loaded still serve their names


def test_a_plugin_package_written_against_advopenood_protocols_fails_naming_the_new_path(installed, site):
    """A package of a round before 0.2.0 imports ``advopenood.protocols`` (removed in 0.3.0): it is a failed
    package whose reason names the new path; the other plugins load."""
    make_dist(site, "zz-legacy-plugin", {"zz_legacy": LEGACY},
              {"advopenood.evaluators": ["zzlegacy = zz_legacy:Legacy"]})
    with pytest.warns(UserWarning, match="could not load plugin 'zzlegacy'"), pytest.raises(UsageError) as raised:
        registry.get("evaluators", "zzlegacy")
    assert [(f.package, f.reason) for f in registry.failures()] == [("zz-legacy-plugin", (
        "ModuleNotFoundError: advopenood.protocols was removed in 0.3.0; use advopenood.plugin (Protocol, PROTOCOLS, "
        "get_protocol for get; the rest is in advopenood.config.protocols)"))]
    assert "evaluator 'zzlegacy' is an entry point of zz-legacy-plugin" in str(raised.value)
    assert registry.get("evaluators", "ood")


def test_a_duplicate_between_two_packages_is_refused_whichever_loads_first(installed, site, tmp_path, capsys,
                                                                           data_root):
    """Two packages registering one name: a run that asks for it is a one-line error naming both distributions;
    every other name still resolves."""
    detector = "class Gap:\n    \"\"\"A detector.\"\"\"\n"
    make_dist(site, "zz-one", {"zz_one": detector}, {"advopenood.detectors": ["zzgap = zz_one:Gap"]})
    make_dist(site, "zz-two", {"zz_two": detector}, {"advopenood.detectors": ["zzgap = zz_two:Gap"]})
    config = pack_config(tmp_path / "cfg", data_root, {"detectors": "msp,zzgap"})
    assert main(["run", "--config", config, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["advopenood: error: detector 'zzgap' is registered twice, by zz_one (zz-one==1.0) and zz_two "
                   "(zz-two==1.0); declare overrides = True on the one that replaces the other on purpose"]
    with pytest.raises(UsageError, match="registered twice"):  # not only the first look-up
        registry.get("detectors", "zzgap")
    assert "zzgap" not in registry.names("detectors") and registry.resolves("detectors", "ross_msp")


# ----------------------------------------------------------------------------------- order independence

ORDER_PACKAGES = {
    "zz-alpha": ({"zz_alpha": '''from advopenood.registry import register


@register("detectors", "zzfirst")
class First:
    """First."""


@register("evaluators", "zzeval")
class Evaluate:
    """An evaluator registered by a detectors entry point's module."""
'''}, {"advopenood.detectors": ["alpha = zz_alpha", "zzfirst = zz_alpha:First"]}),
    "zz-beta": ({"zz_beta": '''class First:
    """Replaces zz_alpha's First on purpose."""

    overrides = True
'''}, {"advopenood.detectors": ["zzfirst = zz_beta:First"]}),
    "zz-gamma": ({"zz_gamma": '''class Second:
    """Second."""
'''}, {"advopenood.attacks": ["zzsecond = zz_gamma:Second"]}),
    "zz-delta": ({"zz_delta": BROKEN}, {"advopenood.analyses": ["zzdelta = zz_delta"]}),
}


def _load(order: tuple[int, ...], groups: tuple[str, ...], points: list[EntryPoint]) -> tuple:
    """The registry after loading ``points`` in ``order`` and the groups in the order ``groups``, from nothing."""
    for module in [m for m in sys.modules if m.startswith("zz_")]:
        del sys.modules[module]
    reg = registry.Registry()
    ordered = EntryPoints(points[i] for i in order)
    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mp.setattr(plugin_registry, "entry_points", lambda **group: ordered.select(**group) if group else ordered)
        for kind in groups:
            reg._discover_group(kind)
    return ({kind: {name: (e.source, e.obj.__qualname__) for name, e in reg.table[kind].items()}
             for kind in registry.KINDS}, reg.overrides(), [f.package for f in reg.failed])


def test_what_exists_does_not_depend_on_the_order_entry_points_load_in(fresh, site):
    points = []
    for dist, (modules, groups) in ORDER_PACKAGES.items():
        make_dist(site, dist, modules, groups)
        points += [EntryPoint(line.split(" = ")[0], line.split(" = ")[1], group)
                   for group, lines in groups.items() for line in lines]
    results = {(order, groups): _load(order, groups, points) for order in itertools.permutations(range(len(points)))
               for groups in (registry.KINDS, tuple(reversed(registry.KINDS)))}
    expected = ({"attacks": {"zzsecond": ("zz_gamma", "Second")}, "detectors": {"zzfirst": ("zz_beta", "First")},
                 "evaluators": {"zzeval": ("zz_alpha", "Evaluate")}, "analyses": {}},
                [{"kind": "detectors", "name": "zzfirst", "plugin": "zz_beta", "replaces": "zz_alpha"}], ["zz_delta"])
    assert len(results) == 240 and {repr(v) for v in results.values()} == {repr(expected)}


# --------------------------------------------------------------------------------------- a run's record

class _MaxLogit:
    """MSP replaced by the largest logit, on purpose (a test's override)."""

    overrides = True

    def setup(self, net, id_loader_dict, ood_loader_dict):
        pass

    def postprocess(self, net, data):
        logits = net(data)
        return logits.argmax(1), logits.max(1).values


def test_an_override_is_named_in_run_json_and_the_report(installed, tmp_path, data_root, session_cache):
    registry.register("detectors", "msp")(_MaxLogit)
    out = tmp_path / "out"
    assert main(["run", "--config", pack_config(tmp_path / "cfg", data_root), "--out", str(out), "--quiet"]) == 0
    info = json.loads((out / "run.json").read_text())
    assert info["plugin_overrides"] == [{"kind": "detectors", "name": "msp", "plugin": __name__,
                                         "replaces": f"advopenood_plugins.detectors.logits ({DIST})"}]
    with np.load(out / "scores" / "msp.npz") as scores:
        assert scores["id"].max() > 1.0  # a logit, not a softmax probability: the override scored
    report = (out / "report.md").read_text()
    assert f"- detectors msp: {__name__} replaces advopenood_plugins.detectors.logits ({DIST})" in report


# ------------------------------------------------------------------------------- generated names (issue 39, 3)

IMPOSTOR = '''class Impostor:
    """Largest logit under a name the project generates."""

    overrides = {overrides}

    def setup(self, net, id_loader_dict, ood_loader_dict):
        pass

    def postprocess(self, net, data):
        logits = net(data)
        return logits.argmax(1), logits.max(1).values
'''

#: a generated name of each kind, and what the message names as its generator
GENERATED = {("detectors", "ross_msp"): f"advopenood_plugins.detectors.ross ({DIST}) generates "
                                        "(ross_<detector>)",
             ("detectors", "smoothed_msp"): f"advopenood_plugins.detectors.smoothed ({DIST}) generates "
                                            "(smoothed_<detector>)",
             ("attacks", "adaptive_msp"): f"advopenood_plugins.attacks.adaptive ({DIST}) generates "
                                          "(adaptive_<detector>)",
             ("attacks", "robust_id_eot_ross_msp"): f"advopenood_plugins.attacks.robust ({DIST}) "
                                                    "generates (robust_id_eot_<detector>)"}


@pytest.mark.parametrize("kind, name", list(GENERATED), ids=[n for _, n in GENERATED])
def test_a_third_party_under_a_generated_name_is_refused_before_the_generator_runs(installed, site, tmp_path, capsys,
                                                                                  data_root, kind, name):
    """A package's entry point loads before the providers run: the provider used to skip the taken name, and the
    impostor was scored under the built-in name with exit 0."""
    make_dist(site, "zz-impostor", {"zz_impostor": IMPOSTOR.format(overrides=False)},
              {f"advopenood.{kind}": [f"{name} = zz_impostor:Impostor"]})
    asked = {"detectors": name} if kind == "detectors" else {"attacks": [name]}
    config = pack_config(tmp_path / "cfg", data_root, {"detectors": "msp", **asked})
    assert main(["run", "--config", config, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"advopenood: error: {kind[:-1]} {name!r} of zz_impostor (zz-impostor==1.0) takes a name that "
                   f"{GENERATED[kind, name]}; declare overrides = True on it to replace the generated one on purpose, "
                   "or rename it"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind, name", list(GENERATED), ids=[n for _, n in GENERATED])
def test_a_third_party_under_a_generated_name_is_refused_after_the_generator_ran(installed, kind, name):
    impostor = plugin("zz_late.plugins", "Impostor")
    assert registry.get(kind, name).__module__.startswith("advopenood_plugins.")  # generated already
    registry.register(kind, name)(impostor)
    with pytest.raises(UsageError) as caught:
        registry.get(kind, name)
    assert str(caught.value) == (f"{kind[:-1]} {name!r} of zz_late.plugins takes a name that {GENERATED[kind, name]}; "
                                 "declare overrides = True on it to replace the generated one on purpose, or rename it")
    assert registry.overrides() == []
    registry.unregister(kind, name)  # the clash resolved: the generated plugin serves the name again
    assert registry.get(kind, name).__module__.startswith("advopenood_plugins.") and registry.clashes()[kind] == {}


def test_a_declared_override_of_a_generated_name_holds_it_in_either_order(installed):
    early, late = plugin("zz_early.detectors", "Early", overrides=True), plugin("zz_late.detectors", "Late",
                                                                              overrides=True)
    registry.register("detectors", "smoothed_msp")(late)  # after the provider generated it
    registry.unregister("detectors", "ross_msp")
    registry.register("detectors", "ross_msp")(early)  # before the provider generates it again
    table = registry.entries("detectors")
    assert table["smoothed_msp"].obj is late and table["ross_msp"].obj is early
    assert registry.overrides() == [
        {"kind": "detectors", "name": "ross_msp", "plugin": "zz_early.detectors",
         "replaces": f"advopenood_plugins.detectors.ross ({DIST}), which generates ross_<detector>"},
        {"kind": "detectors", "name": "smoothed_msp", "plugin": "zz_late.detectors",
         "replaces": f"advopenood_plugins.detectors.smoothed ({DIST}), which generates smoothed_<detector>"}]


def test_a_declared_override_of_a_generated_name_is_named_in_run_json_and_the_report(installed, site, tmp_path,
                                                                                    data_root, session_cache):
    make_dist(site, "zz-impostor", {"zz_impostor": IMPOSTOR.format(overrides=True)},
              {"advopenood.detectors": ["ross_msp = zz_impostor:Impostor"]})
    out = tmp_path / "out"
    config = pack_config(tmp_path / "cfg", data_root, {"detectors": "ross_msp", "attacks": []})
    assert main(["run", "--config", config, "--out", str(out), "--quiet"]) == 0
    replaced = f"advopenood_plugins.detectors.ross ({DIST}), which generates ross_<detector>"
    info = json.loads((out / "run.json").read_text())
    assert info["plugin_overrides"] == [{"kind": "detectors", "name": "ross_msp",
                                         "plugin": "zz_impostor (zz-impostor==1.0)", "replaces": replaced}]
    with np.load(out / "scores" / "ross_msp.npz") as scores:
        assert scores["id"].max() > 1.0  # a logit: the declared override scored, not ROSS
    assert f"- detectors ross_msp: zz_impostor (zz-impostor==1.0) replaces {replaced}" in (out / "report.md").read_text()


# ------------------------------------------------------------------------------------- the public API

def test_every_name_of_the_public_plugin_module_imports():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        public = importlib.import_module("advopenood.plugin")
        namespace: dict = {}
        exec("from advopenood.plugin import *", namespace)
    assert len(public.__all__) == len(set(public.__all__))
    assert [n for n in public.__all__ if n not in namespace] == []
    for needed in ("Attack", "Postprocessor", "DifferentiableDetector", "register", "create", "Results", "Section",
                   "Table", "Paragraph", "Bullets", "Figure", "RunContext", "Protocol", "PROTOCOLS", "UsageError"):
        assert needed in public.__all__


@pytest.mark.parametrize("path", sorted(EXAMPLE.glob("*.py")), ids=lambda p: p.name)
def test_the_example_package_imports_only_the_public_plugin_module(path):
    from advopenood import plugin as public

    imports = [node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, (ast.Import, ast.ImportFrom))]
    ours = [node for node in imports if (getattr(node, "module", None) or "").startswith("advopenood")
            or any(alias.name.startswith("advopenood") for alias in node.names)]
    assert all(isinstance(node, ast.ImportFrom) and node.module == "advopenood.plugin" for node in ours)
    assert [a.name for node in ours for a in node.names if a.name not in public.__all__] == []


@pytest.mark.parametrize("statement", ["from advopenood.config import protocols", "from advopenood.detectors import "
                                       "Postprocessor", "from advopenood.outputs import Results",
                                       "import advopenood.data.datasets"])
def test_the_current_paths_do_not_warn(statement):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        exec(statement, {})


# ------------------------------------------------------------------------ a clash costs only its names (issue 49, 4)

NEGENTROPY = '''class Negentropy:
    """Another negentropy."""

    def setup(self, net, id_loader_dict, ood_loader_dict):
        pass

    def postprocess(self, net, data):
        logits = net(data)
        return logits.argmax(1), logits.max(1).values
'''


def _clashing_packages(site: Path) -> tuple[str, str]:
    """Two packages, each registering a built-in name without ``overrides``: ``msp`` and ``ross_msp``. Their clash
    lines, as the run's error names them."""
    make_dist(site, "zz-msp", {"zz_msp": IMPOSTOR.format(overrides=False)},
              {"advopenood.detectors": ["msp = zz_msp:Impostor"]})
    make_dist(site, "zz-ross", {"zz_ross": IMPOSTOR.format(overrides=False)},
              {"advopenood.detectors": ["ross_msp = zz_ross:Impostor"]})
    return (f"detector 'msp' is registered twice, by advopenood_plugins.detectors.logits ({DIST}) and zz_msp "
            "(zz-msp==1.0); declare overrides = True on the one that replaces the other on purpose",
            f"detector 'ross_msp' of zz_ross (zz-ross==1.0) takes a name that {GENERATED['detectors', 'ross_msp']}; "
            "declare overrides = True on it to replace the generated one on purpose, or rename it")


def test_a_clash_leaves_help_and_list_working_with_one_warning_per_clash(installed, site, capsys):
    """The issue's case: a package registering ``msp`` (another ``ross_msp``) made every command exit 2, ``--help``
    and ``list`` included, naming only the first clash. Now both are warned of at once and ``list`` marks them."""
    msp, ross = _clashing_packages(site)
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    captured = capsys.readouterr()
    assert "COMMAND" in captured.out
    assert captured.err.strip().splitlines() == [
        f"advopenood: warning: {msp} (unusable until then: msp; every other name works)",
        f"advopenood: warning: {ross} (unusable until then: ross_msp; every other name works)"]
    assert main(["list", "detectors"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert rows["msp"].split(None, 1)[1] == f"UNUSABLE: {msp}" and rows["ross_msp"].endswith(ross)
    assert {"ebo", "ross_<detector>", "smoothed_<detector>"} <= set(rows)
    assert registry.resolves("detectors", "ross_ebo") and registry.resolves("attacks", "adaptive_ebo")
    for name, line in (("msp", msp), ("ross_msp", ross), ("adaptive_msp", msp), ("adaptive_ross_msp", ross)):
        with pytest.raises(UsageError) as caught:  # a name made from a clashing one is unusable too
            registry.get("attacks" if name.startswith("adaptive") else "detectors", name)
        assert str(caught.value) == line


def test_a_clash_costs_a_run_only_if_it_asks_for_the_name(installed, site, tmp_path, capsys, data_root,
                                                          session_cache):
    """A run of ``ebo`` goes on (one warning line per clash); a run of ``msp`` is one line naming both packages
    and the fix, before any work. Two packages registering ``negentropy`` (a built-in name) do not stop a run either."""
    # negentropy is the example package's (tests/thirdparty_plugin) where that is installed
    held = [registry.entries("detectors")["negentropy"].origin] if registry.resolves("detectors", "negentropy") else []
    installed.discovered.clear()  # the packages below load on the next look-up
    msp, ross = _clashing_packages(site)
    for dist in ("zz-neg-one", "zz-neg-two"):
        module = dist.replace("-", "_")
        make_dist(site, dist, {module: NEGENTROPY}, {"advopenood.detectors": [f"negentropy = {module}:Negentropy"]})
    both = ["zz_neg_one (zz-neg-one==1.0)", "zz_neg_two (zz-neg-two==1.0)"]
    negentropy = (f"detector 'negentropy' is registered 3 times, by {held[0]}, {both[0]} and {both[1]}; declare "
                  "overrides = True on the one that replaces the others on purpose" if held else
                  f"detector 'negentropy' is registered twice, by {both[0]} and {both[1]}; declare overrides = True "
                  "on the one that replaces the other on purpose")
    out = tmp_path / "out"
    config = pack_config(tmp_path / "cfg", data_root, {"detectors": "ebo"})
    assert main(["run", "--config", config, "--out", str(out), "--quiet"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert [line for line in err if "warning" in line] == [
        f"advopenood: warning: {line} (unusable until then: {name}; every other name works)"
        for line, name in ((msp, "msp"), (negentropy, "negentropy"), (ross, "ross_msp"))]
    assert (out / "scores" / "ebo.npz").is_file()
    for detectors, line in (("ebo,msp", msp), ("negentropy", negentropy), ("all", msp)):
        assert main(["run", "--config", config, "--detectors", detectors, "--out", str(tmp_path / "refused")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"advopenood: error: {line}" + (" (so 'detectors: all' cannot select it)"
                                                        if detectors == "all" else "")]
        assert not (tmp_path / "refused").exists()


EMPTY_FAMILY = '''from advopenood.plugin import family


@family("detectors", "", accepts=lambda obj: True)
def wrap(detector):
    """Every name, wrapped."""
    return type(detector, (), {})
'''


def test_a_package_whose_family_has_an_empty_prefix_is_refused_naming_it(installed, site, capsys):
    """An empty prefix made every command, ``list`` included, end in RecursionError. The family is refused when it
    registers: its package failed to load (named in one line where a listing would lack it), the others work."""
    make_dist(site, "zz-empty", {"zz_empty": EMPTY_FAMILY}, {"advopenood.detectors": ["wrap = zz_empty"]})
    with pytest.warns(UserWarning, match="could not load plugin 'wrap'"), pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0 and "COMMAND" in capsys.readouterr().out
    assert main(["list", "detectors"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "advopenood: error: plugin package zz-empty failed to load: UsageError: detector family of zz_empty "
        "(zz-empty==1.0) has an empty prefix, so every name would be a member of itself; valid choices: a prefix such "
        "as 'my_' (my_<detector>) (advopenood list detectors would lack its plugins)"]
    assert registry.get("detectors", "msp") and registry.resolves("attacks", "adaptive_ross_msp")
