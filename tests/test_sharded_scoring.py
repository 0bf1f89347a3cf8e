"""Detector scoring sharded over torchrun: two CPU ranks (gloo) give the scores of one process, bit for bit."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DETECTORS = "msp,mds,knn,gram,odin"


@pytest.fixture(scope="module")
def config(tmp_path_factory, data_root) -> Path:
    """The CIFAR ResNet-20 config, small: 128 fit images, one OOD set, batches of 16 (2 per scored set: one a rank)."""
    cfg = yaml.safe_load((REPO / "configs" / "cifar10_resnet20.yaml").read_text())
    cfg["data"]["root"] = str(data_root)
    cfg["data"]["ood"] = cfg["data"]["ood"][:1]
    cfg["data"]["fit_limit"] = 128
    cfg["batch_size"] = 16
    path = tmp_path_factory.mktemp("cfg") / "cifar.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_cmd(config: Path, cache: Path, out: Path) -> list[str]:
    return ["-m", "advopenood.cli", "run", "--config", str(config), "--attack", "fgsm", "--limit", "32",
            "--detectors", DETECTORS, "--evaluator", "ood", "--cache-dir", str(cache), "--out", str(out), "--quiet"]


ENV = {**os.environ, "ADVOPENOOD_BACKEND": "gloo", "OMP_NUM_THREADS": "1"}


def scores(out: Path) -> dict[str, np.ndarray]:
    found = {}
    for name in DETECTORS.split(","):
        with np.load(out / "scores" / f"{name}.npz") as d:
            found.update({f"{name}/{k}": d[k] for k in d.files})
    return found


@pytest.mark.parametrize("world_size", [2])
def test_torchrun_ranks_score_bit_identical_to_one_process(config, tmp_path, world_size):
    single = subprocess.run([sys.executable, *run_cmd(config, tmp_path / "c1", tmp_path / "one")], env=ENV,
                            capture_output=True, text=True, timeout=900)
    assert single.returncode == 0, single.stderr[-2000:]
    sharded = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world_size),
                              "--master_port", "29541", *run_cmd(config, tmp_path / "c2", tmp_path / "ranks")],
                             env=ENV, capture_output=True, text=True, timeout=900)
    assert sharded.returncode == 0, sharded.stderr[-2000:]
    one, ranks = scores(tmp_path / "one"), scores(tmp_path / "ranks")
    assert sorted(one) == sorted(ranks) and all(f"{d}/{s}" in one for d in DETECTORS.split(",") for s in ("id", "fgsm"))
    for key in one:
        assert np.array_equal(one[key], ranks[key]), key
    work = json.loads((tmp_path / "ranks" / "run.json").read_text())["detector_work"]
    assert work["score_sets_computed"] == 15 and work["fit_pass_computed"] == 1
    assert not list((tmp_path / "c2").glob("scores/_parts/*/*")), "rank shares are removed after the merge"
    assert (tmp_path / "one" / "ood.csv").read_text() == (tmp_path / "ranks" / "ood.csv").read_text()
