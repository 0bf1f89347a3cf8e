"""Paired comparisons (``paired.csv``), the leaderboard's ranks with ties and the heatmap's chance marking: the paired
interval is narrower than the unpaired one on real scores, twins are always paired, ``verify`` re-derives them."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from advopenood.cli.main import main
from advopenood.evaluation import intervals as iv
from advopenood.evaluation.metrics import auroc_difference_interval, auroc_interval
from advopenood.outputs.plots import chance_mask, ood_matrix
from advopenood_plugins.kit.paired import (MAX_ALL_PAIRS, add_ranks, detector_pairs, holm_rank_ranges, holm_ranks,
                                           paired_table, tie_ranks)

from conftest import pack_config


@pytest.fixture(scope="module")
def msp_mls(cifar_model, pack_set) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """MSP and MLS confidences of the pack's ResNet-20 on 100 CIFAR-10 test images and 100 Textures."""
    from advopenood.data.datasets import stack

    def logits(name: str, path: str) -> torch.Tensor:
        x, _ = stack(pack_set(name, path, 100), list(range(100)))
        with torch.no_grad():
            return cifar_model(x)

    out = {}
    for det, fn in (("msp", lambda z: torch.softmax(z, 1).max(1).values), ("mls", lambda z: z.max(1).values)):
        out[det] = tuple(fn(logits(name, f"{name}_test.npz")).numpy() for name in ("cifar10", "texture"))
    return out


def fake_ctx(scores: dict[str, tuple[np.ndarray, np.ndarray]], method: str = "bootstrap", resamples: int = 2000):
    """The parts of a RunContext that :func:`paired_table` reads: the interval policy of the plan's ci and the seed,
    scores on one set."""
    plan = SimpleNamespace(ci=SimpleNamespace(method=method, resamples=resamples))
    return SimpleNamespace(plan=plan, seed=0, protocol="strong", intervals=iv.IntervalPolicy.of(plan.ci, 0),
                           scores={d: {"id": i, "texture": o} for d, (i, o) in scores.items()})


def ood_rows(scores: dict[str, tuple[np.ndarray, np.ndarray]]) -> pd.DataFrame:
    from advopenood.evaluation.metrics import auroc

    return pd.DataFrame([{"detector": d, "ood_set": "texture", "group": "far", "auroc": 100 * auroc(i, o)}
                         for d, (i, o) in scores.items()])


@pytest.mark.parametrize("method", ["bootstrap", "delong"])
def test_paired_interval_is_narrower_than_the_unpaired_one(method, msp_mls):
    """MSP and MLS rank the same 100 + 100 real images alike: the paired interval of their AUROC difference is
    narrower than the unpaired combination (independent resamples / independent DeLong variances)."""
    row = paired_table(fake_ctx(msp_mls, method), ood_rows(msp_mls), {"texture": None}).iloc[0]
    paired = row["delta_auroc_hi"] - row["delta_auroc_lo"]
    if method == "bootstrap":
        reps = [iv.metric_intervals(i, o, "bootstrap", 0, f"ood|{d}|texture")[1]["auroc"] for d, (i, o) in
                msp_mls.items()]
        unpaired = float(np.subtract(*iv.percentile(reps[0] - reps[1])[::-1]))
    else:
        halves = [(hi - lo) / 2 for lo, hi in (auroc_interval(*c) for c in msp_mls.values())]
        unpaired = 2 * 100 * math.hypot(*halves)
    assert row["delta_auroc_lo"] <= row["delta_auroc"] <= row["delta_auroc_hi"]
    assert paired < 0.75 * unpaired
    assert row["significant"] == (row["delta_auroc_lo"] > 0 or row["delta_auroc_hi"] < 0)


def test_delong_paired_is_the_single_auroc_interval_against_a_constant(msp_mls):
    """Against a detector that ties every image (AUROC 50, no variance) the paired difference interval is the
    single AUROC's DeLong interval shifted by 0.5."""
    conf_id, conf_ood = msp_mls["msp"]
    lo, hi = auroc_difference_interval(conf_id, conf_ood, np.zeros_like(conf_id), np.zeros_like(conf_ood))
    assert (lo + 0.5, hi + 0.5) == pytest.approx(auroc_interval(conf_id, conf_ood))


NAMES = {"few": ["ebo", "msp", "mls", "smoothed_msp"],
         "many": [f"d{i:02d}" for i in range(MAX_ALL_PAIRS - 1)] + ["msp", "smoothed_msp"]}


@pytest.mark.parametrize("case", list(NAMES))
def test_twins_are_always_paired_derived_first(case):
    names = NAMES[case]
    aurocs = {d: float(i) for i, d in enumerate(names)}  # smoothed_msp is best, msp second: never best vs twin only
    aurocs.update({"d00": 99.0} if case == "many" else {})
    pairs = detector_pairs(names, aurocs)
    assert ("smoothed_msp", "msp", True) in pairs
    assert sum(frozenset((a, b)) == {"msp", "smoothed_msp"} for a, b, _ in pairs) == 1
    if case == "few":
        assert len(pairs) == len(names) * (len(names) - 1) // 2
    else:  # more than MAX_ALL_PAIRS detectors: each against the best (d00), plus the twin pair
        assert len(pairs) == len(names) and all(a == "d00" for a, _, twin in pairs if not twin)


NAN = math.nan
RANKS = {
    "overlap chain ties only with the leader": ([90, 88, 80, 70], [85, 84, 76, 60], [95, 92, 84, 80], True,
                                                [1, 1, 3, 3]),
    "disjoint": ([90, 80, 70], [88, 78, 68], [92, 82, 72], True, [1, 2, 3]),
    "all overlap": ([60, 59, 58], [40, 40, 40], [80, 80, 80], True, [1, 1, 1]),
    "fpr lower is better": ([10, 40, 12], [5, 30, 8], [15, 50, 20], False, [1, 3, 1]),
    "NaN has no rank": ([70, NAN, 90], [60, NAN, 85], [80, NAN, 95], True, [2, None, 1]),
    "no intervals: equal values tie": ([70, 80, 80], [NAN] * 3, [NAN] * 3, True, [3, 1, 1]),
}


@pytest.mark.parametrize("case", list(RANKS))
def test_ranks_tie_where_intervals_overlap(case):
    values, lo, hi, higher, want = RANKS[case]
    with pytest.warns(DeprecationWarning):
        got = tie_ranks(values, lo, hi, higher)
    assert [None if pd.isna(r) else r for r in got] == want


def test_leaderboard_ranks_follow_the_paired_holm_tests_not_overlapping_intervals():
    """Two means whose 95 % intervals overlap widely (the shared ID draws move both alike) but whose paired
    differences never cross 0 are ranked apart (the overlap rule tied them); two whose paired difference straddles 0
    tie: the rule of the headline (Holm-adjusted paired tests), not interval overlap."""
    rng = np.random.default_rng(0)
    shared = rng.normal(0, 5, 2000)  # the draw of the shared ID images moves every detector's mean alike
    reps = {0: 80 + shared + 1.0, 1: 80 + shared, 2: 60 + shared / 5}
    values = [81.0, 80.0, 60.0]
    assert np.percentile(reps[0], 2.5) < np.percentile(reps[1], 97.5)  # the intervals overlap
    assert holm_ranks(values, reps, True) == [1, 2, 3]
    tight = 81 + rng.normal(0, 0.1, 2000)
    loose = tight - 1 + rng.normal(0, 3, 2000)  # its own interval is wide, and its difference to tight straddles 0
    assert holm_ranks([81.0, 80.0], {0: tight, 1: loose}, True) == [1, 1]
    assert holm_ranks([10.0, 40.0, math.nan], None, False)[:2] == [1, 2]  # no replicates: the point estimates
    board = pd.DataFrame({"detector": ["a", "b"], "adv_auroc": [81.0, 80.0]})
    assert add_ranks(board.copy(), {"adv_auroc": True}, lambda d, m: reps[0 if d == "a" else 1],
                     n_id=100)["adv_auroc_rank"].tolist() == [1, 2]
    below = add_ranks(board.copy(), {"adv_auroc": True}, lambda d, m: reps[0 if d == "a" else 1], n_id=32)
    assert below["adv_auroc_rank"].isna().all()  # fewer ID images than min_conclusive: no rank


def test_a_rank_is_the_range_the_holm_tests_allow():
    """A mean shown above two others that are not shown apart: ranks 1 and 2-3 (both ends written, the worst end
    in ``<metric>_rank_worst``), where the best end alone read "2, 2" as if both were second; without replicates
    the point estimates give one place each."""
    rng = np.random.default_rng(1)
    shared = rng.normal(0, 5, 2000)
    reps = {0: 80 + shared, 1: 70 + shared + rng.normal(0, 3, 2000), 2: 70.5 + shared + rng.normal(0, 3, 2000)}
    values = [80.0, 70.0, 70.5]
    assert holm_rank_ranges(values, reps, True) == [(1, 1), (2, 3), (2, 3)]
    assert holm_rank_ranges([10.0, 40.0, math.nan], None, False) == [(1, 1), (2, 2), None]
    board = add_ranks(pd.DataFrame({"detector": ["a", "b", "c"], "adv_auroc": values}), {"adv_auroc": True},
                      lambda d, m: reps["abc".index(d)], n_id=100)
    assert board["adv_auroc_rank"].tolist() == [1, 2, 2] and board["adv_auroc_rank_worst"].tolist() == [1, 3, 3]


def test_heatmap_marks_cells_whose_interval_contains_chance():
    rows = [("msp", "texture", 80, 70, 90), ("msp", "fgsm", 55, 45, 65), ("ebo", "texture", 50, NAN, NAN),
            ("ebo", "fgsm", 30, 20, 49.9)]
    ood = pd.DataFrame([{"dataset": "c", "arch": "r", "backend": "b", "detector": d, "attack": "none" if s == "texture"
                         else s, "ood_set": s, "auroc": a, "auroc_lo": lo, "auroc_hi": hi} for d, s, a, lo, hi in rows])
    mask = chance_mask(ood)
    table = ood_matrix(ood, "auroc")
    assert list(table.index) == ["msp", "ebo"] and list(table.columns) == ["texture", "fgsm"]
    assert mask.tolist() == [[False, True], [False, False]]


@pytest.fixture(scope="module")
def pack_run(tmp_path_factory, data_root) -> Path:
    """8 CIFAR-10 images vs 8 Textures, FGSM, MSP, MLS and smoothed MSP, 100 bootstrap resamples."""
    work = tmp_path_factory.mktemp("paired")
    cfg = pack_config(work, data_root, {"detectors": "msp,mls,smoothed_msp",
                                        "ci": {"method": "bootstrap", "resamples": 100}})
    out = work / "out"
    assert main(["run", "--config", cfg, "--out", str(out), "--cache-dir", str(work / "cache"), "--quiet"]) == 0
    return out


def test_a_run_writes_paired_comparisons_and_ranks(pack_run):
    paired = pd.read_csv(pack_run / "paired.csv")
    assert set(paired["ood_set"]) == {"texture", "fgsm"} and len(paired) == 2 * 3
    twins = paired[paired["twin"]]
    assert set(zip(twins["detector_a"], twins["detector_b"], twins["ood_set"])) == {
        ("smoothed_msp", "msp", "texture"), ("smoothed_msp", "msp", "fgsm")}
    assert (paired["delta_auroc"] - (paired["auroc_a"] - paired["auroc_b"])).abs().max() < 1e-3
    assert (paired["significant"] == ((paired["delta_auroc_lo"] > 0) | (paired["delta_auroc_hi"] < 0))).all()
    assert set(paired["ci"]) == {"bootstrap-100"}
    board = pd.read_csv(pack_run / "leaderboard.csv")
    assert board["adv_auroc_rank"].isna().all() and board["far_auroc_rank"].isna().all()  # 8 < min_conclusive
    report = (pack_run / "report.md").read_text()
    assert "## Paired comparisons" in report and "adv_auroc_rank" in report


def test_verify_rederives_paired_and_ranks(pack_run, capsys):
    assert main(["verify", str(pack_run)]) == 0
    assert "0 difference(s)" in capsys.readouterr().out


EDITS = {"paired delta_auroc_lo": ("paired.csv", "delta_auroc_lo", -0.5),
         "leaderboard adv_auroc_rank": ("leaderboard.csv", "adv_auroc_rank", None)}


@pytest.mark.parametrize("edit", list(EDITS))
def test_verify_finds_one_changed_cell(edit, pack_run, tmp_path, capsys):
    table, column, change = EDITS[edit]
    run = tmp_path / "run"
    shutil.copytree(pack_run, run)
    df = pd.read_csv(run / table)
    df.loc[0, column] = 1 if change is None else df.loc[0, column] + change  # None: a rank where none may be
    df.to_csv(run / table, index=False, float_format="%.6g")
    assert main(["verify", str(run)]) == 1
    lines = [line for line in capsys.readouterr().out.splitlines() if "DIFFERENCE" in line]
    assert len(lines) == 1 and table in lines[0] and column in lines[0]


@pytest.mark.parametrize("method", ["delong", "none"])
def test_verify_rederives_paired_under_every_ci_method(method, tmp_path, data_root, capsys):
    cfg = pack_config(tmp_path / "work", data_root, {"detectors": "msp,mls", "ci": {"method": method}})
    out = tmp_path / "out"
    assert main(["run", "--config", cfg, "--out", str(out), "--cache-dir", str(tmp_path / "cache"), "--quiet"]) == 0
    paired = pd.read_csv(out / "paired.csv")
    assert set(paired["ci"]) == {method} and paired["delta_auroc_lo"].notna().all() == (method == "delong")
    assert main(["verify", str(out)]) == 0
    assert "0 difference(s)" in capsys.readouterr().out


def test_verify_rederives_the_holm_ranks_of_a_run_above_min_conclusive(session_cache, tmp_path, capsys):
    """A demo run of 100 images a set (min_conclusive): the leaderboard ranks by the paired Holm tests, ``verify``
    re-derives them (0 differences) and finds a changed rank."""
    out = tmp_path / "run"
    assert main(["run", "--config", "demo", "--limit", "100", "--attack", "fgsm", "--detectors", "msp,mls,knn",
                 "--analysis", "", "--ci-resamples", "200", "--out", str(out), "--quiet"]) == 0
    board = pd.read_csv(out / "leaderboard.csv")
    assert board["far_auroc_rank"].notna().all() and board["adv_auroc_rank"].min() == 1
    capsys.readouterr()
    assert main(["verify", str(out)]) == 0
    assert "0 difference(s)" in capsys.readouterr().out
    assert (board["far_auroc_rank"] <= board["far_auroc_rank_worst"]).all()
    written = (out / "leaderboard_openood.json").read_text()
    entries = json.loads(written)  # OpenOOD's Rank: the near-OOD AUROC's Holm range, not a point-estimate order
    ranks = board.set_index("detector")
    assert [[e["Rank"], e["Rank_Worst"]] for e in entries] == [
        ["/" if pd.isna(v) else int(v) for v in ranks.loc[e["advopenood"]["detector"], ["near_auroc_rank",
                                                                                       "near_auroc_rank_worst"]]]
        for e in entries]
    assert {e["Rank_Rule"] for e in entries} == {"no rank: no near-OOD AUROC"}  # the demo's sets are all far-OOD
    entries[0]["Rank_Worst"] = len(entries) + 1
    (out / "leaderboard_openood.json").write_text(json.dumps(entries))
    assert main(["verify", str(out)]) == 1
    assert "Rank, Rank_Worst" in capsys.readouterr().out
    (out / "leaderboard_openood.json").write_text(written)
    board.loc[board["far_auroc_rank"].idxmin(), "far_auroc_rank"] = len(board) + 1
    board.to_csv(out / "leaderboard.csv", index=False, float_format="%.6g")
    assert main(["verify", str(out)]) == 1
    lines = [line for line in capsys.readouterr().out.splitlines() if "DIFFERENCE" in line]
    assert len(lines) == 1 and "far_auroc_rank" in lines[0]


def test_a_difference_of_two_aurocs_at_a_bound_is_no_point():
    """Both detectors at AUROC 0 on 32 + 32 images (every ID score below every OOD score): every bootstrap resample
    gives a difference of 0, so the percentile interval is [0, 0]; the stated interval is the square-and-add one of
    the two score intervals (method ``mover``), wider than a point and around 0, and the checker's agrees."""
    from advopenood.evaluation import oracle

    id_a, ood_a = np.linspace(0, 1, 32), np.linspace(2, 3, 32)
    cell_a, cell_b = (id_a, ood_a), (id_a * 2, ood_a * 2)
    policy = iv.IntervalPolicy("bootstrap", 500, 0)
    got = policy.paired("paired|x", [cell_a, cell_b], ("auroc",))
    assert iv.percentile(got[0]["auroc"] - got[1]["auroc"]) == (0.0, 0.0)
    lo, hi, _, how = policy.bounded_difference(cell_a, cell_b, got[0]["auroc"], got[1]["auroc"])
    assert how == "mover" and lo < -1 and hi > 1 and abs(lo + hi) < 1e-9
    plan = oracle.IntervalPlan("bootstrap", 500, 0)
    checked = plan.bounded_difference(cell_a, cell_b, got[0]["auroc"], got[1]["auroc"])
    assert checked[2] == how and checked[:2] == pytest.approx((lo, hi), abs=1e-6)
