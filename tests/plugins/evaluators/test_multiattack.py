"""Multi-attack metrics (MultiRobustBench adapted to detectors): CR and stability by hand, an eps sweep on real
CIFAR-10 adversarial sets under both positive rules, and the ``verify`` hook."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest

from advopenood import registry
from advopenood.errors import UsageError
from advopenood.evaluation.metrics import ood_metrics
from advopenood_plugins.evaluators.mead.plugin import SetInfo, worst_case_scores
from advopenood_plugins.evaluators.multiattack.plugin import (ALPHA, CURVE_COLUMNS, DEVIATIONS, MULTI_COLUMNS,
                                                              attack_label, chance_corrected, competitiveness,
                                                              competitiveness_table, detection_accuracy,
                                                              multiattack_table, stability_constant, sweep_curves,
                                                              sweep_stability)
from test_mead import build_context, write_run

CR_COLUMNS = ("cr_ind_avg", "cr_ind_worst", "cr_cc_ind_avg", "cr_cc_ind_worst")


def test_chance_correction_and_detection_accuracy():
    np.testing.assert_allclose(chance_corrected(np.array([50.0, 100.0, 25.0]), "auroc"), [0.0, 1.0, -0.5])
    np.testing.assert_allclose(chance_corrected(np.array([95.0, 0.0]), "fpr95"), [0.0, 1.0])
    np.testing.assert_allclose(detection_accuracy(np.array([50.0, 100.0, 0.0]), "auroc"), [0.5, 1.0, 0.0])
    np.testing.assert_allclose(detection_accuracy(np.array([95.0, 0.0, 100.0]), "fpr95"), [0.05, 1.0, 0.0])
    for fn in (chance_corrected, detection_accuracy):
        with pytest.raises(UsageError, match="valid choices"):
            fn(1.0, "aupr")


def test_competitiveness_ratios_by_hand():
    # AUROC (%) of three detectors on four sets; p4: the best barely beats chance and c is far below it
    auroc = pd.DataFrame({"p1": [90.0, 80.0, 40.0], "p2": [60.0, 75.0, 50.0], "p3": [30.0, 45.0, 20.0],
                          "p4": [50.5, 50.0, 10.0]}, index=["a", "b", "c"])
    cr = competitiveness_table(auroc, "auroc")
    # Definition 3.4 on AUROC / 100: the best per set is 90 (a), 75 (b), 45 (b), 50.5 (a)
    assert cr.loc["a", "cr_ind_avg"] == pytest.approx(100 * (1 + 60 / 75 + 30 / 45 + 1) / 4)
    assert cr.loc["a", "cr_ind_worst"] == pytest.approx(100 * 30 / 45)
    assert cr.loc["b", "cr_ind_avg"] == pytest.approx(100 * (80 / 90 + 1 + 1 + 50 / 50.5) / 4)
    assert cr.loc["b", "cr_ind_worst"] == pytest.approx(100 * 80 / 90)
    assert cr.loc["c", "cr_ind_avg"] == pytest.approx(100 * (40 / 90 + 50 / 75 + 20 / 45 + 10 / 50.5) / 4)
    assert cr.loc["c", "cr_ind_worst"] == pytest.approx(100 * 10 / 50.5)
    assert (cr.n_sets_cr == 4).all()
    # chance-corrected, clipped at chance: g = 0.8, 0.6, 0 | 0.2, 0.5, 0 | 0, 0, 0 | 0.01, 0, 0; p3 has no
    # detector above chance and is left out. Unclipped, c on p4 would be (10 - 50) / 50 / 0.01 = -8000 %.
    assert cr.loc["a", "cr_cc_ind_avg"] == pytest.approx(100 * (1 + 0.2 / 0.5 + 1) / 3)
    assert cr.loc["a", "cr_cc_ind_worst"] == pytest.approx(100 * 0.2 / 0.5)
    assert cr.loc["b", "cr_cc_ind_avg"] == pytest.approx(100 * (0.6 / 0.8 + 1 + 0) / 3)
    assert cr.loc["b", "cr_cc_ind_worst"] == pytest.approx(0.0)
    assert cr.loc["c", "cr_cc_ind_avg"] == pytest.approx(0.0) and cr.loc["c", "cr_cc_ind_worst"] == pytest.approx(0.0)
    assert (cr.n_sets_cr_cc == 3).all()
    named = competitiveness_table(auroc, "auroc", reference="b")
    assert named.loc["a", "cr_ind_avg"] == pytest.approx(100 * (90 / 80 + 60 / 75 + 30 / 45 + 50.5 / 50) / 4)
    assert named.loc["b", "cr_ind_worst"] == pytest.approx(100.0)
    with pytest.raises(UsageError, match="valid choices: best, a, b, c"):
        competitiveness_table(auroc, "auroc", reference="zzz")


def test_competitiveness_on_fpr95_leaves_out_sets_no_detector_handles():
    # FPR95 (%): on q2 every detector flags all clean images at 95 % TPR (TNR 0): no ratio is defined there
    fpr = pd.DataFrame({"q1": [20.0, 60.0], "q2": [100.0, 100.0]}, index=["a", "b"])
    cr = competitiveness_table(fpr, "fpr95")
    assert cr.loc["b", "cr_ind_avg"] == pytest.approx(100 * 0.4 / 0.8) and cr.loc["a", "cr_ind_worst"] == 100.0
    assert cr.loc["b", "cr_cc_ind_worst"] == pytest.approx(100 * (35 / 95) / (75 / 95))
    assert (cr.n_sets_cr == 1).all() and (cr.n_sets_cr_cc == 1).all()
    with pytest.raises(ValueError, match="non-negative"):
        competitiveness(pd.DataFrame({"p": [-0.1, 0.5]}, index=["a", "b"]))


def test_sweep_stability_by_hand():
    eps = {"pgd@1": 1 / 255, "pgd@2": 2 / 255, "pgd@4": 4 / 255, "fgsm@1": 1 / 255, "fgsm@4": 4 / 255, "df": None}
    labels = {k: attack_label(k) for k in eps}
    perf = {"pgd@1": 0.9, "pgd@2": 0.6, "pgd@4": 0.5, "fgsm@1": 0.8, "fgsm@4": 0.2, "df": 0.0}
    # pgd: s = 0.25, 0.5, 1 -> neighbour slopes 0.3 / 0.25 = 1.2 and 0.1 / 0.5 = 0.2; fgsm: s = 0.25, 1 -> 0.6 / 0.75
    assert sweep_stability(perf, labels, eps) == pytest.approx(1.2)
    assert sweep_stability({**perf, "pgd@2": 0.85}, labels, eps) == pytest.approx(0.8)
    assert math.isnan(sweep_stability({"df": 0.1}, labels, eps))


def test_stability_constant_is_eq4_with_alpha_by_hand():
    # strengths s(P) = 1 - a*(P) and one detector's a(h, P); Eq. 4 over pairs with 0 < |s1 - s2| <= alpha
    strength = {"p": 0.10, "q": 0.12, "r": 0.14, "t": 0.50, "u": 0.50}
    perf = {"p": 0.90, "q": 0.85, "r": 0.86, "t": 0.20, "u": 0.70}
    # alpha 0.03: (p, q) 0.05 / 0.02 = 2.5 and (q, r) 0.01 / 0.02 = 0.5; (p, r) is 0.04 apart; t and u tie (left out)
    assert stability_constant(perf, strength, alpha=0.03) == pytest.approx(2.5)
    flat = {**perf, "q": 0.89, "r": 0.88}  # neighbours now change by 0.01 per 0.02 of strength
    assert stability_constant(flat, strength, alpha=0.03) == pytest.approx(0.5)
    # alpha 0.4 reaches t: (r, t) 0.68 / 0.36 is the steepest ((q, t) 0.69 / 0.38, (p, t) 0.7 / 0.4, pairs with u 0.5)
    assert stability_constant(flat, strength, alpha=0.4) == pytest.approx(0.68 / 0.36)
    assert math.isnan(stability_constant({"t": 0.2, "u": 0.7}, strength, alpha=0.03))
    assert math.isnan(stability_constant({**perf, "q": math.nan}, strength, alpha=0.03))


def test_union_and_averages_on_hand_built_scores():
    conf_id = np.array([0.9, 0.8, 0.7, 0.6])
    sets = [SetInfo("pgd@0.1", "linf", 0.1, "ce", np.array([True, True, False, True])),
            SetInfo("pgd@0.2", "linf", 0.2, "ce", np.array([True, True, True, True])),
            SetInfo("fgsm@0.1", "linf", 0.1, "ce", np.array([True, False, False, False]))]
    scores = {"det": {"id": conf_id, "pgd@0.1": np.array([0.5, 0.3, 0.0, 0.65]),
                      "pgd@0.2": np.array([0.1, 0.2, 0.3, 0.4]), "fgsm@0.1": np.array([0.85, 0.0, 0.0, 0.0])}}
    curves = sweep_curves(scores, sets, "unit")
    assert list(curves.columns) == CURVE_COLUMNS
    union_01 = curves[(curves.attack == "union") & (curves.eps == 0.1)].iloc[0]
    assert union_01.auroc == pytest.approx(100 * 8 / 12)  # the hand-built MEAD case of test_mead
    table = multiattack_table(scores, sets, "unit", curves=curves).set_index("metric")
    assert list(multiattack_table(scores, sets).columns) == MULTI_COLUMNS
    single = {s.name: ood_metrics(conf_id, scores["det"][s.name][s.positive]) for s in sets}
    assert table.loc["auroc", "avg"] == pytest.approx(np.mean([m["auroc"] for m in single.values()]))
    assert table.loc["auroc", "worst"] == pytest.approx(min(m["auroc"] for m in single.values()))
    assert table.loc["fpr95", "worst"] == pytest.approx(max(m["fpr95"] for m in single.values()))
    assert table.loc["auroc", "worst_set"] == "fgsm@0.1"
    conf = np.stack([scores["det"][s.name] for s in sets], 1)
    worst, pos = worst_case_scores(conf, np.stack([s.positive for s in sets], 1))
    assert table.loc["auroc", "union"] == pytest.approx(ood_metrics(conf_id, worst[pos])["auroc"])
    assert table.loc["auroc", "cr_ind_avg"] == pytest.approx(100.0)  # the only detector is the best one
    assert set(table.protocol) == set(curves.protocol) == {"strong"}
    assert table.loc["auroc", "n_sets"] == 3 and table.loc["auroc", "alpha"] == ALPHA
    assert set(curves.ci) == set(table.ci) == {"none"} and curves.auroc_lo.isna().all()  # no plan: no intervals


def test_worst_has_its_sets_interval_and_union_that_of_its_worst_case_scores(sweep_run):
    """``worst_lo`` / ``worst_hi``: the worst set's curve row; ``union_lo`` / ``union_hi``: the worst-case scores over
    every set resampled against the clean scores with the row's seeded draws, each resample's AUROC by sklearn."""
    from sklearn.metrics import roc_auc_score

    from advopenood.evaluation.intervals import generator

    ctx, outputs = sweep_run
    table, curves = outputs["multiattack.csv"], outputs["multiattack_curves.csv"]
    # the run's bootstrap, an interval at a bound naming its method ("; at a bound: fpr95 wilson")
    assert all(str(c).startswith("bootstrap-2000") for c in [*table.ci, *curves.ci])
    for frame, cols in ((curves, ("auroc", "fpr95")), (table, ("worst", "union"))):
        for col in cols:
            assert ((frame[f"{col}_lo"] <= frame[col] + 1e-9) & (frame[col] <= frame[f"{col}_hi"] + 1e-9)).all()
    per_set = curves.set_index(["detector", "set"])
    for row in table.itertuples():
        assert [row.worst_lo, row.worst_hi] == [per_set.loc[(row.detector, row.worst_set), f"{row.metric}_lo"],
                                                per_set.loc[(row.detector, row.worst_set), f"{row.metric}_hi"]]
    names = list(ctx.adv_sets)
    worst, _ = worst_case_scores(np.stack([ctx.scores["msp"][s] for s in names], 1).astype(np.float64),
                                 np.stack([ctx.ood_positives(s) for s in names], 1))
    conf_id = ctx.scores["msp"]["id"]
    rng = generator(ctx.seed, "union|msp|all")  # the documented draws: all ID indices, then all positive ones
    idx_id = rng.integers(0, len(conf_id), (2000, len(conf_id)))
    idx_pos = rng.integers(0, len(worst), (2000, len(worst)))
    reps = [100 * roc_auc_score(np.r_[np.zeros(len(i)), np.ones(len(j))], -np.r_[conf_id[i], worst[j]])
            for i, j in zip(idx_id, idx_pos)]
    row = table.set_index(["detector", "metric"]).loc[("msp", "auroc")]
    assert [row.union_lo, row.union_hi] == pytest.approx(list(np.percentile(reps, [2.5, 97.5])), abs=1e-9)


SWEEP = {**{f"fgsm@{k}/255": ("mead_fgsm_ce_linf", {"eps": k / 255}) for k in (1, 4, 16)},
         **{f"pgd@{k}/255": ("mead_pgd_ce_linf", {"eps": k / 255, "steps": 3}) for k in (1, 4, 16)},
         "df": ("df", {})}


@pytest.fixture(scope="module")
def sweep_ctx(cifar_model, cifar_test, tmp_path_factory):
    """FGSM and PGD at Linf 1, 4, 16 /255 and DeepFool on 64 CIFAR-10 images, seen through the 8-bit view."""
    return build_context(cifar_model, cifar_test, SWEEP, tmp_path_factory.mktemp("multiattack"), n=64,
                         quantize="uint8_trunc")


def evaluate(ctx, protocol: str, **params):
    """The ``multiattack`` evaluator on ``ctx`` under ``protocol``."""
    ctx = dataclasses.replace(ctx, plan=ctx.plan.replace(protocol=protocol))  # frozen: a new one under that plan
    return ctx, registry.get("evaluators", "multiattack")(**params)(ctx)


@pytest.fixture(scope="module")
def sweep_run(sweep_ctx):
    return evaluate(sweep_ctx, "lorenz2024")


def test_every_competitiveness_ratio_lies_in_0_100_on_the_pack(sweep_run):
    table = sweep_run[1]["multiattack.csv"]
    for col in CR_COLUMNS:
        assert table[col].notna().all() and table[col].between(0.0, 100.0).all(), table[col].tolist()


def test_multiattack_evaluator_on_a_real_sweep(sweep_run):
    ctx, outputs = sweep_run
    table, curves = outputs["multiattack.csv"], outputs["multiattack_curves.csv"]
    assert outputs.figures and all(p.parent == ctx.plot_dir and p.is_file() for p in outputs.figures)
    assert list(table.columns) == MULTI_COLUMNS and list(curves.columns) == CURVE_COLUMNS
    assert set(table.detector) == {"msp", "mls"} and set(table.metric) == {"auroc", "fpr95"}
    per_set = curves[curves.attack != "union"]
    assert set(per_set.attack) == {"fgsm", "pgd", "df"} and len(per_set) == 2 * len(SWEEP)
    assert set(curves[curves.attack == "union"].eps.round(6)) == {round(k / 255, 6) for k in (1, 4, 16)}
    for (detector, metric), row in table.set_index(["detector", "metric"]).iterrows():
        values = per_set[per_set.detector == detector].set_index("set")[metric].dropna()
        assert row.avg == pytest.approx(values.mean())
        assert row.worst == pytest.approx(values.min() if metric == "auroc" else values.max())
        assert row.n_sets == len(values) and row.reference == "best" and row.alpha == ALPHA
        assert row.cr_ind_worst <= row.cr_ind_avg + 1e-9 and row.cr_cc_ind_worst <= row.cr_cc_ind_avg + 1e-9
        assert np.isfinite(row.stability_eps) and row.stability_eps >= 0
        assert math.isnan(row.stability) or row.stability >= 0
    # against the per-set best detector, on every set one of the two detectors has ratio 1
    for metric in ("auroc", "fpr95"):
        part = table[table.metric == metric].set_index("detector")
        wide = per_set.pivot(index="detector", columns="set", values=metric)
        acc = pd.DataFrame(detection_accuracy(wide.to_numpy(), metric), index=wide.index, columns=wide.columns)
        best = acc.max()  # a*(P); 0 where every detector has FPR95 = 100 %
        assert (part.n_sets_cr == (best > 0).sum()).all() and (best > 0).sum() >= 2
        assert part.cr_ind_avg.max() <= 100.0 + 1e-9
        msp = acc.loc["msp"][best > 0] / best[best > 0]
        assert part.loc["msp", "cr_ind_avg"] == pytest.approx(100 * msp.mean())
        assert part.loc["msp", "cr_ind_worst"] == pytest.approx(100 * msp.min())
        # Eq. 4 with s = 1 - a*, every pair of sets within alpha, straight from the per-set table
        s = (1 - best).to_numpy()
        a = acc.loc["msp"].to_numpy()
        slopes = [abs(a[i] - a[j]) / abs(s[i] - s[j]) for i in range(len(s)) for j in range(len(s))
                  if 0 < abs(s[i] - s[j]) <= ALPHA + 1e-12]
        assert part.loc["msp", "stability"] == pytest.approx(max(slopes)) if slopes else \
            math.isnan(part.loc["msp", "stability"])
    assert set(table.protocol) == set(curves.protocol) == {"lorenz2024"}
    assert sorted(p.name for p in ctx.plot_dir.glob("eps_sweep_*.png")) == \
        ["eps_sweep_mls_linf.png", "eps_sweep_msp_linf.png"]


@pytest.mark.parametrize("protocol, rule", [("lorenz2024", "all"), ("strong", "successful")])
def test_positives_follow_the_runs_protocol(sweep_ctx, protocol, rule):
    ctx, outputs = evaluate(sweep_ctx, protocol, plots=False)
    curves, table = outputs["multiattack_curves.csv"], outputs["multiattack.csv"]
    if rule == "successful":  # DeepFool: some successes are lost to the truncation; they must not be positives
        assert (ctx.adv_sets["df"].records.success.to_numpy(bool) & ~ctx.success("df")).any()
    for row in curves[curves.attack != "union"].itertuples():
        mask = ctx.ood_positives(row.set)  # strong: success of the 8-bit images; lorenz2024: every attacked image
        assert row.n_pos == mask.sum() == (64 if rule == "all" else ctx.success(row.set).sum())
        assert row.auroc == pytest.approx(ood_metrics(ctx.scores[row.detector]["id"],
                                                      ctx.scores[row.detector][row.set][mask])["auroc"])
    assert set(curves.positives) == set(table.positives) == {rule}


def test_every_row_names_its_deviations_from_the_paper(sweep_run, sweep_ctx):
    table = sweep_run[1]["multiattack.csv"]
    for row in table.itertuples():
        said = row.deviations.split("; ")
        assert DEVIATIONS[row.metric] in said and DEVIATIONS["best"] in said
        assert DEVIATIONS["clean"] in said and DEVIATIONS["sc"] in said
    named = evaluate(sweep_ctx, "lorenz2024", reference="mls", plots=False)[1]["multiattack.csv"]
    assert all("a*(P) = detector mls's score" in d for d in named.deviations)


def test_union_worst_case_bounds_every_set_on_real_scores(sweep_run):
    ctx, outputs = sweep_run
    names = list(ctx.adv_sets)
    positive = np.stack([ctx.ood_positives(s) for s in names], 1)
    conf = np.stack([ctx.scores["msp"][s] for s in names], 1).astype(np.float64)
    worst, any_positive = worst_case_scores(conf, positive)
    assert any_positive.all()  # lorenz2024: every attacked image is a positive
    assert np.all(worst == conf.max(1))
    row = outputs["multiattack.csv"].set_index(["detector", "metric"]).loc[("msp", "auroc")]
    assert row.union == pytest.approx(ood_metrics(ctx.scores["msp"]["id"], worst)["auroc"])


def test_named_reference_and_bad_params(sweep_run):
    ctx, _ = sweep_run
    table = registry.get("evaluators", "multiattack")(reference="msp", plots=False)(ctx)["multiattack.csv"]
    msp = table[(table.detector == "msp") & (table.metric == "auroc")].iloc[0]
    assert msp.cr_ind_avg == pytest.approx(100.0) and msp.reference == "msp"
    with pytest.raises(UsageError, match="valid choices"):
        registry.get("evaluators", "multiattack")(reference="knn")(ctx)
    for alpha in (0, None):
        with pytest.raises(UsageError, match="alpha"):
            registry.get("evaluators", "multiattack")(alpha=alpha)


@pytest.mark.parametrize("protocol, params", [("lorenz2024", {}), ("strong", {"alpha": 0.5}),
                                              ("strong", {"reference": "msp", "detectors": ["msp", "mls"]})])
def test_verify_rederives_the_multiattack_tables(sweep_ctx, tmp_path, protocol, params):
    ctx, outputs = evaluate(sweep_ctx, protocol, plots=False, **params)
    run = write_run(tmp_path, ctx, outputs.tables, "multiattack", params)
    assert registry.get("evaluators", "multiattack").verify(run) == []


@pytest.mark.parametrize("table, column, change", [
    ("multiattack_curves.csv", "auroc", 0.5), ("multiattack_curves.csv", "n_pos", -1),
    ("multiattack.csv", "union", 0.2), ("multiattack.csv", "cr_ind_avg", -0.1),
    ("multiattack.csv", "cr_cc_ind_worst", 1), ("multiattack.csv", "stability", 0.01),
    ("multiattack.csv", "stability_eps", 0.01), ("multiattack.csv", "avg", 0.1),
    ("multiattack_curves.csv", "auroc_lo", -0.5), ("multiattack.csv", "union_hi", 0.5),
    ("multiattack.csv", "worst_lo", -0.5)])
def test_verify_reports_a_changed_number(sweep_ctx, tmp_path, table, column, change):
    params = {"alpha": 0.5}
    ctx, outputs = evaluate(sweep_ctx, "strong", plots=False, **params)
    tables = {name: df.copy() for name, df in outputs.tables.items()}
    target = tables[table]
    row = int(np.flatnonzero(target[column].notna().to_numpy())[0])
    target.loc[row, column] = target.loc[row, column] + change
    lines = registry.get("evaluators", "multiattack").verify(write_run(tmp_path, ctx, tables, "multiattack", params))
    assert len(lines) == 1 and lines[0].startswith(f"{table}: ") and f" {column}: written" in lines[0]
