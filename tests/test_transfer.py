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
from advopenood.config import apply_overrides, load_config
from advopenood.errors import UsageError
from advopenood.metrics import id_threshold
from advopenood.models import build_model
from advopenood.pipeline import run
from advopenood_plugins.transfer import (CSV_COLUMNS, TransferAnalysis, defense_accuracy,
                                         fraction_rows, jacobian_augment, transfer_asr)

PARAMS = {"fractions": [50, 100], "epochs": 4, "jacobian_rounds": 1, "attacks": ["fgsm", "mim"], "limit": 64}


def test_asr_counts_only_rows_the_target_got_right():
    y = np.array([0, 1, 2, 3, 4])
    clean = np.array([0, 1, 2, 3, 0])  # the last row is already wrong when clean
    adv = np.array([0, 2, 2, 0, 1])
    assert transfer_asr(y, clean, adv) == pytest.approx(50.0)  # 2 of the 4 correct rows flipped
    assert np.isnan(transfer_asr(y, (y + 1) % 5, adv))


def test_defense_accuracy_adds_rejections_to_correct_predictions():
    y = np.array([0, 1, 2, 3])
    adv = np.array([0, 0, 0, 3])
    assert defense_accuracy(y, adv) == pytest.approx(50.0)  # the vanilla defense accuracy
    assert defense_accuracy(y, adv, np.array([False, True, False, False])) == pytest.approx(75.0)
    # rejecting a correctly classified example adds nothing
    assert defense_accuracy(y, adv, np.array([True, False, False, True])) == pytest.approx(50.0)
    assert defense_accuracy(y, adv, np.ones(4, bool)) == pytest.approx(100.0)


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


def test_jacobian_augmentation_steps_lambda_along_the_label_logit(cifar_model, cifar_batch):
    x, _ = cifar_batch
    x = x[:16]
    labels = torch.arange(16) % 10
    x_new = jacobian_augment(cifar_model, x, labels, 0.1, batch_size=8)
    delta = (x_new - x).abs()
    assert x_new.min() >= 0 and x_new.max() <= 1 and delta.max() <= 0.1 + 1e-6
    assert (delta > 0.099).float().mean() > 0.5  # a full lambda step wherever clipping allows it
    small = jacobian_augment(cifar_model, x, labels, 0.5 / 255, batch_size=16)  # locally linear: the logit grows
    with torch.no_grad():
        before = cifar_model(x).gather(1, labels[:, None])
        after = cifar_model(small).gather(1, labels[:, None])
    assert (after > before).float().mean() > 0.9
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


def test_registered_and_validates_parameters():
    assert registry.get("analyses", "transfer") is TransferAnalysis
    with pytest.raises(UsageError, match="'nope'.*valid choices: .*fgsm"):
        TransferAnalysis(attacks=["fgsm", "nope"])
    for bad in (0, 150, -5):
        with pytest.raises(UsageError, match=f"fraction {bad}.*valid choices"):
            TransferAnalysis(fractions=[25, bad])
    with pytest.raises(UsageError, match="query_detector 'nodet'.*valid choices: .*msp"):
        TransferAnalysis(query_detector="nodet")
    with pytest.raises(UsageError, match="arch 'vgg'"):
        TransferAnalysis(arch="vgg")
    with pytest.raises(UsageError, match="eps"):
        TransferAnalysis(eps=2.0)


def _config(out: Path, data_root: Path, params: dict) -> dict:
    cfg, folder = load_config("cifar10_resnet20")
    cfg["data"]["ood"] = []
    cfg["data"]["fit_limit"] = 2000
    cfg["evaluators"] = []
    cfg["analysis_params"] = {"transfer": params}
    return apply_overrides(cfg, config_dir=folder, data_root=str(data_root), attack="fgsm", detectors="msp,mds",
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
    _, df, _ = cifar_run
    assert list(df.columns) == CSV_COLUMNS
    assert len(df) == 3 * 2 * 2
    assert set(df.surrogate) == {"pure", "mixed"} and set(df.attack) == {"fgsm", "mim"}
    assert set(df.detector) == {"msp", "mds"}
    assert (df.n == 64).all() and (df.seed == 0).all() and np.allclose(df.eps, 8 / 255, atol=1e-6)
    assert (df[df.surrogate == "pure"].data_fraction == 100).all()


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
    np.testing.assert_allclose(df.improvement, df.defense_acc - df.undefended_acc, atol=1e-9)
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
