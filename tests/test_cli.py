"""The CLI: `list`, a third-party plugin found through its entry point, and the bad-input matrix."""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from advopenood.cli.main import build_parser, commands, main
from advopenood.config.packaged import packaged_configs
from conftest import pack_config

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("ADVOPENOOD_TEST_DATA", REPO.parent / "shared" / "data"))


def run_cli(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "advopenood.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=cwd, timeout=900)


@pytest.mark.parametrize("kind, expected", [("attacks", ["fgsm", "pgd", "df", "mpgd"]),
                                            ("detectors", ["msp", "odin", "mds", "vim", "scale"]),
                                            ("evaluators", ["ood"]), ("analyses", ["gradcam", "bintest"])])
def test_list_prints_plugins_with_descriptions(capsys, kind, expected):
    assert main(["list", kind]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = {line.split()[0]: line for line in lines}
    for name in expected:
        assert name in names and len(names[name].split(None, 1)) == 2


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory) -> Path:
    """The example plugin under tests/ installed with pip into a folder put on PYTHONPATH."""
    target = tmp_path_factory.mktemp("site")
    build = tmp_path_factory.mktemp("build")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "--target", str(target), str(REPO / "tests" / "thirdparty_plugin")],
                   check=True, capture_output=True, cwd=build, timeout=300)
    return target


def test_third_party_detector_is_listed_and_runs(plugin_path, tmp_path, data_root, session_cache):
    """Listed, and scored in a run beside MSP: the pack's trained ResNet-20 on 64 CIFAR-10 images against Textures
    and their FGSM images (a trained network that needs no training in the run, unlike the demo's)."""
    env = {"PYTHONPATH": os.pathsep.join([str(plugin_path), os.environ.get("PYTHONPATH", "")])}
    listed = run_cli("list", "detectors", env=env)
    assert listed.returncode == 0 and any(l.startswith("negentropy ") for l in listed.stdout.splitlines())
    out = tmp_path / "out"
    config = pack_config(tmp_path / "cfg", data_root, {"limit": 64, "batch_size": 64,
                                                        "detectors": ["negentropy", "msp"]})
    done = run_cli("run", "--config", config, "--out", str(out), "--quiet", env=env)
    assert done.returncode == 0, done.stderr
    import pandas as pd

    ood = pd.read_csv(out / "ood.csv")
    rows = ood[ood.detector == "negentropy"]
    assert set(rows.ood_set) >= {"fgsm", "texture"} and rows.auroc.notna().all()
    assert rows[rows.ood_set == "texture"].auroc.iloc[0] > 50


def _config(tmp_path: Path, **changes) -> str:
    """The CIFAR-10 ResNet-20 config with dotted keys changed (``None`` removes a key), written to a new file."""
    cfg = yaml.safe_load((REPO / "configs" / "cifar10_resnet20.yaml").read_text())
    cfg["data"]["root"] = str(DATA)
    for dotted, value in changes.items():
        node = cfg
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node[key]
        if value is None:
            node.pop(leaf)
        else:
            node[leaf] = value
    path = tmp_path / f"cfg{len(list(tmp_path.glob('cfg*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _text_config(tmp_path: Path, old: str, new: str) -> str:
    """The CIFAR-10 ResNet-20 config file with one piece of its text replaced (keeps YAML lines and columns)."""
    text = (REPO / "configs" / "cifar10_resnet20.yaml").read_text().replace("root: ../../shared/data", f"root: {DATA}")
    assert old in text
    path = tmp_path / "edited.yaml"
    path.write_text(text.replace(old, new))
    return str(path)


def _file(tmp_path: Path, name: str, make) -> Path:
    path = tmp_path / name
    make(path)
    return path


def _state_dict_of(arch: str) -> dict:
    from advopenood.models.classifier import build_model

    return build_model(arch, 10).backbone.state_dict()


CIFAR = str(REPO / "configs" / "cifar10_resnet20.yaml")
ROOT = ["--data-root", str(DATA)]

#: name -> (make arguments from tmp_path, fragment the one error line must contain)
BAD_CASES: dict[str, tuple] = {
    "unknown key top": (lambda t: ["run", "--config", _text_config(t, "detectors: all", "detecters: all")],
                        "unknown key detecters; did you mean detectors? (edited.yaml line 27, column 1)"),
    "unknown key nested": (lambda t: ["run", "--config", _text_config(t, "checkpoint:", "chekpoint:")],
                           "unknown key model.chekpoint; did you mean model.checkpoint? (edited.yaml line 10, column 3)"),
    "unknown key in list": (lambda t: ["run", "--config", _config(t, **{"data.ood": [{"kind": "npz", "pth": "x.npz"}]})],
                            "unknown key data.ood[0].pth; did you mean data.ood[0].path?"),
    "wrong type": (lambda t: ["run", "--config", _text_config(t, "num_classes: 10", "num_classes: ten")],
                   "model.num_classes: Input should be a valid integer"),
    "bad yaml": (lambda t: ["run", "--config", _text_config(t, "seed: 0", "seed: [0")], "is not valid YAML at line"),
    "yaml not a mapping": (lambda t: ["run", "--config", str(_file(t, "list.yaml", lambda p: p.write_text("- a\n")))],
                           "must be a YAML mapping"),
    "unknown protocol": (lambda t: ["run", "--config", CIFAR, *ROOT, "--protocol", "lorenz"],
                         "unknown protocol 'lorenz'; did you mean 'lorenz2024'?"),
    "unknown arch": (lambda t: ["run", "--config", _config(t, **{"model.arch": "resnet21"})],
                     "model.arch: unknown architecture 'resnet21'; did you mean 'resnet20'?"),
    "attack": (lambda t: ["run", "--config", CIFAR, *ROOT, "--attack", "pgdd"], "unknown attack 'pgdd'; did you mean 'pgd'?"),
    "attack params name": (lambda t: ["run", "--config", _config(t, attack_params={"pgdd": {"steps": 3}})],
                           "attack_params.pgdd"),
    "eps zero": (lambda t: ["run", "--config", CIFAR, *ROOT, "--eps", "0"], "--eps 0 is out of range"),
    "eps big": (lambda t: ["run", "--config", CIFAR, *ROOT, "--eps", "2"], "eps 2.0"),
    "eps text": (lambda t: ["run", "--config", CIFAR, *ROOT, "--eps", "eight"], "'eight'"),
    "config": (lambda t: ["run", "--config", "nosuch"], "'nosuch'"),
    "data root": (lambda t: ["run", "--config", CIFAR, "--data-root", str(_file(t, "empty", Path.mkdir))],
                  "cifar10_test.npz"),
    "no folder": (lambda t: ["run", "--config", CIFAR, "--data-root", str(t / "nope")], "nope"),
    "missing data file": (lambda t: ["run", "--config", _config(t, **{"data.ood": [{"kind": "npz", "path": "gone.npz"}]})],
                          "gone.npz' not found"),
    "nchw npz": (lambda t: ["run", "--config", _config(t, **{"data.id": {"kind": "npz", "name": "c", "path": str(_file(
        t, "nchw.npz", lambda p: np.savez(p, x=np.zeros((4, 3, 32, 32), np.uint8), y=np.zeros(4, np.int64))))}})],
        "x has shape (4, 3, 32, 32), which is channels-first (NCHW)"),
    "float range": (lambda t: ["run", "--config", _config(t, **{"data.id": {"kind": "npz", "name": "f", "path": str(_file(
        t, "float.npz", lambda p: np.savez(p, x=np.linspace(-1, 2, 4 * 32 * 32 * 3, dtype=np.float32).reshape(4, 32, 32, 3),
                                           y=np.zeros(4, np.int64))))}})], "outside [0, 1]"),
    "corrupt checkpoint": (lambda t: ["run", "--config", _config(t, **{"model.checkpoint": str(_file(
        t, "bad.pt", lambda p: p.write_bytes(b"not a checkpoint")))})], "cannot be loaded"),
    "pickled checkpoint": (lambda t: ["run", "--config", _config(t, **{"model.checkpoint": str(_file(
        t, "obj.pt", lambda p: __import__("torch").save({"net": object()}, p)))})], "cannot be loaded"),
    "mismatched checkpoint": (lambda t: ["run", "--config", _config(t, **{"model.arch": "resnet18_32x32"})],
                              "does not match architecture 'resnet18_32x32'"),
    "dataset kind": (lambda t: ["run", "--config", _config(t, **{"data.id": {"kind": "zip", "path": "x"}})],
                     "data.id.kind 'zip' is not a data kind"),
    "demo set": (lambda t: ["run", "--config", _config(t, **{"data.id": {"kind": "demo", "name": "letters"}})],
                 "'letters'"),
    "detector": (lambda t: ["run", "--config", CIFAR, *ROOT, "--detectors", "msp,foo"], "'foo'"),
    "evaluator": (lambda t: ["run", "--config", CIFAR, *ROOT, "--evaluator", "bar"], "'bar'"),
    "analysis": (lambda t: ["run", "--config", CIFAR, *ROOT, "--analysis", "baz"], "'baz'"),
    "backend": (lambda t: ["run", "--config", CIFAR, *ROOT, "--detector-backend", "sklearn"], "'sklearn'"),
    "device": (lambda t: ["run", "--config", CIFAR, *ROOT, "--device", "tpu"], "'tpu'"),
    "limit": (lambda t: ["run", "--config", CIFAR, *ROOT, "--limit", "0"], "--limit"),
    "num workers": (lambda t: ["run", "--config", CIFAR, *ROOT, "--num-workers", "999"], "cores"),
    "kind": (lambda t: ["list", "widgets"], "'widgets'"),
    "out is a file": (lambda t: ["run", "--config", CIFAR, *ROOT, "--out", str(_file(t, "f.txt", lambda p: p.write_text("x")))],
                      "is a file"),
    "out read-only": (lambda t: ["run", "--config", CIFAR, *ROOT, "--out", str(_file(t, "ro", lambda p: (p.mkdir(),
                                                                                                      p.chmod(0o555))) / "o")],
                      "is not writable"),
    "out foreign files": (lambda t: ["run", "--config", CIFAR, *ROOT, "--out", str(_file(t, "mine", lambda p: (
        p.mkdir(), (p / "thesis.tex").write_text("x"))))], "holds files advopenood did not write (e.g. 'thesis.tex')"),
    "adaptive family": (lambda t: ["run", "--config", CIFAR, *ROOT, "--attack", "pgd,adaptive", "--detectors", ""],
                        "attack 'adaptive' stands for one attack per selected detector"),
    "ood source": (lambda t: ["run", "--config", _config(t, **{"data.ood": []}), "--attack", "adaptive_ood_msp"],
                   "ood_set None is not one of the run's OOD sets"),
    "adaptive lam": (lambda t: ["run", "--config", _config(t, attack_params={"adaptive_mds": {"lam": -1}}),
                                "--attack", "adaptive_mds"], "lam -1"),
    "detector param": (lambda t: ["run", "--config", _config(t, detector_params={"knn": {"K2": 5}}), "--attack", "fgsm",
                                  "--detectors", "knn"], "'K2'"),
    "transfer": (lambda t: ["run", "--config", _config(t, analysis_params={"transfer": {"fractions": [150]}}),
                            "--attack", "fgsm", "--analysis", "transfer"], "fraction 150"),
    "analysis param": (lambda t: ["run", "--config", _config(t, analysis_params={"gradcam": {"treshold": 2}}), "--attack",
                                  "fgsm", "--analysis", "gradcam"], "unknown parameter 'treshold' for analysis 'gradcam'"),
    "attack param type": (lambda t: ["run", "--config", _config(t, attack_params={"pgd": {"steps": "ten"}}), "--attack",
                                     "pgd"], "parameter steps of attack 'pgd' is 'ten'; valid choices: int"),
    "detector param type": (lambda t: ["run", "--config", _config(t, detector_params={"knn": {"K": "abc"}}), "--attack",
                                       "fgsm", "--detectors", "knn"], "parameter K of detector 'knn' is 'abc'"),
    "analysis param type": (lambda t: ["run", "--config", _config(t, analysis_params={"gradcam": {"l2_threshold": "x"}}),
                                       "--attack", "fgsm", "--analysis", "gradcam"],
                            "parameter l2_threshold of analysis 'gradcam' is 'x'; valid choices: int or float"),
    "bintest gap": (lambda t: ["run", "--config", _config(t, analysis_params={"bintest": {"gap": 2}}), "--attack", "fgsm",
                               "--analysis", "bintest"], "analysis bintest: gap 2"),
    "bintest kappa": (lambda t: ["bintest", "--config", _config(t, analysis_params={"bintest": {"kappa": 1.5}}),
                                 "--attack", "fgsm"], "analysis bintest: kappa 1.5; valid choices: 0 < kappa < 1"),
    "bintest kappa type": (lambda t: ["bintest", "--config", _config(t, analysis_params={"bintest": {"kappa": "high"}}),
                                      "--attack", "fgsm"], "parameter kappa of analysis 'bintest' is 'high'"),
    "flag": (lambda t: ["run", "--config", CIFAR, "--bogus"], "run: unknown flag --bogus; valid flags: --help,"),
    "flag typo": (lambda t: ["run", "--config", CIFAR, "--detecters", "msp"],
                  "unknown flag --detecters; did you mean --detectors?"),
    "flag of another subcommand": (lambda t: ["attack", "--config", CIFAR, "--detectors", "msp"],
                                   "attack: unknown flag --detectors;"),
    "eps zero denominator": (lambda t: ["run", "--config", CIFAR, *ROOT, "--eps", "8/0"],
                             "eps '8/0' has a zero denominator"),
    "attack in a long list": (lambda t: ["run", "--config", CIFAR, *ROOT, "--attack", "pgdd"],
                              "more; see `advopenood list attacks`"),
    "attack params in a long list": (lambda t: ["run", "--config", _config(t, attack_params={"pgdd": {"steps": 3}})],
                                     "more; see `advopenood list attacks`"),
}


def _tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


#: cases refused before any data file is opened: they run without the benchmark pack
PACK_FREE = {"unknown key top", "unknown key nested", "unknown key in list", "wrong type", "bad yaml",
             "yaml not a mapping", "unknown arch", "config", "data root", "no folder", "dataset kind",
             "kind", "flag", "flag typo", "flag of another subcommand"}


@pytest.mark.parametrize("name", list(BAD_CASES))
def test_bad_input_exits_2_with_one_line_quickly_writing_nothing(name, tmp_path, capsys, monkeypatch, request):
    if name not in PACK_FREE:
        request.getfixturevalue("data_root")  # skips with its one-line reason when the pack is absent
    make, fragment = BAD_CASES[name]
    args = make(tmp_path)
    cache = tmp_path / "cache"
    monkeypatch.setenv("ADVOPENOOD_CACHE", str(cache))
    if args[0] == "run" and "--out" not in args and "--bogus" not in args:
        args += ["--out", str(tmp_path / "out")]
    before = _tree(tmp_path)
    t0 = time.perf_counter()
    rc = main(args)
    elapsed = time.perf_counter() - t0
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("advopenood: error:"), err
    assert fragment in err[0], err[0]
    assert "advopenood: error: advopenood" not in err[0] and len(err[0]) < 1000, "a doubled prefix or an endless list"
    assert elapsed < 5.0, f"{elapsed:.1f} s"
    assert _tree(tmp_path) == before, "the failed run wrote files"


@pytest.mark.parametrize("plural, singular, value", [("--attacks", "--attack", "fgsm,pgd"),
                                                     ("--detector", "--detectors", "msp,odin"),
                                                     ("--evaluators", "--evaluator", "ood,meanconf"),
                                                     ("--analyses", "--analysis", "gradcam")])
def test_each_plugin_flag_takes_both_forms(plural, singular, value):
    """``--detectors`` is plural, ``--attack`` singular: each flag is accepted in both forms, with the same effect."""
    base = ["run", "--config", "demo"]
    assert build_parser().parse_args([*base, plural, value]) == build_parser().parse_args([*base, singular, value])
    assert getattr(build_parser().parse_args([*base, plural, value]), singular.lstrip("-")) == value


def test_unavailable_backend_is_refused_before_work(tmp_path, capsys, data_root):
    if importlib.util.find_spec("openood") is not None:
        pytest.skip("OpenOOD is installed here, so its backend is available")
    rc = main(["run", "--config", CIFAR, *ROOT, "--detector-backend", "openood", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "needs OpenOOD, which is not installed" in err[0]
    assert not (tmp_path / "o").exists()


def test_bad_input_from_the_shell_has_no_traceback():
    done = run_cli("run", "--config", "demo", "--attack", "pgd,qqqq")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "advopenood: error: unknown attack 'qqqq'; valid choices: " + done.stderr.split("valid choices: ")[1].strip()]
    assert "Traceback" not in done.stderr


def test_corrupt_checkpoint_from_the_shell_has_no_traceback(tmp_path, data_root):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"\x80\x02not a pickle")
    done = run_cli("run", "--config", _config(tmp_path, **{"model.checkpoint": str(bad)}), "--out", str(tmp_path / "o"))
    assert done.returncode == 2 and "Traceback" not in done.stderr and "cannot be loaded" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("argv", [[], ["--help"]])
def test_bare_command_and_help_list_every_subcommand(argv):
    done = run_cli(*argv)
    assert done.returncode == 0
    assert "bintest" in commands()  # declared by the analysis, not the core
    for command in commands():
        assert any(line.split()[:1] == [command] for line in done.stdout.splitlines()), command


@pytest.mark.parametrize("command", ["run", "attack", "demo", "bintest", "list"])
def test_each_subcommand_has_its_own_help(command):
    done = run_cli(command, "--help")
    assert done.returncode == 0 and done.stdout.startswith(f"usage: advopenood {command}")
    has_detectors = "--detectors" in done.stdout
    assert has_detectors == (command in ("run", "demo"))


def _parser_flags(command: str) -> set[str]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser = sub.choices[command]
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--") and s != "--help"}


def test_docs_flag_table_matches_the_run_parser():
    readme = (REPO / "docs" / "cli.md").read_text()
    table = readme.split("| flag | meaning |", 1)[1].split("\n\n", 1)[0]
    documented = {flag for row in table.splitlines() if row.startswith("| `")
                  for flag in re.findall(r"--[a-z][a-z-]*", re.split(r"(?<!\\)\|", row)[1])}
    assert documented == _parser_flags("run")
    configs = re.findall(r"`([a-z0-9_]+)`", table.split("`--config`", 1)[1].splitlines()[0])
    assert set(configs) >= set(packaged_configs())


def test_cli_sets_passive_openmp_unless_the_user_chose():
    code = "import os, advopenood.cli.main; print(os.environ['OMP_WAIT_POLICY'])"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env).stdout.strip() == "PASSIVE"
    env["OMP_WAIT_POLICY"] = "ACTIVE"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env).stdout.strip() == "ACTIVE"


FAST_COMMANDS = [["--help"], ["run", "--help"], ["verify", "--help"], ["bintest", "--help"], ["list", "detectors"],
                 ["list", "analyses"], ["list", "attacks"]]


#: a CLI call in a fresh process that says whether it imported torch (on stderr)
TORCH_PROBE = ("import sys, json; from advopenood.cli.main import main\n"
               "try:\n    main(json.loads(sys.argv[1]))\nexcept SystemExit:\n    pass\n"
               "print('TORCH=' + str('torch' in sys.modules), file=sys.stderr)")


def _probe(argv: list[str], cache: Path) -> subprocess.CompletedProcess:
    import json

    return subprocess.run([sys.executable, "-c", TORCH_PROBE, json.dumps(argv)], capture_output=True, text=True,
                          env={**os.environ, "ADVOPENOOD_CACHE": str(cache)})


@pytest.fixture(scope="module")
def indexed_cache(tmp_path_factory) -> Path:
    """A cache that holds the plugin index, stored by one ``list detectors`` as any install does once."""
    cache = tmp_path_factory.mktemp("indexed")
    assert run_cli("list", "detectors", env={"ADVOPENOOD_CACHE": str(cache)}).returncode == 0
    assert (cache / "registry-index.json").is_file()
    return cache


def test_the_first_call_builds_the_plugin_index_and_answers_as_every_later_call(tmp_path, indexed_cache):
    """torch is imported only to build the index (once per change of plugins): a fresh cache's first call builds
    it and prints what a call on a built index prints."""
    first = _probe(["list", "attacks"], tmp_path)
    assert first.returncode == 0 and (tmp_path / "registry-index.json").is_file() and "TORCH=True" in first.stderr
    assert _probe(["list", "attacks"], indexed_cache).stdout == first.stdout


@pytest.mark.parametrize("argv", FAST_COMMANDS, ids=" ".join)
def test_help_and_list_answer_without_importing_torch(argv, indexed_cache):
    """The CLI shell reads the plugin index: help and listings never import torch once it is built."""
    done = _probe(argv, indexed_cache)
    assert done.returncode == 0 and done.stdout and "TORCH=False" in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("kind, names", [
    ("attacks", ["adaptive_eot_smoothed_msp", "adaptive_apgd_eot", "robust_id_smoothed_msp",
                 "robust_apgd_ood_eot_smoothed_msp", "robust_id_eot"]),
    ("detectors", ["smoothed_msp"])])
def test_the_first_look_up_in_a_process_holds_every_generated_plugin(kind, names):
    """A family registered while a listing runs (the adaptive attacks' families take the detectors, whose discovery
    imports smoothed.py and its families) counts in the same listing: the first ``names`` of a fresh process equals
    the second, and the plugin index built from it is complete (it once lacked all 54 EOT attacks)."""
    probe = ("from advopenood import registry\n"
             f"first = registry.names({kind!r}); second = registry.names({kind!r})\n"
             f"print(first == second, *[n in first for n in {names!r}])")
    got = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert got.stdout.split() == ["True"] * (1 + len(names)), got.stderr[-2000:]


def test_descriptions_are_whole_sentences(capsys):
    assert main(["list", "detectors"]) == 0
    odin = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("odin "))
    assert odin.rstrip().endswith(".") and "the input gradient from the shared pass" in odin


def test_the_plugin_index_notices_an_edit_to_a_module_no_entry_point_names(tmp_path, monkeypatch):
    """``plugins/smoothed.py`` registers plugins but is imported by ``plugins/detectors.py``, not named by an entry
    point: editing it must change the index's fingerprint, so ``advopenood list`` is never served stale."""
    import os

    from advopenood import plugin_index

    sibling = Path(plugin_index._module_files("advopenood_plugins.detectors")[-1]).with_name("smoothed.py")
    before = plugin_index._fingerprint()
    st = sibling.stat()
    os.utime(sibling, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    try:
        assert plugin_index._fingerprint() != before
    finally:
        os.utime(sibling, ns=(st.st_atime_ns, st.st_mtime_ns))


#: flags refused before torch and the plugins load (advopenood/cli/precheck.py); the docs quote the time measured
PRECHECKED = {"eps": (["--eps", "abc"], "eps 'abc' is not a number"),
              "ci": (["--ci", "nosuch"], "ci.method (--ci) 'nosuch' is not an interval method"),
              "resamples": (["--ci", "bootstrap", "--ci-resamples", "5"], "ci.resamples: 5 resamples are too few for a bootstrap"),
              "resamples bound": (["--ci-resamples", "100001"], "ci.resamples (--ci-resamples) 100001 is out of range"),
              "detector": (["--detectors", "msp,nosuch"], "unknown detector 'nosuch'"),
              "attack": (["--attack", "pgd,adaptive_nosuch"], "unknown attack 'adaptive_nosuch'"),
              "evaluator": (["--evaluator", "ood,nosuch"], "unknown evaluator 'nosuch'"),
              # issue 49, item 3: names are case-sensitive, and a name composes each family at most once
              "upper case": (["--detectors", "msp,ROSS_MSP"], "did you mean 'ross_msp' (names are case-sensitive)?"),
              "nested": (["--detectors", "smoothed_" * 400 + "msp"], "composes family smoothed_<detector> twice")}


@pytest.mark.parametrize("case", list(PRECHECKED))
def test_bad_flags_are_refused_before_torch_loads(case, tmp_path, indexed_cache):
    """``run --eps abc`` and the like exit 2 with one line, without importing torch or a plugin (the names from the
    plugin index), in well under the 8-10 s a full load took."""
    import json

    flags, fragment = PRECHECKED[case]
    env = {**os.environ, "ADVOPENOOD_CACHE": str(indexed_cache)}
    probe = ("import sys, json; from advopenood.cli.main import main\n"
             "rc = main(json.loads(sys.argv[1]))\n"
             "print('RC=%d TORCH=%s PLUGINS=%s' % (rc, 'torch' in sys.modules, "
             "any(m.startswith('advopenood_plugins') for m in sys.modules)))")
    argv = ["run", "--config", "demo", "--out", str(tmp_path / "out"), *flags]
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", probe, json.dumps(argv)], env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    assert "RC=2 TORCH=False PLUGINS=False" in done.stdout, (done.stdout, done.stderr)
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and fragment in done.stderr
    assert elapsed < 3.0, f"{elapsed:.1f} s"
    assert not (tmp_path / "out").exists()


#: config, value, folder and file mistakes refused before torch loads (issue 50, item 9): flags -> what the line says
REFUSED_EARLY = {"eps": (["--eps", "-0.1"], "--eps -0.1 is out of range"),
                 "seed": (["--seed", "-1"], "seed: Input should be greater than or equal to 0 (got -1) (from the flag "
                                            "--seed)"),
                 "config name": (["--config", "cifar10_resnet2"], "config 'cifar10_resnet2' not found"),
                 "key": (["--config", "{tmp}/bad.yaml"], "unknown key attackz; did you mean attacks? (bad.yaml line 2"),
                 "out": (["--out", "{tmp}/a_file"], "output folder '{tmp}/a_file' is a file"),
                 "data root": (["--data-root", "{tmp}/nosuch"], "data root '{tmp}/nosuch' is not a folder")}


def test_config_folder_and_file_mistakes_are_refused_before_torch_loads(tmp_path, indexed_cache):
    """A bad key or value in the YAML, a mistyped config name, a flag's value the schema refuses (named by its flag),
    an output folder that is a file, a missing data root, ``--device cuda`` without a GPU driver and ``verify`` of a
    missing folder: each exit 2 in one line, and none of them imports torch or a plugin (one process for all)."""
    import json

    from advopenood.run.preflight import GPU_DRIVER_PATHS

    (tmp_path / "bad.yaml").write_text("name: demo\nattackz: [pgd]\n")
    (tmp_path / "a_file").write_text("x\n")
    cases = {k: ([a.format(tmp=tmp_path) for a in flags], text.format(tmp=tmp_path))
             for k, (flags, text) in REFUSED_EARLY.items()}
    argvs = {k: ["run", "--config", "demo", "--out", str(tmp_path / "out"), *flags] for k, (flags, _) in cases.items()}
    argvs["verify"], cases["verify"] = ["verify", str(tmp_path / "nosuch")], ([], "does not exist")
    if not any(os.path.exists(p) for p in GPU_DRIVER_PATHS):
        argvs["cuda"] = ["run", "--config", "demo", "--out", str(tmp_path / "out"), "--device", "cuda"]
        cases["cuda"] = ([], "device 'cuda' is not available on this machine")
    probe = ("import sys, json; from advopenood.cli.main import main\n"
             "for name, argv in json.loads(sys.argv[1]).items():\n"
             "    print(name, file=sys.stderr); rc = main(argv)\n"
             "    print(name, rc, 'torch' in sys.modules, any(m.startswith('advopenood_plugins') for m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe, json.dumps(argvs)], capture_output=True, text=True,
                          env={**os.environ, "ADVOPENOOD_CACHE": str(indexed_cache)})
    assert done.stdout.splitlines() == [f"{name} 2 False False" for name in argvs], (done.stdout, done.stderr[-3000:])
    lines = done.stderr.splitlines()
    for name, (_, text) in cases.items():  # each case: its name, then its one line
        said = lines[lines.index(name) + 1]
        assert said.startswith("advopenood: error: ") and text in said, (name, said)
    assert len(lines) == 2 * len(cases) and not (tmp_path / "out").exists()


def test_list_into_a_closed_pipe_ends_quietly():
    """``advopenood list attacks | head -1``: the reader leaves early; no BrokenPipeError traceback, exit 0."""
    proc = subprocess.Popen([sys.executable, "-m", "advopenood.cli", "list", "attacks"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # before the CLI writes its first line
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 0 and "Traceback" not in err and "BrokenPipe" not in err, err
