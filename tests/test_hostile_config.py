"""Hostile or careless configs and caches: each is refused before any work with one line (exit 2), never a
traceback, an unbounded expansion or a silently different run."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from advopenood.cli.main import main

REPO = Path(__file__).resolve().parents[1]


def _config(tmp_path: Path, old: str = "", new: str = "", extra: str = "") -> list[str]:
    """``run --config`` of the CIFAR-10 config with ``old`` replaced by ``new`` and ``extra`` appended. Its data
    files are not ``.npz`` files (:func:`unreadable_data`): a config that passes the plan's checks is refused later for
    that, never run."""
    text = (REPO / "configs" / "cifar10_resnet20.yaml").read_text(encoding="utf-8")
    assert old in text
    text = text.replace("root: ../../shared/data", f"root: {unreadable_data(tmp_path, text)}").replace(old, new) + extra
    path = tmp_path / "hostile.yaml"
    path.write_text(text, encoding="utf-8")
    return ["run", "--config", str(path)]


def unreadable_data(tmp_path: Path, text: str) -> Path:
    """A data root holding every file a config's text names (its ``path:`` values and checkpoint), none of them
    readable as what it should be: the CLI's checks before torch loads find each present, and the preflight refuses
    the first after the plan's checks passed."""
    root = tmp_path / "unreadable-data"
    root.mkdir(exist_ok=True)
    for name in re.findall(r"(?:path|checkpoint): ([\w.]+)", text):
        (root / name).write_text("not what it should be\n")
    return root


def _aliases(levels: int) -> str:
    """A "billion laughs" document: each level lists the one before nine times (9**levels values)."""
    lines = ['l0: &l0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def _file_in_cache(sub: str) -> Callable[[Path], list[str]]:
    def make(tmp_path: Path) -> list[str]:
        (tmp_path / "cache").mkdir()
        (tmp_path / "cache" / sub).write_text("not a folder")
        return [*_config(tmp_path), "--cache-dir", str(tmp_path / "cache")]
    return make


#: name -> (arguments from tmp_path, fragment of the one error line)
CASES: dict[str, tuple[Callable[[Path], list[str]], str]] = {
    "alias bomb": (lambda t: _config(t, extra=_aliases(6)), "expands to more than 100000 values through YAML aliases"),
    "alias loop": (lambda t: _config(t, extra="loop: &loop [1, *loop]\n"), "loop[1] (hostile.yaml line 30, column 7) "
                                                                          "refers to itself through a YAML alias"),
    "deep nesting": (lambda t: _config(t, extra="deep: " + "[" * 5000 + "]" * 5000 + "\n"), "nests too deeply"),
    "duplicate key": (lambda t: _config(t, extra="seed: 3\n"), "key seed is written twice (lines 5 and 30)"),
    "duplicate nested key": (lambda t: _config(t, "  arch: resnet20\n", "  arch: resnet20\n  arch: resnet18_32x32\n"),
                             "key model.arch is written twice (lines 9 and 10)"),
    "seed 2**63": (lambda t: _config(t, "seed: 0", f"seed: {2**63}"),
                   f"seed: Input should be less than or equal to {2**63 - 1} (got {2**63}) (hostile.yaml line 5"),
    "seed 2**64 flag": (lambda t: [*_config(t), "--seed", str(2**64)], "seed: Input should be less than or equal to"),
    "eps empty list": (lambda t: _config(t, "attacks: [fgsm, pgd, df, mpgd]", "attacks: [{name: pgd, eps: []}]"),
                       "attacks[0].eps: Tuple should have at least 1 item"),
    "eps text": (lambda t: _config(t, "attacks: [fgsm, pgd, df, mpgd]", "attacks: [{name: pgd, eps: abc}]"),
                 "attacks[0].eps: eps 'abc' is not a number"),
    "eps text in a sweep": (lambda t: _config(t, "attacks: [fgsm, pgd, df, mpgd]",
                                              "attacks: [{name: pgd, eps: [abc]}]"),
                            "attacks[0].eps[0]: eps 'abc' is not a number"),
    "attack entry not a mapping": (lambda t: _config(t, "attacks: [fgsm, pgd, df, mpgd]", "attacks: [5]"),
                                   "attacks[0]: Input should be a valid string (got 5)"),
    "eps flag without a value": (lambda t: [*_config(t), "--eps", ","], "--eps ',' names no budget"),
    # issue 39, item 5: a non-finite number became null in the saved plan, then the parameter's default
    "nan plugin param": (lambda t: _config(t, "attacks: [fgsm, pgd, df, mpgd]",
                                           "attacks: [{name: pgd, params: {rel_stepsize: .nan}}]"),
                         "attacks[0].params.rel_stepsize is .nan (hostile.yaml line 26, column 46); valid choices: a "
                         "finite number"),
    "inf attack_params eps": (lambda t: _config(t, extra="attack_params: {pgd: {eps: .inf}}\n"),
                              "attack_params.pgd.eps is .inf (hostile.yaml line 30"),
    "minus inf detector param": (lambda t: _config(t, extra="detector_params: {odin: {temperature: -.Inf}}\n"),
                                 "detector_params.odin.temperature is -.Inf (hostile.yaml line 30"),
    "overflow to inf": (lambda t: _config(t, extra="evaluator_params: {ood: {zz: 1.0e+999}}\n"),
                        "evaluator_params.ood.zz is 1.0e+999 (hostile.yaml line 30"),
    "nan in the model's mean": (lambda t: _config(t, "mean: [0.485,", "mean: [.NaN,"),
                                "model.mean[0] is .NaN (hostile.yaml line 14, column 10)"),
    "nan eps": (lambda t: _config(t, "attacks: [fgsm, pgd, df, mpgd]", "attacks: [{name: pgd, eps: .nan}]"),
                "attacks[0].eps is .nan"),
    "quoted nan eps": (lambda t: _config(t, "attacks: [fgsm, pgd, df, mpgd]", "attacks: [{name: pgd, eps: 'nan'}]"),
                       "attacks[0].eps: eps 'nan' is not a finite number"),
    "nan eps flag": (lambda t: [*_config(t), "--eps", "nan"], "eps 'nan' is not a finite number"),
    "inf in an eps sweep flag": (lambda t: [*_config(t), "--eps", "8/255,inf"], "eps 'inf' is not a finite number"),
    # issue 49, item 5: a flag's error names the flag, not the file's line of the key it replaced
    "seed flag -1": (lambda t: [*_config(t), "--seed", "-1"],
                     "seed: Input should be greater than or equal to 0 (got -1) (from the flag --seed)"),
    "device flag": (lambda t: [*_config(t), "--device", "tpu"],
                    "device: 'tpu' is not a device; valid choices: cpu, cuda, cuda:N (from the flag --device)"),
    # issue 49, item 3: a list or a mapping where a name is expected; names are case-sensitive; bounded nesting
    "ensemble a list": (lambda t: _config(t, "evaluators: [ood]", "evaluators: [ood, robust_auroc]",
                                          "evaluator_params: {robust_auroc: {ensemble: [standard]}}\n"),
                        "parameter ensemble of evaluator 'robust_auroc' is ['standard']; valid choices: str"),
    "ensemble a mapping": (lambda t: _config(t, "evaluators: [ood]", "evaluators: [ood, robust_auroc]",
                                             "evaluator_params: {robust_auroc: {ensemble: {kind: standard}}}\n"),
                           "parameter ensemble of evaluator 'robust_auroc' is {'kind': 'standard'}; valid choices: "
                           "str"),
    "upper-case detector": (lambda t: _config(t, "detectors: all", "detectors: ROSS_MSP"),
                            "unknown detector 'ROSS_MSP'; did you mean 'ross_msp' (names are case-sensitive)?"),
    "upper-case attack": (lambda t: _config(t, "attacks: [fgsm, pgd, df, mpgd]", "attacks: [FGSM]"),
                          "unknown attack 'FGSM'; did you mean 'fgsm' (names are case-sensitive)?"),
    "upper-case attack_params": (lambda t: _config(t, extra="attack_params: {PGD: {steps: 3}}\n"),
                                 "attack_params.PGD (hostile.yaml line 30, column 17): unknown attack 'PGD'; did you "
                                 "mean 'pgd' (names are case-sensitive)?"),
    "400 nested smoothed_": (lambda t: _config(t, "detectors: all", "detectors: " + "smoothed_" * 400 + "msp"),
                             "composes family smoothed_<detector> twice; valid choices: a name that composes each "
                             "family at most once"),
    "500 nested ross_": (lambda t: _config(t, "attacks: [fgsm, pgd, df, mpgd]",
                                           "attacks: [adaptive_" + "ross_" * 500 + "msp]"),
                         "composes family ross_<detector> twice"),
    "cache adv is a file": (_file_in_cache("adv"), "attack store"),
    "cache scores is a file": (_file_in_cache("scores"), "score cache"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_config_is_refused_in_one_line_before_work(name, tmp_path, capsys, monkeypatch):
    make, fragment = CASES[name]
    monkeypatch.setenv("ADVOPENOOD_CACHE", str(tmp_path / "default-cache"))
    args = [*make(tmp_path), "--out", str(tmp_path / "out")]
    rc = main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("advopenood: error:"), err
    assert fragment in err[0], err[0]
    assert not (tmp_path / "out").exists() and not (tmp_path / "default-cache" / "adv").exists()


def test_cache_file_message_names_the_file(tmp_path, capsys):
    args = _file_in_cache("adv")(tmp_path)
    assert main([*args, "--out", str(tmp_path / "out")]) == 2
    assert f"attack store {str(tmp_path / 'cache' / 'adv')!r} is a file" in capsys.readouterr().err


@pytest.mark.parametrize("seed", [str(2**63), "-1", "ten"])
def test_eval_ood_seed_out_of_range_is_refused_in_one_line(seed, tmp_path, capsys):
    assert main(["eval-ood", "--root", str(tmp_path), "--seed", seed]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "argument --seed: " in err[0] and seed in err[0], err
    assert f"valid choices: 0..{2**63 - 1}" in err[0]


@pytest.mark.parametrize("key, value", [("seed", 2**63 - 1), ("seed", 0)])
def test_seeds_in_range_are_taken(key, value):
    from advopenood.config.loading import validate

    plan = validate({"model": {"arch": "resnet20"}, "data": {"id": {"kind": "demo"}}, key: value})
    assert plan.seed == value


@pytest.mark.parametrize("text, expected", [
    ("anchor: &p {steps: 3}\nattack_params: {pgd: *p, fgsm: *p}\n", {"pgd": {"steps": 3}, "fgsm": {"steps": 3}}),
    ("base: &p {steps: 3}\nattack_params:\n  pgd:\n    <<: *p\n    restarts: 2\n",
     {"pgd": {"steps": 3, "restarts": 2}}),
])
def test_small_aliases_and_merge_keys_still_read(text, expected):
    """Aliases are expanded within the bound, and a merge key (``<<``) is not a duplicate key."""
    from advopenood.config.loading import _read_yaml

    raw, positions = _read_yaml(text, "small.yaml")
    assert raw["attack_params"] == expected
    assert positions[("attack_params",)][0] == 2


def test_config_is_read_as_utf8_under_any_locale(tmp_path):
    """A UTF-8 config reads the same under an ASCII locale (``LC_ALL=C`` without Python's UTF-8 mode): a name, and
    a name after a comment with non-ASCII characters, both read in one Python process under that locale."""
    paths = []
    for i, text in enumerate(["name: caf\u00e9\n", "# \u00e9t\u00e9 \u2014 UTF-8 comment\nname: caf\u00e9\n"]):
        paths.append(tmp_path / f"utf8_{i}.yaml")
        paths[-1].write_text(text + "model: {arch: resnet20}\ndata: {id: {kind: demo}}\n", encoding="utf-8")
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0",
           "PYTHONIOENCODING": "utf-8"}
    code = ("import sys; from advopenood.config.loading import load_config; "
            "[print(load_config(path)[0].name) for path in sys.argv[1:]]")
    done = subprocess.run([sys.executable, "-c", code, *map(str, paths)], env=env, capture_output=True, text=True,
                          encoding="utf-8", timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["caf\u00e9", "caf\u00e9"]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
def test_a_non_finite_number_given_in_python_is_refused(value):
    """A plan built from a mapping (the Python API, a re-validation) and a plugin built directly: the same refusal,
    the value shown as Python writes it."""
    from advopenood import registry
    from advopenood.config.loading import validate
    from advopenood.errors import UsageError

    raw = {"model": {"arch": "resnet20"}, "data": {"id": {"kind": "demo"}}, "detectors": "",
           "attacks": [{"name": "pgd", "params": {"rel_stepsize": value}}]}
    with pytest.raises(UsageError, match=rf"^attacks\[0\]\.params\.rel_stepsize: {value!r} is not a finite number; "):
        validate(raw)
    with pytest.raises(UsageError, match=rf"^parameter rel_stepsize of attack 'pgd' is {value!r}; valid choices: a "
                                         "finite number"):
        registry.create("attacks", "pgd", rel_stepsize=value)


def test_a_nan_plugin_parameter_is_refused_before_a_real_run(tmp_path, capsys, data_root, session_cache):
    """The issue's case on the pack: ``rel_stepsize: .nan`` ran PGD with the default step (exit 0); now exit 2, in
    one line, before any work."""
    import time

    from conftest import pack_config

    config = pack_config(tmp_path / "cfg", data_root, {"attacks": [{"name": "pgd", "params": {"rel_stepsize":
                                                                                                  float("nan")}}]})
    assert ".nan" in Path(config).read_text()
    started = time.monotonic()
    assert main(["run", "--config", config, "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "attacks[0].params.rel_stepsize is .nan (tiny.yaml line" in err[0], err
    assert time.monotonic() - started < 5 and not (tmp_path / "out").exists()
