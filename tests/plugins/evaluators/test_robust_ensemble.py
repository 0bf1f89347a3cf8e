"""The robust AUROC's attack ensemble on the real CIFAR-10 ResNet-20 (issue 42): the per-image worst case over a
detector's attacks (``method`` ``ensemble``), ``robust_ensemble.csv``, ``ensemble: standard`` with its Square member
on the score, the gradient-masking flag on a detector built to mask its gradient, and their verify hook."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import assert_section_rerendered, edited_copy, pack_config, registered

from advopenood.cli.main import main
from advopenood.config.loading import apply_overrides, load_config
from advopenood.config.schema import thaw
from advopenood.errors import UsageError
from advopenood.run.pipeline import run
from advopenood_plugins.attacks.robust import ScoreSquare
from advopenood_plugins.detectors.logits import MSP
from advopenood_plugins.evaluators.robust_auroc.plugin import RobustAUROC
from advopenood_plugins.kit.attacks import Best

#: few steps and queries: the test is about the bookkeeping and the flag, not the attacks' strength
FAST = {**{f"robust_{s}": {"steps": 5} for s in ("id", "ood")},
        **{f"robust_{m}_{s}": {"n_iter": 5} for m in ("apgd", "apgd_aux") for s in ("id", "ood")}}
QUERIES = 40


class MaskedMSP(MSP):
    """MSP rounded to 1e-3: the same ranking up to ties, and a gradient that is zero everywhere (a step function),
    so every gradient attack stands still: a detector built to mask its gradient (test only)."""

    openood_name = None

    def score(self, net, x, out):
        return torch.round(torch.softmax(out.logits.float(), 1).amax(1) * 1000) / 1000

    grad_score = score


@pytest.fixture(scope="module", autouse=True)
def _masked():
    yield from registered({("detectors", "zzmasked"): MaskedMSP})


def _config(data_root, out, params, detectors="msp,zzmasked"):
    cfg = thaw(load_config("cifar10_resnet20")[0])
    cfg["data"]["ood"] = cfg["data"]["ood"][:1]  # tin
    cfg["data"]["fit_limit"] = 200
    cfg["attack_params"] = FAST
    cfg["evaluator_params"] = {"robust_auroc": params}
    return apply_overrides(cfg, data_root=str(data_root), out=str(out), limit=16, attack="fgsm",
                           detectors=detectors, evaluator="robust_auroc", ci_resamples=300)


@pytest.fixture(scope="module")
def ensemble_run(data_root, session_cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("ensemble")
    run(_config(data_root, out, {"method": ["pgd"], "ensemble": "standard", "square_queries": QUERIES}),
        progress=False)
    return out


def test_standard_ensemble_adds_apgd_the_second_objective_and_square_per_side(ensemble_run):
    sets = set(json.loads((ensemble_run / "run.json").read_text())["attacks"])
    for det in ("msp", "zzmasked"):
        for method in ("", "apgd_", "apgd_aux_", "square_"):
            assert {f"robust_{method}id_{det}", f"robust_{method}ood_{det}-tin"} <= sets
    params = json.loads((ensemble_run / "run.json").read_text())["attacks"]["robust_square_id_msp"]["params"]
    assert params["n_queries"] == QUERIES


def test_the_ensemble_is_at_most_every_single_attack_row_and_the_last_step(ensemble_run):
    table = pd.read_csv(ensemble_run / "robust_auroc.csv")
    steps = pd.read_csv(ensemble_run / "robust_ensemble.csv")
    for det in ("msp", "zzmasked"):
        mine = table[table["detector"] == det]
        ens = mine[mine["method"] == "ensemble"].iloc[0]
        singles = mine[mine["method"] != "ensemble"]
        assert set(singles["method"]) == {"pgd", "apgd", "apgd_aux", "square"}
        assert ens["robust_auroc"] <= singles["robust_auroc"].min() + 1e-9
        assert ens["robust_auroc_lo"] <= ens["robust_auroc"] <= ens["robust_auroc_hi"]
        path = steps[steps["detector"] == det].sort_values("step")
        assert list(path["attack"]) == ["none", "apgd", "apgd_aux", "pgd", "square"]
        assert path["robust_auroc"].iloc[0] == pytest.approx(ens["clean_auroc"], abs=1e-4)
        assert path["robust_auroc"].iloc[-1] == pytest.approx(ens["robust_auroc"], abs=1e-4)
        assert (np.diff(path["robust_auroc"].to_numpy()) <= 1e-9).all()  # adding an attack never helps the detector
        assert path["id_images_set"].iloc[1:].sum() > 0


def test_one_number_has_one_interval_across_the_ensemble_row_its_steps_and_the_single_rows(ensemble_run):
    """The clean AUROC carries ood.csv's interval in every row (single attacks, ensemble, step 0), and the last step
    is the ensemble row with the ensemble row's interval (0.2.0 gave each of them its own draws)."""
    table = pd.read_csv(ensemble_run / "robust_auroc.csv")
    steps = pd.read_csv(ensemble_run / "robust_ensemble.csv")
    for det in ("msp", "zzmasked"):
        mine = table[table["detector"] == det]
        assert mine[["clean_auroc_lo", "clean_auroc_hi"]].drop_duplicates().shape[0] == 1
        ens = mine[mine["method"] == "ensemble"].iloc[0]
        path = steps[steps["detector"] == det].sort_values("step")
        first, last = path.iloc[0], path.iloc[-1]
        assert (first["robust_auroc_lo"], first["robust_auroc_hi"]) == pytest.approx(
            (ens["clean_auroc_lo"], ens["clean_auroc_hi"]), abs=1e-6)
        assert (last["robust_auroc_lo"], last["robust_auroc_hi"]) == pytest.approx(
            (ens["robust_auroc_lo"], ens["robust_auroc_hi"]), abs=1e-6)


def test_masking_is_flagged_on_the_masked_detector_and_not_on_msp(ensemble_run):
    table = pd.read_csv(ensemble_run / "robust_auroc.csv")
    flags = table.groupby("detector")["masking_suspected"].agg(set)
    assert flags["zzmasked"] == {True} and flags["msp"] == {False}
    masked = table[table["detector"] == "zzmasked"].set_index("method")["robust_auroc"]
    assert masked["square"] < min(masked["pgd"], masked["apgd"])
    report = (ensemble_run / "report.md").read_text()
    assert "Gradient masking suspected on ZZMASKED" in report.replace("zzmasked", "ZZMASKED")
    assert "Gradient masking suspected on MSP" not in report and "robust_ensemble.png" in report


def test_verify_rerenders_the_ensemble_section(ensemble_run, tmp_path):
    """Issue 49, item 2: a sentence added to the ensemble's section passed, the section taken as saved; verify
    renders it again from robust_ensemble.csv and its plot."""
    assert_section_rerendered(ensemble_run, tmp_path, "Robust AUROC of the attack ensemble")


def test_the_ensemble_verifies_and_each_edit_is_one_difference(ensemble_run, tmp_path, capsys):
    assert main(["verify", str(ensemble_run)]) == 0
    row = int(pd.read_csv(ensemble_run / "robust_auroc.csv").query("method == 'ensemble'").index[0])
    for table, column, index in (("robust_auroc.csv", "robust_auroc", row),
                                 ("robust_auroc.csv", "robust_fpr95_hi", row),
                                 ("robust_ensemble.csv", "robust_auroc", 2),
                                 ("robust_ensemble.csv", "ood_images_set", 3)):
        copy = edited_copy(ensemble_run, tmp_path / f"{table}-{column}", table, column, 1.0, index)
        capsys.readouterr()
        assert main(["verify", str(copy)]) == 1
        said = capsys.readouterr()
        assert "1 difference(s)" in said.out + said.err, (table, column)


def test_a_flipped_masking_flag_is_a_difference(ensemble_run, tmp_path, capsys):
    copy = tmp_path / "run"
    import shutil

    shutil.copytree(ensemble_run, copy)
    frame = pd.read_csv(copy / "robust_auroc.csv")
    frame.loc[frame["detector"] == "msp", "masking_suspected"] = True
    frame.to_csv(copy / "robust_auroc.csv", index=False, float_format="%.6g")
    capsys.readouterr()
    assert main(["verify", str(copy)]) == 1
    said = capsys.readouterr()
    assert "masking_suspected" in said.out + said.err


def test_square_on_a_score_with_a_known_minimiser_gets_close_to_it():
    """The mean pixel value is minimised over the Linf ball by ``x - eps`` (inside [0, 1]): Square must go most of
    the way there, stay in the ball, and never end above the clean value."""
    torch.manual_seed(0)
    x, eps = torch.rand(2, 3, 32, 32) * 0.8 + 0.1, 8 / 255

    def objective(z):
        conf = z.mean((1, 2, 3))
        return -conf, torch.zeros(len(z), dtype=torch.bool), -conf, None

    best = Best(x)
    best.update(x, torch.zeros(2, dtype=torch.bool), -x.mean((1, 2, 3)))
    square = ScoreSquare(objective, best, norm="Linf", n_queries=300, eps=eps, p_init=0.8, seed=0,
                         resc_schedule=True, device=x.device)
    square.init_hyperparam(x)
    square.attack_single_run(x, torch.zeros(2, dtype=torch.long))
    drop = (x.mean((1, 2, 3)) - best.x.mean((1, 2, 3))) / eps  # 1.0 at the minimiser
    assert (drop > 0.45).all() and (drop <= 1.0 + 1e-6).all()
    assert (best.x - x).abs().max() <= eps + 1e-6


@pytest.mark.parametrize("queries", [0, -5, 2.5, "many", True])
def test_a_square_budget_that_is_not_a_positive_integer_is_refused(queries):
    with pytest.raises(UsageError, match="square_queries"):
        RobustAUROC(ensemble="standard", square_queries=queries)


def test_a_bad_square_budget_exits_2_in_one_line(data_root, tmp_path, capsys):
    config = pack_config(tmp_path / "cfg", data_root, {"evaluators": ["robust_auroc"],
                                                       "evaluator_params": {"robust_auroc": {"square_queries": 0}}})
    rc = main(["run", "--config", config, "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "square_queries 0" in err
    assert not (tmp_path / "o").exists()


def test_an_unknown_ensemble_is_refused():
    with pytest.raises(UsageError, match="ensemble 'everything'"):
        RobustAUROC(ensemble="everything")


def test_one_attack_per_side_is_nothing_to_combine_in_run_json_and_the_report(data_root, tmp_path):
    out = tmp_path / "run"
    run(_config(data_root, out, {"method": "pgd"}, detectors="msp"), progress=False)
    info = json.loads((out / "run.json").read_text())
    reason = info["nothing_computed"]["evaluator:robust_auroc:ensemble"]
    assert reason.startswith("no robust ensemble: one attack per side for msp (tin, eps 0.0313725)")
    report = (out / "report.md").read_text()
    assert "robust_auroc:ensemble: nothing to compute" in report and reason in report
    assert not (out / "robust_ensemble.csv").exists()
    assert "ensemble" not in set(pd.read_csv(out / "robust_auroc.csv")["method"])
    assert main(["verify", str(out)]) == 0


@pytest.mark.parametrize("queries", [0, -1])
def test_a_square_attack_with_a_bad_query_budget_is_refused(queries):
    from advopenood.attacks.base import build_attack

    with pytest.raises(UsageError, match=f"n_queries {queries}"):
        build_attack("robust_square_id_msp", {"n_queries": queries}, input_size=32)


@pytest.fixture(scope="module")
def fit_set(pack_set):
    return pack_set("cifar10_train", "cifar10_train_10k.npz", 1000)


@pytest.mark.parametrize("name, params", [("robust_apgd_aux_id_msp", {"n_iter": 5}),
                                          ("robust_apgd_aux_ood_msp", {"n_iter": 5}),
                                          ("robust_apgd_aux_id_mds", {"n_iter": 5}),  # feature distance
                                          ("robust_apgd_aux_ood_mds", {"n_iter": 5}),
                                          ("robust_square_id_mds", {"n_queries": 30}),
                                          ("robust_square_ood_msp", {"n_queries": 30})])
def test_each_new_member_moves_every_images_confidence_its_way_inside_the_ball(name, params, cifar_model, fit_set,
                                                                                cifar_batch, pack_set):
    """The second objective (logit margin for MSP, feature distance for MDS) and Square on the score: inside the
    ball, never worse for the attacker than the clean image, and on average a clear move the attacker's way."""
    from advopenood.attacks.base import build_attack
    from advopenood.capabilities import bind_attack
    from advopenood.data.datasets import stack

    attack = bind_attack(build_attack(name, params, input_size=32), cifar_model, fit_set, seed=0, batch_size=128,
                         device=torch.device("cpu"))
    if attack.source == "id":
        x, y = cifar_batch[0][:8], cifar_batch[1][:8]
    else:
        x, y = stack(pack_set("tin", "tin_test.npz", 8), list(range(8)))
    x_adv = attack(cifar_model, x, y, seed=1)
    assert float((x_adv - x).abs().amax()) <= 8 / 255 + 1e-6 and 0 <= float(x_adv.min()) and float(x_adv.max()) <= 1
    clean, adv = attack.detector_score(x).double(), attack.detector_score(x_adv).double()
    moved = (adv - clean) * attack.sign
    assert bool((moved >= -1e-6).all())
    assert float(moved.mean()) > 0.1 * float(clean.std())


def test_standard_ensemble_of_a_randomised_detector_has_eot_gradients_and_a_plain_square(data_root, tmp_path):
    """A randomised detector gets the EOT twins of the gradient members and Square without a twin (each query is
    scored with fresh noise); Square's default budget is 500 queries on a CPU and AutoAttack's 5,000 on a GPU."""
    from advopenood.config.plan import expand_attacks

    cfg = _config(data_root, tmp_path, {"ensemble": "standard"}, detectors="msp,smoothed_msp")
    specs = {s.set_name: s for s in expand_attacks(cfg, 32)}
    assert [n for n in specs if "smoothed_msp" in n] == [
        "robust_apgd_id_eot_smoothed_msp", "robust_apgd_ood_eot_smoothed_msp-tin",
        "robust_apgd_aux_id_eot_smoothed_msp", "robust_apgd_aux_ood_eot_smoothed_msp-tin",
        "robust_square_id_smoothed_msp", "robust_square_ood_smoothed_msp-tin"]
    assert "robust_id_msp" not in specs  # without `method`, the standard ensemble replaces the default PGD
    assert specs["robust_square_id_msp"].params["n_queries"] == 500
    gpu = {s.set_name: s for s in expand_attacks(cfg.replace(device="cuda"), 32)}
    assert gpu["robust_square_ood_msp-tin"].params["n_queries"] == 5000


def test_robust_paired_compares_the_detectors_ensembles_and_verify_rederives_them(ensemble_run, tmp_path, capsys):
    """The ensemble rows enter robust_paired.csv (each detector by its own per-image worst case), with the
    difference of the two ensemble rows' robust AUROCs, and an edit of such a row is one verify difference."""
    table = pd.read_csv(ensemble_run / "robust_auroc.csv")
    paired = pd.read_csv(ensemble_run / "robust_paired.csv")
    ens = paired[paired["method"] == "ensemble"]
    assert len(ens) == 1
    row = ens.iloc[0]
    robust = table[table["method"] == "ensemble"].set_index("detector")["robust_auroc"]
    assert row["robust_auroc_a"] == pytest.approx(robust[row["detector_a"]], abs=1e-6)
    assert row["robust_auroc_b"] == pytest.approx(robust[row["detector_b"]], abs=1e-6)
    assert row["delta_robust_auroc_lo"] <= row["delta_robust_auroc"] <= row["delta_robust_auroc_hi"]
    copy = edited_copy(ensemble_run, tmp_path / "paired", "robust_paired.csv", "delta_robust_auroc_lo", -99.0,
                       int(ens.index[0]))
    capsys.readouterr()
    assert main(["verify", str(copy)]) == 1
    said = capsys.readouterr()
    assert "1 difference(s)" in said.out + said.err and "robust_paired.csv" in said.out + said.err


def test_the_ensemble_run_verifies_in_a_fresh_process(ensemble_run):
    """``advopenood verify`` in a new process re-derives the ensemble rows, robust_ensemble.csv and robust_paired.csv's
    ensemble rows with nothing of the writing process loaded but the test's masked detector, registered as a third
    party would register it (a fresh process does not know it otherwise)."""
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    probe = (f"import sys; sys.path[:0] = [{str(here)!r}, {str(here.parents[1])!r}]\n"
             "from test_robust_ensemble import MaskedMSP\nfrom advopenood import registry\n"
             "registry.register('detectors', 'zzmasked')(MaskedMSP)\nfrom advopenood.cli.main import main\n"
             f"sys.exit(main(['verify', {str(ensemble_run)!r}]))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0 and "0 difference(s)" in done.stdout + done.stderr, done.stderr[-2000:]


@pytest.fixture(scope="module")
def randomised_run(data_root, session_cache, tmp_path_factory):
    """The standard ensemble on smoothed MSP (two noise copies: cheap, and noisy enough to choose wrongly on), and no
    ``method``; the ``ood`` evaluator writes the leaderboard."""
    out = tmp_path_factory.mktemp("randomised")
    cfg = _config(data_root, out, {"ensemble": "standard", "square_queries": 20, "eot": 2}, detectors="smoothed_msp")
    run(cfg.replace(detector_params={"smoothed_msp": {"n": 2, "sigma": 0.1}},
                    evaluators=("robust_auroc", "levels", "ood")), progress=False)
    return out


def test_the_leaderboards_robust_fields_are_the_ensemble_row_by_one_rule(randomised_run, tmp_path, capsys):
    """Issue 49, item 5: with ``ensemble: standard`` and no ``method`` the writer took APGD's rows and verify
    re-derived APGD-aux's (each the first of its own table's order): 2 differences on an untouched run. One rule
    (the ensemble row where there is one), applied by the writer and by verify to the re-derived rows."""
    (entry,) = json.loads((randomised_run / "leaderboard_openood.json").read_text())
    robust = pd.read_csv(randomised_run / "robust_auroc.csv")
    ensemble = robust[robust["method"] == "ensemble"]
    assert len(ensemble) == 1 and entry["Robust_Method"] == "ensemble" and entry["Robust_Eps"] == "8/255"
    assert entry["Near-OOD_Robust_AUROC"] == f"{ensemble['robust_auroc'].iloc[0]:.2f}"  # tin: near-OOD
    assert entry["Near-OOD_Robust_FPR95"] == f"{ensemble['robust_fpr95'].iloc[0]:.2f}"
    assert main(["verify", str(randomised_run)]) == 0
    copy = tmp_path / "run"
    shutil.copytree(randomised_run, copy)
    (copy / "leaderboard_openood.json").write_text(json.dumps([{**entry, "Robust_Method": "apgd"}]))
    capsys.readouterr()
    assert main(["verify", str(copy)]) == 1
    assert "leaderboard_openood.json: smoothed_msp Robust_Eps, Robust_Method: written ('8/255', 'apgd'), " \
           "re-derived ('8/255', 'ensemble')" in capsys.readouterr().out


def test_a_randomised_detectors_worst_case_chooses_on_attack_noise_and_scores_evaluation_noise(randomised_run):
    """Issue 48: each image's worst set is the one whose saved attack-stream confidence (``<set>.select``) is the
    worst; its value is that set's evaluation confidence. Re-derived here with numpy's argmin over the files."""
    from advopenood.evaluation.metrics import auroc

    arrays = dict(np.load(randomised_run / "scores" / "smoothed_msp.npz"))
    row = pd.read_csv(randomised_run / "robust_auroc.csv").query("method == 'ensemble'").iloc[0]
    sides = {"id": ["id", *row["id_attack"].split("+")], "ood": ["tin", *row["ood_attack"].split("+")]}
    worst = {}
    for side, names in sides.items():
        conf, by = (np.stack([arrays[n + suffix] for n in names]) for suffix in ("", ".select"))
        at = by.argmin(0) if side == "id" else by.argmax(0)
        worst[side] = conf[at, np.arange(conf.shape[1])]
        plain = conf.min(0) if side == "id" else conf.max(0)
        assert not np.array_equal(worst[side], plain)  # the old rule would have taken other values
    assert row["robust_auroc"] == pytest.approx(100 * auroc(worst["id"], worst["ood"]), abs=1e-4)


def test_verify_rederives_the_rule_and_catches_an_edited_randomised_cell(randomised_run, tmp_path, capsys):
    assert main(["verify", str(randomised_run)]) == 0
    row = int(pd.read_csv(randomised_run / "robust_auroc.csv").query("method == 'ensemble'").index[0])
    copy = edited_copy(randomised_run, tmp_path / "cell", "robust_auroc.csv", "robust_auroc", 1.0, row)
    capsys.readouterr()
    assert main(["verify", str(copy)]) == 1
    assert "robust_auroc.csv" in "".join(capsys.readouterr())
    # the selection confidences are part of the evidence: without them the rule cannot be re-derived
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(randomised_run, bare)
    arrays = dict(np.load(bare / "scores" / "smoothed_msp.npz"))
    np.savez(bare / "scores" / "smoothed_msp.npz", **{k: v for k, v in arrays.items() if k != "id.select"})
    capsys.readouterr()
    assert main(["verify", str(bare)]) == 1
    assert "no id.select" in "".join(capsys.readouterr())


def test_levels_choose_a_randomised_detectors_worst_pair_on_attack_noise(randomised_run):
    """The levels evaluator's worst robust pair of smoothed MSP is the pair whose attack-stream AUROC is the lowest
    (its ``<set>.select`` arrays; the ensemble row's per-image worst choice), and the row reports that pair's
    evaluation AUROC (issue 48: a worst case over separately scored sets never chooses on evaluation noise)."""
    from advopenood.evaluation.metrics import auroc

    arrays = dict(np.load(randomised_run / "scores" / "smoothed_msp.npz"))
    robust = pd.read_csv(randomised_run / "robust_auroc.csv")
    levels = pd.read_csv(randomised_run / "levels.csv").set_index("criterion")
    by = {}
    for r in robust.to_dict("records"):
        ids, oods = r["id_attack"].split("+"), r["ood_attack"].split("+")
        if r["method"] == "ensemble":
            ids, oods = ["id", *ids], ["tin", *oods]
        worst_id = np.min([arrays[f"{n}.select"] for n in ids], 0)
        worst_ood = np.max([arrays[f"{n}.select"] for n in oods], 0)
        by[f"{r['id_attack']}+{r['ood_attack']}"] = (100 * auroc(worst_id, worst_ood), r["robust_auroc"])
    listed = [n.strip() for n in levels.loc["robust_auroc", "sets"].split(", ")]
    assert len(listed) > 1 and set(listed) <= set(by)
    at = min(sorted(listed), key=lambda k: round(by[k][0], 9))
    assert levels.loc["robust_auroc", "worst_set"] == at
    assert levels.loc["robust_auroc", "auroc"] == pytest.approx(by[at][1], abs=1e-4)


def test_a_rerun_reads_the_attack_stream_confidences_back_from_the_store(randomised_run, data_root, tmp_path):
    """The attack-stream confidences are stored like the scores: an identical re-run computes none of them and
    writes the same ``<set>.select`` arrays."""
    cfg = _config(data_root, tmp_path, {"ensemble": "standard", "square_queries": 20, "eot": 2},
                  detectors="smoothed_msp")
    run(cfg.replace(detector_params={"smoothed_msp": {"n": 2, "sigma": 0.1}},
                    evaluators=("robust_auroc", "levels")), progress=False)
    work = json.loads((tmp_path / "run.json").read_text())["detector_work"]
    assert work["selection_sets_computed"] == 0 and work["selection_sets_reused"] > 0
    first, again = (dict(np.load(f / "scores" / "smoothed_msp.npz")) for f in (randomised_run, tmp_path))
    selected = [k for k in first if k.endswith(".select")]
    assert selected and all(np.array_equal(first[k], again[k]) for k in selected)
