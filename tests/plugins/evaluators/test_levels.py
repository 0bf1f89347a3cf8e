"""Lorenz et al.'s four levels of adversarial robustness per detector, on the real CIFAR-10 ResNet-20."""
from __future__ import annotations

import dataclasses
import json
import math
import shutil

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from conftest import assert_section_rerendered, edited_copy

from advopenood.config.loading import apply_overrides, load_config
from advopenood.config.schema import thaw
from advopenood.errors import UsageError
from advopenood.run.pipeline import run
from advopenood.evaluation.verify import RunFiles
from advopenood.cli.main import main
from advopenood.config.schema import CISection
from advopenood.evaluation.intervals import bound_rule
from advopenood.evaluation.metrics import auroc_interval
from advopenood_plugins.evaluators.levels.plugin import (COLUMNS, CRITERIA, LEVELS, Levels, beyond_baseline,
                                                         clean_aurocs, conclusive, levels_table, reached_level,
                                                         weakened, worst_levels)
from advopenood_plugins.evaluators.levels.report import read_conclusive, read_levels
from advopenood_plugins.evaluators.levels.verify import verify_levels

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


def _row(table: pd.DataFrame, criterion: str) -> pd.Series:
    (row,) = table[table.criterion == criterion].itertuples(index=False)
    return row


def test_each_criterion_is_the_worst_auroc_of_its_sets(levels_run):
    """Level 1: PGD-40 only (FGSM is single-step, PGD-5 has fewer steps than the default); level 3 and level 4's
    adaptive attacks: adaptive_msp (ID->ID); level 4's OOD->ID: adaptive_ood_msp and robust_ood_msp-tin; ours: the
    robust pair; level 2: not on ResNet-20 / CIFAR-10. Every AUROC from scores/msp.npz (the protocol's positive
    masks) with scikit-learn."""
    _, out = levels_run
    table = pd.read_csv(out / "levels.csv")
    assert list(table.columns) == COLUMNS and set(table.detector) == {"msp"}
    assert [(r.level, r.criterion, r.criterion_source) for r in table.itertuples()] == \
        [(c.level, c.name, c.source) for c in CRITERIA]
    with np.load(out / "scores" / "msp.npz") as s:
        pos = {n: s[n][s[f"{n}.positive"]] for n in ("pgd", "adaptive_msp", "adaptive_ood_msp", "robust_ood_msp-tin")}
        want = {"strong": _auroc(s["id"], pos["pgd"]), "bpda_adaptive": _auroc(s["id"], pos["adaptive_msp"]),
                "adaptive_id": _auroc(s["id"], pos["adaptive_msp"]),
                "ood_to_id": min(_auroc(s["id"], pos["adaptive_ood_msp"]), _auroc(s["id"], pos["robust_ood_msp-tin"])),
                "robust_auroc": _auroc(s["robust_id_msp"], s["robust_ood_msp-tin"])}
    sets = {"strong": "pgd", "bpda_adaptive": "adaptive_msp", "adaptive_id": "adaptive_msp",
            "ood_to_id": "adaptive_ood_msp, robust_ood_msp-tin", "robust_auroc": "robust_id_msp+robust_ood_msp-tin"}
    for criterion, value in want.items():
        row = _row(table, criterion)
        assert row.auroc == pytest.approx(value, abs=1e-4) and row.sets == sets[criterion]
        assert row.passed == float(value >= 50)
    level2 = _row(table, "other_model_data")
    assert math.isnan(level2.auroc) and math.isnan(level2.passed) and pd.isna(level2.sets)
    assert set(table.min_auroc) == {50} and set(table.protocol) == {"strong"}
    assert set(table.reached) == {0}  # MSP falls below chance under PGD already
    assert _row(table, "strong").auroc < 50


def test_each_criterion_has_the_interval_of_its_worst_set(levels_run):
    """The interval beside a worst AUROC is that of the set attaining it: ood.csv's cell for an attack set (same key,
    same resamples), robust_auroc.csv's paired interval for the robust pair; ``conclusive``: it excludes the bar, and
    never on these 16 images (below min_conclusive)."""
    _, out = levels_run
    table = pd.read_csv(out / "levels.csv").dropna(subset=["auroc"])
    ood = pd.read_csv(out / "ood.csv").set_index(["detector", "ood_set"])
    robust = pd.read_csv(out / "robust_auroc.csv")
    robust.index = robust.id_attack + "+" + robust.ood_attack
    assert len(table) == 5 and (table.ci == "bootstrap-2000").all()
    for r in table.itertuples():
        assert r.auroc_lo <= r.auroc <= r.auroc_hi and r.worst_set in r.sets.split(", ")
        want = robust.loc[r.worst_set, ["robust_auroc_lo", "robust_auroc_hi"]] if r.criterion == "robust_auroc" \
            else ood.loc[("msp", r.worst_set), ["auroc_lo", "auroc_hi"]]
        assert [r.auroc_lo, r.auroc_hi] == pytest.approx(list(want.astype(float)), abs=1e-4)
        assert r.conclusive == 0.0  # 16 images a side: too few to conclude, whatever the interval
    assert _row(table, "ood_to_id").worst_set == min(("adaptive_ood_msp", "robust_ood_msp-tin"),
                                                     key=lambda n: ood.loc[("msp", n), "auroc"])


@pytest.mark.parametrize("lo, hi, bar, want", [(55.0, 70.0, 50.0, 1.0), (30.0, 45.0, 50.0, 1.0),
                                               (45.0, 60.0, 50.0, 0.0), (50.0, 60.0, 50.0, 0.0),
                                               (math.nan, math.nan, 50.0, math.nan)])
def test_a_pass_or_fail_is_conclusive_only_when_the_interval_excludes_the_bar(lo, hi, bar, want):
    assert conclusive(lo, hi, bar) == pytest.approx(want, nan_ok=True)


def test_below_min_conclusive_no_pass_or_fail_is_conclusive():
    """A sample below min_conclusive images a side is never conclusive, even where its interval excludes the bar,
    and the reading says why (issue 50)."""
    assert conclusive(55.0, 70.0, 50.0, small=True) == 0.0 and math.isnan(conclusive(math.nan, math.nan, 50, True))
    row = {"detector": "msp", "level": 1, "criterion": "strong", "auroc": 65.0, "auroc_lo": 55.0, "auroc_hi": 72.0,
           "worst_set": "pgd", "passed": 1.0, "conclusive": 0.0, "min_auroc": 50.0}
    [line] = read_conclusive(pd.DataFrame([row]))
    assert line.endswith("but the sample has fewer than 100 images on a side: not conclusive.")


@pytest.mark.parametrize("passed, conclusive_, said", [
    (1.0, 0.0, "MSP passes the bar of 50 at level 1 (strong: worst AUROC 55.0, 95 % interval 41.0 to 69.0 on pgd), "
               "but the interval contains the bar: not conclusive."),
    (0.0, 0.0, "MSP falls short of the bar of 50 at level 1"),
    (1.0, 1.0, None)])
def test_a_pass_or_fail_whose_interval_contains_the_bar_is_read_as_not_conclusive(passed, conclusive_, said):
    row = {"detector": "msp", "level": 1, "criterion": "strong", "auroc": 55.0, "auroc_lo": 41.0, "auroc_hi": 69.0,
           "worst_set": "pgd", "passed": passed, "conclusive": conclusive_, "min_auroc": 50.0}
    lines = read_conclusive(pd.DataFrame([row]))
    assert lines == [] if said is None else (len(lines) == 1 and lines[0].startswith(said))


@pytest.mark.parametrize("method", ["none", "delong"])
def test_ci_none_leaves_the_bounds_empty_and_delong_gives_delongs(levels_run, method):
    ctx, _ = levels_run
    plan = ctx.plan.model_copy(update={"ci": CISection(method=method)})
    row = _row(levels_table(dataclasses.replace(ctx, plan=plan)), "strong")
    assert row.ci == method and row.worst_set == "pgd"
    scores = ctx.scores["msp"]
    conf_id, conf_ood = scores["id"], scores["pgd"][ctx.ood_positives("pgd")]
    want = [100 * b for b in auroc_interval(conf_id, conf_ood)] if method == "delong" else [math.nan, math.nan]
    if method == "delong":  # DeLong's, or at a bound (variance 0 at AUROC 0 or 100) the score interval instead
        want = list(bound_rule("auroc", row.auroc, *want, len(conf_id), len(conf_ood))[:2])
    assert [row.auroc_lo, row.auroc_hi] == pytest.approx(want, nan_ok=True)


#: hand-made confidences: clean ID images all at 1; an attacked set at HELD (0, below every ID image: AUROC 100) or
#: BROKEN (2, above every ID image: AUROC 0); the robust pair's ID side at 1 unless named (then -5: AUROC 0)
HELD, BROKEN = 0.0, 2.0


@pytest.mark.parametrize("broken, worst, reached", [
    ((), {1: 100, 2: None, 3: 100, 4: 100}, 4),
    # the ID->ID adaptive attack counts at level 4 too (Sec. 4: "adaptive attacks"): a detector it breaks is not level 4
    (("adaptive_msp",), {1: 100, 2: None, 3: 0, 4: 0}, 1),
    (("pgd",), {1: 0, 2: None, 3: 100, 4: 100}, 0),
    (("adaptive_ood_msp",), {1: 100, 2: None, 3: 100, 4: 0}, 3),
    (("robust_id_msp",), {1: 100, 2: None, 3: 100, 4: 0}, 3),  # our criterion alone: both sides attacked
    (("fgsm", "pgd_weak"), {1: 100, 2: None, 3: 100, 4: 100}, 4),  # single-step and weakened sets do not count
])
def test_each_level_follows_its_rule_on_hand_made_scores(levels_run, broken, worst, reached):
    ctx, _ = levels_run
    n = {name: len(array) for name, array in ctx.scores["msp"].items()}
    scores = {name: np.full(size, BROKEN if name in broken else HELD) for name, size in n.items()}
    scores["id"] = np.ones(n["id"])
    scores["robust_id_msp"] = np.full(n["robust_id_msp"], -5.0 if "robust_id_msp" in broken else 1.0)
    scores.update({name: np.ones(size) for name, size in n.items() if name in ctx.ood_sets})
    table = levels_table(dataclasses.replace(ctx, scores={"msp": scores}))
    row = worst_levels(table).iloc[0]
    for k, value in worst.items():
        assert math.isnan(row[f"level{k}_auroc"]) if value is None else row[f"level{k}_auroc"] == value
    assert row.reached == reached and set(table.reached) == {reached}
    assert list(table.passed.isna()) == [c.level == 2 for c in CRITERIA]
    assert list(table.conclusive.isna()) == [c.level == 2 for c in CRITERIA]  # every row with an interval
    assert (table.conclusive.dropna() == 0.0).all()  # 16 images: below min_conclusive, nothing is conclusive


@pytest.mark.parametrize("arch, dataset, beyond", [
    ("resnet18_32x32", "cifar10", False),   # the paper's baseline
    ("resnet20", "cifar10", False),         # another model, the same data: "different models and datasets" read as both
    ("resnet18", "imagenet200", False),     # the same model on other data
    ("timm:resnet18.a1_in1k", "imagenet", False),
    ("resnet50", "cifar100", True),
    ("swin_t", "imagenet", True),
    ("resnet20", "mnist", True),
])
def test_level2_is_measured_against_the_papers_resnet18_on_cifar10(arch, dataset, beyond):
    assert beyond_baseline(arch, dataset) == beyond


def test_criterion_source_names_the_papers_criteria_and_ours():
    """Every level's definition is Sec. 4's; the robust AUROC (both sides attacked) is our addition."""
    assert {c.level for c in CRITERIA} == {1, 2, 3, 4}
    assert [c.name for c in CRITERIA if c.source == "ours"] == ["robust_auroc"]
    assert {c.source for c in CRITERIA} == {"paper", "ours"}


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
    # levels.csv's interval beside each quoted AUROC (issue 40: a number is stated with its interval)
    ({"detector": "mds", "level1_auroc": 97.0, "level1_lo": 95.1, "level1_hi": 98.4, "level2_auroc": math.nan,
      "level3_auroc": 12.0, "level3_lo": 8.0, "level3_hi": 16.5, "level4_auroc": math.nan, "reached": 1.0,
      "min_auroc": 50.0},
     "MDS reaches level 1 (worst AUROC there 97.0, 95 % interval 95.1 to 98.4, at least 50); at level 3 its worst "
     "AUROC is 12.0, 95 % interval 8.0 to 16.5, below 50. Levels 2 and 4 are not evaluated in this run."),
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

def _other_run(folder, arch: str, dataset: str, level1: float | None) -> str:
    """A run folder on ``arch`` / ``dataset`` whose levels.csv gives MSP the level-1 AUROC ``level1`` (None: no
    levels.csv)."""
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps({"model": {"arch": arch},
                                                 "config": {"data": {"dataset": dataset}}}))
    if level1 is not None:
        pd.DataFrame({"detector": ["msp", "msp", "mds"], "level": [1, 3, 1], "criterion": ["strong", "bpda_adaptive",
                      "strong"], "auroc": [level1, 1.0, 99.0]}).to_csv(folder / "levels.csv", index=False)
    return str(folder)


def test_level2_counts_runs_beyond_resnet18_on_cifar10_and_verifies(levels_run, tmp_path):
    """A ResNet-50 on ImageNet contributes its level 1; a ResNet-18 on CIFAR-10 does not, and neither does this run
    (ResNet-20 on CIFAR-10)."""
    ctx, out = levels_run
    other = _other_run(tmp_path / "r50", "resnet50", "imagenet", 30.0)
    baseline = _other_run(tmp_path / "r18", "resnet18_32x32", "cifar10", 1.0)
    table = Levels(runs=[other, baseline])(ctx)["levels.csv"]
    row = _row(table, "other_model_data")
    assert row.auroc == pytest.approx(30.0) and row.sets == "r50:level1" and row.criterion_source == "paper"
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    table.to_csv(copy / "levels.csv", index=False, float_format="%.6g")
    info = json.loads((copy / "run.json").read_text())
    info["config"]["evaluator_params"] = {"levels": {"runs": [other, baseline]}}
    (copy / "run.json").write_text(json.dumps(info))
    assert verify_levels(RunFiles.open(copy)) == []


@pytest.mark.parametrize("make, message", [
    (lambda tmp: str(tmp), "is not a run folder"),
    (lambda tmp: _other_run(tmp / "bare", "resnet50", "imagenet", None), "has no levels.csv"),
    (lambda tmp: _other_run(tmp / "unnamed", "", "imagenet", 30.0), "names no model architecture"),
])
def test_a_runs_entry_that_cannot_count_is_refused_when_built(tmp_path, make, message):
    with pytest.raises(UsageError, match=message):
        Levels(runs=[make(tmp_path)])


# ----------------------------------------------------------------------------------------------- verify hook

def test_an_untouched_run_verifies(levels_run):
    _, out = levels_run
    assert verify_levels(RunFiles.open(out)) == []


def test_verify_rerenders_the_levels_section(levels_run, tmp_path):
    """Issue 49, item 2: a sentence added to the levels section (report_sections.json and the report written again
    from it, the manifest re-hashed) passed, the section taken as saved; verify renders it again from levels.csv,
    its plot and the saved scores (the clean AUROCs its readings name)."""
    assert_section_rerendered(levels_run[1], tmp_path, "Levels of adversarial robustness")


@pytest.mark.parametrize("row, column, value", [(0, "auroc", lambda v: v + 0.01), (5, "auroc", lambda v: v + 1),
                                                (0, "reached", lambda v: 4.0), (0, "passed", lambda v: 1 - v),
                                                (5, "criterion_source", lambda v: "paper"),
                                                (0, "sets", lambda v: "pgd, fgsm"),
                                                (0, "auroc_lo", lambda v: v - 0.5), (5, "auroc_hi", lambda v: v + 0.01),
                                                (0, "conclusive", lambda v: 1 - v),
                                                (4, "worst_set", lambda v: "pgd")])
def test_one_changed_cell_is_one_difference(levels_run, tmp_path, row, column, value):
    _, out = levels_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    table = pd.read_csv(copy / "levels.csv")
    table.loc[row, column] = value(table.loc[row, column])
    table.to_csv(copy / "levels.csv", index=False, float_format="%.6g")
    lines = verify_levels(RunFiles.open(copy))
    assert len(lines) == 1 and column in lines[0]


def test_a_detector_taken_out_of_levels_csv_is_missing(levels_run, tmp_path):
    """verify derives levels.csv's rows from the detectors the run scored, not from the rows written: msp's rows
    deleted are six missing rows, one per criterion."""
    _, out = levels_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    table = pd.read_csv(copy / "levels.csv")
    table[table["detector"] != "msp"].to_csv(copy / "levels.csv", index=False, float_format="%.6g")
    lines = verify_levels(RunFiles.open(copy))
    assert len(lines) == 6 and all("'detector': 'msp'" in x and x.endswith("is missing") for x in lines), lines


def test_an_edited_lower_bound_fails_verify(levels_run, tmp_path):
    _, out = levels_run
    copy = edited_copy(out, tmp_path, "levels.csv", "auroc_lo")
    assert main(["verify", str(copy)]) == 1


def test_worst_levels_carry_the_interval_of_the_worst_criterion_into_the_error_bars(tmp_path, monkeypatch):
    """The per-level view (report table and bar plot) shows the worst criterion's 95 % interval (issue 31, item 2:
    error bars on bar plots)."""
    import matplotlib.axes

    from advopenood_plugins.evaluators.levels.report import plot_levels

    table = pd.DataFrame({"detector": "msp", "level": [1, 3, 4, 4], "criterion": ["strong", "bpda_adaptive",
                          "adaptive_id", "ood_to_id"], "auroc": [80.0, 40.0, 30.0, 20.0],
                          "auroc_lo": [70.0, 30.0, 22.0, 12.0], "auroc_hi": [88.0, 50.0, 38.0, 29.0],
                          "reached": 1, "min_auroc": 50.0})
    row = worst_levels(table).iloc[0]
    assert (row.level4_auroc, row.level4_lo, row.level4_hi) == (20.0, 12.0, 29.0)
    assert (row.level1_lo, row.level1_hi) == (70.0, 88.0) and math.isnan(row.level2_lo)
    seen = []
    real_bar = matplotlib.axes.Axes.bar
    monkeypatch.setattr(matplotlib.axes.Axes, "bar", lambda self, *a, **k: seen.append(k.get("yerr")) or
                        real_bar(self, *a, **k))
    plot_levels(worst_levels(table), tmp_path / "levels.png", 50.0)
    errs = {k: e[:, 0].tolist() for k, e in zip(LEVELS, seen)}
    assert errs[4] == [8.0, 9.0] and errs[1] == [10.0, 8.0] and errs[2] == [0.0, 0.0]


def _cells(out) -> dict[tuple[str, str], dict[str, tuple[float, float]]]:
    """Every AUROC cell (detector, set or ID+OOD pair) with its interval, by the file and column that hold it."""
    cells: dict[tuple[str, str], dict[str, tuple[float, float]]] = {}

    def add(key, where, lo, hi):
        cells.setdefault(key, {})[where] = (round(float(lo), 6), round(float(hi), 6))

    for r in pd.read_csv(out / "ood.csv").to_dict("records"):
        add((r["detector"], r["ood_set"]), "ood.csv", r["auroc_lo"], r["auroc_hi"])
    for r in pd.read_csv(out / "robust_auroc.csv").to_dict("records"):
        add((r["detector"], r["ood_set"]), "robust_auroc.csv clean_auroc", r["clean_auroc_lo"], r["clean_auroc_hi"])
        add((r["detector"], r["ood_attack"]), "robust_auroc.csv ood_attacked_auroc", r["ood_attacked_auroc_lo"],
            r["ood_attacked_auroc_hi"])
        add((r["detector"], f"{r['id_attack']}+{r['ood_attack']}"), "robust_auroc.csv robust_auroc",
            r["robust_auroc_lo"], r["robust_auroc_hi"])
    for r in pd.read_csv(out / "levels.csv").dropna(subset=["worst_set"]).to_dict("records"):
        add((r["detector"], r["worst_set"]), f"levels.csv {r['criterion']}", r["auroc_lo"], r["auroc_hi"])
    return cells


def test_one_cell_has_one_interval_in_every_file(levels_run):
    """An AUROC cell (detector, set) that ood.csv, robust_auroc.csv (its clean and attacked-OOD AUROCs are ood.csv's
    cells) and levels.csv all show has the same 95 % interval in each (it once had two: the robust row drew its own
    resamples for the clean and attacked-OOD cells)."""
    _, out = levels_run
    shared = {k: v for k, v in _cells(out).items() if len(v) > 1}
    assert any(len(v) > 2 for v in shared.values()), shared  # a cell in ood.csv, robust_auroc.csv and levels.csv
    for key, where in shared.items():
        assert len(set(where.values())) == 1, (key, where)
