"""``benchmarks/reproduce_cifar10.py``: mPGD cells as a spread over position seeds, the paper's GRAM beside both
GRAMs, and the run config it writes (hand-made run folders; the paper's values from the CSV)."""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import reproduce_cifar10 as rc  # noqa: E402

#: mPGD AUROC of MSP per position seed and the ASR per seed (paper: MSP mPGD 74.68, ASR 68.06)
MSP_MPGD = {0: 40.0, 1: 60.0, 2: 80.0}
ASR_MPGD = {0: 90.0, 1: 80.0, 2: 40.0}


@pytest.fixture()
def run_folder(tmp_path: Path) -> Path:
    """A run folder with clean accuracy 80, PGD and three mPGD sets (``mpgd_p<s>``), MSP and both GRAMs."""
    asr = [{"attack": "pgd", "clean_acc": 80.0, "asr_all": 100.0, "n": 200}]
    asr += [{"attack": f"mpgd_p{s}", "clean_acc": 80.0, "asr_all": v, "n": 200} for s, v in ASR_MPGD.items()]
    ood = [{"attack": "none", "detector": "msp", "fpr95": 50.0, "auroc": 90.0, "n_ood": 200}]
    ood += [{"attack": f"mpgd_p{s}", "detector": "msp", "fpr95": 90.0, "auroc": v, "n_ood": 200}
            for s, v in MSP_MPGD.items()]
    ood += [{"attack": "pgd", "detector": d, "fpr95": 99.0, "auroc": v, "n_ood": 200}
            for d, v in (("msp", 1.0), ("gram", 99.0), ("gram_legacy", 1.0))]
    pd.DataFrame(asr).to_csv(tmp_path / "asr.csv", index=False)
    pd.DataFrame(ood).to_csv(tmp_path / "ood.csv", index=False)
    return tmp_path


def test_mpgd_cells_are_mean_min_max_over_position_seeds(run_folder):
    df = rc.compare("resnet18", run_folder).set_index(["detector", "attack", "metric"])
    msp = df.loc[("msp", "mpgd", "auroc")]
    assert (msp.ours, msp.ours_min, msp.ours_max, msp.seeds) == (60.0, 40.0, 80.0, 3)
    assert msp.paper == 74.68 and msp["diff"] == pytest.approx(60.0 - 74.68)
    assert bool(msp.same_side_50) and msp.seeds_paper_side == 2  # 60 and 80 on the paper's side, 40 not
    asr = df.loc[("", "mpgd", "asr_all")]
    assert (asr.ours, asr.ours_min, asr.ours_max, asr.seeds) == (70.0, 40.0, 90.0, 3)
    pgd = df.loc[("msp", "pgd", "auroc")]
    assert (pgd.ours, pgd.ours_min, pgd.ours_max, pgd.seeds, pgd.seeds_paper_side) == (1.0, 1.0, 1.0, 1, 1)


def test_paper_gram_is_compared_with_both_grams_and_counted_with_the_legacy_one(run_folder):
    df = rc.compare("resnet18", run_folder)
    cells = df[(df.attack == "pgd") & (df.metric == "auroc")].set_index("detector")
    assert cells.paper["gram"] == cells.paper["gram_legacy"] == 22.50  # Table 4, CIFAR-10, GRAM / PGD
    assert not cells.same_side_50["gram"] and cells.same_side_50["gram_legacy"]
    counted = rc.summary(df).split("AUROC same side of 50 in ")[1].split(" cells")[0]
    assert counted.endswith("/64")  # the paper's 16 detectors x 4 attacks, gram_legacy standing for its GRAM


def test_run_config_has_one_mpgd_set_per_seed_and_both_grams():
    raw = rc.run_config("resnet18", [0, 3, 7])
    assert raw["attacks"][:3] == ["fgsm", "pgd", "df"]
    assert raw["attacks"][3:] == [{"name": "mpgd", "params": {"position_seed": s}, "label": f"mpgd_p{s}"}
                                  for s in (0, 3, 7)]
    assert {"gram", "gram_legacy", "msp", "mds"} <= set(raw["detectors"]) and len(raw["detectors"]) == 17
