"""Multi-attack metrics (MultiRobustBench adapted to detectors): CR and stability by hand, and an eps sweep on
real CIFAR-10 adversarial sets."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from advopenood import registry
from advopenood.errors import UsageError
from advopenood.evaluation.metrics import ood_metrics
from advopenood_plugins.mead import SetInfo, worst_case_scores
from advopenood_plugins.multiattack import (CURVE_COLUMNS, MULTI_COLUMNS, attack_label, chance_corrected,
                                            competitiveness, competitiveness_table, detection_accuracy,
                                            multiattack_table, stability_constant, sweep_curves)

CR_COLUMNS = ("cr_ind_avg", "cr_ind_worst", "cr_cc_ind_avg", "cr_cc_ind_worst")
from test_mead import build_context


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


def test_stability_constant_by_hand():
    eps = {"pgd@1": 1 / 255, "pgd@2": 2 / 255, "pgd@4": 4 / 255, "fgsm@1": 1 / 255, "fgsm@4": 4 / 255, "df": None}
    labels = {k: attack_label(k) for k in eps}
    perf = {"pgd@1": 0.9, "pgd@2": 0.6, "pgd@4": 0.5, "fgsm@1": 0.8, "fgsm@4": 0.2, "df": 0.0}
    # pgd: s = 0.25, 0.5, 1 -> neighbour slopes 0.3 / 0.25 = 1.2 and 0.1 / 0.5 = 0.2; fgsm: s = 0.25, 1 -> 0.6 / 0.75
    assert stability_constant(perf, labels, eps) == pytest.approx(1.2)
    assert stability_constant(perf, labels, eps, alpha=0.3) == pytest.approx(1.2)
    # alpha 0.8 adds (pgd@1, pgd@4): 0.4 / 0.75, and fgsm's pair 0.8
    assert stability_constant({**perf, "pgd@2": 0.85}, labels, eps, alpha=0.8) == pytest.approx(0.8)
    assert math.isnan(stability_constant({"df": 0.1}, labels, eps))


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
    single = {s.name: ood_metrics(conf_id, scores["det"][s.name][s.success]) for s in sets}
    assert table.loc["auroc", "avg"] == pytest.approx(np.mean([m["auroc"] for m in single.values()]))
    assert table.loc["auroc", "worst"] == pytest.approx(min(m["auroc"] for m in single.values()))
    assert table.loc["fpr95", "worst"] == pytest.approx(max(m["fpr95"] for m in single.values()))
    assert table.loc["auroc", "worst_set"] == "fgsm@0.1"
    conf = np.stack([scores["det"][s.name] for s in sets], 1)
    worst, pos = worst_case_scores(conf, np.stack([s.success for s in sets], 1))
    assert table.loc["auroc", "union"] == pytest.approx(ood_metrics(conf_id, worst[pos])["auroc"])
    assert table.loc["auroc", "cr_ind_avg"] == pytest.approx(100.0)  # the only detector is the best one
    assert set(table.protocol) == set(curves.protocol) == {"strong"}
    assert table.loc["auroc", "n_sets"] == 3


SWEEP = {**{f"fgsm@{k}/255": ("mead_fgsm_ce_linf", {"eps": k / 255}) for k in (1, 4, 16)},
         **{f"pgd@{k}/255": ("mead_pgd_ce_linf", {"eps": k / 255, "steps": 3}) for k in (1, 4, 16)}}


@pytest.fixture(scope="module")
def sweep_run(cifar_model, cifar_test, tmp_path_factory):
    out = tmp_path_factory.mktemp("multiattack")
    ctx = build_context(cifar_model, cifar_test, SWEEP, out, n=64)
    ctx.protocol = "lorenz2024"
    return ctx, registry.get("evaluators", "multiattack")()(ctx)


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
    assert set(per_set.attack) == {"fgsm", "pgd"} and len(per_set) == 2 * len(SWEEP)
    assert set(curves[curves.attack == "union"].eps.round(6)) == {round(k / 255, 6) for k in (1, 4, 16)}
    for (detector, metric), row in table.set_index(["detector", "metric"]).iterrows():
        values = per_set[per_set.detector == detector].set_index("set")[metric].dropna()
        assert row.avg == pytest.approx(values.mean())
        assert row.worst == pytest.approx(values.min() if metric == "auroc" else values.max())
        assert row.n_sets == len(values) and row.reference == "best"
        assert row.cr_ind_worst <= row.cr_ind_avg + 1e-9 and row.cr_cc_ind_worst <= row.cr_cc_ind_avg + 1e-9
        assert np.isfinite(row.stability) and row.stability >= 0
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
    assert set(table.protocol) == set(curves.protocol) == {"lorenz2024"}
    # stronger attacks succeed more often: the positive set grows along the PGD sweep
    pgd = per_set[(per_set.attack == "pgd") & (per_set.detector == "msp")].sort_values("eps")
    assert pgd.n_pos.is_monotonic_increasing and pgd.n_pos.iloc[-1] > pgd.n_pos.iloc[0]
    assert sorted(p.name for p in ctx.plot_dir.glob("eps_sweep_*.png")) == \
        ["eps_sweep_mls_linf.png", "eps_sweep_msp_linf.png"]


def test_union_worst_case_bounds_every_set_on_real_scores(sweep_run):
    ctx, outputs = sweep_run
    names = list(ctx.adv_sets)
    success = np.stack([ctx.adv_sets[s].records.success.to_numpy().astype(bool) for s in names], 1)
    conf = np.stack([ctx.scores["msp"][s] for s in names], 1)
    worst, positive = worst_case_scores(conf, success)
    assert positive.sum() == success.any(1).sum()
    assert np.all(np.where(success, conf <= worst[:, None], True))
    row = outputs["multiattack.csv"].set_index(["detector", "metric"]).loc[("msp", "auroc")]
    assert row.union == pytest.approx(ood_metrics(ctx.scores["msp"]["id"], worst[positive])["auroc"])


def test_named_reference_and_bad_params(sweep_run):
    ctx, _ = sweep_run
    table = registry.get("evaluators", "multiattack")(reference="msp", plots=False)(ctx)["multiattack.csv"]
    msp = table[(table.detector == "msp") & (table.metric == "auroc")].iloc[0]
    assert msp.cr_ind_avg == pytest.approx(100.0) and msp.reference == "msp"
    with pytest.raises(UsageError, match="valid choices"):
        registry.get("evaluators", "multiattack")(reference="knn")(ctx)
    with pytest.raises(UsageError, match="alpha"):
        registry.get("evaluators", "multiattack")(alpha=0)
