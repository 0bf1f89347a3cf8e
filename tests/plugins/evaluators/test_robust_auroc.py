"""Robust AUROC on the real CIFAR-10 ResNet-20: the attacks on both sides, the evaluator, its expansion, its verify
hook, the binarization test's detector variant and the OpenOOD leaderboard entries."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from conftest import assert_section_rerendered, edited_copy
import torch
from sklearn.metrics import roc_auc_score

from advopenood import registry
from advopenood.attacks.base import build_attack
from advopenood.capabilities import bind_attack
from advopenood.cli.main import main
from advopenood.config.loading import apply_overrides, load_config
from advopenood.config.plan import expand_attacks
from advopenood.config.schema import thaw
from advopenood.errors import UsageError
from advopenood.evaluation.metrics import MIN_CONCLUSIVE
from advopenood.run.pipeline import run
from advopenood.evaluation.verify import RunFiles
from advopenood_plugins.analyses.bintest import binarization as bt
from advopenood_plugins.evaluators.ood.report import with_positives
from advopenood.evaluation import oracle
from advopenood.evaluation.intervals import IntervalPolicy, bound_rule, metric_intervals
from advopenood.evaluation.metrics import auroc_interval
from advopenood_plugins.evaluators.robust_auroc.plugin import COLUMNS, ROBUST_METRICS, robust_intervals, robust_metrics
from advopenood_plugins.evaluators.robust_auroc.verify import verify_robust

CPU = torch.device("cpu")
DETECTORS = ("msp", "mds")
#: the robust run's bootstrap resamples (fewer than the default 2,000: verify re-runs each as a loop)
RESAMPLES = 500


def _config(data_root, out, **overrides):
    cfg = thaw(load_config("cifar10_resnet20")[0])
    cfg["data"]["ood"] = cfg["data"]["ood"][:2]  # tin (near), mnist (far)
    cfg["data"]["fit_limit"] = 200  # MDS and every attack's calibration: 20 rows a class
    cfg["attack_params"] = {"pgd": {"steps": 10}, "robust_id": {"steps": 20}, "robust_ood": {"steps": 20}}
    return apply_overrides(cfg, data_root=str(data_root), out=str(out), **{
        "limit": 16, "attack": "pgd", "detectors": ",".join(DETECTORS), "evaluator": "ood,robust_auroc",
        "ci_resamples": RESAMPLES, **overrides})


@pytest.fixture(scope="module")
def robust_run(data_root, session_cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("robust")
    ctx = run(_config(data_root, out), progress=False)
    return ctx, out


# ------------------------------------------------------------------------------------------------ the metric

#: (clean ID, clean OOD, attacked ID, attacked OOD) -> clean, ID-attacked, OOD-attacked, robust AUROC (%), by hand:
#: AUROC = share of (ID, OOD) pairs with conf_id > conf_ood, ties counting one half
HAND = [
    ([3, 4], [1, 2], [3, 4], [1, 2], (100, 100, 100, 100)),
    ([3, 4], [1, 2], [0.5, 4], [1, 2], (100, 50, 100, 50)),
    ([3, 4], [1, 2], [1, 1], [3, 5], (100, 25, 37.5, 0)),
    ([3, 4], [1, 2], [2, 4], [2, 2], (100, 87.5, 100, 75)),
]


@pytest.mark.parametrize("clean_id, clean_ood, adv_id, adv_ood, want", HAND)
def test_robust_metrics_match_hand_computed_aurocs(clean_id, clean_ood, adv_id, adv_ood, want):
    got = robust_metrics(np.array(clean_id, float), np.array(clean_ood, float), np.array(adv_id, float),
                         np.array(adv_ood, float))
    assert [got[k] for k in ("clean_auroc", "id_attacked_auroc", "ood_attacked_auroc", "robust_auroc")] == \
        pytest.approx(want)
    assert oracle.auroc(np.array(adv_id, float), np.array(adv_ood, float)) == pytest.approx(want[3])


def test_robust_fpr95_is_openoods_first_point_reaching_95_percent_tpr():
    """20 OOD scores 0..19 and ID scores 10.5..29.5: the first threshold flagging 19 of 20 OOD (TPR 95 %) is
    conf <= 18, which flags the ID scores 10.5..17.5, 8 of 20: FPR95 = 40 %."""
    conf_ood, conf_id = np.arange(20.0), np.arange(10.5, 30.0)
    assert robust_metrics(conf_id, conf_ood, conf_id, conf_ood)["robust_fpr95"] == pytest.approx(40.0)
    assert oracle.fpr95(conf_id, conf_ood) == pytest.approx(40.0)


# ------------------------------------------------------------------------------------------------- attacks

@pytest.fixture(scope="module")
def fit_set(pack_set):
    """200 fit rows: what MDS fits on (20 a class for a 64-dimensional feature) and each attack calibrates its
    detector's standardisation and 95 %-TPR threshold on (one pass a row, for every attack bound)."""
    return pack_set("cifar10_train", "cifar10_train_10k.npz", 200)


@pytest.fixture(scope="module")
def small_fit(pack_set):
    """64 fit rows: what a smoothed detector's attack calibrates on (4 noisy passes a row) where the number of rows
    does not matter to the test (Linf PGD and APGD follow the loss's sign and ordering, not its scale)."""
    return pack_set("cifar10_train", "cifar10_train_10k.npz", 64)


@pytest.mark.parametrize("name, steps", [("robust_id_msp", {"steps": 10}), ("robust_ood_msp", {"steps": 10}),
                                         ("robust_apgd_id_mds", {"n_iter": 10}), ("robust_apgd_ood_mds", {"n_iter": 10})])
def test_each_attack_moves_every_images_confidence_its_way_inside_the_ball(name, steps, cifar_model, fit_set,
                                                                            cifar_batch, pack_set):
    attack = bind_attack(build_attack(name, steps, input_size=32), cifar_model, fit_set, seed=0, batch_size=128,
                         device=CPU)
    if attack.source == "id":
        x, y = cifar_batch[0][:12], cifar_batch[1][:12]
    else:
        from advopenood.data.datasets import stack
        x, y = stack(pack_set("tin", "tin_test.npz", 12), list(range(12)))
    x_adv = attack(cifar_model, x, y, seed=1)
    assert float((x_adv - x).abs().amax()) <= 8 / 255 + 1e-6 and 0 <= float(x_adv.min()) and float(x_adv.max()) <= 1
    clean, adv = attack.detector_score(x).double(), attack.detector_score(x_adv).double()
    moved = (adv - clean) * attack.sign  # sign -1: ID side lowers, +1: OOD side raises
    assert bool((moved >= -1e-6).all()), "an attacked image must never be worse for the attacker than its clean self"
    assert float(moved.mean()) > 0.1 * float(clean.std())


def test_ood_side_success_means_the_detector_accepts_and_id_side_that_it_rejects(robust_run):
    ctx, out = robust_run
    for name in ("robust_id_msp", "robust_ood_msp-tin"):
        adv = ctx.adv_sets[name]
        attack = bind_attack(build_attack(adv.attack, adv.params), ctx.model, ctx.fit_set, seed=ctx.seed,
                             batch_size=64, device=CPU)
        conf = torch.cat([attack.detector_score(x) for x, _ in adv.iter_batches(64)]).numpy()
        accepted = conf >= attack.target.threshold
        want = accepted if attack.sign > 0 else ~accepted
        np.testing.assert_array_equal(adv.records["success"].to_numpy(dtype=bool), want)


# ------------------------------------------------------------------------------------------- the evaluator


def test_run_writes_robust_auroc_and_the_joint_auroc_is_never_above_either_side(robust_run):
    _, out = robust_run
    table = pd.read_csv(out / "robust_auroc.csv")
    assert list(table.columns) == COLUMNS
    assert sorted(zip(table.detector, table.ood_set)) == sorted((d, s) for d in DETECTORS for s in ("tin", "mnist"))
    assert (table.n_id == 16).all() and (table.n_ood == 16).all() and (table.protocol == "strong").all()
    assert (table.robust_auroc <= table[["id_attacked_auroc", "ood_attacked_auroc"]].min(axis=1) + 1e-9).all()
    assert (table[["id_attacked_auroc", "ood_attacked_auroc"]].max(axis=1) <= table.clean_auroc + 1e-9).all()
    msp = table[table.detector == "msp"]
    assert (msp.robust_auroc < msp.clean_auroc - 40).all()


def test_rows_recompute_from_the_saved_scores(robust_run):
    """Every AUROC of the table from scores/<det>.npz with scikit-learn's roc_auc_score (OOD positive, -conf)."""
    _, out = robust_run
    for r in pd.read_csv(out / "robust_auroc.csv").to_dict("records"):
        with np.load(out / "scores" / f"{r['detector']}.npz") as s:
            sides = {"clean": (s["id"], s[r["ood_set"]]), "id_attacked": (s[r["id_attack"]], s[r["ood_set"]]),
                     "ood_attacked": (s["id"], s[r["ood_attack"]]), "robust": (s[r["id_attack"]], s[r["ood_attack"]])}
        for column, (conf_id, conf_ood) in sides.items():
            label = np.r_[np.zeros(len(conf_id)), np.ones(len(conf_ood))]
            want = 100 * roc_auc_score(label, -np.r_[conf_id, conf_ood])
            assert r[f"{column}_auroc"] == pytest.approx(want, abs=1e-4), (r["detector"], r["ood_set"], column)


def test_every_metric_has_a_paired_interval_around_it(robust_run):
    """Bootstrap bounds around each value; with the same ID and OOD draws for the robust and the ID-attacked AUROC,
    an attacked OOD image never below its clean twin keeps their order in each bound. The clean and attacked-OOD
    AUROCs are ood.csv's cells, with ood.csv's intervals (one cell, one interval)."""
    _, out = robust_run
    table = pd.read_csv(out / "robust_auroc.csv")
    assert (table.ci.str.split(";").str[0] == f"bootstrap-{RESAMPLES}").all() and table.error.isna().all()
    for metric in ROBUST_METRICS:
        lo, value, hi = table[f"{metric}_lo"], table[metric], table[f"{metric}_hi"]
        assert ((lo <= value + 1e-9) & (value <= hi + 1e-9)).all(), metric
    # the order holds for the paired percentiles; a bound that took the score interval (named in ci) is another method
    both = table[~table.ci.str.contains("robust_auroc |id_attacked_auroc ", regex=True)]
    for end in ("lo", "hi"):
        assert (both[f"robust_auroc_{end}"] <= both[f"id_attacked_auroc_{end}"] + 1e-9).all()
    ood = pd.read_csv(out / "ood.csv").set_index(["detector", "ood_set"])
    for r in table.to_dict("records"):
        for metric, where in (("clean_auroc", r["ood_set"]), ("ood_attacked_auroc", r["ood_attack"])):
            cell = ood.loc[(r["detector"], where)]
            assert (r[f"{metric}_lo"], r[f"{metric}_hi"]) == (cell["auroc_lo"], cell["auroc_hi"]), (metric, r)


def test_an_attacked_image_moves_with_its_clean_twin():
    """An attack that moves nothing: drawn in pairs, every AUROC's interval is the clean one exactly; the same cells
    resampled independently (a generator each, as unpaired cells of ood.csv are) give other intervals."""
    rng = np.random.default_rng(0)
    clean_id, clean_ood = rng.normal(1, 1, 16), rng.normal(0, 1, 16)
    policy = IntervalPolicy("bootstrap", 2000, 0)
    paired, reason = robust_intervals(clean_id, clean_ood, clean_id, clean_ood, policy, "k")
    assert reason == ""
    unpaired = {m: metric_intervals(clean_id, clean_ood, "bootstrap", 0, f"k|{m}", 2000)[0]
                for m in ("clean_auroc", "id_attacked_auroc", "ood_attacked_auroc", "robust_auroc")}
    for metric in unpaired:
        assert (paired[f"{metric}_lo"], paired[f"{metric}_hi"]) == (paired["clean_auroc_lo"], paired["clean_auroc_hi"])
    assert len({(b["auroc_lo"], b["auroc_hi"]) for b in unpaired.values()}) > 1


@pytest.mark.parametrize("sizes, reason", [((16, 16, 15, 16), "not paired"), ((1, 16, 1, 16), "at least 2")])
def test_a_row_without_an_interval_says_why(sizes, reason):
    arrays = [np.linspace(0, 1, n) for n in sizes]
    bounds, why = robust_intervals(*arrays, IntervalPolicy("bootstrap", 200, 0), "k")
    assert reason in why and all(np.isnan(v) for k, v in bounds.items() if k != "ci")


@pytest.mark.parametrize("method", ["none", "delong"])
def test_ci_none_leaves_the_bounds_empty_and_delong_gives_delongs_aurocs(robust_run, data_root, tmp_path, method):
    ctx, _ = robust_run
    out = tmp_path / method
    run(_config(data_root, out, ci=method), progress=False)
    table = pd.read_csv(out / "robust_auroc.csv")
    assert (table.ci.str.split(";").str[0] == method).all()
    assert table[["robust_fpr95_lo", "robust_fpr95_hi"]].isna().all().all()
    for r in table.to_dict("records"):
        with np.load(out / "scores" / f"{r['detector']}.npz") as s:
            conf_id, conf_ood = s[r["id_attack"]], s[r["ood_attack"]]
        want = [100 * b for b in auroc_interval(conf_id, conf_ood)] if method == "delong" else [np.nan, np.nan]
        if method == "delong":  # at a bound (DeLong's variance 0) the score interval instead, named in ci
            want = list(bound_rule("robust_auroc", r["robust_auroc"], *want, len(conf_id), len(conf_ood))[:2])
        np.testing.assert_allclose([r["robust_auroc_lo"], r["robust_auroc_hi"]], want, atol=1e-4)
    assert main(["verify", str(out)]) == 0


def test_id_side_sets_are_id_negatives_not_ood_positives(robust_run):
    """The ID images pushed to look OOD are no adversarial examples to detect: ood.csv, the leaderboard's means
    and the detection evaluators (id_adv_sets) leave them out; the OOD side stays an OOD->ID row."""
    ctx, out = robust_run
    ood = pd.read_csv(out / "ood.csv")
    assert not ood.attack.str.startswith("robust_id_").any()
    assert {"robust_ood_msp-tin", "robust_ood_mds-mnist"} <= set(ood.attack)
    assert set(ctx.id_adv_sets) == {"pgd"} and "robust_id_msp" not in ctx.positive_sets
    board = pd.read_csv(out / "leaderboard.csv")
    assert (board.n_adv == 1 + 2).all()  # pgd and the detector's own two OOD-side sets (the other's are transfer)
    assert all(set(s.split(",")) == {"pgd", f"robust_ood_{d}-tin", f"robust_ood_{d}-mnist"}
               for d, s in zip(board.detector, board.adv_sets))
    plotted = with_positives(ctx)["msp"]  # the ROC curves of plots/roc_msp.png
    assert "robust_id_msp" not in plotted and "robust_id_msp.positive" not in plotted
    assert "robust_ood_msp-tin.positive" in plotted


def test_evaluator_adds_its_sets_once_per_detector_method_and_ood_set(data_root, tmp_path):
    cfg = _config(data_root, tmp_path, attack="pgd,robust_id_msp", eps="4/255")
    specs = {s.set_name: s for s in expand_attacks(cfg, 32)}
    assert list(specs) == ["pgd", "robust_id_msp", "robust_ood_msp-tin", "robust_ood_msp-mnist", "robust_id_mds",
                           "robust_ood_mds-tin", "robust_ood_mds-mnist"]
    assert {s.params["eps"] for s in specs.values()} == {4 / 255}  # the run's --eps
    assert specs["robust_ood_mds-mnist"].params["ood_set"] == "mnist"
    assert specs["robust_id_mds"].params["steps"] == 20  # attack_params of the family
    both = cfg.replace(evaluator_params={"robust_auroc": {"method": ["pgd", "apgd"], "ood_sets": ["tin"]}})
    names = [s.set_name for s in expand_attacks(both, 32)]
    assert names[-4:] == ["robust_apgd_id_msp", "robust_apgd_ood_msp-tin", "robust_apgd_id_mds",
                          "robust_apgd_ood_mds-tin"]
    with pytest.raises(UsageError, match="ood_sets 'svhn' is not a natural OOD set"):
        expand_attacks(cfg.replace(evaluator_params={"robust_auroc": {"ood_sets": ["svhn"]}}), 32)
    with pytest.raises(UsageError, match="method 'fgsm'; valid choices: pgd, apgd"):
        registry.create("evaluators", "robust_auroc", method="fgsm")
    assert registry.create("evaluators", "robust_auroc", method=["pgd", "apgd"], eps=[4 / 255, 8 / 255])
    with pytest.raises(UsageError, match="eps 2.0; valid choices"):
        registry.create("evaluators", "robust_auroc", eps=2.0)


#: robust_auroc's settings for a randomised detector -> the sets it adds for msp and smoothed_msp (one OOD set)
FAMILIES = [
    ({}, ["robust_id_msp", "robust_ood_msp-tin", "robust_id_eot_smoothed_msp", "robust_ood_eot_smoothed_msp-tin"]),
    ({"randomised_attacks": "plain"}, ["robust_id_msp", "robust_ood_msp-tin", "robust_id_smoothed_msp",
                                       "robust_ood_smoothed_msp-tin"]),
    ({"randomised_attacks": "both", "method": "apgd", "eot": 3},
     ["robust_apgd_id_msp", "robust_apgd_ood_msp-tin", "robust_apgd_id_smoothed_msp",
      "robust_apgd_ood_smoothed_msp-tin", "robust_apgd_id_eot_smoothed_msp", "robust_apgd_ood_eot_smoothed_msp-tin"]),
]


@pytest.mark.parametrize("params, names", FAMILIES)
def test_a_randomised_detector_gets_the_eot_attacks_by_default(data_root, tmp_path, params, names):
    """Issue 31: the EOT twins of the robust attacks for a randomised detector (declared capability) by default, the
    plain ones on request; an EOT set takes the plain attacks' attack_params and the evaluator's number of draws."""
    cfg = _config(data_root, tmp_path, detectors="msp,smoothed_msp").replace(
        evaluator_params={"robust_auroc": {"ood_sets": ["tin"], **params}})
    specs = {s.set_name: s for s in expand_attacks(cfg, 32)}
    assert list(specs) == ["pgd", *names]
    for name in names:
        assert specs[name].params.get("eot") == (params.get("eot") if "_eot_" in name else None)
    if not params:
        assert specs["robust_id_eot_smoothed_msp"].params["steps"] == 20  # attack_params.robust_id


@pytest.mark.parametrize("params, match", [({"randomised_attacks": "sometimes"}, "randomised_attacks 'sometimes'"),
                                           ({"eot": 0}, "eot 0"), ({"eot": True}, "eot True")])
def test_bad_randomised_settings_are_refused(params, match):
    with pytest.raises(UsageError, match=match):
        registry.create("evaluators", "robust_auroc", **params)


@pytest.mark.parametrize("method, steps", [("pgd", {"steps": 5}), ("apgd", {"n_iter": 5})])
def test_eot_robust_auroc_is_at_most_the_plain_ones_on_a_smoothed_detector(method, steps, cifar_model, small_fit,
                                                                            cifar_batch, pack_set):
    """Issue 31, finding 2: on smoothed_msp (16 ID, 16 texture images, 8/255, same steps and start), both sides
    attacked with EOT gradients give a robust AUROC no higher than the plain attacks' noise-free gradient, both
    scored with the evaluation noise (independent of the attacks' draws)."""
    from advopenood.data.datasets import stack
    from advopenood.detection.scoring import fit_detectors

    params = {"smoothed_msp": {"n": 4, "sigma": 0.05}}
    det = fit_detectors(["smoothed_msp"], "pytorch-ood", cifar_model, small_fit, batch_size=128, device=CPU, seed=0,
                        params=params, progress=False).dets["smoothed_msp"]
    sides = {"id": (cifar_batch[0][:16], cifar_batch[1][:16]),
             "ood": stack(pack_set("textures", "texture_test.npz", 16), list(range(16)))}
    prefix = "robust_" if method == "pgd" else "robust_apgd_"
    with torch.no_grad():
        clean = {side: det.score(cifar_model, x, None).numpy() for side, (x, _) in sides.items()}
    robust = {}
    for family in ("", "eot_"):
        attacked = {}
        for side, (x, y) in sides.items():
            attack = bind_attack(build_attack(f"{prefix}{side}_{family}smoothed_msp", steps, input_size=32),
                                 cifar_model, small_fit, seed=0, batch_size=128, device=CPU, detector_params=params)
            torch.manual_seed(0)
            x_adv = attack.perturb(cifar_model, x, y)
            assert float((x_adv - x).abs().amax()) <= 8 / 255 + 1e-6
            with torch.no_grad():
                attacked[side] = det.score(cifar_model, x_adv, None).numpy()
        robust[family or "plain"] = 100 * roc_auc_score(np.r_[np.zeros(16), np.ones(16)],
                                                        -np.r_[attacked["id"], attacked["ood"]])
    clean_auroc = 100 * roc_auc_score(np.r_[np.zeros(16), np.ones(16)], -np.r_[clean["id"], clean["ood"]])
    print(method, clean_auroc, robust)
    assert robust["eot_"] <= robust["plain"] < clean_auroc - 40


# ---------------------------------------------------------------------------------------------- verify hook

def test_an_untouched_run_verifies(robust_run, capsys):
    _, out = robust_run
    assert verify_robust(RunFiles.open(out)) == []
    assert main(["verify", str(out)]) == 0
    assert "0 difference(s)" in capsys.readouterr().out


def test_verify_rerenders_the_robust_section(robust_run, tmp_path):
    """Issue 49, item 2: a sentence added to the robust AUROC section passed, the section taken as saved; verify
    renders it again from robust_auroc.csv and robust_paired.csv."""
    assert_section_rerendered(robust_run[1], tmp_path, "Robust AUROC (ID and OOD attacked)")


@pytest.mark.parametrize("column, change", [("robust_auroc", 0.5), ("clean_auroc", -1e-3), ("robust_fpr95", -6.25),
                                            ("n_ood", -1), ("robust_auroc_lo", -0.5), ("ood_attacked_auroc_hi", 1e-3),
                                            ("robust_fpr95_hi", -1.0)])
def test_one_changed_number_is_one_difference(robust_run, tmp_path, column, change):
    _, out = robust_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    table = pd.read_csv(copy / "robust_auroc.csv")
    table[column] = table[column].astype(type(change))
    table.loc[1, column] = table.loc[1, column] + change
    table.to_csv(copy / "robust_auroc.csv", index=False, float_format="%.6g")
    lines = verify_robust(RunFiles.open(copy))
    assert len(lines) == 1 and column in lines[0] and table.loc[1, "detector"] in lines[0]


def test_an_edited_lower_bound_fails_verify(robust_run, tmp_path, capsys):
    _, out = robust_run
    copy = edited_copy(out, tmp_path, "robust_auroc.csv", "robust_auroc_lo")
    assert main(["verify", str(copy)]) == 1
    assert "robust_auroc_lo" in capsys.readouterr().out


def test_a_changed_robust_field_of_a_leaderboard_entry_is_a_difference(robust_run, tmp_path):
    _, out = robust_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    entries = json.loads((copy / "leaderboard_openood.json").read_text())
    entries[0]["Far-OOD_Robust_AUROC"] = "99.99"
    (copy / "leaderboard_openood.json").write_text(json.dumps(entries))
    lines = verify_robust(RunFiles.open(copy))
    assert len(lines) == 1 and "Far-OOD_Robust_AUROC" in lines[0] and "'99.99'" in lines[0]


def test_a_missing_row_is_a_difference(robust_run, tmp_path):
    _, out = robust_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    pd.read_csv(copy / "robust_auroc.csv").iloc[1:].to_csv(copy / "robust_auroc.csv", index=False)
    lines = verify_robust(RunFiles.open(copy))
    assert len(lines) == 1 and "is missing" in lines[0]


# ------------------------------------------------------------------------------------ paired differences

def test_robust_paired_holds_each_pair_with_the_difference_of_its_rows(robust_run):
    _, out = robust_run
    robust, paired = pd.read_csv(out / "robust_auroc.csv"), pd.read_csv(out / "robust_paired.csv")
    groups = robust.groupby(["ood_set", "eps", "method"]).ngroups
    assert len(paired) == groups and set(zip(paired.detector_a, paired.detector_b)) == {("mds", "msp")}
    for r in paired.to_dict("records"):
        mine = robust[(robust.ood_set == r["ood_set"]) & (robust.method == r["method"])].set_index("detector")
        assert r["robust_auroc_a"] == pytest.approx(mine.loc["mds", "robust_auroc"], abs=1e-4)
        assert r["delta_robust_auroc"] == pytest.approx(r["robust_auroc_a"] - r["robust_auroc_b"], abs=1e-4)
        assert r["delta_robust_auroc_lo"] <= r["delta_robust_auroc_hi"]
        assert r["ci"] in (f"bootstrap-{RESAMPLES}", f"bootstrap-{RESAMPLES}; at a bound: delta_robust_auroc mover")
        assert r["delta_robust_auroc_lo"] < r["delta_robust_auroc_hi"]  # never one point
        assert r["significant"] == (r["delta_robust_auroc_lo"] > 0 or r["delta_robust_auroc_hi"] < 0)


def test_the_robust_table_is_a_product_computed_once_per_run_for_its_own_scores_and_plan(robust_run, monkeypatch):
    """The run's :class:`Products` computes the table once, each reader gets a copy of its own; another context
    (other scores, another plan) is another run's product."""
    import dataclasses

    from advopenood.config.schema import CISection
    from advopenood.evaluation.products import Products
    from advopenood_plugins.evaluators.robust_auroc.plugin import robust_table
    from advopenood.evaluation import shared as kit_robust  # the robust table's home (re-exported by the kit)
    from advopenood_plugins.kit.robust import ROBUST_TABLE

    ctx, out = robust_run
    calls = []
    real = kit_robust.robust_pairs
    monkeypatch.setattr(kit_robust, "robust_pairs", lambda c: calls.append(c) or real(c))
    products = Products(ctx)
    first, again = (products.supply([ROBUST_TABLE])[ROBUST_TABLE] for _ in range(2))
    assert len(calls) == 1 and first is not again and first.equals(again)
    written = pd.read_csv(out / "robust_auroc.csv")
    assert np.allclose(first["robust_auroc"], written[written["method"] != "ensemble"]["robust_auroc"], atol=1e-4)
    first["robust_auroc"] = -1.0  # one reader's change never reaches the next
    assert products.supply([ROBUST_TABLE])[ROBUST_TABLE].equals(again) and len(calls) == 1
    flipped = {d: {n: -a for n, a in s.items()} for d, s in ctx.scores.items()}
    other = Products(dataclasses.replace(ctx, scores=flipped)).get(ROBUST_TABLE)
    assert np.allclose(other["robust_auroc"], 100 - again["robust_auroc"])
    plan = ctx.plan.model_copy(update={"ci": CISection(method="none")})
    assert Products(dataclasses.replace(ctx, plan=plan)).get(ROBUST_TABLE)["robust_auroc_lo"].isna().all()
    assert robust_table(ctx).equals(again)  # called directly: computed for the context given


def test_the_paired_bootstrap_resamples_both_detectors_on_the_same_images(robust_run):
    from advopenood.evaluation.intervals import generator
    from advopenood_plugins.evaluators.robust_auroc.paired import paired_key

    ctx, out = robust_run
    r = pd.read_csv(out / "robust_paired.csv").iloc[0]
    robust = pd.read_csv(out / "robust_auroc.csv")
    rows = robust[(robust.ood_set == r.ood_set) & (robust.method == r.method)].set_index("detector")
    cells = {d: (ctx.scores[d][rows.loc[d, "id_attack"]], ctx.scores[d][rows.loc[d, "ood_attack"]]) for d in DETECTORS}
    n, m = len(cells["msp"][0]), len(cells["msp"][1])
    rng = generator(ctx.seed, paired_key(r.ood_set, r.eps, r.method))  # the documented draws: ID first, then OOD
    idx_id, idx_ood = rng.integers(0, n, (RESAMPLES, n)), rng.integers(0, m, (RESAMPLES, m))
    auc = {d: np.array([100 * roc_auc_score(np.r_[np.zeros(n), np.ones(m)], -np.r_[c[0][i], c[1][j]])
                        for i, j in zip(idx_id, idx_ood)]) for d, c in cells.items()}
    lo, hi = np.percentile(auc["mds"] - auc["msp"], [2.5, 97.5])
    if hi - lo <= 1e-6:  # every resample the same difference: the square-and-add interval of the two score intervals
        from advopenood.evaluation.intervals import auroc_score_interval

        a, b = (100 * roc_auc_score(np.r_[np.zeros(n), np.ones(m)], -np.r_[cells[d]]) for d in ("mds", "msp"))
        (la, ua), (lb, ub) = auroc_score_interval(a, n, m), auroc_score_interval(b, n, m)
        lo, hi = a - b - np.hypot(a - la, ub - b), a - b + np.hypot(ua - a, b - lb)
        assert r.ci == f"bootstrap-{RESAMPLES}; at a bound: delta_robust_auroc mover"
    assert (r.delta_robust_auroc_lo, r.delta_robust_auroc_hi) == pytest.approx((lo, hi), abs=1e-3)


@pytest.mark.parametrize("column, change", [("delta_robust_auroc", 0.5), ("delta_robust_auroc_hi", -0.5),
                                            ("robust_auroc_b", 1e-3)])
def test_a_changed_paired_number_is_one_difference(robust_run, tmp_path, column, change):
    _, out = robust_run
    copy = edited_copy(out, tmp_path, "robust_paired.csv", column, change)
    lines = verify_robust(RunFiles.open(copy))
    assert len(lines) == 1 and column in lines[0] and "robust_paired.csv" in lines[0]


# ------------------------------------------------------------------------------------- OpenOOD leaderboard

#: the fields of an entry of OpenOOD's leaderboard (branch ``leaderboard``, model_info/cifar10/*.json at f969dfa)
OPENOOD_FIELDS = ["Training", "Postprocessor", "Near-OOD_AUROC", "Far-OOD_AUROC", "ID_Accuracy", "Outlier_Data", "Arch",
                  "Additional_Description", "ID_Accuracy_Mean", "Near-OOD_AUROC_Mean", "Far-OOD_AUROC_Mean", "Rank"]


def test_leaderboard_entries_follow_openoods_schema_with_our_fields(robust_run):
    ctx, out = robust_run
    entries = json.loads((out / "leaderboard_openood.json").read_text())
    board = pd.read_csv(out / "leaderboard.csv").set_index("detector")
    robust = pd.read_csv(out / "robust_auroc.csv")
    assert len(entries) == len(board)
    for entry in entries:
        assert list(entry)[:len(OPENOOD_FIELDS)] == OPENOOD_FIELDS
        det = entry["advopenood"]["detector"]
        assert entry["Postprocessor"].endswith(f">{det.upper()}</a>") and entry["Arch"] == "ResNet20"
        assert entry["Near-OOD_AUROC"] == entry["Near-OOD_AUROC_Mean"] == f"{board.loc[det, 'near_auroc']:.2f}"
        assert entry["Far-OOD_AUROC"] == f"{board.loc[det, 'far_auroc']:.2f}"
        assert entry["ID_Accuracy"] == f"{board.loc[det, 'id_acc']:.2f}"
        assert entry["Adversarial_AUROC"] == f"{board.loc[det, 'adv_auroc']:.2f}"
        rows = robust[robust.detector == det].set_index("ood_set")
        assert entry["Near-OOD_Robust_AUROC"] == f"{rows.loc['tin', 'robust_auroc']:.2f}"  # the one near set
        assert entry["Far-OOD_Robust_FPR95"] == f"{rows.loc['mnist', 'robust_fpr95']:.2f}"  # the one far set
        assert entry["Robust_Eps"] == "8/255" and entry["Robust_Method"] == "pgd"
        prov = entry["advopenood"]
        assert prov["protocol"] == "strong" and prov["seed"] == 0
        assert {k: v["key"] for k, v in prov["attacks"].items()} == {k: a.key for k, a in ctx.adv_sets.items()}
        assert prov["model_info_path"].startswith("model_info/cifar10/unknown_")
    for entry in entries:  # Rank..Rank_Worst: leaderboard.csv's Holm range, never a point-estimate ordering
        row = board.loc[entry["advopenood"]["detector"]]
        assert [entry["Rank"], entry["Rank_Worst"]] == ["/" if pd.isna(row[c]) else int(row[c])
                                                        for c in ("near_auroc_rank", "near_auroc_rank_worst")]
    assert len(ctx.clean.y) < MIN_CONCLUSIVE  # too few ID images for any rank: none, and the reason
    assert {e["Rank"] for e in entries} == {"/"}
    assert {e["Rank_Rule"] for e in entries} == {
        f"no rank: {len(ctx.clean.y)} ID images, fewer than min_conclusive ({MIN_CONCLUSIVE})"}


# ------------------------------------------------------------------------------ binarization test, detector variant

@pytest.fixture(scope="module")
def bintest_samples(cifar_model, cifar_batch):
    x, y = cifar_batch
    with torch.no_grad():
        correct = np.nonzero((cifar_model(x).argmax(1) == y).numpy())[0][:3]
    return x[correct], y[correct], correct


@pytest.mark.parametrize("name, params, passes", [
    ("robust_id_msp", {"steps": 20}, True),
    ("robust_ood_msp", {"steps": 20}, True),
    ("robust_id_msp", {"steps": 3, "rel_stepsize": 0.01}, False),  # 3 steps of 1 % of eps: cannot reach the corner
])
def test_binarization_detector_variant_runs_the_robust_attacks(name, params, passes, cifar_model, fit_set,
                                                               bintest_samples):
    """Both tests run the attack's own optimiser and detector term (its test forms); a weakened one fails."""
    x, y, rows = bintest_samples
    attack = bind_attack(build_attack(name, params, input_size=32), cifar_model, fit_set, seed=0, batch_size=128,
                         device=CPU)
    summary, samples = bt.run_bintest(cifar_model, x, y, attack, n_inner=99, n_random=50, seed=0, indices=rows,
                                      detector=attack.detector_score)
    assert summary["test"] == "detector" and set(samples.test) == {"regular", "inverted"}
    assert bool(summary["passed"]) == passes
    hit = samples[samples.attack_success.astype("boolean").fillna(False).astype(bool)]
    assert not hit[hit.test == "regular"].detected_adv.astype(bool).any()
    assert hit[hit.test == "inverted"].detected_adv.astype(bool).all()


# ------------------------------------------------------------------------------- the report leads (issue 50)

def test_a_robust_runs_report_opens_on_the_robust_table(robust_run):
    """Issue 50, item 1: with ``--evaluator ood,robust_auroc`` the first section is robust_auroc's headline (per
    detector and OOD set: both sides, ID side, OOD side, clean, each with its interval, masking, budget), before
    ood's AUROC table; run.json names the lead; What ran groups the sets by family."""
    _, out = robust_run
    info = json.loads((out / "run.json").read_text())
    assert info["lead"] == {"evaluator": "robust_auroc", "section": "Robust AUROC per detector and OOD set"}
    report = (out / "report.md").read_text()
    heads = [line for line in report.splitlines() if line.startswith("## ")]
    assert heads[:2] == ["## Robust AUROC per detector and OOD set", "## AUROC per detector and set"], heads
    lead = report.split("## Robust AUROC per detector and OOD set", 1)[1].split("\n## ", 1)[0]
    header = next(line for line in lead.splitlines() if line.startswith("| detector"))
    assert header == ("| detector | OOD set | eps (Linf) | attacks | robust (both sides) | ID side attacked "
                      "| OOD side attacked | clean | masking suspected | budget |")
    table = pd.read_csv(out / "robust_auroc.csv")
    rows = [line for line in lead.splitlines() if line.startswith("| MSP | tin |")]
    r = table[(table["detector"] == "msp") & (table["ood_set"] == "tin")].iloc[0]
    assert len(rows) == 1 and f"| {r['robust_auroc']:.1f} [{r['robust_auroc_lo']:.1f}, {r['robust_auroc_hi']:.1f}] |" \
        in rows[0] and f"| {r['clean_auroc']:.1f} [{r['clean_auroc_lo']:.1f}, " in rows[0] and "20 steps" in rows[0]
    ran = next(line for line in report.splitlines() if line.startswith("What ran"))
    assert "robust_id_<detector> (2 sets) and robust_ood_<detector> (4 sets) at eps 8/255" in ran, ran
    assert report.index("Too few images to conclude") < report.index("## Robust AUROC per detector")


def test_sets_aimed_at_another_detector_are_a_transfer_table_not_a_rank(robust_run):
    """Issue 50, item 1: robust_ood_msp-* in MDS's row is a transfer result: out of the headline's ranks and MDS's
    adversarial mean, in a table of its own; ood.csv names the detector each set is aimed at."""
    _, out = robust_run
    ood = pd.read_csv(out / "ood.csv")
    aimed = dict(zip(ood["ood_set"], ood["aimed_at"].fillna("")))
    assert aimed["robust_ood_msp-tin"] == "msp" and aimed["pgd"] == "" and aimed["tin"] == ""
    report = (out / "report.md").read_text()
    head = report.split("## AUROC per detector and set", 1)[1].split("\n## ", 1)[0]
    mds = next(line for line in head.splitlines() if line.startswith("| MDS |")).split(" | ")
    columns = next(line for line in head.splitlines() if line.startswith("| detector |")).split(" | ")
    assert mds[columns.index("robust_ood_msp-tin")] == "transfer"
    own = mds[columns.index("robust_ood_mds-tin")]
    assert "#" not in own  # the aimed detector's own cell: shown, not ranked
    assert "On robust_ood_msp-tin" not in head and "On robust_ood_mds-tin" not in head
    transfer = report.split("## Transfer: sets attacked to break another detector", 1)[1].split("\n## ", 1)[0]
    cell = ood[(ood["detector"] == "mds") & (ood["ood_set"] == "robust_ood_msp-tin")].iloc[0]
    row = next(line for line in transfer.splitlines() if line.startswith("| MDS |"))
    assert f"{cell['auroc']:.1f} [{cell['auroc_lo']:.1f}, {cell['auroc_hi']:.1f}]" in row and "own" in row
    board = pd.read_csv(out / "leaderboard.csv").set_index("detector")
    mine = ood[(ood["detector"] == "mds") & (ood["group"] == "adversarial") & ood["aimed_at"].fillna("mds").eq("mds")]
    assert board.loc["mds", "n_adv"] == len(mine) == 3  # pgd and the two sets aimed at MDS; not the MSP ones
    assert board.loc["mds", "adv_auroc"] == pytest.approx(mine["auroc"].mean(), abs=1e-3)


def test_report_lead_picks_the_lead_and_one_naming_no_evaluator_is_refused(robust_run, data_root, tmp_path, capsys):
    """Issue 50, bad input: ``report.lead`` names the evaluator whose headline opens the report; one that names no
    evaluator of the run is exit 2 in one line, before any work."""
    import yaml

    cfg = thaw(_config(data_root, tmp_path / "o").dump())
    cfg["report"] = {"lead": "levels"}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["run", "--config", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "report.lead" in err and "'levels' is not an evaluator of this run" in err \
        and "valid choices: ood, robust_auroc" in err, err
    assert not (tmp_path / "o").exists()
    from advopenood.run.report import lead

    chosen = apply_overrides(cfg | {"report": {"lead": "ood"}}, out=str(tmp_path / "o2"))
    assert lead(chosen) == {"evaluator": "ood", "section": "AUROC per detector and set"}
    assert lead(_config(data_root, tmp_path / "o3"))["evaluator"] == "robust_auroc"


def test_names_are_spelled_one_way_in_sentences_tables_and_latex(robust_run):
    """Issue 50, item 7: a set keeps its declared name (``tin``, never ``TIN``) and a detector its display name
    (``MSP``, never ``msp``) in report.md's sentences and tables and in tables.tex alike."""
    import re as regex

    _, out = robust_run
    report, latex = (out / "report.md").read_text(), (out / "tables.tex").read_text()
    for text in (report, latex):
        assert not regex.search(r"\bTIN\b|\bMNIST\b", text)
    assert "On tin:" in report and "| tin |" in report
    rows = [line for line in report.splitlines() if line.startswith("| ")]
    assert not any(regex.search(r"\| (msp|mds) \|", line) for line in rows)
    assert regex.search(r"^MSP &", latex, regex.M) and not regex.search(r"^msp &", latex, regex.M)
