"""End to end on real data: the embedded demo, the CIFAR-10 pack, resume/determinism, PNG export."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from advopenood.models.specs import as_model_spec
from advopenood import registry
from advopenood.cli.main import main
from advopenood.data.datasets import build_dataset, limit_dataset
from advopenood.models.demo import DEMO_MODEL
from advopenood.models.classifier import build_from_config
from advopenood.models.training import train_classifier
from advopenood.errors import UsageError
from advopenood.outputs.plots import pick_examples

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory, session_cache) -> Path:
    out = tmp_path_factory.mktemp("demo")
    assert main(["demo", "--limit", "150", "--out", str(out), "--quiet"]) == 0
    return out


def test_demo_writes_every_output(demo_run):
    for name in ("asr.csv", "ood.csv", "table_ood.md", "table_ood.csv", "gradcam.csv", "report.md", "report.html",
                 "run.json"):
        assert (demo_run / name).is_file(), name
    asr = pd.read_csv(demo_run / "asr.csv")
    assert list(asr.columns) == ["dataset", "arch", "attack", "eps", "n", "clean_acc", "clean_acc_lo", "clean_acc_hi",
                                 "asr", "asr_lo", "asr_hi",
                                 "asr_all", "asr_all_lo", "asr_all_hi", "ci", "mean_linf", "mean_l2", "seed", "source",
                                 "protocol"]
    assert (asr.source == "id").all()
    assert set(asr.attack) == {"fgsm", "pgd", "df", "mpgd"} and (asr.n == 150).all()
    assert asr.clean_acc.iloc[0] > 95
    by = asr.set_index("attack")
    assert by.loc["df", "asr"] == 100 and by.loc["pgd", "asr"] >= by.loc["fgsm", "asr"]
    assert by.loc["pgd", "mean_linf"] <= 16 / 255 + 1e-6
    ood = pd.read_csv(demo_run / "ood.csv")
    assert set(ood.ood_set) >= {"textures", "blobs", "inverted", "fgsm", "pgd", "df", "mpgd"}
    assert set(ood.detector) == set(registry.parse_names("detectors", "all"))  # the 16 built-ins, any plugin's


@pytest.mark.parametrize("ood_set", ["textures", "blobs", "inverted"])
def test_demo_detects_natural_ood(demo_run, ood_set):
    ood = pd.read_csv(demo_run / "ood.csv")
    auroc = ood[(ood.attack == "none") & (ood.ood_set == ood_set)].set_index("detector").auroc
    assert len(auroc) == len(registry.parse_names("detectors", "all")) and (auroc > 80).sum() >= 12, auroc.sort_values().to_dict()
    assert (auroc[["msp", "mls", "odin", "gen", "knn", "mds", "vim"]] > 80).all(), auroc.to_dict()


def test_pgd_defeats_the_demos_logit_detectors(demo_run):
    ood = pd.read_csv(demo_run / "ood.csv")
    auroc = ood[ood.attack == "pgd"].set_index("detector").auroc
    assert (auroc[["msp", "mls", "ebo", "odin", "gen"]] < 50).all(), auroc.to_dict()
    assert (auroc[["mds", "gram"]] > 80).all(), auroc.to_dict()


def test_example_grid_rows_are_clean_correct(demo_run):
    cams = pd.read_csv(demo_run / "gradcam.csv")
    wrong = cams[cams.clean_pred != cams.y]
    assert len(wrong) and wrong.success.all()  # misclassified clean images count as successful attacks
    for attack, frame in cams.groupby("attack"):
        picks = pick_examples(frame, 6)
        assert len(picks) == 6 and (picks.clean_pred == picks.y).all() and picks.success.all(), attack
        assert not set(picks["index"]) & set(wrong["index"])
        assert (demo_run / "plots" / f"gradcam_examples_{attack}.png").is_file()
    assert pick_examples(wrong, 6).empty


def test_demo_config_trains_the_demo_model(demo_run):
    info = json.loads((demo_run / "run.json").read_text())
    assert {k: info["config"]["model"][k] for k in DEMO_MODEL} == DEMO_MODEL


def test_negative_mixup_is_a_usage_error():
    digits = limit_dataset(build_dataset({"kind": "demo", "name": "digits", "split": "train"}, None, 1, 16), 8, 0)
    with pytest.raises(UsageError, match="mixup"):
        train_classifier(build_from_config(as_model_spec(DEMO_MODEL), None, "cpu"), digits, {**DEMO_MODEL["train"], "mixup": -1},
                         0, progress=False)


def test_run_json_records_seed_versions_and_keys(demo_run):
    info = json.loads((demo_run / "run.json").read_text())
    assert info["seed"] == 0 and {"torch", "foolbox", "advopenood"} <= set(info["versions"])
    assert {a["key"] for a in info["attacks"].values()} and info["attack_work"]["shards_generated"] >= 4


def test_second_identical_run_does_no_attack_work_and_is_identical(demo_run, tmp_path):
    out = tmp_path / "again"
    assert main(["demo", "--limit", "150", "--out", str(out), "--quiet", "--analysis", ""]) == 0
    info = json.loads((out / "run.json").read_text())
    assert info["attack_work"]["shards_generated"] == 0 and info["attack_work"]["shards_reused"] >= 4
    for name in ("asr.csv", "ood.csv"):
        assert (out / name).read_text() == (demo_run / name).read_text(), name


def test_cifar_pack_reaches_the_papers_asr(data_root, tmp_path, session_cache):
    out = tmp_path / "cifar"
    assert main(["attack", "--config", str(REPO / "configs" / "cifar10_resnet20.yaml"), "--data-root", str(data_root),
                 "--attack", "pgd,df", "--limit", "200", "--out", str(out), "--quiet"]) == 0
    asr = pd.read_csv(out / "asr.csv").set_index("attack")
    assert asr.loc["pgd", "asr"] >= 99 and asr.loc["df", "asr"] == 100
    assert 80 < asr.loc["pgd", "clean_acc"] < 95


def test_png_export_writes_openood_lists_and_rechecks(tmp_path, session_cache, capsys):
    out = tmp_path / "export"
    assert main(["attack", "--config", "demo", "--attack", "pgd", "--limit", "40", "--out", str(out), "--quiet",
                 "--export-png"]) == 0
    lines = [l for l in capsys.readouterr().out.splitlines() if "survive 8-bit rounding" in l]
    assert len(lines) == 1
    survive, total = (int(v) for v in lines[0].split(" - ")[1].split(" successful")[0].split(" of "))
    assert 0 < survive <= total <= 40
    imglist = out / "openood" / "benchmark_imglist" / "digits" / "test_adv_pgd.txt"
    entries = imglist.read_text().splitlines()
    assert len(entries) == 40
    assert (out / "openood" / "images_classic" / entries[0].split()[0]).is_file()
