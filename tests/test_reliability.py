"""Reliability on the real CIFAR pack: kill + resume, concurrent writers, torchrun sharding, determinism."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def config(tmp_path_factory, data_root) -> Path:
    cfg = yaml.safe_load((REPO / "configs" / "cifar10_resnet20.yaml").read_text())
    cfg["data"]["root"] = str(data_root)
    cfg["attack_params"] = {"pgd": {"steps": 10}}
    path = tmp_path_factory.mktemp("cfg") / "cifar.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def attack_cmd(config: Path, cache: Path, out: Path, limit: int = 80) -> list[str]:
    """PGD (10 steps) on ``limit`` images in shards of 8: 10 shards, enough for a kill to land mid-way."""
    return [sys.executable, "-m", "advopenood.cli", "attack", "--config", str(config), "--attack", "pgd",
            "--limit", str(limit), "--shard-size", "8", "--cache-dir", str(cache), "--out", str(out), "--quiet"]


def shard_bytes(cache: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(cache.glob("adv/*/shard_*.npz"))}


@pytest.fixture(scope="module")
def reference(config, tmp_path_factory) -> dict[str, bytes]:
    """An uninterrupted single-process run."""
    cache = tmp_path_factory.mktemp("ref")
    subprocess.run(attack_cmd(config, cache, cache / "out"), check=True, capture_output=True, timeout=600)
    shards = shard_bytes(cache)
    assert len(shards) == 10
    return shards


def test_killed_run_resumes_from_first_missing_shard(config, reference, tmp_path):
    cache = tmp_path / "cache"
    proc = subprocess.Popen(attack_cmd(config, cache, tmp_path / "out"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 300
    while len(list(cache.glob("adv/*/shard_*.npz.sha256"))) < 3 and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = len(list(cache.glob("adv/*/shard_*.npz.sha256")))
    assert 3 <= done_before < 10, "the run was not interrupted mid-way"
    assert not list(cache.glob("adv/*/manifest.json"))
    subprocess.run(attack_cmd(config, cache, tmp_path / "out"), check=True, capture_output=True, timeout=600)
    import json

    info = json.loads((tmp_path / "out" / "run.json").read_text())["attacks"]["pgd"]
    assert info["reused"] >= done_before - 1 and info["generated"] <= 10 - done_before + 1
    assert shard_bytes(cache) == reference


def test_concurrent_runs_on_one_key_do_not_corrupt_it(config, reference, tmp_path):
    cache = tmp_path / "cache"
    procs = [subprocess.Popen(attack_cmd(config, cache, tmp_path / f"out{i}"), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE) for i in range(2)]
    for p in procs:
        assert p.wait(timeout=600) == 0, p.stderr.read()
    assert shard_bytes(cache) == reference
    assert (tmp_path / "out0" / "asr.csv").read_text() == (tmp_path / "out1" / "asr.csv").read_text()


def test_torchrun_two_ranks_equal_single_process(config, reference, tmp_path):
    cache = tmp_path / "cache"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533",
           "-m", "advopenood.cli", *attack_cmd(config, cache, tmp_path / "out")[3:]]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "ADVOPENOOD_BACKEND": "gloo", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert shard_bytes(cache) == reference
    assert len(list(cache.glob("adv/*/manifest.json"))) == 1
    assert (tmp_path / "out" / "asr.csv").is_file()


@pytest.mark.parametrize("sig, code, message", [(signal.SIGTERM, 143, "advopenood: terminated (SIGTERM); "),
                                                 (signal.SIGINT, 130, "advopenood: interrupted; ")])
def test_a_signalled_run_leaves_no_staging_folder_and_says_so(config, tmp_path, sig, code, message):
    """SIGTERM (a scheduler's, ``kill``) is handled as Ctrl-C is: the staging folder is removed and one line says so."""
    out = tmp_path / "out"
    proc = subprocess.Popen(attack_cmd(config, tmp_path / "cache", out), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 300
    while not list(tmp_path.glob(f".{out.name}.partial*")) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be signalled"
    proc.send_signal(sig)
    err = proc.communicate(timeout=120)[1].strip().splitlines()
    assert proc.returncode == code, err
    assert len(err) == 1 and err[0].startswith(message), err
    assert not list(tmp_path.glob(f".{out.name}.partial*"))
