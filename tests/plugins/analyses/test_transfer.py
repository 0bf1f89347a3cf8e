"""Black-box transfer analysis: the metrics, the adversaries' test rows, the Jacobian augmentation, the authors'
surrogate and training, MIM, pure/mixed surrogates end to end under ``strong`` and ``mahmood2021``, and the
verify hook."""
from __future__ import annotations

import dataclasses
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import advopenood_plugins.analyses.transfer.plugin as transfer
from conftest import assert_section_rerendered
import advopenood_plugins.analyses.transfer.adversary as adversary
from advopenood import registry
from advopenood.config.loading import apply_overrides, load_config
from advopenood.config.schema import thaw
from advopenood.data.datasets import Subset
from advopenood.errors import UsageError
from advopenood.evaluation.metrics import id_threshold
from advopenood.models.classifier import build_model
from advopenood.outputs.results import Paragraph, Table
from advopenood.run.pipeline import run
from advopenood_plugins.analyses.transfer.plugin import (CSV_COLUMNS, FIXED_DEVIATIONS, PROTOCOL_SETTINGS, SAMPLES_FILE,
                                                         TransferAnalysis)
from advopenood_plugins.analyses.transfer.report import read_transfer, transfer_section
from advopenood_plugins.analyses.transfer.tables import (Adversary, Outcome, clean_correct, defense_accuracy,
                                                         detection_metrics, improvement, plan, table_rows, transfer_asr)
from advopenood_plugins.analyses.transfer.adversary import (CWCNN, RoundTrainer, first_rows, fraction_rows,
                                                            jacobian_augment, jacobian_lambdas, train_mixed)
from advopenood_plugins.analyses.transfer.verify import verify

PARAMS = {"fractions": [50, 100], "epochs": 4, "jacobian_rounds": 1, "attacks": ["fgsm", "mim"], "limit": 64}
#: The fit rows of the end-to-end run (its surrogates' training data), and the authors' adversary's share of them.
FIT, MAHMOOD_FIT = 1000, 500
#: The authors' adversary, shrunk for two CPU cores: 5 % of a 500-image fit set, one epoch, one round, 20 images.
MAHMOOD = {"fractions": [5], "attacks": ["fgsm", "bim"], "epochs": 1, "pure_epochs": 1, "jacobian_rounds": 1,
           "limit": 20}

# Five attacked rows: the transferred images flip rows 1 and 3.
Y = np.array([0, 1, 2, 3, 4])
ADV = np.array([0, 2, 2, 0, 4])


def test_asr_counts_the_attacked_rows():
    assert transfer_asr(Y, ADV) == pytest.approx(40.0)  # 2 of 5 flipped
    assert np.isnan(transfer_asr(Y[:0], ADV[:0]))
    np.testing.assert_array_equal(clean_correct(Y, [0, 1, 2, 3, 0]), [True, True, True, True, False])


@pytest.mark.parametrize("rejected, expected", [
    (None, 60.0),  # vanilla: rows 0, 2 and 4 keep their label
    ([False, True, False, False, False], 80.0),  # rejecting a flipped row adds it
    ([True, False, True, False, True], 60.0),  # rejecting correctly labelled rows adds nothing
    ([True, True, True, True, True], 100.0),
])
def test_defense_accuracy_counts_right_or_rejected(rejected, expected):
    got = defense_accuracy(Y, ADV, None if rejected is None else np.array(rejected))
    assert got == pytest.approx(expected)
    assert np.isnan(defense_accuracy(Y[:0], ADV[:0], None if rejected is None else np.zeros(0, bool)))


def test_undefended_accuracy_is_100_minus_asr():
    rng = np.random.default_rng(0)
    for _ in range(20):
        y, adv = (rng.integers(0, 3, 50) for _ in range(2))
        assert defense_accuracy(y, adv) == pytest.approx(100.0 - transfer_asr(y, adv))


def _outcome(y, adv_pred, conf=None):
    y = np.array(y)
    return Outcome(y, y.copy(), np.array(adv_pred), y.copy(), 0.05, {} if conf is None else {"msp": np.array(conf)})


def test_improvement_is_against_the_vanilla_adversarys_own_run_and_can_be_negative():
    """Mahmood et al. Sec. 3.10: each defense under its own attack run vs the vanilla network under its own."""
    advs = [Adversary("mixed", 25.0, None, np.array([0, 1, 2, 3]), [""], 0),
            Adversary("mixed", 25.0, "msp", np.array([0, 1, 2, 4]), ["msp"], 0)]
    outcomes = [{"fgsm": _outcome([0, 1, 2, 3], [0, 1, 2, 9])},  # vanilla run: 3 of 4 right -> 75 %
                {"fgsm": _outcome([0, 1, 2, 4], [0, 5, 6, 7], [0.9, 0.1, 0.9, 0.9])}]  # row 0 right, row 1 rejected
    conf_id = {"msp": np.array([0.9, 0.8, 0.95, 0.7, 0.85])}
    rows = table_rows(advs, outcomes, [300, 320], {"msp": 0.5}, conf_id, np.ones(5, bool))
    vanilla, defended = rows
    assert vanilla["detector"] == "" and vanilla["defense_acc"] == vanilla["vanilla_acc"] == 75.0
    assert vanilla["improvement"] == 0.0 and vanilla["query_detector"] == "" and vanilla["queries"] == 300
    assert defended["detector"] == "msp" and defended["query_detector"] == "msp" and defended["queries"] == 320
    assert defended["asr"] == 75.0 and defended["undefended_acc"] == 25.0
    assert defended["defense_acc"] == 50.0 and defended["vanilla_acc"] == 75.0
    assert defended["improvement"] == -25.0  # the defense does worse than no defense (Fig. 1's negative bars)
    # positives 0.1, 0.9, 0.9 against negatives 0.9, 0.8, 0.95, 0.7, 0.85: 5 + 2 * (1 + 0.5) of 15 pairs ranked right
    assert defended["auroc"] == pytest.approx(100 * 8 / 15)
    assert improvement(50.0, 75.0) == -25.0


def test_shared_adversary_compares_the_detector_on_the_same_examples():
    adv = Adversary("pure", 100.0, None, np.array([0, 1, 2, 3]), ["msp"], 0)
    (row,) = table_rows([adv], [{"fgsm": _outcome([0, 1, 2, 3], [0, 5, 2, 9], [0.9, 0.1, 0.9, 0.1])}], [0],
                        {"msp": 0.5}, {"msp": np.ones(4)}, np.ones(4, bool))
    assert row["vanilla_acc"] == row["undefended_acc"] == 50.0 and row["defense_acc"] == 100.0
    assert row["improvement"] == 50.0


# Eight ID test rows: the classifier gets rows 2 and 5 wrong; MSP rejects rows 1 and 6 when clean.
PLAN_Y = np.arange(8)
PLAN_PRED = np.array([0, 1, 9, 3, 4, 9, 6, 7])
PLAN_ACCEPTED = {"msp": np.array([True, False, True, True, True, True, False, True])}


def test_mahmood2021_adversaries_attack_the_rows_the_authors_select():
    settings = {**PROTOCOL_SETTINGS["mahmood2021"], "fractions": (25.0,), "limit": 3}
    got = plan(settings, ["msp"], PLAN_PRED == PLAN_Y, PLAN_ACCEPTED, None, 0)
    assert [(a.mode, a.oracle, a.defenses, a.baseline) for a in got] == [
        ("pure", None, ["", "msp"], 0), ("mixed", None, [""], 1), ("mixed", "msp", ["msp"], 1)]
    np.testing.assert_array_equal(got[0].rows, [0, 1, 2])  # pure: the first 3 test images, unfiltered (L274-275)
    np.testing.assert_array_equal(got[1].rows, [0, 1, 3])  # vanilla mixed: the first 3 the classifier gets right
    np.testing.assert_array_equal(got[2].rows, [0, 3, 4])  # MSP's mixed: ... and MSP accepts (L41, L229-247)


def test_strong_adversaries_share_the_clean_correct_rows():
    settings = {**PROTOCOL_SETTINGS["strong"], "fractions": (25.0, 50.0)}
    got = plan(settings, ["msp", "mds"], PLAN_PRED == PLAN_Y, PLAN_ACCEPTED, "msp", 0)
    assert [(a.mode, a.oracle, a.baseline) for a in got] == [("pure", None, 0), ("mixed", "msp", 1),
                                                            ("mixed", "msp", 2)]
    for a in got:
        np.testing.assert_array_equal(a.rows, [0, 1, 3, 4, 6, 7])
        assert a.defenses == ["msp", "mds"]


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


@pytest.mark.parametrize("n, fraction, expected", [
    (50_000, 1, 500), (50_000, 25, 12_500), (50_000, 100, 50_000),  # DefaultMethodsVanilla.py L64-66
    (10, 25, 2),  # numpy.round(2.5) = 2, as the authors' queryNumArray
    (50, 1, 1),  # at least one row
])
def test_first_rows_are_the_authors_xtrain_prefix(n, fraction, expected):
    np.testing.assert_array_equal(first_rows(n, fraction), np.arange(expected))


@pytest.mark.parametrize("rounds, schedule, expected", [
    (3, "cleverhans", [-0.1, -0.1, -0.1]),  # the authors' data_aug = 4: three augmentations, all -lambda
    (5, "cleverhans", [-0.1, -0.1, -0.1, 0.1, 0.1]),  # CleverHans' lmbda_coef = 2 * int(int(rho / 3) != 0) - 1
    (2, "constant", [0.1, 0.1]),  # Papernot et al. Algorithm 1
    (0, "cleverhans", []),
])
def test_jacobian_lambda_schedule(rounds, schedule, expected):
    assert jacobian_lambdas(rounds, 0.1, schedule) == pytest.approx(expected)


@pytest.mark.parametrize("lam, clip", [(0.1, True), (-0.1, False), (0.1, False)])
def test_jacobian_augmentation_steps_along_the_label_logit_gradient(cifar_model, cifar_batch, lam, clip):
    x, _ = cifar_batch
    x = x[:16]
    labels = torch.arange(16) % 10
    x_new = jacobian_augment(cifar_model, x, labels, lam, batch_size=8, clip=clip)
    delta = (x_new - x).abs()
    assert delta.max() <= 0.1 + 1e-6
    if clip:
        assert x_new.min() >= 0 and x_new.max() <= 1 and (delta > 0.099).float().mean() > 0.5
    else:  # CleverHans' jacobian_augmentation does not clip: every pixel moves by |lambda|, some leave [0, 1]
        assert (delta > 0.099).float().mean() > 0.99 and (x_new.min() < 0 or x_new.max() > 1)
    small = jacobian_augment(cifar_model, x, labels, math.copysign(0.5 / 255, lam), batch_size=16, clip=clip)
    with torch.no_grad():  # locally linear: +lambda raises the label's logit, -lambda lowers it
        before, after = cifar_model(x).gather(1, labels[:, None]), cifar_model(small).gather(1, labels[:, None])
    assert ((after > before) if lam > 0 else (after < before)).float().mean() > 0.9
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


@pytest.mark.parametrize("name, expected", [
    ("fgsm", ("fgsm", {"eps": 0.05})),  # DefaultMethodsVanilla.py L39
    ("bim", ("pgd", {"eps": 0.05, "steps": 10, "rel_stepsize": 0.1, "random_start": False})),  # L41-44, rStart 0
    ("pgd", ("pgd", {"eps": 0.05, "steps": 10, "rel_stepsize": 0.1, "random_start": True})),  # L43
    ("mim", ("mim", {"eps": 0.05, "steps": 10, "rel_stepsize": 0.1, "decay": 1.0})),  # L45
    ("cw", ("cw", {"eps": None, "steps": 1000, "binary_search_steps": 9, "stepsize": 0.01,  # L48, l2_attack.py
                   "initial_const": 0.001, "confidence": 0.0, "abort_early": True})),
])
def test_mahmood2021_attacks_take_the_authors_parameters(name, expected):
    attack = TransferAnalysis._attack(name, TransferAnalysis().settings("mahmood2021"), 32)
    assert attack.name == expected[0]
    assert {k: attack.params[k] for k in expected[1]} == pytest.approx(expected[1])


def test_registered():
    assert registry.get("analyses", "transfer") is TransferAnalysis
    assert TransferAnalysis.verify is verify


@pytest.mark.parametrize("params, message", [
    ({"attacks": ["fgsm", "nope"]}, "'nope'.*valid choices: .*bim.*fgsm"),
    ({"attacks": []}, "attacks is empty.*valid choices"),
    *[({"fractions": [25, bad]}, f"fraction {bad}.*valid choices") for bad in (0, 150, -5)],
    ({"query_detector": "nodet"}, "query_detector 'nodet'.*valid choices: .*msp"),
    ({"arch": "vgg"}, "arch 'vgg'.*valid choices: cw_cnn, resnet20"),
    ({"eps": 2.0}, "eps"),
    ({"steps": 0}, "steps 0.*valid choices"),
    ({"pure_epochs": 0}, "pure_epochs 0.*valid choices"),
    ({"jacobian_lambda": 0}, "jacobian_lambda 0.*valid choices"),
    ({"epochs": 2.5}, "epochs 2.5.*valid choices"),
])
def test_bad_parameters_raise_before_any_work(params, message):
    with pytest.raises(UsageError, match=message):
        TransferAnalysis(**params)


@pytest.mark.parametrize("protocol, key, value", [
    ("mahmood2021", "attacks", ("fgsm", "bim", "mim", "pgd", "cw")),  # AttackWrappersBlackBox.py L82-129
    ("mahmood2021", "eps", 0.05), ("mahmood2021", "steps", 10), ("mahmood2021", "cw_steps", 1000),
    ("mahmood2021", "limit", 1000),  # DefaultMethodsVanilla.py L51
    ("mahmood2021", "arch", "cw_cnn"),  # NetworkConstructors.py L19-45
    ("mahmood2021", "epochs", 10), ("mahmood2021", "train_batch", 128),  # DefaultMethodsVanilla.py L52-54
    ("mahmood2021", "lr", 1e-4), ("mahmood2021", "optimizer", "adam"),  # NetworkConstructors.py L42-44
    ("mahmood2021", "jacobian_rounds", 3), ("mahmood2021", "jacobian_lambda", 0.1),  # data_aug 4, lmbda 0.1
    ("mahmood2021", "jacobian_schedule", "cleverhans"), ("mahmood2021", "jacobian_clip", False),
    ("mahmood2021", "requery", True), ("mahmood2021", "max_augment", None), ("mahmood2021", "data_rows", "first"),
    ("mahmood2021", "adversaries", "per_defense"), ("mahmood2021", "fractions", (1, 25, 50, 75, 100)),
    ("strong", "eps", None), ("strong", "arch", "democnn"), ("strong", "epochs", 5), ("strong", "limit", None),
    ("strong", "jacobian_rounds", 2), ("strong", "jacobian_schedule", "constant"), ("strong", "jacobian_clip", True),
    ("strong", "adversaries", "shared"), ("strong", "optimizer", "cosine"),
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


def test_authors_surrogate_has_dropout_and_keras_initialisation():
    torch.manual_seed(0)
    net = CWCNN(10, 3, 32)
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    linears = [m for m in net.modules() if isinstance(m, torch.nn.Linear)]
    assert [(c.kernel_size, c.out_channels) for c in convs] == [((3, 3), 64), ((3, 3), 64), ((3, 3), 128),
                                                                 ((3, 3), 128)]
    assert [m.out_features for m in linears] == [256, 256, 10]
    assert sum(isinstance(m, torch.nn.MaxPool2d) for m in net.modules()) == 2
    dense = list(net.dense)
    assert isinstance(dense[3], torch.nn.Dropout) and dense[3].p == 0.5 and dense[1] is linears[0]  # after FC 1
    for m in convs + linears:  # Glorot-uniform: |w| <= sqrt(6 / (fan_in + fan_out)); zero biases
        fan_in, fan_out = m.weight[0].numel(), m.weight.shape[0] * m.weight[0, 0].numel()
        assert m.weight.abs().max() <= math.sqrt(6 / (fan_in + fan_out)) and not m.bias.any()
    x = torch.rand(4, 3, 32, 32)
    assert net.stages(x)[-1].shape == (4, 256, 1, 1)
    net.eval()
    assert torch.equal(net.stages(x)[-1], net.stages(x)[-1])  # no dropout at test time (K.set_learning_phase(0))


def test_adam_rounds_keep_one_optimizer_with_a_constant_rate(cifar_model, cifar_batch):
    """The authors' Keras model is compiled once and fit once per round: Adam's state carries over."""
    model = build_model("resnet20", 10, None)
    model.load_state_dict(cifar_model.state_dict())
    x, y = cifar_batch
    settings = {**PROTOCOL_SETTINGS["mahmood2021"], "train_batch": 16}
    trainer = RoundTrainer(model, settings, progress=False)
    trainer(x[:32], y[:32], seed=0, epochs=1)
    trainer(x[:48], y[:48], seed=1, epochs=1)
    state = trainer.opt.state[next(model.parameters())]
    assert int(state["step"]) == 2 + 3  # 32 / 16 + 48 / 16 batches, one optimizer
    assert trainer.opt.param_groups[0]["lr"] == 1e-4 and not model.training


class _RejectingOracle:
    """The trained ResNet-20's labels; rejects every image it labels 0. Records the size of every query."""

    def __init__(self, model):
        self.model, self.sizes, self.kept, self.queries = model, [], [], 0

    def __call__(self, x):
        with torch.no_grad():
            labels = self.model(x).argmax(1)
        self.sizes.append(len(x))
        self.kept.append(int((labels != 0).sum()))
        self.queries += len(x)
        return labels, labels != 0


@pytest.mark.parametrize("requery", [True, False])
def test_mixed_adversary_requeries_the_whole_set_as_the_authors(cifar_model, cifar_batch, requery):
    model = build_model("resnet20", 10, None)
    model.load_state_dict(cifar_model.state_dict())
    oracle = _RejectingOracle(cifar_model)
    settings = {**PROTOCOL_SETTINGS["mahmood2021"], "jacobian_rounds": 2, "epochs": 1, "train_batch": 32,
                "requery": requery}
    train_mixed(model, oracle, cifar_batch[0][:24], settings, seed=0, batch_size=32, progress=False)
    assert len(oracle.sizes) == 3 and oracle.sizes[0] == 24
    if requery:  # FilterData on [old set, augmented copies] (AttackWrappersBlackBox.py L187-189)
        assert oracle.sizes[1:] == [2 * oracle.kept[0], 2 * oracle.kept[1]]
    else:  # only the new points, appended to the kept ones
        assert oracle.sizes[1:] == [oracle.kept[0], oracle.kept[0] + oracle.kept[1]]
    assert oracle.queries == sum(oracle.sizes)


def _table(rows: list[tuple]) -> pd.DataFrame:
    cols = ["surrogate", "data_fraction", "attack", "asr", "detector", "defense_acc", "vanilla_acc", "improvement",
            "n"]
    return pd.DataFrame(rows, columns=cols).assign(protocol="strong")


@pytest.mark.parametrize("rows, expected", [
    ([("pure", 100, "fgsm", 20.0, "msp", 85.0, 80.0, 5.0, 50), ("pure", 100, "mim", 30.0, "msp", 72.0, 70.0, 2.0, 50)],
     ["pure surrogate, 100 % of the training data (up to 50 attacked test images): transfer ASR fgsm 20.0 %, mim "
      "30.0 %; defense accuracy improvement MSP on fgsm +5.0 points, MSP on mim +2.0 points."]),
    ([("mixed", 25, "fgsm", 0.0, "msp", 100.0, 100.0, 0.0, 40)],
     ["mixed surrogate, 25 % of the training data (up to 40 attacked test images): transfer ASR fgsm 0.0 %; defense "
      "accuracy improvement MSP on fgsm +0.0 points."]),
    ([("mixed", 25, "fgsm", 30.0, "", 70.0, 70.0, 0.0, 40), ("mixed", 25, "fgsm", 40.0, "knn", 64.0, 70.0, -6.0, 38)],
     ["mixed surrogate, 25 % of the training data (up to 40 attacked test images): transfer ASR fgsm 30.0 %; defense "
      "accuracy improvement KNN on fgsm -6.0 points."]),
    ([("mixed", 1, "fgsm", np.nan, "msp", np.nan, np.nan, np.nan, 0)],
     ["mixed surrogate, 1 % of the training data (up to 0 attacked test images): nothing to attack."]),
    ([("pure", 100, "pgd", 10.0, "", 90.0, 90.0, 0.0, 30)],
     ["pure surrogate, 100 % of the training data (up to 30 attacked test images): transfer ASR pgd 10.0 %."]),
])
def test_read_transfer_sentences_follow_the_numbers(rows, expected):
    """Each attack's and detector's number as the table holds it; none called the highest or the most (no paired
    test; issue 40)."""
    assert read_transfer(_table(rows)) == expected


@pytest.mark.parametrize("protocol, deviations, says", [
    ("strong", np.nan, ["the adversary is ours (protocol strong)", "not comparable"]),
    ("mahmood2021", "epochs=1 (authors 10)", ["its own adversary", "can be negative",
                                              "Deviations from the authors' adversary: epochs=1 (authors 10)."]),
])
def test_report_section_names_whose_adversary_it_is(protocol, deviations, says):
    table = _table([("pure", 100, "fgsm", 10.0, "msp", 95.0, 90.0, 5.0, 50)]).assign(protocol=protocol,
                                                                                     deviations=deviations)
    section = transfer_section(table)
    text = " ".join(i.text for i in section.items if isinstance(i, Paragraph))
    assert section.title == "Black-box transfer" and all(s in text for s in says)
    assert "deviations" not in next(i.frame for i in section.items if isinstance(i, Table)).columns


# -------------------------------------------------------------------------------------------- end to end


def _config(out: Path, data_root: Path, params: dict) -> dict:
    cfg = thaw(load_config("cifar10_resnet20")[0])
    cfg["data"]["ood"] = []
    cfg["data"]["fit_limit"] = FIT
    cfg["evaluators"] = []
    cfg["analysis_params"] = {"transfer": params}
    return apply_overrides(cfg, data_root=str(data_root), attack="fgsm", detectors="msp,mds",
                           analysis="transfer", limit=64, out=str(out))


def _cache_files(cache: Path) -> set[str]:
    return {str(p.relative_to(cache)) for d in ("surrogates", "transfer_adv") for p in (cache / d).rglob("*")
            if p.is_file() and not p.name.endswith(".lock")}


@pytest.fixture(scope="module")
def cifar_run(tmp_path_factory, data_root, session_cache):
    """The pipeline on 64 CIFAR-10 test images and a :data:`FIT`-image fit set: pure + mixed 50 % / 100 %
    surrogates."""
    out = tmp_path_factory.mktemp("transfer")
    ctx = run(_config(out, data_root, PARAMS), progress=False)
    return ctx, pd.read_csv(out / "transfer.csv"), _cache_files(session_cache)


@pytest.fixture(scope="module")
def mahmood_run(cifar_run, tmp_path_factory):
    """The authors' adversary (shrunk, :data:`MAHMOOD`) on the same run, its fit set cut to :data:`MAHMOOD_FIT`
    images: pure + 5 % mixed, vanilla and per detector."""
    ctx, _, _ = cifar_run
    out = tmp_path_factory.mktemp("mahmood")
    ctx = dataclasses.replace(ctx, out=out, fit_set=Subset(ctx.fit_set, np.arange(MAHMOOD_FIT)),
                              plan=ctx.plan.replace(protocol="mahmood2021", cache_dir=str(out / "cache")))
    table = TransferAnalysis(**MAHMOOD)(ctx)["transfer.csv"]
    return ctx, table


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
    assert df[df.surrogate == "pure"].query_detector.isna().all()  # read back from an empty cell
    assert (df[df.surrogate == "mixed"].query_detector == "msp").all()  # the run's first detector


def test_strong_compares_every_detector_on_the_same_examples(cifar_run):
    ctx, df, _ = cifar_run
    assert ctx.clean.accuracy < 95  # the trained ResNet-20 gets some of the pack's test images wrong
    np.testing.assert_allclose(df.undefended_acc, 100.0 - df.asr, atol=1e-4)  # the CSV keeps 6 digits
    np.testing.assert_allclose(df.vanilla_acc, df.undefended_acc)
    assert (df.defense_acc <= 100).all() and (df.improvement >= 0).all()


def test_queries_pure_none_mixed_grow_with_the_fraction(cifar_run):
    _, df, _ = cifar_run
    assert (df[df.surrogate == "pure"].queries == 0).all()
    mixed = df[df.surrogate == "mixed"].groupby("data_fraction").queries.agg(["min", "max"])
    assert (mixed["min"] == mixed["max"]).all()  # one count per surrogate
    q50, q100 = mixed.loc[50, "min"], mixed.loc[100, "min"]
    # FIT / 2 (resp. FIT) fit images plus one Jacobian round over as many of the accepted ones
    assert FIT // 2 < q50 <= FIT and FIT < q100 <= 2 * FIT


def test_metrics_are_in_range(cifar_run):
    _, df, _ = cifar_run
    assert df.asr.between(0, 100).all() and df.asr.max() > 0
    np.testing.assert_allclose(df.improvement, df.defense_acc - df.vanilla_acc, atol=1e-4)  # 6 digits in the CSV
    assert df.auroc.between(0, 100).all() and df.fpr95.between(0, 100).all()
    # the target is the same for every detector: its accuracy does not depend on the detector
    assert df.groupby(["surrogate", "data_fraction", "attack"]).undefended_acc.nunique().eq(1).all()
    assert (df.surrogate_acc > 25).all()  # chance is 10 %


def test_second_run_reuses_surrogates_and_examples(cifar_run, tmp_path, data_root, session_cache, monkeypatch):
    _, df, files = cifar_run

    def refuse(*args, **kwargs):
        raise AssertionError("a cached surrogate was trained or queried again")

    monkeypatch.setattr(transfer, "train_pure", refuse)
    monkeypatch.setattr(transfer, "train_mixed", refuse)
    monkeypatch.setattr(adversary.Oracle, "__call__", refuse)
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


def test_query_detector_is_strongs_only(cifar_run):
    ctx, _, _ = cifar_run
    with pytest.raises(UsageError, match="query_detector 'msp' applies to protocol strong.*valid choices: null"):
        TransferAnalysis(query_detector="msp")(dataclasses.replace(ctx, plan=ctx.plan.replace(protocol="mahmood2021")))


def test_surrogate_is_a_real_model_of_the_target_input_format(cifar_run, session_cache):
    ctx, _, _ = cifar_run
    path = next((session_cache / "surrogates").glob("*.pt"))
    model = build_model("democnn", 10, path, mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225], in_channels=3,
                        input_size=32)
    assert model(torch.rand(2, 3, 32, 32)).shape == (2, 10)


def test_mahmood2021_runs_each_defense_against_its_own_adversary(mahmood_run):
    ctx, got = mahmood_run
    assert list(got.columns) == CSV_COLUMNS and (got.protocol == "mahmood2021").all()
    keys = set(zip(got.surrogate, got.data_fraction, got.query_detector, got.detector))
    assert keys == {("pure", 100.0, "", ""), ("pure", 100.0, "", "msp"), ("pure", 100.0, "", "mds"),
                    ("mixed", 5.0, "", ""), ("mixed", 5.0, "msp", "msp"), ("mixed", 5.0, "mds", "mds")}
    assert len(got) == 2 * len(keys) and set(got.attack) == {"fgsm", "bim"}
    assert np.allclose(got.eps, 0.05)  # DefaultMethodsVanilla.py L39-42, not our 8/255
    np.testing.assert_allclose(got.undefended_acc, 100.0 - got.asr)
    np.testing.assert_allclose(got.improvement, got.defense_acc - got.vanilla_acc)
    for (surrogate, attack), part in got.groupby(["surrogate", "attack"]):
        vanilla = part[part.detector == ""].iloc[0]
        assert vanilla.improvement == 0 and (part.vanilla_acc == vanilla.undefended_acc).all()
    pure = got[got.surrogate == "pure"]
    assert (pure.n == 20).all() and (pure.queries == 0).all() and (pure.improvement >= 0).all()
    mixed = got[got.surrogate == "mixed"]
    # 5 % of the fit images; one round doubles the set and queries it all again (all accepted: no detector)
    held = MAHMOOD_FIT // 20
    assert (mixed[mixed.detector == ""].queries == held + 2 * held).all()
    assert mixed[mixed.detector != ""].queries.between(held + 2, held + 2 * held).all()


def test_mahmood2021_adversaries_attack_the_rows_their_oracle_gets_right(mahmood_run):
    ctx, _ = mahmood_run
    with np.load(ctx.out / SAMPLES_FILE) as d:
        rows = {k: d[k] for k in d.files if k.endswith(".rows")}
    correct = ctx.clean.pred == ctx.clean.y
    np.testing.assert_array_equal(rows["a0.rows"], np.arange(20))  # pure: the first 20 test images
    np.testing.assert_array_equal(rows["a1.rows"], np.flatnonzero(correct)[:20])  # vanilla mixed
    for key, det in (("a2.rows", "msp"), ("a3.rows", "mds")):  # each detector's mixed adversary
        accepted = ctx.scores[det]["id"] >= id_threshold(ctx.scores[det]["id"])
        np.testing.assert_array_equal(rows[key], np.flatnonzero(correct & accepted)[:20])
    assert not np.array_equal(rows["a1.rows"], rows["a3.rows"])  # MDS rejects some clean-correct images


def test_mahmood2021_lists_every_deviation_from_the_authors_code(mahmood_run):
    ctx, got = mahmood_run
    for row in got.itertuples():
        items = row.deviations.split("; ")
        assert {"epochs=1 (authors 10)", "pure_epochs=1 (authors 100)", "jacobian_rounds=1 (authors 3)",
                "limit=20 (authors 1000)", "fractions=[5] (authors [1, 25, 50, 75, 100])",
                "attacks=[fgsm, bim] (authors [fgsm, bim, mim, pgd, cw])"} <= set(items)
        assert not any(i.startswith("dataset") for i in items)  # the pack's CIFAR-10 is the authors' dataset
        assert f"adversary data: {MAHMOOD_FIT} training images (authors 50000)" in items
        assert "test images: a seeded subset of 64, in test-set order (authors: the whole test set in order)" in items
        assert set(FIXED_DEVIATIONS) <= set(items)
        assert any(i.startswith("pure surrogate: 1 epochs") for i in items) == (row.surrogate == "pure")
    surrogate = next((ctx.plan.cache / "surrogates").glob("*.pt"))
    CWCNN(10, 3, 32).load_state_dict(torch.load(surrogate, weights_only=True)["state_dict"])  # the authors' network


# ------------------------------------------------------------------------------------------------ verify


@pytest.fixture
def run_files():
    """``run_files(folder)``: the run folder as the verify hook reads it."""
    from advopenood.evaluation.verify import RunFiles

    return RunFiles.open


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("transfer.csv", SAMPLES_FILE, "run.json"):
        if (src / name).is_file():
            shutil.copy(src / name, dst / name)
    return dst


@pytest.mark.parametrize("which", ["strong", "mahmood2021"])
def test_verify_rederives_an_untouched_table(cifar_run, mahmood_run, run_files, tmp_path, which):
    if which == "strong":
        folder = cifar_run[0].out
    else:
        ctx, table = mahmood_run
        folder = _copy(cifar_run[0].out, tmp_path)  # run.json
        table.to_csv(folder / "transfer.csv", index=False, float_format="%.6g")  # as the pipeline writes it
        shutil.copy(ctx.out / SAMPLES_FILE, folder / SAMPLES_FILE)
    assert verify(run_files(folder)) == []


@pytest.mark.parametrize("column, delta", [("asr", 0.5), ("defense_acc", -1.0), ("vanilla_acc", 2.0),
                                           ("improvement", 0.01), ("auroc", 0.3), ("n", 1), ("queries", 1)])
def test_verify_fails_when_one_number_changes(cifar_run, run_files, tmp_path, column, delta):
    folder = _copy(cifar_run[0].out, tmp_path)
    table = pd.read_csv(folder / "transfer.csv")
    row = table.index[(table.surrogate == "mixed") & table.auroc.notna()][0]
    table.loc[row, column] += delta
    table.to_csv(folder / "transfer.csv", index=False, float_format="%.6g")
    lines = verify(run_files(folder))
    assert len(lines) == 1 and f" {column}: written" in lines[0] and "'mixed'" in lines[0]


def test_verify_checks_the_rows_each_adversary_attacked(cifar_run, mahmood_run, run_files, tmp_path):
    ctx, table = mahmood_run
    _copy(cifar_run[0].out, tmp_path)
    table.to_csv(tmp_path / "transfer.csv", index=False, float_format="%.6g")
    with np.load(ctx.out / SAMPLES_FILE) as d:
        arrays = {k: d[k] for k in d.files}
    arrays["a3.rows"] = arrays["a1.rows"]  # MDS's adversary on the vanilla adversary's images
    np.savez(tmp_path / SAMPLES_FILE, **arrays)
    lines = verify(run_files(tmp_path))
    assert any("adversary 'mixed 5 mds'" in line and "its rule selects" in line for line in lines)


def test_verify_reports_missing_samples(cifar_run, run_files, tmp_path):
    folder = _copy(cifar_run[0].out, tmp_path)
    (folder / SAMPLES_FILE).unlink()
    assert verify(run_files(folder)) == [f"transfer.csv: {SAMPLES_FILE} is missing; the table cannot be re-derived"]


def test_verify_rerenders_the_transfer_section(cifar_run, tmp_path):
    """Issue 49, item 2: a sentence added to the transfer section passed, the section taken as saved; verify renders
    it again from transfer.csv."""
    assert_section_rerendered(cifar_run[0].out, tmp_path, "Black-box transfer")
