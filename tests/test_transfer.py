"""Black-box transfer analysis: the metrics, the Jacobian augmentation, MIM, and pure/mixed surrogates end to end."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import advopenood_plugins.transfer as transfer
from advopenood import registry
from advopenood.config.loading import apply_overrides, load_config
from advopenood.config.schema import thaw
from advopenood.errors import UsageError
from advopenood.evaluation.metrics import id_threshold
from advopenood.models.classifier import build_model
from advopenood.run.pipeline import run
from advopenood.outputs.results import Paragraph, Table
from advopenood_plugins.transfer import (CSV_COLUMNS, PROTOCOL_SETTINGS, CWCNN, TransferAnalysis, clean_correct,
                                         defense_accuracy, detection_metrics, fraction_rows, jacobian_augment,
                                         read_transfer, transfer_asr, transfer_section)

PARAMS = {"fractions": [50, 100], "epochs": 4, "jacobian_rounds": 1, "attacks": ["fgsm", "mim"], "limit": 64}

# Five ID test rows: the last is misclassified when clean; the transferred images flip rows 1 and 3.
Y = np.array([0, 1, 2, 3, 4])
CLEAN = np.array([0, 1, 2, 3, 0])
ADV = np.array([0, 2, 2, 0, 4])  # row 4 is "right" on the adversarial image but was wrong when clean


def test_asr_counts_only_rows_the_target_got_right():
    np.testing.assert_array_equal(clean_correct(Y, CLEAN), [True, True, True, True, False])
    assert transfer_asr(Y, CLEAN, ADV) == pytest.approx(50.0)  # 2 of the 4 clean-correct rows flipped
    assert np.isnan(transfer_asr(Y, (Y + 1) % 5, ADV))


@pytest.mark.parametrize("rejected, expected", [
    (None, 50.0),  # vanilla: rows 0 and 2 of the 4 clean-correct rows keep their label; row 4 does not count
    ([False, True, False, False, False], 75.0),  # rejecting a flipped row adds it
    ([True, False, True, False, True], 50.0),  # rejecting correct rows, or the clean-wrong row 4, adds nothing
    ([True, True, True, True, True], 100.0),
])
def test_defense_accuracy_on_clean_correct_rows(rejected, expected):
    got = defense_accuracy(Y, CLEAN, ADV, None if rejected is None else np.array(rejected))
    assert got == pytest.approx(expected)
    assert np.isnan(defense_accuracy(Y, (Y + 1) % 5, ADV, None if rejected is None else np.array(rejected)))


def test_undefended_accuracy_is_100_minus_asr():
    rng = np.random.default_rng(0)
    for _ in range(20):
        y, clean, adv = (rng.integers(0, 3, 50) for _ in range(3))
        assert defense_accuracy(y, clean, adv) == pytest.approx(100.0 - transfer_asr(y, clean, adv))


def test_detection_metrics_keep_clean_correct_negatives_and_fooling_positives():
    conf_id, id_correct = np.array([0.9, 0.8, 0.1]), np.array([True, True, False])  # 0.1: a clean-wrong row
    conf_adv, fooled = np.array([0.85, 0.2, 0.95]), np.array([True, True, False])  # 0.95 did not fool the target
    # 4 (positive, negative) pairs: 0.85 < 0.9, 0.2 < 0.8, 0.2 < 0.9 ranked right, 0.85 > 0.8 wrong -> 3/4;
    # flagging both positives needs a threshold above 0.85, which flags 0.8: FPR95 = 1/2
    assert detection_metrics(conf_id, id_correct, conf_adv, fooled) == pytest.approx({"auroc": 75.0, "fpr95": 50.0})
    nan = detection_metrics(conf_id, id_correct, conf_adv, np.zeros(3, bool))
    assert np.isnan(nan["auroc"]) and np.isnan(nan["fpr95"])


def test_threshold_accepts_95_percent_of_clean_id():
    conf = np.random.default_rng(0).normal(size=10_000)
    thr = id_threshold(conf)
    assert np.mean(conf >= thr) == pytest.approx(0.95, abs=1e-3)


def test_fraction_rows_are_seeded_and_nested():
    small, large = fraction_rows(1000, 25, 3), fraction_rows(1000, 75, 3)
    assert len(small) == 250 and len(large) == 750 and set(small) <= set(large)
    np.testing.assert_array_equal(small, fraction_rows(1000, 25, 3))
    assert not np.array_equal(small, fraction_rows(1000, 25, 4))
    assert len(fraction_rows(50, 1, 0)) == 1  # at least one row


@pytest.mark.parametrize("direction", ["logit", "loss"])
def test_jacobian_augmentation_steps_lambda_along_the_gradient_sign(cifar_model, cifar_batch, direction):
    x, _ = cifar_batch
    x = x[:16]
    labels = torch.arange(16) % 10
    x_new = jacobian_augment(cifar_model, x, labels, 0.1, batch_size=8, direction=direction)
    delta = (x_new - x).abs()
    assert x_new.min() >= 0 and x_new.max() <= 1 and delta.max() <= 0.1 + 1e-6
    assert (delta > 0.099).float().mean() > 0.5  # a full lambda step wherever clipping allows it
    small = jacobian_augment(cifar_model, x, labels, 0.5 / 255, batch_size=16, direction=direction)
    with torch.no_grad():  # locally linear: "logit" raises the label's logit, "loss" raises its cross-entropy
        before, after = cifar_model(x), cifar_model(small)
    if direction == "logit":
        grew = after.gather(1, labels[:, None]) > before.gather(1, labels[:, None])
    else:
        grew = (torch.nn.functional.cross_entropy(after, labels, reduction="none")
                > torch.nn.functional.cross_entropy(before, labels, reduction="none"))
    assert grew.float().mean() > 0.9
    assert all(p.requires_grad for p in cifar_model.parameters())  # parameters unfrozen again


def test_mim_stays_in_the_ball_and_fools_resnet20(cifar_model, cifar_batch):
    x, y = cifar_batch
    x, y = x[:16], y[:16]
    cls = registry.get("attacks", "mim")
    assert cls.defaults(32) == {"eps": 8 / 255, "steps": 10, "decay": 1.0, "rel_stepsize": None}
    x_adv = cls(**cls.defaults(32))(cifar_model, x, y, seed=0)
    assert (x_adv - x).abs().max() <= 8 / 255 + 1e-6
    assert x_adv.min() >= 0 and x_adv.max() <= 1
    with torch.no_grad():
        clean, adv = cifar_model(x).argmax(1), cifar_model(x_adv).argmax(1)
    correct = clean == y
    assert correct.sum() >= 10
    assert (adv[correct] != y[correct]).float().mean() >= 0.9


def test_registered():
    assert registry.get("analyses", "transfer") is TransferAnalysis


@pytest.mark.parametrize("params, message", [
    ({"attacks": ["fgsm", "nope"]}, "'nope'.*valid choices: .*fgsm"),
    ({"attacks": []}, "attacks is empty.*valid choices"),
    *[({"fractions": [25, bad]}, f"fraction {bad}.*valid choices") for bad in (0, 150, -5)],
    ({"query_detector": "nodet"}, "query_detector 'nodet'.*valid choices: .*msp"),
    ({"arch": "vgg"}, "arch 'vgg'.*valid choices: cw_cnn, resnet20"),
    ({"eps": 2.0}, "eps"),
    ({"steps": 0}, "steps 0.*valid choices"),
    ({"jacobian_direction": "up"}, "jacobian_direction 'up'.*valid choices: logit, loss"),
    ({"jacobian_lambda": 0}, "jacobian_lambda 0.*valid choices"),
    ({"epochs": 2.5}, "epochs 2.5.*valid choices"),
])
def test_bad_parameters_raise_before_any_work(params, message):
    with pytest.raises(UsageError, match=message):
        TransferAnalysis(**params)


@pytest.mark.parametrize("protocol, key, value", [
    ("mahmood2021", "eps", 0.05),  # App. B.2
    ("mahmood2021", "steps", 10),
    ("mahmood2021", "arch", "cw_cnn"),  # Table 4
    ("mahmood2021", "epochs", 100), ("mahmood2021", "lr", 1e-4), ("mahmood2021", "train_batch", 64),  # Table 2
    ("mahmood2021", "jacobian_rounds", 4), ("mahmood2021", "jacobian_lambda", 0.1),  # Table 3
    ("mahmood2021", "jacobian_direction", "loss"), ("mahmood2021", "max_augment", None),
    ("mahmood2021", "fractions", (1, 25, 50, 75, 100)),  # Sec. 4
    ("strong", "eps", None), ("strong", "arch", "democnn"), ("strong", "epochs", 5),
    ("strong", "jacobian_rounds", 2), ("strong", "jacobian_direction", "logit"),
    ("lorenz2024", "arch", "democnn"),  # a protocol without a transfer adversary of its own runs ours
])
def test_protocol_settings(protocol, key, value):
    assert TransferAnalysis().settings(protocol)[key] == value


@pytest.mark.parametrize("protocol", list(PROTOCOL_SETTINGS))
def test_explicit_parameters_win_over_the_protocol(protocol):
    got = TransferAnalysis(eps="8/255", arch="democnn", epochs=2, jacobian_rounds=1, fractions=[]).settings(protocol)
    assert got["eps"] == pytest.approx(8 / 255) and got["arch"] == "democnn" and got["epochs"] == 2
    assert got["jacobian_rounds"] == 1 and got["fractions"] == ()
    assert got["lr"] == PROTOCOL_SETTINGS[protocol]["lr"]  # what was not set still comes from the protocol


def test_paper_surrogate_is_table_4(cifar_model):
    net = CWCNN(10, 3, 32)
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    linears = [m for m in net.modules() if isinstance(m, torch.nn.Linear)]
    assert [(c.kernel_size, c.out_channels) for c in convs] == [((3, 3), 64), ((3, 3), 64), ((3, 3), 128),
                                                                 ((3, 3), 128)]
    assert [m.out_features for m in linears] == [256, 256, 10]
    assert sum(isinstance(m, torch.nn.MaxPool2d) for m in net.modules()) == 2
    maps = net.stages(torch.rand(2, 3, 32, 32))
    assert maps[-1].shape == (2, 256, 1, 1)


def _table(rows: list[tuple]) -> pd.DataFrame:
    cols = ["surrogate", "data_fraction", "attack", "asr", "detector", "defense_acc", "undefended_acc", "improvement",
            "n"]
    return pd.DataFrame(rows, columns=cols).assign(protocol="strong")


@pytest.mark.parametrize("rows, expected", [
    ([("pure", 100, "fgsm", 20.0, "msp", 85.0, 80.0, 5.0, 50), ("pure", 100, "mim", 30.0, "msp", 72.0, 70.0, 2.0, 50)],
     ["pure surrogate, 100 % of the training data (50 clean-correct test images): the highest transfer ASR is "
      "30.0 % (mim); MSP adds the most defense accuracy, +5.0 points on fgsm (80.0 % -> 85.0 %)."]),
    ([("mixed", 25, "fgsm", 0.0, "msp", 100.0, 100.0, 0.0, 40)],
     ["mixed surrogate, 25 % of the training data (40 clean-correct test images): no transferred example fools the "
      "target; no detector adds defense accuracy."]),
    ([("mixed", 1, "fgsm", np.nan, "msp", np.nan, np.nan, np.nan, 0)],
     ["mixed surrogate, 1 % of the training data (0 clean-correct test images): nothing to attack."]),
    ([("pure", 100, "pgd", 10.0, "", 90.0, 90.0, 0.0, 30)],
     ["pure surrogate, 100 % of the training data (30 clean-correct test images): the highest transfer ASR is "
      "10.0 % (pgd)."]),
])
def test_read_transfer_sentences_follow_the_numbers(rows, expected):
    assert read_transfer(_table(rows)) == expected


def _config(out: Path, data_root: Path, params: dict) -> dict:
    cfg = thaw(load_config("cifar10_resnet20")[0])
    cfg["data"]["ood"] = []
    cfg["data"]["fit_limit"] = 2000
    cfg["evaluators"] = []
    cfg["analysis_params"] = {"transfer": params}
    return apply_overrides(cfg, data_root=str(data_root), attack="fgsm", detectors="msp,mds",
                           analysis="transfer", limit=64, out=str(out))


def _cache_files(cache: Path) -> set[str]:
    return {str(p.relative_to(cache)) for d in ("surrogates", "transfer_adv") for p in (cache / d).rglob("*")
            if p.is_file() and not p.name.endswith(".lock")}


@pytest.fixture(scope="module")
def cifar_run(tmp_path_factory, data_root, session_cache):
    """The pipeline on 64 CIFAR-10 test images and a 2,000-image fit set: pure + mixed 50 % / 100 % surrogates."""
    out = tmp_path_factory.mktemp("transfer")
    ctx = run(_config(out, data_root, PARAMS), progress=False)
    return ctx, pd.read_csv(out / "transfer.csv"), _cache_files(session_cache)


def test_table_has_one_row_per_surrogate_attack_and_detector(cifar_run):
    ctx, df, _ = cifar_run
    assert list(df.columns) == CSV_COLUMNS
    assert len(df) == 3 * 2 * 2
    assert set(df.surrogate) == {"pure", "mixed"} and set(df.attack) == {"fgsm", "mim"}
    assert set(df.detector) == {"msp", "mds"}
    n_correct = int(np.sum(ctx.clean.pred == ctx.clean.y))  # of the 64 test images (limit 64 is above it)
    assert 40 < n_correct < 64 and (df.n == n_correct).all()
    assert (df.seed == 0).all() and np.allclose(df.eps, 8 / 255, atol=1e-6)
    assert (df[df.surrogate == "pure"].data_fraction == 100).all()
    assert (df.protocol == "strong").all() and df.deviations.isna().all()  # ours: it claims nothing of the paper


def test_every_metric_is_on_clean_correct_rows(cifar_run):
    ctx, df, _ = cifar_run
    assert ctx.clean.accuracy < 95  # the trained ResNet-20 gets some of the pack's test images wrong
    # Mahmood et al. score clean-correct samples only: the vanilla defense accuracy is 100 - ASR by construction
    np.testing.assert_allclose(df.undefended_acc, 100.0 - df.asr, atol=1e-4)  # the CSV keeps 6 digits
    assert (df.defense_acc <= 100).all() and (df.defense_acc >= df.undefended_acc).all()


def test_queries_pure_none_mixed_grow_with_the_fraction(cifar_run):
    _, df, _ = cifar_run
    assert (df[df.surrogate == "pure"].queries == 0).all()
    mixed = df[df.surrogate == "mixed"].groupby("data_fraction").queries.agg(["min", "max"])
    assert (mixed["min"] == mixed["max"]).all()  # one count per surrogate
    q50, q100 = mixed.loc[50, "min"], mixed.loc[100, "min"]
    # 1,000 (resp. 2,000) fit images plus one Jacobian round over the accepted ones
    assert 1000 < q50 <= 2000 and 2000 < q100 <= 4000


def test_metrics_are_in_range_and_the_detector_only_adds(cifar_run):
    _, df, _ = cifar_run
    assert df.asr.between(0, 100).all() and df.asr.max() > 0
    assert (df.defense_acc >= df.undefended_acc).all()
    np.testing.assert_allclose(df.improvement, df.defense_acc - df.undefended_acc, atol=1e-4)  # 6 digits in the CSV
    assert df.auroc.between(0, 100).all() and df.fpr95.between(0, 100).all()
    # the target is the same for every detector: its accuracy does not depend on the detector
    assert df.groupby(["surrogate", "data_fraction", "attack"]).undefended_acc.nunique().eq(1).all()
    assert (df.surrogate_acc > 25).all()  # chance is 10 %


def test_second_run_reuses_surrogates_and_examples(cifar_run, tmp_path, data_root, session_cache, monkeypatch):
    _, df, files = cifar_run

    def refuse(*args, **kwargs):
        raise AssertionError("a cached surrogate was trained or queried again")

    monkeypatch.setattr(transfer, "train_classifier", refuse)
    monkeypatch.setattr(transfer.Oracle, "__call__", refuse)
    monkeypatch.setattr(transfer, "jacobian_augment", refuse)
    run(_config(tmp_path, data_root, PARAMS), progress=False)
    assert _cache_files(session_cache) == files
    assert len([f for f in files if f.startswith("surrogates")]) == 3
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "transfer.csv"), df)


def test_without_detectors_rows_have_no_detector_and_vanilla_accuracy(cifar_run, tmp_path):
    ctx, df, _ = cifar_run
    ctx = dataclasses.replace(ctx, bank=None, out=tmp_path)
    got = TransferAnalysis(**{**PARAMS, "fractions": []})(ctx)["transfer.csv"]  # the cached pure surrogate
    assert list(got.columns) == CSV_COLUMNS and len(got) == 2
    assert (got.detector == "").all() and got.auroc.isna().all() and got.fpr95.isna().all()
    np.testing.assert_allclose(got.defense_acc, got.undefended_acc)
    ref = df[(df.surrogate == "pure") & (df.detector == "msp")].reset_index(drop=True)
    np.testing.assert_allclose(got.asr, ref.asr, rtol=1e-5)  # the CSV keeps 6 digits


def test_query_detector_must_be_fitted_in_the_run(cifar_run):
    ctx, _, _ = cifar_run
    with pytest.raises(UsageError, match="query_detector 'knn'.*valid choices: msp, mds"):
        TransferAnalysis(**{**PARAMS, "query_detector": "knn"})(ctx)


def test_surrogate_is_a_real_model_of_the_target_input_format(cifar_run, session_cache):
    ctx, _, _ = cifar_run
    path = next((session_cache / "surrogates").glob("*.pt"))
    model = build_model("democnn", 10, path, mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225], in_channels=3,
                        input_size=32)
    assert model(torch.rand(2, 3, 32, 32)).shape == (2, 10)


def test_mahmood2021_protocol_uses_the_papers_adversary_and_names_its_deviations(cifar_run, tmp_path):
    ctx, _, _ = cifar_run
    ctx = dataclasses.replace(ctx, protocol="mahmood2021", out=tmp_path,
                              plan=ctx.plan.replace(cache_dir=str(tmp_path / "cache")))
    got = TransferAnalysis(fractions=[], attacks=["fgsm"], epochs=1, limit=32)(ctx)["transfer.csv"]
    assert list(got.columns) == CSV_COLUMNS and len(got) == 2  # pure surrogate x fgsm x {msp, mds}
    assert (got.protocol == "mahmood2021").all() and np.allclose(got.eps, 0.05)  # App. B.2, not our 8/255
    np.testing.assert_allclose(got.undefended_acc, 100.0 - got.asr)
    deviations = got.deviations.iloc[0].split("; ")
    assert "epochs=1 (paper 100)" in deviations and "attacks=[fgsm] (paper [fgsm, pgd, mim])" in deviations
    assert "adversary data 2000 training images (paper 50000, Table 3)" in deviations
    surrogate = next((tmp_path / "cache" / "surrogates").glob("*.pt"))
    CWCNN(10, 3, 32).load_state_dict(torch.load(surrogate, weights_only=True)["state_dict"])  # Table 4's network


@pytest.mark.parametrize("protocol, deviations, says", [
    ("strong", np.nan, ["the adversary is ours (protocol strong)", "not comparable"]),
    ("mahmood2021", "epochs=1 (paper 100)", ["Mahmood et al.'s CIFAR-10 one", "Deviations from the paper's adversary: "
                                                                              "epochs=1 (paper 100)."]),
])
def test_report_section_names_whose_adversary_it_is(protocol, deviations, says):
    table = _table([("pure", 100, "fgsm", 10.0, "msp", 95.0, 90.0, 5.0, 50)]).assign(protocol=protocol,
                                                                                     deviations=deviations)
    section = transfer_section(table)
    text = " ".join(i.text for i in section.items if isinstance(i, Paragraph))
    assert section.title == "Black-box transfer" and all(s in text for s in says)
    assert "deviations" not in next(i.frame for i in section.items if isinstance(i, Table)).columns
