"""95 % intervals (:mod:`advopenood.evaluation.intervals`): the vectorised bootstrap is OpenOOD's metrics on every
resample, the plan refuses bad ``ci`` settings, runs write the bounds, and ``verify`` re-derives them."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from advopenood.cli.main import main
from advopenood.evaluation import intervals as iv
from advopenood.evaluation import resampling
from advopenood.evaluation import metrics

from conftest import pack_config

SCORES = {
    "continuous": lambda rng, n, m: (rng.normal(size=n), rng.normal(0.7, 1.0, size=m)),
    "heavy ties": lambda rng, n, m: (rng.integers(0, 4, n).astype(float), rng.integers(1, 5, m).astype(float)),
    "all tied": lambda rng, n, m: (np.zeros(n), np.zeros(m)),
    "infinite": lambda rng, n, m: (np.r_[np.inf, rng.normal(size=n - 1)], np.r_[-np.inf, rng.normal(size=m - 1)]),
    "separated": lambda rng, n, m: (rng.normal(5, 1, size=n), rng.normal(-5, 1, size=m)),
}


@pytest.mark.parametrize("kind", list(SCORES))
def test_replicates_are_openoods_metrics_on_each_resample(kind):
    """Every resample's four metrics equal :func:`metrics.ood_metrics` of the resampled arrays (FPR95 with
    sklearn's dropped intermediate points, AUPR trapezoidal), ties and infinities included."""
    rng = np.random.default_rng(7)
    for _ in range(40):
        n, m = (int(v) for v in rng.integers(2, 40, 2))
        conf_id, conf_ood = SCORES[kind](rng, n, m)
        idx_id, idx_ood = rng.integers(0, n, (6, n)), rng.integers(0, m, (6, m))
        reps = iv.replicates(conf_id, conf_ood, idx_id, idx_ood)
        for b in range(6):
            want = metrics.ood_metrics(conf_id[idx_id[b]], conf_ood[idx_ood[b]])
            for name, value in want.items():
                assert reps[name][b] == pytest.approx(value, abs=1e-9), (kind, name, b)


def test_a_cells_interval_is_reproducible_from_seed_and_key():
    rng = np.random.default_rng(0)
    conf_id, conf_ood = rng.normal(size=50), rng.normal(0.5, 1, size=60)
    first = iv.metric_intervals(conf_id, conf_ood, "bootstrap", 3, "ood|msp|textures", 200)[0]
    again = iv.metric_intervals(conf_id, conf_ood, "bootstrap", 3, "ood|msp|textures", 200)[0]
    other = iv.metric_intervals(conf_id, conf_ood, "bootstrap", 3, "ood|msp|blobs", 200)[0]
    assert first == again and first != other
    auroc = 100 * metrics.auroc(conf_id, conf_ood)
    assert first["auroc_lo"] < auroc < first["auroc_hi"]


def test_paired_cells_move_together():
    """An attacked image moves with its clean twin: the same draws index both cells, so the difference of a cell
    with itself is exactly 0 on every resample, and each cell's replicates are those of its own unpaired call."""
    rng = np.random.default_rng(2)
    clean = (rng.normal(1, 1, 30), rng.normal(0, 1, 25))
    attacked = (clean[0] - 0.3, clean[1] + 0.4)
    same, other = iv.paired_replicates([clean, clean], 0, "robust|msp|x", 300)
    assert all(np.array_equal(same[m], other[m]) for m in iv.METRICS)
    first, second = iv.paired_replicates([clean, attacked], 0, "robust|msp|x", 300)
    alone = iv.metric_intervals(*attacked, "bootstrap", 0, "robust|msp|x", 300)[1]
    assert all(np.array_equal(second[m], alone[m]) for m in iv.METRICS)
    with pytest.raises(ValueError, match="one ID and one OOD length"):
        iv.paired_replicates([clean, (clean[0][:5], clean[1])], 0, "k")


@pytest.mark.parametrize("n_id,n_ood", [(1, 30), (30, 1), (0, 5)])
def test_too_few_images_leave_the_interval_empty_with_the_reason(n_id, n_ood):
    from advopenood_plugins.evaluators.ood.plugin import metric_row

    from conftest import make_plan

    class Ctx:
        plan, seed = make_plan(), 0
        intervals = iv.IntervalPolicy.of(plan.ci, seed)

    rng = np.random.default_rng(1)
    row = metric_row(rng.normal(size=n_id), rng.normal(size=n_ood), Ctx(), "ood|msp|x")
    assert all(np.isnan(row[f"{m}_{end}"]) for m in iv.METRICS for end in ("lo", "hi"))
    assert row["ci"] == "bootstrap-2000" and row["error"]
    if min(n_id, n_ood) == 1:
        assert "at least 2 per side" in row["error"] and not np.isnan(row["auroc"])


@pytest.mark.parametrize("k,n,lo,hi", [(0, 10, 0.0, 27.75), (10, 10, 72.25, 100.0), (5, 10, 23.66, 76.34),
                                       (80, 100, 71.12, 86.66)])
def test_wilson_interval(k, n, lo, hi):
    """Wilson's (1927) score interval, against published values (e.g. Newcombe 1998, Table I: 0/10 -> 0-0.2775)."""
    assert iv.wilson(k, n) == pytest.approx((lo, hi), abs=0.01)


def test_delong_and_bootstrap_agree_within_a_point_on_a_real_run(cifar_model, pack_set):
    """MSP of the pack's ResNet-20 on 200 CIFAR-10 test images against 200 Textures: both 95 % AUROC intervals
    within one point of each other at each end."""
    from advopenood.data.datasets import stack

    def msp(name: str, path: str) -> np.ndarray:
        x, _ = stack(pack_set(name, path, 200), list(range(200)))
        with torch.no_grad():
            return torch.softmax(cifar_model(x), 1).max(1).values.numpy()

    conf_id, conf_ood = msp("cifar10", "cifar10_test.npz"), msp("texture", "texture_test.npz")
    boot = iv.metric_intervals(conf_id, conf_ood, "bootstrap", 0, "ood|msp|texture")[0]
    delong = iv.metric_intervals(conf_id, conf_ood, "delong", 0, "ood|msp|texture")[0]
    assert abs(boot["auroc_lo"] - delong["auroc_lo"]) < 1 and abs(boot["auroc_hi"] - delong["auroc_hi"]) < 1
    assert np.isnan(delong["fpr95_lo"])  # DeLong bounds AUROC only


BAD = {
    "--ci unknown": (["--ci", "wald"], {}, "ci.method"),
    "--ci-resamples below 100": (["--ci-resamples", "99"], {}, "ci.resamples"),
    "config ci.method": ([], {"ci": {"method": "percentile"}}, "ci.method"),
    "config ci.resamples": ([], {"ci": {"resamples": 10}}, "ci.resamples"),
    "config unknown ci key": ([], {"ci": {"level": 0.9}}, "ci.level"),
    "--ci-resamples above the bound": (["--ci-resamples", "200000"], {}, "ci.resamples"),
    "config ci.resamples above the bound": ([], {"ci": {"resamples": 100_001}}, "ci.resamples"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_ci_settings_are_refused_in_one_line(case, tmp_path, data_root, capsys):
    flags, changes, key = BAD[case]
    cfg = pack_config(tmp_path / "work", data_root, changes)
    out = tmp_path / "out"
    rc = main(["run", "--config", cfg, "--out", str(out), "--cache-dir", str(tmp_path / "cache"), "--quiet", *flags])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err and key in err
    assert not out.exists()


@pytest.fixture(scope="module")
def pack_run(tmp_path_factory, data_root) -> Path:
    """8 CIFAR-10 images vs 8 Textures, FGSM, MSP and EBO, 100 bootstrap resamples."""
    work = tmp_path_factory.mktemp("intervals")
    cfg = pack_config(work, data_root, {"detectors": "msp,ebo", "ci": {"method": "bootstrap", "resamples": 100}})
    out = work / "out"
    assert main(["run", "--config", cfg, "--out", str(out), "--cache-dir", str(work / "cache"), "--quiet"]) == 0
    return out


def test_a_run_writes_an_interval_beside_every_metric(pack_run):
    ood = pd.read_csv(pack_run / "ood.csv")
    for m in iv.METRICS:
        cols = list(ood.columns)
        assert cols[cols.index(m) + 1: cols.index(m) + 3] == [f"{m}_lo", f"{m}_hi"]
        assert (ood[f"{m}_lo"] <= ood[m] + 1e-9).all() and (ood[m] <= ood[f"{m}_hi"] + 1e-9).all()
    assert {c.split(";")[0] for c in ood["ci"]} == {"bootstrap-100"}  # then the methods taken at a bound, if any
    asr = pd.read_csv(pack_run / "asr.csv")
    assert (asr["ci"] == "wilson").all() and (asr["asr_lo"] <= asr["asr"]).all() and (asr["asr"] <= asr["asr_hi"]).all()
    board = pd.read_csv(pack_run / "leaderboard.csv")
    assert board[["adv_auroc_lo", "adv_auroc_hi"]].notna().all().all()
    entries = json.loads((pack_run / "leaderboard_openood.json").read_text())
    assert all(e["Adversarial_AUROC_Lo"] != "/" and e["CI"] == "bootstrap-100" for e in entries)
    assert json.loads((pack_run / "run.json").read_text())["config"]["ci"] == {"method": "bootstrap", "resamples": 100}
    report = (pack_run / "report.md").read_text()
    assert "stratified percentile bootstrap, 100 resamples" in report
    auroc = ood[(ood["detector"] == "msp") & (ood["attack"] == "fgsm")].iloc[0]
    assert f"{auroc['auroc']:.1f} [{auroc['auroc_lo']:.1f}, {auroc['auroc_hi']:.1f}]" in report


EDITS = {"ood auroc_lo": ("ood.csv", "auroc_lo"), "ood fpr95_hi": ("ood.csv", "fpr95_hi"),
         "leaderboard adv_auroc_hi": ("leaderboard.csv", "adv_auroc_hi"), "asr asr_lo": ("asr.csv", "asr_lo")}


def test_verify_rederives_the_intervals(pack_run, capsys):
    assert main(["verify", str(pack_run)]) == 0
    assert "0 difference(s)" in capsys.readouterr().out


@pytest.mark.parametrize("edit", list(EDITS))
def test_verify_finds_one_changed_bound(edit, pack_run, tmp_path, capsys):
    table, column = EDITS[edit]
    run = tmp_path / "run"
    shutil.copytree(pack_run, run)
    df = pd.read_csv(run / table)
    df.loc[0, column] = float(df.loc[0, column]) - 0.5
    df.to_csv(run / table, index=False, float_format="%.6g")
    assert main(["verify", str(run)]) == 1
    lines = [line for line in capsys.readouterr().out.splitlines() if "DIFFERENCE" in line]
    cells = [line for line in lines if "claims.json" not in line]  # a claim quoting the cell disagrees with it too
    assert len(cells) == 1 and table in cells[0] and column in cells[0]
    assert all(f"is not {table}'s" in line for line in lines if line not in cells)


def test_verify_refuses_a_run_json_with_resamples_above_the_bound(pack_run, tmp_path, capsys):
    """An edited ``run.json`` asking for more resamples than a plan may: one line, exit 2, nothing re-derived."""
    run = tmp_path / "run"
    shutil.copytree(pack_run, run)
    info = json.loads((run / "run.json").read_text())
    info["config"]["ci"]["resamples"] = 100_001
    (run / "run.json").write_text(json.dumps(info))
    assert main(["verify", str(run)]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and "ci.resamples" in err and "100001" in err and "Traceback" not in err
    assert "difference" not in captured.out


# ------------------------------------------------------------------------------------------- the kernel and blocks

def _baseline():
    """The kernel this one replaced, as ``benchmarks/bench_intervals.py`` keeps it (its BASELINE section)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_intervals.py"
    spec = importlib.util.spec_from_file_location("bench_intervals", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def msp_cells(cifar_model, pack_set) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """MSP of the pack's ResNet-20 on 200 CIFAR-10 test images vs 200 Textures (saturated scores tie at 1.0), the
    same rounded to 2 decimals (heavy ties between the sides), and a rounded synthetic cell."""
    from advopenood.data.datasets import stack

    def msp(name: str, path: str) -> np.ndarray:
        x, _ = stack(pack_set(name, path, 200), list(range(200)))
        with torch.no_grad():
            return torch.softmax(cifar_model(x), 1).max(1).values.numpy().astype(np.float64)

    cell = (msp("cifar10", "cifar10_test.npz"), msp("texture", "texture_test.npz"))
    rng = np.random.default_rng(3)
    return {"msp": cell, "msp rounded": (np.round(cell[0], 2), np.round(cell[1], 2)),
            "synthetic": (np.round(rng.normal(1, 1, 300), 1), np.round(rng.normal(0.3, 1, 250), 1))}


@pytest.mark.parametrize("name", ["msp", "msp rounded", "synthetic"])
def test_the_kernel_gives_the_replaced_kernels_numbers(msp_cells, name):
    """Every resample's AUROC and FPR95 bit for bit as the replaced kernel's (same draws: the blocked draws are the
    one-call draws), AUPR within 1e-10 points (its sums run in another order), every interval end equal as the
    CSVs write it (%.6g)."""
    base = _baseline()
    conf_id, conf_ood = msp_cells[name]
    want_bounds, want = base.baseline_bootstrap(conf_id, conf_ood, 7, f"ood|msp|{name}", 2000)
    bounds, got, _ = iv.metric_intervals(conf_id, conf_ood, "bootstrap", 7, f"ood|msp|{name}", 2000)
    assert np.array_equal(got["auroc"], want["auroc"]) and np.array_equal(got["fpr95"], want["fpr95"])
    for m in ("aupr_in", "aupr_out"):
        np.testing.assert_allclose(got[m], want[m], rtol=0, atol=1e-10)
    raw = {f"{m}_{end}": v for m in got for end, v in zip(("lo", "hi"), iv.percentile(got[m]))}  # before the rule
    assert {c: f"{v:.6g}" for c, v in raw.items()} == {c: f"{v:.6g}" for c, v in want_bounds.items()}


def test_blocked_draws_are_the_one_call_draws(monkeypatch):
    """Drawn a block at a time (here blocks of 3 resamples, the last one short), the writer's and the oracle's
    draws are the numbers the cell's generator gives in one call: all ID indices, then all OOD indices."""
    from advopenood.evaluation import oracle

    rng = iv.generator(11, "ood|msp|texture")
    want_id, want_ood = rng.integers(0, 37, (20, 37)), rng.integers(0, 23, (20, 23))
    monkeypatch.setattr(resampling, "DRAW_BLOCK", 3 * 37)
    monkeypatch.setattr(oracle, "HELD", 3 * 37)
    for blocks in (list(iv.draws(11, "ood|msp|texture", 37, 23, 20)),
                   list(oracle.resample_blocks(11, "ood|msp|texture", 37, 23, 20))):
        assert [len(b[0]) for b in blocks] == [3] * 6 + [2]
        assert np.array_equal(np.concatenate([b[0] for b in blocks]), want_id)
        assert np.array_equal(np.concatenate([b[1] for b in blocks]), want_ood)


def test_blocked_paired_bootstrap_equals_the_one_block_one(msp_cells, monkeypatch):
    cells = [msp_cells["msp"], msp_cells["msp rounded"]]
    whole = iv.paired_replicates(cells, 2, "paired|texture", 500)
    monkeypatch.setattr(resampling, "DRAW_BLOCK", 7 * 200)
    blocked = iv.paired_replicates(cells, 2, "paired|texture", 500)
    assert all(np.array_equal(w[m], b[m]) for w, b in zip(whole, blocked) for m in iv.METRICS)


def _peak(fn) -> int:
    """Peak bytes traced while ``fn`` runs (numpy's buffers included)."""
    import tracemalloc

    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_bootstrap_memory_does_not_grow_with_the_resamples():
    """Issue 39 item 7: 10^9 resamples ended in a MemoryError, an edited run.json made verify grow past 21 GB. The
    writer holds one block of draws whatever the resample count: 20,000 resamples of a 500 + 500 cell peak under
    40 MB and under 3x the peak of 2,000 (all draws at once took 160 MB); the oracle's draws likewise."""
    from advopenood.evaluation import oracle

    rng = np.random.default_rng(5)
    conf_id, conf_ood = rng.normal(1, 1, 500), rng.normal(0, 1, 500)
    small = _peak(lambda: iv.metric_intervals(conf_id, conf_ood, "bootstrap", 0, "k", 2000))
    large = _peak(lambda: iv.metric_intervals(conf_id, conf_ood, "bootstrap", 0, "k", 20_000))
    assert large < 40e6 and large < 3 * small, (small, large)
    drawn = _peak(lambda: sum(len(b[0]) for b in oracle.resample_blocks(0, "k", 500, 500, 20_000)))
    assert drawn < 40e6, drawn
