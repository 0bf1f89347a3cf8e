"""The one interval policy (``IntervalPolicy``) and its store of bootstrap replicates (``<cache>/intervals``)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import pack_config
from advopenood.evaluation import intervals as iv
from advopenood.evaluation.intervals import IntervalPolicy
from advopenood.evaluation.intervalstore import IntervalStore


@pytest.fixture(scope="module")
def msp(cifar_model, pack_set) -> dict[str, np.ndarray]:
    """MSP of the pack's ResNet-20 on 120 CIFAR-10 test images, 120 Textures and 120 MNIST images."""
    from advopenood.data.datasets import stack

    def scores(name: str, path: str) -> np.ndarray:
        x, _ = stack(pack_set(name, path, 120), list(range(120)))
        with torch.no_grad():
            return torch.softmax(cifar_model(x), 1).max(1).values.numpy().astype(np.float64)

    return {"id": scores("cifar10", "cifar10_test.npz"), "texture": scores("texture", "texture_test.npz"),
            "mnist": scores("mnist", "mnist_test.npz")}


@pytest.fixture
def kernel_calls(monkeypatch) -> list[str]:
    """The cell keys the bootstrap kernel (``paired_replicates``) is called with, in order."""
    calls: list[str] = []
    kernel = iv.paired_replicates

    def counted(cells, seed, key, *args, **kwargs):
        calls.append(key)
        return kernel(cells, seed, key, *args, **kwargs)

    monkeypatch.setattr(iv, "paired_replicates", counted)
    return calls


def _recipe(conf_id: np.ndarray, conf_ood: np.ndarray, seed: int, key: str, resamples: int) -> dict[str, float]:
    """The recipe as the writers assembled it by hand before the policy: the cell's seeded draws, the kernel's
    replicates on them, the percentile interval."""
    reps = iv.paired_replicates([(conf_id, conf_ood)], seed, key, resamples)[0]
    return {f"{m}_{end}": v for m, values in reps.items() for end, v in zip(("lo", "hi"), iv.percentile(values))}


def test_the_policy_gives_the_hand_assembled_recipes_intervals_on_pack_scores(msp):
    """Bit for bit: a cell's bounds, a paired difference's and a share's, by the policy of the plan's ``ci`` and the
    run seed, are the numbers the writers computed before it."""
    from advopenood.config.loading import validate
    from advopenood.evaluation.metrics import auroc_difference_interval

    plan = validate({"model": {"arch": "resnet20"}, "data": {"id": {"kind": "demo"}}, "attacks": [], "detectors": "",
                     "evaluators": "", "ci": {"method": "bootstrap", "resamples": 300}})
    policy = IntervalPolicy.of(plan.ci, 5)
    assert (policy.method, policy.resamples, policy.seed, policy.label) == ("bootstrap", 300, 5, "bootstrap-300")
    bounds, reps, reason = policy.cell("ood|msp|texture", msp["id"], msp["texture"])
    assert reason == "" and bounds == _recipe(msp["id"], msp["texture"], 5, "ood|msp|texture", 300)
    a, b = (msp["id"], msp["texture"]), (msp["id"] ** 2, msp["texture"])
    got = policy.paired("paired|texture", [a, b], ("auroc",))
    lo, hi, _ = policy.difference(a, b, got[0]["auroc"], got[1]["auroc"])
    want = iv.paired_replicates([a, b], 5, "paired|texture", 300, ("auroc",))
    assert (lo, hi) == iv.percentile(want[0]["auroc"] - want[1]["auroc"])
    delong = IntervalPolicy("delong", 300, 5)
    assert delong.difference(a, b, None, None)[:2] == tuple(100.0 * v for v in auroc_difference_interval(*a, *b))
    assert policy.wilson(37, 120) == iv.wilson(37, 120) and np.isnan(IntervalPolicy().wilson(37, 120)).all()


def test_a_stored_interval_is_the_computed_one_and_a_rerun_does_not_bootstrap(msp, tmp_path, kernel_calls):
    """The first request resamples and stores; a second policy on the same store (a re-run) reads every cell and
    paired set back, bit for bit, without calling the kernel; the same numbers as a policy without a store."""
    cells = {"ood|msp|texture": (msp["id"], msp["texture"]), "ood|msp|mnist": (msp["id"], msp["mnist"])}
    plain = IntervalPolicy("bootstrap", 200, 3)
    want = {k: plain.cell(k, *c) for k, c in cells.items()}
    want_pair = plain.paired("paired|x", list(cells.values()), ("auroc",))
    kernel_calls.clear()
    first = IntervalPolicy("bootstrap", 200, 3, IntervalStore(tmp_path / "intervals"))
    got = {k: first.cell(k, *c) for k, c in cells.items()}
    got_pair = first.paired("paired|x", list(cells.values()), ("auroc",))
    assert len(kernel_calls) == 3 and first.store.work == {"computed": 3, "read": 0}
    kernel_calls.clear()
    again = IntervalPolicy("bootstrap", 200, 3, IntervalStore(tmp_path / "intervals"))
    read = {k: again.cell(k, *c) for k, c in cells.items()}
    read_pair = again.paired("paired|x", list(cells.values()), ("auroc",))
    assert kernel_calls == [] and again.store.work == {"computed": 0, "read": 3}
    for k in cells:
        assert got[k][0] == want[k][0] == read[k][0]
        for m in iv.METRICS:
            assert np.array_equal(want[k][1][m], got[k][1][m]) and np.array_equal(want[k][1][m], read[k][1][m])
    for w, g, r in zip(want_pair, got_pair, read_pair):
        assert np.array_equal(w["auroc"], g["auroc"]) and np.array_equal(w["auroc"], r["auroc"])


@pytest.mark.parametrize("change", ["one score", "key", "seed", "resamples", "metrics"])
def test_a_changed_score_or_setting_misses_the_store(msp, tmp_path, kernel_calls, change):
    """A score nudged by one ulp, another cell key, seed, resample count or metric set is another entry: resampled,
    never the stored one."""
    conf_ood = msp["texture"].copy()
    IntervalPolicy("bootstrap", 200, 3, IntervalStore(tmp_path)).paired("k", [(msp["id"], conf_ood)])
    kernel_calls.clear()
    seed, resamples, key, metrics = 3, 200, "k", iv.METRICS
    if change == "one score":
        conf_ood[7] = np.nextafter(conf_ood[7], 2.0)
    seed, resamples, key = (4 if change == "seed" else seed, 300 if change == "resamples" else resamples,
                            "k2" if change == "key" else key)
    metrics = ("auroc",) if change == "metrics" else metrics
    policy = IntervalPolicy("bootstrap", resamples, seed, IntervalStore(tmp_path))
    got = policy.paired(key, [(msp["id"], conf_ood)], metrics)[0]
    assert kernel_calls == [key] and policy.store.work == {"computed": 1, "read": 0}
    assert np.array_equal(got["auroc"], iv.paired_replicates([(msp["id"], conf_ood)], seed, key, resamples)[0]["auroc"])


@pytest.mark.parametrize("damage", ["bytes", "entry"])
def test_a_corrupt_entry_is_said_and_recomputed_never_served(msp, tmp_path, kernel_calls, capsys, damage):
    """Bytes that do not match the checksum, or an entry whose checksum matches but whose content is not the
    replicates: said (a warning / a line on stderr), resampled, and the right numbers stored again."""
    import hashlib

    cell = [(msp["id"], msp["texture"])]
    want = IntervalPolicy("bootstrap", 200, 3, IntervalStore(tmp_path)).paired("k", cell)[0]
    (path,) = tmp_path.glob("*.npz")
    bad = b"not an npz" if damage == "entry" else path.read_bytes()[:-9] + b"123456789"
    path.write_bytes(bad)
    if damage == "entry":
        path.with_name(path.name + ".sha256").write_text(hashlib.sha256(bad).hexdigest() + "\n")
    kernel_calls.clear()
    policy = IntervalPolicy("bootstrap", 200, 3, IntervalStore(tmp_path))
    with pytest.warns(UserWarning, match="does not match its checksum") if damage == "bytes" else _nothing():
        got = policy.paired("k", cell)[0]
    if damage == "entry":
        assert "interval file" in capsys.readouterr().err
    assert kernel_calls == ["k"] and all(np.array_equal(got[m], want[m]) for m in iv.METRICS)
    kernel_calls.clear()
    again = IntervalPolicy("bootstrap", 200, 3, IntervalStore(tmp_path)).paired("k", cell)[0]
    assert kernel_calls == [] and all(np.array_equal(again[m], want[m]) for m in iv.METRICS)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _tables(out: Path) -> dict[str, pd.DataFrame]:
    return {p.name: pd.read_csv(p) for p in sorted(out.glob("*.csv"))}


def test_a_rerun_reads_every_interval_back_and_writes_the_same_tables(data_root, tmp_path):
    """A real run twice on one cache (ResNet-20, 8 CIFAR-10 images vs Textures, FGSM, MSP and EBO, ``ood``): the
    re-run, in a process of its own, resamples nothing (``run.json``'s ``interval_work``), every CSV is the first
    run's, and ``advopenood verify`` re-derives the re-run's intervals independently."""
    from advopenood.cli.main import main

    cfg = pack_config(tmp_path / "cfg", data_root, {"detectors": "msp,ebo", "ci": {"method": "bootstrap",
                                                                                   "resamples": 200}})
    args = ["run", "--config", cfg, "--cache-dir", str(tmp_path / "cache"), "--quiet"]
    assert main([*args, "--out", str(tmp_path / "first")]) == 0
    done = subprocess.run([sys.executable, "-m", "advopenood.cli", *args, "--out", str(tmp_path / "second")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    work = [json.loads((tmp_path / o / "run.json").read_text())["interval_work"] for o in ("first", "second")]
    assert work[0]["computed"] > 0 and work[0]["read"] == 0
    assert work[1] == {"computed": 0, "read": work[0]["computed"]}
    first, second = _tables(tmp_path / "first"), _tables(tmp_path / "second")
    assert list(first) == list(second) and "ood.csv" in first
    for name in first:
        pd.testing.assert_frame_equal(first[name], second[name])
    assert main(["verify", str(tmp_path / "second")]) == 0
