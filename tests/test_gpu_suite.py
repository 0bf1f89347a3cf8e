"""``benchmarks/gpu_suite.py --smoke`` (issue 42, item 5): the GPU suite's code path on the CPU at tiny sizes, and
what it writes under its one output folder."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def suite(data_root, session_cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("suite")
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_suite.py"), "--smoke", "--out", str(out)],
                          capture_output=True, text=True, env={**os.environ, "ADVOPENOOD_TEST_DATA": str(data_root)})
    assert done.returncode == 0, done.stderr[-3000:]
    return out, done.stdout


def test_the_smoke_suite_runs_the_audit_and_the_study_and_says_what_it_finished(suite):
    out, stdout = suite
    info = json.loads((out / "suite.json").read_text())
    assert info["sizes"] == "smoke" and info["queries"] == 4
    assert set(info["runs"]) == {"ross_audit/cifar10_resnet20_published", "ross_audit/cifar10_resnet20_adaptive",
                                 "robust_study/cifar10_resnet20"}
    for name, r in info["runs"].items():
        assert r["verified"] is True and Path(r["folder"]).is_dir() and Path(r["folder"]).is_relative_to(out)
        assert f"finished {name}:" in stdout and "verify ok" in stdout
        attacks = json.loads((Path(r["folder"]) / "run.json").read_text())["attacks"]  # the smoke's 2 iterations
        assert {a["params"][k] for a in attacks.values() for k in ("steps", "n_iter") if k in a["params"]} == {2}
    assert "3 runs in" in stdout


@pytest.mark.parametrize("run, detector", [("ross_audit/cifar10_resnet20_adaptive", "ross_msp"),
                                           ("robust_study/cifar10_resnet20", "msp")])
def test_each_robust_run_has_the_standard_ensemble_with_square(suite, run, detector):
    out, _ = suite
    folder = out / run
    attacks = json.loads((folder / "run.json").read_text())["attacks"]
    assert attacks[f"robust_square_id_{detector}"]["params"]["n_queries"] == 4
    assert f"robust_apgd_aux_id_{detector}" in attacks or f"robust_apgd_aux_id_eot_{detector}" in attacks
    table = pd.read_csv(folder / "robust_auroc.csv")
    mine = table[(table["detector"] == detector) & np.isclose(table["eps"], 8 / 255)]
    ens = mine[mine["method"] == "ensemble"]
    assert len(ens) == 1 and {"square", "apgd", "apgd_aux"} <= set(mine["method"])
    assert ens["robust_auroc"].iloc[0] <= mine.loc[mine["method"] != "ensemble", "robust_auroc"].min() + 1e-9
    steps = pd.read_csv(folder / "robust_ensemble.csv")
    last = steps[(steps["detector"] == detector) & np.isclose(steps["eps"], 8 / 255)].iloc[-1]
    assert last["attack"] == "square" and last["robust_auroc"] == pytest.approx(ens["robust_auroc"].iloc[0], abs=1e-4)


def test_the_tables_hold_each_runs_ensemble_numbers(suite):
    out, _ = suite
    text = (out / "tables.md").read_text()
    assert "## ROSS audit, cifar10_resnet20" in text and "## Robust study, cifar10_resnet20" in text
    for run in ("ross_audit/cifar10_resnet20_adaptive", "robust_study/cifar10_resnet20"):
        ens = pd.read_csv(out / run / "robust_auroc.csv").query("method == 'ensemble'").iloc[0]
        assert f"{ens['robust_auroc']:.1f} [{ens['robust_auroc_lo']:.1f}, {ens['robust_auroc_hi']:.1f}]" in text


def test_the_device_pack_gives_a_run_the_full_packs_images_at_its_limit_only(data_root, tmp_path):
    """``benchmarks/device_pack.py``: the cut sets hold the rows a run of that --limit selects, in order, so the run
    sees the full pack's images; used at another --limit they are other images (the pack is for one limit)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import device_pack
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    out = device_pack.write_pack(tmp_path / "pack", 16, source=data_root)
    assert sorted(p.name for p in out.iterdir()) == sorted([*device_pack.CUT, *device_pack.WHOLE])
    with np.load(out / "cifar10_test.npz") as z:
        assert len(z["y"]) == 16
    assert device_pack.same_images(out, 16, source=data_root)
    assert not device_pack.same_images(out, 8, source=data_root)
