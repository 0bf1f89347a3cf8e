"""The CLI: `list`, a third-party plugin found through its entry point, and the bad-input matrix."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from advopenood.cli import main

REPO = Path(__file__).resolve().parents[1]


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


def test_third_party_detector_is_listed_and_runs(plugin_path, tmp_path, session_cache):
    env = {"PYTHONPATH": os.pathsep.join([str(plugin_path), os.environ.get("PYTHONPATH", "")])}
    listed = run_cli("list", "detectors", env=env)
    assert listed.returncode == 0 and any(l.startswith("negentropy ") for l in listed.stdout.splitlines())
    out = tmp_path / "out"
    done = run_cli("run", "--config", "demo", "--attack", "fgsm", "--detectors", "negentropy,msp", "--limit", "80",
                   "--analysis", "", "--out", str(out), "--quiet", env=env)
    assert done.returncode == 0, done.stderr
    import pandas as pd

    ood = pd.read_csv(out / "ood.csv")
    rows = ood[ood.detector == "negentropy"]
    assert set(rows.ood_set) >= {"fgsm", "textures", "blobs"} and rows.auroc.notna().all()
    assert rows[rows.ood_set == "blobs"].auroc.iloc[0] > 50


def _config(tmp_path: Path, **changes) -> str:
    cfg = yaml.safe_load((REPO / "configs" / "cifar10_resnet20.yaml").read_text())
    for dotted, value in changes.items():
        node = cfg
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node[key]
        node[leaf] = value
    path = tmp_path / f"cfg{len(list(tmp_path.glob('cfg*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def bad_cases(tmp_path: Path, data_root: Path) -> dict[str, tuple[list[str], str]]:
    np.savez(tmp_path / "float.npz", x=np.linspace(-1, 2, 4 * 32 * 32 * 3, dtype=np.float32).reshape(4, 32, 32, 3),
             y=np.zeros(4, dtype=np.int64))
    empty = tmp_path / "empty"
    empty.mkdir()
    cifar = str(REPO / "configs" / "cifar10_resnet20.yaml")
    root = ["--data-root", str(data_root)]
    return {
        "attack": (["run", "--config", cifar, *root, "--attack", "cw"], "'cw'"),
        "eps zero": (["run", "--config", cifar, *root, "--eps", "0"], "eps 0.0"),
        "eps big": (["run", "--config", cifar, *root, "--eps", "2"], "eps 2.0"),
        "eps text": (["run", "--config", cifar, *root, "--eps", "eight"], "'eight'"),
        "config": (["run", "--config", "nosuch"], "'nosuch'"),
        "data root": (["run", "--config", cifar, "--data-root", str(empty)], "cifar10_test.npz"),
        "no folder": (["run", "--config", cifar, "--data-root", str(tmp_path / "nope")], "nope"),
        "range": (["run", "--config", _config(tmp_path, **{"data.id": {"kind": "npz", "path": str(tmp_path / "float.npz"),
                                                                      "name": "f"}}), *root], "outside [0, 1]"),
        "checkpoint": (["run", "--config", _config(tmp_path, **{"model.arch": "resnet18_32x32"}), *root],
                       "does not match architecture 'resnet18_32x32'"),
        "dataset kind": (["run", "--config", _config(tmp_path, **{"data.id": {"kind": "zip", "path": "x"}}), *root],
                         "'zip'"),
        "demo set": (["run", "--config", _config(tmp_path, **{"data.id": {"kind": "demo", "name": "letters"}}), *root],
                     "'letters'"),
        "detector": (["run", "--config", cifar, *root, "--detectors", "msp,foo"], "'foo'"),
        "evaluator": (["run", "--config", cifar, *root, "--evaluator", "bar"], "'bar'"),
        "analysis": (["run", "--config", cifar, *root, "--analysis", "baz"], "'baz'"),
        "backend": (["run", "--config", cifar, *root, "--detector-backend", "sklearn"], "'sklearn'"),
        "device": (["run", "--config", cifar, *root, "--device", "tpu"], "'tpu'"),
        "limit": (["run", "--config", cifar, *root, "--limit", "0"], "--limit"),
        "kind": (["list", "widgets"], "'widgets'"),
        "adaptive family": (["run", "--config", cifar, *root, "--attack", "pgd,adaptive", "--detectors", ""],
                            "attack 'adaptive' stands for one attack per selected detector"),
        "ood source": (["run", "--config", _config(tmp_path, **{"data.ood": []}), *root, "--attack", "adaptive_ood_msp"],
                       "ood_set None is not one of the run's OOD sets"),
        "adaptive lam": (["run", "--config", _config(tmp_path, attack_params={"adaptive_mds": {"lam": -1}}), *root,
                          "--attack", "adaptive_mds"], "lam -1"),
        "detector param": (["run", "--config", _config(tmp_path, detector_params={"knn": {"K2": 5}}), *root,
                            "--attack", "fgsm", "--detectors", "knn"], "'K2'"),
        "transfer": (["run", "--config", _config(tmp_path, analysis_params={"transfer": {"fractions": [150]}}), *root,
                      "--attack", "fgsm", "--analysis", "transfer"], "fraction 150"),
        "flag": (["run", "--config", cifar, "--bogus"], "--bogus"),
    }


def test_bad_input_matrix_exits_2_with_one_line(tmp_path, data_root, capsys):
    for name, (args, fragment) in bad_cases(tmp_path, data_root).items():
        out = tmp_path / f"out_{name.replace(' ', '_')}"
        rc = main([*args, "--out", str(out)] if args[0] == "run" and "--bogus" not in args else args)
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2, name
        assert len(err) == 1 and err[0].startswith("advopenood: error:"), (name, err)
        assert fragment in err[0], (name, err[0])
        assert not (out / "asr.csv").exists() and not (out / "ood.csv").exists(), name


def test_bad_input_from_the_shell_has_no_traceback():
    done = run_cli("run", "--config", "demo", "--attack", "pgd,cw")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "advopenood: error: unknown attack 'cw'; valid choices: " + done.stderr.split("valid choices: ")[1].strip()]
    assert "Traceback" not in done.stderr
