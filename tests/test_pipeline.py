"""End to end on real data: the embedded demo, the CIFAR-10 pack, resume/determinism, PNG export."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest
from PIL import Image

from advopenood.evaluation.metrics import MIN_CONCLUSIVE
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
    """Every output holds what it must: asr.csv and ood.csv their rows, table_ood.csv/.md ood.csv's cells per
    detector, gradcam.csv every attack, run.json the clean accuracy, the reports their title and sections."""
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
    table = pd.read_csv(demo_run / "table_ood.csv").set_index("detector")
    pgd = ood[ood.ood_set == "pgd"].set_index("detector")
    assert sorted(table.index) == sorted(set(ood.detector))
    assert list(table[f"{ood.dataset.iloc[0]} pgd AUROC"]) == pytest.approx(list(pgd.loc[table.index, "auroc"]),
                                                                           abs=1e-3)
    markdown = (demo_run / "table_ood.md").read_text().splitlines()
    assert markdown[0].startswith("| detector | ") and [r.split(" | ")[0] for r in markdown[2:]] == [
        f"| {det}" for det in table.index]
    cams = pd.read_csv(demo_run / "gradcam.csv")
    assert set(cams.attack) == set(asr.attack) and cams.l2.ge(0).all() and cams.ssim.between(-1, 1).all()
    info = json.loads((demo_run / "run.json").read_text())
    assert info["clean_acc"] == pytest.approx(asr.clean_acc.iloc[0], abs=0.01) and info["sample"]["n_id"] == 150
    for report in ("report.md", "report.html"):
        text = (demo_run / report).read_text()
        assert all(t in text for t in ("advopenood report: demo", "Attack success rates", "OOD detection")), report


@pytest.mark.parametrize("ood_set", ["textures", "blobs", "inverted"])
def test_demo_detects_natural_ood(demo_run, ood_set):
    ood = pd.read_csv(demo_run / "ood.csv")
    auroc = ood[(ood.attack == "none") & (ood.ood_set == ood_set)].set_index("detector").auroc
    assert len(auroc) == len(registry.parse_names("detectors", "all")) and (auroc > 80).sum() >= 12, auroc.sort_values().to_dict()
    # each of these separates the set: its whole 95 % interval lies well above chance (the point estimates sit near 80
    # and move by a point with the demo network's training, which depends on the machine's threads and BLAS)
    lower = ood[(ood.attack == "none") & (ood.ood_set == ood_set)].set_index("detector").auroc_lo
    assert (lower[["msp", "mls", "odin", "gen", "knn", "mds", "vim"]] > 70).all(), lower.to_dict()


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
        grid = mpimg.imread(demo_run / "plots" / f"gradcam_examples_{attack}.png")  # a drawn grid, not an empty file
        assert grid.ndim == 3 and min(grid.shape[:2]) > 100 and grid.std() > 0, attack
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
                 "--attack", "pgd,df", "--limit", "50", "--out", str(out), "--quiet"]) == 0
    asr = pd.read_csv(out / "asr.csv").set_index("attack")
    assert (asr.n == 50).all()
    assert asr.loc["pgd", "asr"] >= 99 and asr.loc["df", "asr"] == 100  # on 50 images: every correct one fooled
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
    for entry in entries:  # each listed image is the 8-bit PNG of a digit at the demo's size, labelled 0-9
        path, label = entry.split()
        image = np.asarray(Image.open(out / "openood" / "images_classic" / path))
        assert image.dtype == np.uint8 and image.shape[:2] == (16, 16) and image.std() > 0 and 0 <= int(label) <= 9


# ------------------------------------------------------------------------------- a report that fits a reader

def _tables(page: str) -> list[list[list[str]]]:
    """Every ``<table>`` of an HTML page as rows of cell texts (header row first)."""
    import html
    import re

    return [[[html.unescape(c) for c in re.findall(r"<t[hd]>(.*?)</t[hd]>", row, re.S)]
             for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)]
            for body in re.findall(r"<table>(.*?)</table>", page, re.S)]


def _rank_ranges(paired: pd.DataFrame, ood_set: str, detectors: list[str]) -> dict[str, str]:
    """Each detector's rank range on ``ood_set`` from paired.csv, counted here: 1 + the detectors shown better, to n -
    the detectors shown worse, shown by the simultaneous test (Holm-adjusted ``p_holm`` below 0.05, issue 50)."""
    part = paired[(paired["ood_set"] == ood_set) & (paired["p_holm"] < 0.05)]
    out = {}
    for d in detectors:
        won = ((part["detector_a"] == d) & (part["delta_auroc"] > 0)) | ((part["detector_b"] == d) &
                                                                        (part["delta_auroc"] < 0))
        lost = ((part["detector_a"] == d) | (part["detector_b"] == d)) & ~won
        best, worst = 1 + int(lost.sum()), len(detectors) - int(won.sum())
        out[d] = f"#{best}" if best == worst else f"#{best}-{worst}"
    return out


def test_the_report_opens_on_the_headline_table_and_stays_small(demo_run):
    """report.html of a real demo run (every detector, four attacks, Grad-CAM) is under 500 KB; after the title and
    what ran comes the headline table (AUROC [interval] and the rank from the paired tests, every detector x set,
    as ood.csv and paired.csv hold them), before any other table or folded section; the paired table shows its top
    rows and links paired.csv; report.md keeps every reading."""
    page = (demo_run / "report.html").read_text()
    assert len(page.encode()) < 500_000
    from advopenood.outputs.report import TOP_ROWS, name
    from advopenood.outputs.results import read_sections

    body = page.split("<body>", 1)[1]
    first = body.index("<table>")
    assert "What ran" in body[:first] and "<h2>AUROC per detector and set</h2>" in body[:first]
    assert first < body.index("<details") and body[:first].count("<h2>") == 1
    ood, paired = pd.read_csv(demo_run / "ood.csv"), pd.read_csv(demo_run / "paired.csv")
    head = _tables(page)[0]
    sets = list(dict.fromkeys(ood["ood_set"]))
    assert head[0] == ["detector", *[name(str(s)) for s in sets]]  # the report's one spelling (issue 50)
    detectors = sorted(ood["detector"].unique())
    assert sorted(r[0] for r in head[1:]) == sorted(name(d) for d in detectors)
    for s, column in zip(sets, zip(*[r[1:] for r in head[1:]])):
        ranks = _rank_ranges(paired, s, detectors)
        cells = dict(zip([r[0] for r in head[1:]], column))
        for r in ood[ood["ood_set"] == s].to_dict("records"):
            # no rank on a set with fewer than MIN_CONCLUSIVE images on a side (issue 50)
            rank = "" if min(r["n_id"], r["n_ood"]) < MIN_CONCLUSIVE else f" {ranks[r['detector']]}"
            assert cells[name(r["detector"])] == f"{r['auroc']:.1f} [{r['auroc_lo']:.1f}, {r['auroc_hi']:.1f}]{rank}"
    shown = next(t for t in _tables(page) if t[0][:3] == ["detector_a", "detector_b", "ood_set"])
    assert len(shown) == TOP_ROWS + 1 < len(paired) and '<a href="paired.csv">' in page
    md = (demo_run / "report.md").read_text()
    for section in read_sections(demo_run):
        for item in section.items:
            for line in getattr(item, "items", ()):
                assert f"- {line}" in md


def test_tables_tex_holds_the_headline_tables_each_on_a_page(demo_run):
    """tables.tex by default: the headline table (split by columns into floats that fit a column) and asr.csv with
    budgets as k/255; no float longer than a page (PAGE_ROWS rows, two lines each where it holds intervals)."""
    import re

    tex = (demo_run / "tables.tex").read_text()
    floats = re.findall(r"\\begin\{table\}.*?\\caption\{(.*?)\}.*?\\midrule\n(.*?)\\bottomrule", tex, re.S)
    assert floats[-1][0].startswith("asr.csv") and "paired.csv" not in tex and "longtable" not in tex
    from advopenood.outputs.latex import PAGE_ROWS

    heads = [c for c, _ in floats if c.startswith("AUROC per detector and set")]
    sets = pd.read_csv(demo_run / "ood.csv")["ood_set"].unique()
    from advopenood.claims import name as display  # the report's one spelling (issue 50)

    assert heads and all(f"{{{display(str(s))}}}" in tex for s in sets)
    for _, rows in floats:
        assert 0 < rows.count("\\\\") <= 2 * PAGE_ROWS
    asr = "".join(c + r for c, r in floats if c.startswith("asr.csv"))
    assert "16/255" in asr and "0.0627" not in asr
