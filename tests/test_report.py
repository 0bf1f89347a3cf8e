"""Plots and the readable report, on the outputs of a real tiny run (ResNet-20, a few CIFAR-10 images), and the
report's plugin-free rendering of saved sections (no data needed)."""
from __future__ import annotations

import base64
import json
import math
import re
import time
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import roc_auc_score

from conftest import SMALL_DEMO, make_plan
from advopenood import io as aio
from advopenood import registry
from advopenood import outputs
from advopenood.run.detect import write_scores
from advopenood.evaluation.context import CleanRecord, RunContext
from advopenood.data.datasets import build_dataset, limit_dataset, make_loader, stack
from advopenood.models.classifier import weights_hash
from advopenood.outputs.results import Bullets, Figure, Results, Paragraph, Section, Table
from advopenood.outputs.plots import ood_matrix, plot_roc, roc_sets
from advopenood.claims import STATED, Claim
from advopenood.outputs.report import asr_section, build_report, eps_label, read_asr, write_report
from advopenood.outputs.report import name as display_name
from advopenood.attacks.store import AdvStore
from advopenood.provenance import library_versions
from advopenood_plugins.analyses.bintest.report import bintest_section, read_bintest
from advopenood_plugins.analyses.gradcam.report import read_gradcam
from advopenood.evaluation.metrics import MIN_CONCLUSIVE
from advopenood_plugins.evaluators.ood.report import compare_natural_adversarial, ood_plots, read_ood

CPU = torch.device("cpu")
N = 48


def _confidences(model, batches) -> dict[str, np.ndarray]:
    """MSP, MLS and energy (EBO) confidences from one pass over ``(x, y)`` batches."""
    logits = []
    with torch.no_grad():
        for x, _ in batches:
            logits.append(model(x))
    z = torch.cat(logits)
    return {"msp": z.softmax(1).amax(1).numpy(), "mls": z.amax(1).numpy(), "ebo": torch.logsumexp(z, 1).numpy()}


@pytest.fixture(scope="module")
def tiny_run(cifar_model, data_root, tmp_path_factory):
    """A real run's output folder: FGSM / PGD / DeepFool on 48 CIFAR-10 images, MSP / MLS / EBO scored
    against them and 48 Textures images, then the ood and mead evaluators, gradcam and a small bintest."""
    t0 = time.perf_counter()
    out = tmp_path_factory.mktemp("report_run")
    cifar = build_dataset({"kind": "npz", "path": "cifar10_test.npz", "name": "cifar10"}, data_root, 3, 32)
    texture = build_dataset({"kind": "npz", "path": "texture_test.npz", "name": "texture"}, data_root, 3, 32)
    id_set, ood_set = limit_dataset(cifar, N, 0), limit_dataset(texture, N, 0)
    attacks = {"fgsm": registry.get("attacks", "fgsm")(eps=8 / 255),
               "pgd": registry.get("attacks", "pgd")(eps=8 / 255, steps=10),
               "df": registry.get("attacks", "df")(steps=20)}
    for name, attack in attacks.items():
        attack.name = name  # the store records attack.name, which the built-in classes leave empty (see report)
    store = AdvStore(out.parent / "store")
    adv_sets = {name: store.generate(id_set, cifar_model, attack, model_hash=weights_hash(cifar_model), seed=0,
                                     device=CPU, progress=False) for name, attack in attacks.items()}
    x, y = stack(id_set)
    with torch.no_grad():
        pred = cifar_model(x).argmax(1).numpy()
    per_set = {"id": _confidences(cifar_model, make_loader(id_set, 16)),
               "texture": _confidences(cifar_model, make_loader(ood_set, 16))}
    per_set.update({name: _confidences(cifar_model, adv.iter_batches(16)) for name, adv in adv_sets.items()})
    scores = {det: {s: per_set[s][det] for s in per_set} for det in ("msp", "mls", "ebo")}
    plan = make_plan(name="tiny", data={"dataset": "cifar10", "id": {"kind": "demo"}}, attacks=list(attacks), batch_size=N)
    ctx = RunContext(plan=plan, out=out, model=cifar_model, id_set=id_set, fit_set=id_set, ood_sets={"texture": ood_set}, adv_sets=adv_sets,
                     clean=CleanRecord(y.numpy(), pred), backend="builtin", scores=scores,
                     progress=False)
    plugins = [registry.get("evaluators", "ood")(), registry.get("evaluators", "mead")(),
               registry.get("analyses", "gradcam")(n_examples=2),
               registry.get("analyses", "bintest")(n_inner=40, n_random=20, limit=2, attacks=["pgd"], progress=False)]
    write_scores(ctx)  # the core's step before the evaluators
    results = [plugin(ctx) for plugin in plugins]
    clean_acc = float(100 * np.mean(pred == y.numpy()))
    asr = []
    for name, adv in adv_sets.items():
        r = adv.records
        correct, success = (r.clean_pred == r.y).to_numpy(), r.success.to_numpy(bool)
        asr.append({"dataset": "cifar10", "arch": "resnet20", "attack": name, "eps": adv.eps, "n": len(r),
                    "clean_acc": clean_acc, "asr": 100 * success[correct].mean(), "asr_all": 100 * success.mean(),
                    "mean_linf": r.linf[success].mean(), "mean_l2": r.l2[success].mean(), "seed": 0})
    aio.write_csv(out / "asr.csv", pd.DataFrame(asr))
    sections = [asr_section(pd.DataFrame(asr))]
    for label, result in zip(("ood", "mead", "gradcam", "bintest"), results):
        sections += outputs.collect(out, result, "strong", label)
    outputs.write_sections(out, sections)
    aio.write_json(out / "run.json", {
        "config": plan.dump(), "seed": 0, "versions": library_versions(), "clean_acc": clean_acc,
        "model": {"arch": "resnet20", "weights_sha256": weights_hash(cifar_model)},
        "data": {"id": id_set.identity()},
        "attacks": {k: {"attack": k, "key": a.key, "params": a.params, **a.stats} for k, a in adv_sets.items()},
        "timings_s": {"total": time.perf_counter() - t0}})
    return out, results[0].figures, write_report(out)


def test_ood_evaluator_writes_heatmap_and_roc(tiny_run):
    out, plots, _ = tiny_run
    assert [p.name for p in plots] == ["auroc_heatmap.png", "roc_msp.png"]
    for path in plots:
        img = mpimg.imread(path)
        assert img.shape[0] > 250 and img.shape[1] > 250 and img[..., :3].std() > 0.05


def test_heatmap_table_and_roc_agree_with_ood_csv(tiny_run):
    out, _, _ = tiny_run
    ood = pd.read_csv(out / "ood.csv")
    table = ood_matrix(ood, "auroc")
    assert list(table.index) == ["msp", "mls", "ebo"]
    assert list(table.columns) == ["texture", "fgsm", "pgd", "df"] and table.attrs["n_natural"] == 1
    with np.load(out / "scores" / "msp.npz") as data:
        conf_id, conf_ood, adversarial = roc_sets({k: data[k] for k in data.files})
    assert adversarial == ["fgsm", "pgd", "df"]
    for name, conf in conf_ood.items():
        labels = np.r_[np.zeros(len(conf_id)), np.ones(len(conf))]
        auroc = 100 * roc_auc_score(labels, -np.r_[conf_id, conf])
        assert auroc == pytest.approx(table.loc["msp", name], rel=1e-5)  # ood.csv keeps 6 digits


def test_report_has_every_section_and_readings_match_the_numbers(tiny_run):
    out, _, md_path = tiny_run
    md = md_path.read_text()
    for heading in ("# advopenood report: tiny", "## Run", "## Attack success rates", "## OOD detection",
                    "## MEAD worst case", "## Binarization test", "## Grad-CAM attention shift"):
        assert heading in md
    ood = pd.read_csv(out / "ood.csv")
    section = md.split("## OOD detection", 1)[1].split("\n## ", 1)[0]  # the readings of ood.csv
    for attack, part in ood[ood["attack"] != "none"].groupby("attack"):
        below = sorted(d.upper() for d, a in zip(part["detector"], part["auroc"]) if a < 50)
        line = next(s for s in section.splitlines() if re.match(rf"- .*\b[Oo]n {attack.upper()}\b", s))
        n_id, n_ood = int(part["n_id"].min()), int(part["n_ood"].min())
        if min(n_id, n_ood) < MIN_CONCLUSIVE:  # a small sample: its range, and no conclusion
            assert line.startswith(f"- On {attack.upper()}, {n_id} ID and {n_ood} OOD images are too few to "
                                   "conclude") and "below chance" not in line
            continue
        if not below:
            assert line.startswith(f"- No detector falls below chance on {attack.upper()}")
        elif len(below) == len(part):
            assert line.startswith(f"- On {attack.upper()} every detector falls below chance")
        else:
            named = re.match(r"- (.*) falls? below chance", line).group(1)
            assert sorted(re.split(r", | and ", named)) == below
    asr = pd.read_csv(out / "asr.csv")
    bounded = asr[asr["eps"].notna()]  # FGSM and PGD at 8/255; DF (no budget) is read on its own
    for r in bounded.to_dict("records"):
        span = f"95 % interval {r['asr_lo']:.1f} to {r['asr_hi']:.1f}" if "asr_lo" in r else "no interval"
        assert f"{r['attack'].upper()}'s success rate at eps 8/255, of the correctly classified images: " \
               f"{r['asr']:.1f} % ({span}" in md
    assert "DF's success rate without a budget (minimal perturbation)" in md and "strongest" not in md
    summary = pd.read_csv(out / "gradcam_summary.csv")
    pgd = summary[(summary["attack"] == "pgd") & (summary["subset"] == "successful")].iloc[0]
    assert f"Under PGD, Grad-CAM attention changed (high L2, low SSIM) for {pgd['pct_changed']:.1f} %" in md
    assert "8/255" in md and "weights sha256" in md
    for link in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md):  # each figure the report shows is a drawn image
        image = mpimg.imread(out / link)
        assert image.ndim == 3 and min(image.shape[:2]) > 100 and image.std() > 0, link
    assert not list(out.glob(".*.tmp"))


class _Images(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.srcs: list[str] = []
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        attrs = dict(attrs)
        if tag == "img":
            self.srcs.append(attrs["src"])
        for key in ("href", "src"):
            if key in attrs and tag != "img":
                self.links.append(attrs[key])


def test_html_is_self_contained_with_every_plot_inline(tiny_run):
    out, _, _ = tiny_run
    page = (out / "report.html").read_text()
    parser = _Images()
    parser.feed(page)
    pngs = sorted((out / "plots").glob("*.png"))
    assert len(parser.srcs) == len(pngs) >= 4
    inline = {base64.b64decode(s.split(",", 1)[1]) for s in parser.srcs if s.startswith("data:image/png;base64,")}
    assert inline == {p.read_bytes() for p in pngs}
    assert not parser.links and "http://" not in page and "https://" not in page
    assert page.count("<table>") == (out / "report.md").read_text().count("\n|---")


def test_sections_are_absent_when_not_saved(tiny_run, tmp_path):
    out, _, _ = tiny_run
    assert "no run results" in write_report(tmp_path).read_text()
    outputs.write_sections(tmp_path, [asr_section(pd.read_csv(out / "asr.csv"))])
    md = write_report(tmp_path).read_text()
    assert "## Attack success rates" in md
    for heading in ("## Run", "## OOD detection", "## MEAD", "## Binarization", "## Grad-CAM", "!["):
        assert heading not in md
    assert ood_plots(pd.read_csv(out / "ood.csv").iloc[:0], {}, tmp_path / "plots") == []
    assert [b.kind for b in build_report(tmp_path)][:2] == ["h1", "h2"]


def test_report_renders_again_from_the_folder_alone(tiny_run, tmp_path):
    out, _, md_path = tiny_run
    copy = tmp_path / "moved"
    for path in out.rglob("*"):
        if path.is_file():
            (copy / path.relative_to(out)).parent.mkdir(parents=True, exist_ok=True)
            (copy / path.relative_to(out)).write_bytes(path.read_bytes())
    (copy / "report.md").unlink()
    (copy / "report.html").unlink()
    assert write_report(copy).read_text() == md_path.read_text()
    assert (copy / "report.html").read_text() == (out / "report.html").read_text()
    saved = (out / outputs.SECTIONS_FILE).read_text()
    assert str(out) not in saved and "plots/gradcam_pgd.png" in saved


def test_report_module_names_no_plugin_and_no_plugin_file():
    import advopenood.outputs.report as report

    source = Path(report.__file__).read_text()
    plugins = registry.names("evaluators") + registry.names("analyses") + ["adaptive"]
    assert {"ood", "mead", "multiattack", "bintest", "gradcam", "transfer"} <= set(plugins)
    for name in plugins:
        assert not re.search(rf"\b{name}\b", source), name
    for fname in re.findall(r"[\w./-]+\.(?:csv|md|npz)", source):
        assert fname in ("asr.csv", "report.md"), fname  # the core's own files only


def test_readings_on_hand_made_tables():
    ood = pd.DataFrame({
        "dataset": "cifar10", "arch": "resnet20", "backend": "builtin",
        "attack": ["none", "none", "none", "pgd", "pgd", "pgd", "df", "df", "df"],
        "ood_set": ["texture"] * 3 + ["pgd"] * 3 + ["df"] * 3, "eps": [np.nan] * 3 + [8 / 255] * 3 + [np.nan] * 3,
        "detector": ["msp", "mls", "knn"] * 3, "auroc": [80.0, 70.0, 90.0, 30.0, 45.0, 60.0, 55.0, 65.0, 75.0]})
    assert read_ood(ood) == [
        "MSP and MLS fall below chance (AUROC < 50) on PGD.",
        "No detector falls below chance on DF.",
        "Averaged over detectors, AUROC falls from 80.0 on natural OOD sets to 55.0 under attack (means of the point "
        "estimates over detectors and sets; their difference is not tested)."]
    bintest = pd.DataFrame({"attack": ["pgd", "fgsm", "df"], "eps": 8 / 255, "asr": [0.99, 0.4, 0.97],
                            "random_asr": [0.1, 0.2, 0.8], "passed": [True, False, False],
                            "inconclusive": [False, False, True]})
    lines = read_bintest(bintest)
    assert lines[0].startswith("PGD (ASR 99 % vs random 10 %) passes")
    assert lines[1].startswith("FGSM (ASR 40 % vs random 20 %) fails")
    assert lines[2].startswith("The test is inconclusive for DF")
    summary = pd.DataFrame({"attack": ["df"] * 3, "subset": ["all", "successful", "unsuccessful"], "n": [10, 10, 0],
                            "pct_changed": [10.0, 10.0, np.nan], "pct_moved": [20.0, 20.0, np.nan],
                            "pct_unchanged": [70.0, 70.0, np.nan], "l2_median": [0.004, 0.004, np.nan],
                            "ssim_median": [0.93, 0.93, np.nan]})
    assert read_gradcam(summary) == [
        "Under DF, Grad-CAM attention changed (high L2, low SSIM) for 10.0 % of 10 successful attacks, moved with "
        "its structure kept for 20.0 % and stayed unchanged for 70.0 % (median L2 0.004, median SSIM 0.93)."]
    assert [eps_label(e) for e in (8 / 255, 4 / 255, 0.05, 1.0, np.nan)] == ["8/255", "4/255", "0.05", "1", ""]


def _ood_table(natural: list[float], adversarial: list[float]) -> pd.DataFrame:
    """An ``ood.csv`` with detectors MSP, MLS, KNN on one natural set (``texture``) and PGD."""
    return pd.DataFrame({"dataset": "digits", "arch": "democnn", "backend": "builtin",
                         "attack": ["none"] * 3 + ["pgd"] * 3, "ood_set": ["texture"] * 3 + ["pgd"] * 3,
                         "detector": ["msp", "mls", "knn"] * 2, "auroc": natural + adversarial})


@pytest.mark.parametrize("natural, adversarial, verb, reading", [
    ([90.0, 85.0, 95.0], [20.0, 30.0, 70.0], "falls from 90.0 on natural OOD sets to 40.0 under attack",
     "their difference is not tested"),
    ([40.0, 35.0, 90.0], [80.0, 85.0, 95.0], "rises from 55.0 on natural OOD sets to 86.7 under attack",
     "their difference is not tested"),
    ([60.0, 60.0, 60.0], [60.0, 60.0, 60.0], "is 60.0 both on natural OOD sets and under attack",
     "their difference is not tested"),
])
def test_natural_vs_adversarial_sentence_follows_the_numbers(natural, adversarial, verb, reading):
    last = read_ood(_ood_table(natural, adversarial))[-1]
    assert last.startswith(f"Averaged over detectors, AUROC {verb}") and reading in last
    nat, adv = np.mean(natural), np.mean(adversarial)
    assert compare_natural_adversarial(nat, adv) == last
    for other in {"falls", "rises", "both"} - {verb.split()[0], verb.split()[2]}:
        assert f"AUROC {other} " not in last


@pytest.mark.parametrize("natural, expected", [
    ([90.0, 85.0, 95.0], None),
    ([40.0, 85.0, 95.0], "MSP scores below chance on natural OOD"),
    ([40.0, 30.0, 95.0], "MSP and MLS score below chance on natural OOD"),
])
def test_natural_below_chance_is_named(natural, expected):
    lines = read_ood(_ood_table(natural, [50.0, 50.0, 50.0]))
    below = [s for s in lines if "below chance on natural OOD" in s]
    assert below == ([] if expected is None else [next(s for s in below if s.startswith(expected))])


@pytest.mark.parametrize("rows", [
    [("fgsm", 8 / 255, 80.0), ("pgd", 8 / 255, 99.0), ("df", None, 100.0)],
    [("fgsm", 8 / 255, 80.0), ("pgd", 8 / 255, 100.0), ("pgd@0.0627", 16 / 255, 100.0)],
    [("pgd", 8 / 255, 97.5)],
])
def test_asr_readings_state_each_rate_with_its_interval_and_rank_none(rows):
    """Each attack's success rate is a ``value`` claim on its asr.csv row with its Wilson interval; no attack is
    called the strongest or the weakest (no paired test of one attack against another; issue 40)."""
    asr = pd.DataFrame([{"attack": a, "eps": e, "asr": v, "asr_lo": v - 5.0, "asr_hi": min(v + 1.0, 100.0),
                         "ci": "wilson", "n": 60, "clean_acc": 98.0} for a, e, v in rows])
    lines = read_asr(asr)
    assert lines[0] == "The classifier's clean accuracy is 98.0 % on 60 ID images."
    claims = [c for c in lines if isinstance(c, Claim)]
    assert [(c.kind, dict(c.row)["attack"], c.value, c.lo, c.hi, c.method) for c in claims] == \
        [("value", a, v, v - 5.0, min(v + 1.0, 100.0), "wilson") for a, _, v in rows]
    assert all(STATED.search(c.text) for c in claims)
    text = " ".join(str(c) for c in lines if isinstance(c, str))
    assert not re.search(r"strongest|weakest", text)
    assert ("not ranked" in text) == (len(rows) > 1)


def test_roc_plot_takes_arrays():
    rng = np.random.default_rng(0)
    fig = plot_roc(rng.normal(1, 1, 200), {"far": rng.normal(-2, 1, 200), "adv": rng.normal(2, 1, 200)}, "msp",
                   adversarial=["adv"])
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels[0].startswith("far (AUROC 9") and labels[1].startswith("adv (AUROC 2")


def test_a_malformed_table_costs_its_section_one_note():
    bad = pd.DataFrame({"attack": ["pgd"], "eps": [0.0313725]})
    with pytest.warns(UserWarning, match="Binarization test"):
        [section] = outputs.guarded("Binarization test", lambda: [bintest_section(bad)])
    assert section.title == "Binarization test" and "could not be rendered" in section.items[0].text


def test_a_missing_figure_costs_one_section_not_the_report(tmp_path):
    outputs.write_sections(tmp_path, [Section("Mine", [Paragraph("kept")]),
                                      Section("Broken", [Figure(tmp_path / "plots" / "gone.png")])])
    with pytest.warns(UserWarning, match="Broken"):
        md = write_report(tmp_path).read_text()
    assert "## Mine\n\nkept" in md and "## Broken" in md and "could not be rendered" in md
    html = (tmp_path / "report.html").read_text()  # the HTML report says the same
    assert all(text in html for text in (">Mine<", "kept", ">Broken<", "could not be rendered")), html


def test_sections_round_trip_through_json(tmp_path):
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "a_b.png").write_bytes(b"png")
    frame = pd.DataFrame({"detector": ["msp", "knn"], "auroc": [51.25, np.nan], "n": [3, 4], "ok": [True, False]})
    saved = [Section("One", [Paragraph("text"), Table(frame.set_index("detector"), "AUROC"),
                             Bullets(["a", "b"], "readings"), Figure(tmp_path / "plots" / "a_b.png")], source="x")]
    outputs.write_sections(tmp_path, saved)
    [back] = outputs.read_sections(tmp_path)
    assert (back.title, back.source) == ("One", "x")
    para, table, bullets, figure = back.items
    assert para == Paragraph("text") and bullets == Bullets(["a", "b"], "readings")
    assert table.caption == "AUROC" and list(table.frame.columns) == ["detector", "auroc", "n", "ok"]
    assert table.frame.to_numpy().tolist() == [["msp", 51.25, 3, True], ["knn", None, 4, False]]
    assert figure.path == tmp_path / "plots" / "a_b.png" and figure.label == "a b"
    md = write_report(tmp_path).read_text()
    assert "| MSP | 51.25 | 3 | True |" in md and "| KNN |  | 4 | False |" in md  # names spelled as sentences do


@pytest.mark.parametrize("bad, match", [
    (lambda tmp: Section("S", ["just a string"]), "valid items: Paragraph, Bullets, Table, Figure"),
    (lambda tmp: outputs.collect(tmp, Results(figures=[tmp / "nope.png"]), "strong", "mine"), "did not write"),
    (lambda tmp: outputs.collect(tmp, Results(figures=[Path("/elsewhere/x.png")]), "strong", "mine"),
     "not under the run's output folder"),
    (lambda tmp: outputs.as_results(["ood.csv"]), "valid choices: Results or dict"),
])
def test_bad_plugin_outputs_are_named(tmp_path, bad, match):
    with pytest.raises((TypeError, ValueError, FileNotFoundError), match=match):
        bad(tmp_path)


def test_collect_writes_tables_with_the_protocol(tmp_path):
    sections = outputs.collect(tmp_path, {"mine.csv": pd.DataFrame({"a": [1]}), "mine.md": pd.DataFrame({"a": [1]})},
                               "lorenz2024", "mine")
    assert sections == [] and pd.read_csv(tmp_path / "mine.csv").to_dict("list") == {"a": [1], "protocol": ["lorenz2024"]}
    assert "| protocol |" in (tmp_path / "mine.md").read_text()  # a pasted Markdown table says how it was made


def _sized(adversarial: list[float], n: int, natural: list[float] | None = None) -> pd.DataFrame:
    table = _ood_table(natural or [90.0, 85.0, 95.0], adversarial)
    return table.assign(n_id=n, n_ood=n)


@pytest.mark.parametrize("adversarial, n, expected, absent", [
    ([30.0, 45.0, 70.0], 8, "On PGD, 8 ID and 8 OOD images are too few to conclude (fewer than 100 per side",
     "below chance"),
    ([30.0, 45.0, 70.0], 150, "MSP falls below chance (AUROC < 50) on PGD; MLS is below 50 but within the 95 % "
                              "interval of chance.", "best"),
    ([46.0, 48.0, 70.0], 200, "No detector falls below chance on PGD; MSP and MLS are below 50 but within the 95 % "
                              "interval of chance.", "worst"),
    ([10.0, 20.0, 30.0], 200, "On PGD every detector falls below chance", None),
])
def test_readings_conclude_only_what_the_sample_supports(adversarial, n, expected, absent):
    """Below MIN_CONCLUSIVE images per side a reading gives the range and says the sample is too small; above it,
    a detector falls below chance only when its 95 % interval lies below 50 (issue 30, item 5)."""
    lines = read_ood(_sized(adversarial, n))
    line = next(s for s in lines if "PGD" in s)
    assert line.startswith(expected), line
    if absent:
        assert absent not in line
    small = n < MIN_CONCLUSIVE
    assert lines[-1].endswith("(in this sample only: too few images to conclude).") is small
    assert ("too few to conclude" in lines[0]) is small  # the natural sets' reading too


def test_a_small_run_says_so_in_run_json_and_the_report(tmp_path, session_cache):
    import json

    from advopenood.cli.main import main

    out = tmp_path / "small"
    assert main(["demo", "--limit", "30", "--attack", "fgsm", "--detectors", "msp", "--analysis", "", "--out",
                 str(out), "--quiet"]) == 0
    sample = json.loads((out / "run.json").read_text())["sample"]
    assert sample == {"n_id": 30, "n_ood": sample["n_ood"], "min_conclusive": MIN_CONCLUSIVE, "conclusive": False,
                      "auroc_halfwidth_at_chance": sample["auroc_halfwidth_at_chance"]}
    assert 0 < sample["n_ood"] <= 30 and 10 < sample["auroc_halfwidth_at_chance"] < 20
    md = (out / "report.md").read_text()
    assert "Too few images to conclude: 30 ID images" in md


# ------------------------------------------------------------- the report's cells, figures, stdout summary, LaTeX

def _html_tables(page: str) -> list[list[list[str]]]:
    """Every ``<table>`` of a page as rows of cell texts (header row first)."""
    tables = []
    for body in re.findall(r"<table>(.*?)</table>", page, re.S):
        rows = re.findall(r"<tr>(.*?)</tr>", body, re.S)
        tables.append([re.findall(r"<t[hd]>(.*?)</t[hd]>", row, re.S) for row in rows])
    return tables


def test_every_report_column_has_one_number_of_decimals_and_wide_tables_scroll(tiny_run):
    """Each column of each table shows its numbers with one number of decimals (97.3 next to 100.0, never 97.30
    next to 100.0), and each table sits in a box that scrolls sideways."""
    out, _, _ = tiny_run
    page = (out / "report.html").read_text()
    checked = 0
    for rows in _html_tables(page):
        for column in zip(*rows[1:]):
            numbers = [c for c in column if re.fullmatch(r"-?\d+(\.\d+)?", c)]
            if len(numbers) == len([c for c in column if c]) and numbers:  # a numeric column
                places = {len(c.split(".")[1]) if "." in c else 0 for c in numbers}
                assert len(places) == 1, column
                checked += 1
    assert checked > 20
    assert page.count('<div class="scroll"><table>') == page.count("<table>") > 5
    assert re.search(r"\.scroll\{overflow-x:auto", page)


@pytest.mark.parametrize("values, shown", [([0.5, 12.345, 150.0], ["0.5", "12.3", "150.0"]),
                                           ([0.0123, 0.5, float("nan")], ["0.012", "0.500", ""]),
                                           ([97.25, 100.0, 5.0], ["97.2", "100.0", "5.0"]),
                                           ([40.0, 12.0], ["40", "12"]),
                                           (["a", 1.5], ["a", "1.50"])])
def test_format_column_keeps_one_number_of_decimals(values, shown):
    from advopenood.outputs.report import format_column

    assert format_column(values) == shown


def test_figures_have_captions_that_say_what_they_show(tiny_run):
    out, _, md_path = tiny_run
    blocks = build_report(out)
    figures = [b for b in blocks + [c for f in blocks if f.kind == "fold" for c in f.content] if b.kind == "img"]
    assert len(figures) >= 4
    for block in figures:
        assert block.caption != Path(block.content).stem.replace("_", " ") and len(block.caption.split()) >= 8, block
    md = md_path.read_text()
    assert "ROC curves of MSP: ID test images against each set" in md and "*AUROC (%) of each detector (rows)" in md


@pytest.mark.parametrize("counts, nan, expected", [
    ({"n_near": 0, "n_far": 1, "n_adv": 2}, ["near"], ["near_fpr95 and near_auroc: the run has no near-OOD set"]),
    ({"n_near": 1, "n_far": 1, "n_adv": 0}, ["adv"], ["adv_fpr95 and adv_auroc: the run has no adversarial set"]),
    ({"n_near": 2, "n_far": 1, "n_adv": 2}, ["near"], ["near_fpr95 and near_auroc: a metric of one of the near-OOD"]),
    ({"n_near": 1, "n_far": 1, "n_adv": 2}, [], [])])
def test_empty_leaderboard_columns_are_explained(counts, nan, expected):
    from advopenood_plugins.evaluators.ood.plugin import LEADERBOARD_COLUMNS
    from advopenood_plugins.evaluators.ood.report import leaderboard_gaps, leaderboard_section

    row = {c: 50.0 for c in LEADERBOARD_COLUMNS if c.endswith(("fpr95", "auroc"))}
    row.update({f"{g}_{m}": math.nan for g in nan for m in ("fpr95", "auroc")}, **counts)
    board = pd.DataFrame([{**row, "detector": d} for d in ("msp", "knn")])
    gaps = leaderboard_gaps(board)
    assert len(gaps) == len(expected) and all(g.startswith(e) for g, e in zip(gaps, expected))
    bullets = [i for i in leaderboard_section(board).items if isinstance(i, Bullets)]
    assert [list(b.items) for b in bullets] == ([gaps] if gaps else [])


def test_the_tiny_run_report_explains_its_empty_leaderboard_columns(tiny_run):
    out, _, md_path = tiny_run
    board = pd.read_csv(out / "leaderboard.csv")
    assert board["near_auroc"].isna().all() and (board["n_near"] == 0).all()
    assert "- near_fpr95 and near_auroc: the run has no near-OOD set" in md_path.read_text()


@pytest.fixture()
def demo_run(small_demo_run):
    """The session's small demo run through the CLI (conftest.SMALL_DEMO): its folder and its stdout's lines."""
    out, stdout = small_demo_run
    return out, stdout.splitlines()


def _interval(line: str) -> tuple[float, float, float]:
    value, lo, hi = re.search(r"([\d.]+) % \(95 % interval ([\d.]+) to ([\d.]+),", line).groups()
    return float(value), float(lo), float(hi)


def test_the_run_ends_with_a_summary_of_headline_numbers_and_their_intervals(demo_run):
    """stdout names the report and gives the clean accuracy and the highest ASR with Wilson intervals, and the
    largest worst adversarial AUROC of a detector with ood.csv's own interval (the run's bootstrap, named), each as
    the tables hold it, stated as point estimates (no "most robust" without a paired test)."""
    from scipy.stats import binomtest

    out, lines = demo_run
    said = {line.split(": ")[1].split(" (")[0]: line for line in lines if line.startswith("advopenood: ")}
    assert said["report"] == f"advopenood: report: {out / 'report.html'}" and (out / "report.html").is_file()
    assert lines[-1] == f"advopenood: wrote {out}"
    info = json.loads((out / "run.json").read_text())
    n = info["sample"]["n_id"]
    acc, lo, hi = _interval(said[f"clean accuracy on {n} ID images"])
    wilson = binomtest(round(acc * n / 100), n).proportion_ci(method="wilson")
    assert acc == pytest.approx(info["clean_acc"], abs=0.05)
    assert (lo, hi) == pytest.approx((100 * wilson.low, 100 * wilson.high), abs=0.05)
    asr = pd.read_csv(out / "asr.csv")
    bounded = asr[asr["eps"].notna()]
    strongest = bounded.loc[bounded["asr"].idxmax()]
    budget = eps_label(strongest["eps"])
    tied = list(bounded.loc[bounded["asr"] == strongest["asr"], "attack"])  # every set at the top ASR is named
    which = tied[0] if len(tied) == 1 else ", ".join(tied[:-1]) + " and " + tied[-1]
    line = said["highest attack success rate"]
    assert f"not a tested ranking): {which} (eps {budget})" in line and "wilson, asr.csv" in line
    assert _interval(line)[:1] == pytest.approx((strongest["asr"],), abs=0.05)
    ood = pd.read_csv(out / "ood.csv")
    adversarial = ood[ood["group"] == "adversarial"]
    worst = adversarial.loc[adversarial.groupby("detector")["auroc"].idxmin()]
    top = worst.sort_values(["auroc", "detector"], ascending=[False, True]).iloc[0]
    line = said["largest worst-case AUROC over the adversarial sets"]
    assert f"{display_name(top['detector'])}, on {display_name(top['ood_set'])}: " in line and f"{top['ci']}, ood.csv" in line
    assert _interval(line) == pytest.approx((top["auroc"], top["auroc_lo"], top["auroc_hi"]), abs=0.051)
    assert "most robust" not in "\n".join(lines)


def _latex_floats(tex: str) -> dict[str, str]:
    """``table name -> the text of its floats`` (a table split into several floats by columns or rows: their
    captions begin with its name) of a tables.tex."""
    out: dict[str, str] = {}
    for caption, body in re.findall(r"\\begin\{table\}.*?\\caption\{(.*?)\}.*?\\toprule\n(.*?)\\bottomrule",
                                    tex, re.S):
        name = caption.replace("\\_", "_").split(" (")[0].split(",")[0].split(":")[0]
        out[name] = out.get(name, "") + caption.replace("\\_", "_") + "\n" + body.replace("\\_", "_")
    return out


def test_tables_tex_holds_every_csv_as_one_latex_table_with_its_numbers(demo_run, tmp_path, capsys):
    """By default tables.tex holds the headline tables (the AUROC table, asr.csv); with --latex all (the same run
    again, read back from the store) every CSV too, split into floats that fit a column, each number the CSV's
    with its column's decimals (in its cell, its interval or, for a column of one value, the caption) and each budget
    as k/255."""
    from advopenood.cli.main import main
    from advopenood.outputs.report import format_column

    out, _ = demo_run
    default = _latex_floats((out / "tables.tex").read_text())
    assert list(default) == ["AUROC per detector and set", "asr.csv"]
    full = tmp_path / "all"
    assert main([*SMALL_DEMO, "--out", str(full), "--latex", "all"]) == 0
    capsys.readouterr()
    tex = (full / "tables.tex").read_text()
    tables = {k: v for k, v in _latex_floats(tex).items() if k.endswith(".csv")}
    csvs = sorted(p.relative_to(full).as_posix() for p in full.rglob("*.csv"))
    assert sorted(tables) == csvs and len(csvs) >= 4 and "longtable" not in tex and "resizebox" not in tex
    assert "tables.tex" in json.loads((full / "manifest.json").read_text())["files"]
    for name in csvs:
        csv = pd.read_csv(full / name)
        text = tables[name].replace(r"\allowbreak{}", "")  # a wrapped text column may break after - and _
        from advopenood.claims import name as display
        from advopenood.outputs.names import NAME_COLUMNS

        for column in csv.columns:
            trio = [c for c in (column.removesuffix("_lo").removesuffix("_hi"),) if {f"{c}_lo", f"{c}_hi"} <=
                    set(csv.columns) and c in csv.columns and pd.api.types.is_numeric_dtype(csv[c])]
            if column == "eps":
                cells = [eps_label(v) for v in csv[column]]
            elif column in NAME_COLUMNS:  # a detector, attack or set name as the report spells it (issue 50)
                cells = [display(str(v)) for v in csv[column]]
            elif trio:  # an estimate and its interval: one number of decimals for the three
                joint = format_column([v for c in (trio[0], f"{trio[0]}_lo", f"{trio[0]}_hi") for v in csv[c].tolist()])
                at = [trio[0], f"{trio[0]}_lo", f"{trio[0]}_hi"].index(column)
                cells = joint[at * len(csv):(at + 1) * len(csv)]
            else:
                cells = format_column(csv[column].tolist())
            for cell in cells:
                shown = cell.replace("_", "\\_").replace("%", "\\%").replace("#", "\\#")
                assert cell == "" or shown in text or cell in text, (name, column, cell)


def test_the_attack_success_table_shows_asr_csvs_intervals(demo_run):
    """The report's attack-success table carries every ASR's Wilson interval as asr.csv holds it."""
    out, _ = demo_run
    asr = pd.read_csv(out / "asr.csv")
    (table,) = [i.frame for i in asr_section(asr).items if isinstance(i, Table)]
    for column in ("asr_lo", "asr_hi", "asr_all_lo", "asr_all_hi"):
        assert list(table[column]) == list(asr[column]), column
    assert set(table["ci"]) == {"wilson"}
