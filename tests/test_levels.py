"""Lorenz et al.'s four levels of adversarial robustness per detector, on the real CIFAR-10 ResNet-20."""
from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from advopenood.config.loading import apply_overrides, load_config
from advopenood.config.schema import thaw
from advopenood.errors import UsageError
from advopenood.run.pipeline import run
from advopenood.evaluation.verify import RunFiles
from advopenood_plugins.levels import COLUMNS, Levels, clean_aurocs, read_levels, reached_level, weakened
from advopenood_plugins.verify_robust import verify_levels

EPS = 8 / 255


@pytest.fixture(scope="module")
def levels_run(data_root, session_cache, tmp_path_factory):
    """FGSM and a 5-step PGD (not level 1), PGD-40 (level 1), adaptive_msp (level 3), adaptive_ood_msp and the
    robust-AUROC sets (level 4) against MSP; 16 CIFAR-10 test images, Tiny-ImageNet as OOD."""
    cfg = thaw(load_config("cifar10_resnet20")[0])
    cfg["data"]["ood"] = cfg["data"]["ood"][:1]
    cfg["data"]["fit_limit"] = 1000
    cfg["attacks"] = ["fgsm", "pgd", {"name": "pgd", "params": {"steps": 5}, "label": "pgd_weak"}, "adaptive_msp",
                      "adaptive_ood_msp"]
    cfg["attack_params"] = {"adaptive_msp": {"steps": 10, "lam": [1.0]}, "adaptive_ood_msp": {"steps": 10, "lam": [1.0]},
                            "robust_id": {"steps": 10}, "robust_ood": {"steps": 10}}
    out = tmp_path_factory.mktemp("levels")
    cfg = apply_overrides(cfg, data_root=str(data_root), limit=16, detectors="msp",
                          evaluator="ood,robust_auroc,levels", out=str(out))
    return run(cfg, progress=False), out


def _auroc(conf_id: np.ndarray, conf_ood: np.ndarray) -> float:
    return 100 * roc_auc_score(np.r_[np.zeros(len(conf_id)), np.ones(len(conf_ood))], -np.r_[conf_id, conf_ood])


def test_each_level_is_the_worst_auroc_of_its_sets(levels_run):
    """Level 1: PGD-40 only (FGSM is single-step, PGD-5 has fewer steps than the default); level 3: adaptive_msp;
    level 4: adaptive_ood_msp, robust_ood_msp-tin and the robust pair; level 2: not in one run. Every AUROC from
    scores/msp.npz (the protocol's positive masks) with scikit-learn."""
    _, out = levels_run
    table = pd.read_csv(out / "levels.csv")
    assert list(table.columns) == COLUMNS and list(table.detector) == ["msp"]
    row = table.iloc[0]
    assert row.sets == ("level1: pgd; level3: adaptive_msp; level4: adaptive_ood_msp, robust_ood_msp-tin, "
                        "robust_id_msp+robust_ood_msp-tin")
    with np.load(out / "scores" / "msp.npz") as s:
        pos = {n: s[n][s[f"{n}.positive"]] for n in ("pgd", "adaptive_msp", "adaptive_ood_msp", "robust_ood_msp-tin")}
        level4 = min(_auroc(s["id"], pos["adaptive_ood_msp"]), _auroc(s["id"], pos["robust_ood_msp-tin"]),
                     _auroc(s["robust_id_msp"], s["robust_ood_msp-tin"]))
        assert row.level1_auroc == pytest.approx(_auroc(s["id"], pos["pgd"]), abs=1e-4)
        assert row.level3_auroc == pytest.approx(_auroc(s["id"], pos["adaptive_msp"]), abs=1e-4)
    assert row.level4_auroc == pytest.approx(level4, abs=1e-4)
    assert math.isnan(row.level2_auroc) and row.min_auroc == 50 and row.protocol == "strong"
    assert row.reached == 0  # MSP falls below chance under PGD already
    assert row.level1_auroc < 50


def test_report_section_says_which_level_and_shows_the_figure(levels_run):
    _, out = levels_run
    report = (out / "report.md").read_text()
    assert "## Levels of adversarial robustness" in report and "plots/levels.png" in report
    assert "MSP reaches no level; at level 1 its worst AUROC is" in report
    assert (out / "plots" / "levels.png").stat().st_size > 0


@pytest.mark.parametrize("attack, params, why", [
    ("pgd", {"eps": EPS, "steps": 40}, ""),
    ("pgd", {"eps": EPS, "steps": 10}, "steps 10 < 40"),
    ("pgd", {"eps": 4 / 255, "steps": 40}, "eps"),
    ("pgd", {"eps": EPS, "steps": 40, "rel_stepsize": 0.01}, "steps x step size"),
    ("pgd", {"eps": EPS, "steps": 40, "abs_stepsize": EPS / 10}, ""),
    ("apgd_ce", {"eps": EPS, "n_iter": 50}, "n_iter 50 < 100"),
    ("square", {"eps": EPS, "n_queries": 100}, "n_queries 100 < 5000"),
    ("df", {"eps": None, "steps": 50}, ""),
])
def test_weakened_settings_are_named(attack, params, why):
    got = weakened(attack, params, 32, "strong")
    assert (got == "") if not why else why in got


@pytest.mark.parametrize("worst, want", [
    ({1: 80, 2: math.nan, 3: 70, 4: 20}, 3),
    ({1: 80, 2: 60, 3: 55, 4: 51}, 4),
    ({1: 40, 2: 90, 3: 90, 4: 90}, 0),
    ({1: math.nan, 2: math.nan, 3: 60, 4: math.nan}, 3),
    ({1: math.nan, 2: math.nan, 3: math.nan, 4: math.nan}, math.nan),
    ({1: 50, 2: math.nan, 3: math.nan, 4: 49.9}, 1),
])
def test_reached_level_is_the_highest_evaluated_level_with_no_evaluated_level_below_falling_short(worst, want):
    got = reached_level(worst, 50.0)
    assert (math.isnan(got) and math.isnan(want)) or got == want


@pytest.mark.parametrize("row, sentence", [
    ({"detector": "mds", "level1_auroc": 97.0, "level2_auroc": math.nan, "level3_auroc": 12.0, "level4_auroc": 3.0,
      "reached": 1.0, "min_auroc": 50.0},
     "MDS reaches level 1 (worst AUROC there 97.0, at least 50); at level 3 its worst AUROC is 12.0, below 50. "
     "Level 2 is not evaluated in this run."),
    ({"detector": "knn", "level1_auroc": math.nan, "level2_auroc": math.nan, "level3_auroc": math.nan,
      "level4_auroc": math.nan, "reached": math.nan, "min_auroc": 50.0},
     "KNN: no level is evaluated (the run has no strong, adaptive or OOD->ID set for it)."),
    ({"detector": "msp", "level1_auroc": 80.0, "level2_auroc": 70.0, "level3_auroc": 60.0, "level4_auroc": 55.0,
      "reached": 4.0, "min_auroc": 50.0}, "MSP reaches level 4 (worst AUROC there 55.0, at least 50)."),
])
def test_readings_name_the_level_reached_and_where_it_falls_short(row, sentence):
    assert read_levels(pd.DataFrame([row])) == [sentence]


def test_clean_auroc_is_the_ood_csv_mean_over_natural_sets(levels_run):
    ctx, out = levels_run
    ood = pd.read_csv(out / "ood.csv")
    want = ood[(ood.detector == "msp") & (ood.attack == "none")]["auroc"].mean()
    assert clean_aurocs(ctx)["msp"] == pytest.approx(want, abs=1e-3)


NEAR_CHANCE = {"detector": "mds", "level1_auroc": 52.7, "level2_auroc": math.nan, "level3_auroc": 16.1,
               "level4_auroc": 17.2, "reached": 1.0, "min_auroc": 50.0}


@pytest.mark.parametrize("clean, warned", [
    ({"mds": 52.0}, True),    # the adversarially trained ResNet-20's MDS: near chance before any attack
    ({"mds": 72.3}, False),   # a detector that detects clean images
    ({}, False),              # no clean AUROC known: no claim
])
def test_a_level_passed_near_chance_is_called_so(clean, warned):
    (sentence,) = read_levels(pd.DataFrame([NEAR_CHANCE]), clean)
    assert sentence.startswith("MDS reaches level 1 (worst AUROC there 52.7, at least 50)")
    assert ("clean AUROC is only 52.0" in sentence) == warned


# ------------------------------------------------------------------------------------ level 2: other runs

def _other_run(folder, arch: str, dataset: str, level1: float | None, transfer: list[float]) -> str:
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps({"model": {"arch": arch},
                                                 "config": {"data": {"dataset": dataset}}}))
    if level1 is not None:
        pd.DataFrame({"detector": ["msp", "mds"], "level1_auroc": [level1, 99.0]}).to_csv(folder / "levels.csv")
    if transfer:
        pd.DataFrame({"detector": ["msp"] * len(transfer), "auroc": transfer}).to_csv(folder / "transfer.csv")
    return str(folder)


def test_level2_counts_runs_on_other_models_or_data_and_verifies(levels_run, tmp_path):
    """A run on ResNet-18 contributes its level 1 and its transfer AUROCs; a run on the same model and data does not."""
    ctx, out = levels_run
    other = _other_run(tmp_path / "r18", "resnet18_32x32", "cifar10", 30.0, [70.0, 60.0])
    same = _other_run(tmp_path / "again", "resnet20", "cifar10", 1.0, [])
    table = Levels(runs=[other, same])(ctx)["levels.csv"]
    row = table.iloc[0]
    own = pd.read_csv(out / "levels.csv").iloc[0].level1_auroc
    assert row.level2_auroc == pytest.approx(min(own, 30.0, 60.0), abs=1e-4)
    assert "level2: r18:level1, r18:transfer, level1:pgd" in row.sets and "again" not in row.sets
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    table.to_csv(copy / "levels.csv", index=False, float_format="%.6g")
    info = json.loads((copy / "run.json").read_text())
    info["config"]["evaluator_params"] = {"levels": {"runs": [other, same]}}
    (copy / "run.json").write_text(json.dumps(info))
    assert verify_levels(RunFiles.open(copy)) == []
    with pytest.raises(UsageError, match="is not a run folder"):
        Levels(runs=[str(tmp_path)])(ctx)


# ----------------------------------------------------------------------------------------------- verify hook

def test_an_untouched_run_verifies(levels_run):
    _, out = levels_run
    assert verify_levels(RunFiles.open(out)) == []


@pytest.mark.parametrize("column, value", [("level1_auroc", lambda v: v + 0.01), ("level4_auroc", lambda v: v + 1),
                                           ("reached", lambda v: 4.0),
                                           ("sets", lambda v: v.replace("level1: pgd", "level1: pgd, fgsm"))])
def test_one_changed_cell_is_one_difference(levels_run, tmp_path, column, value):
    _, out = levels_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    table = pd.read_csv(copy / "levels.csv")
    table.loc[0, column] = value(table.loc[0, column])
    table.to_csv(copy / "levels.csv", index=False, float_format="%.6g")
    lines = verify_levels(RunFiles.open(copy))
    assert len(lines) == 1 and column in lines[0]
