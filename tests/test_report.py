"""Plots and the readable report, on the outputs of a real tiny run (ResNet-20, a few CIFAR-10 images), and the
report's plugin-free rendering of saved sections (no data needed)."""
from __future__ import annotations

import base64
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

from advopenood import io as aio
from advopenood import outputs, registry
from advopenood.pipeline import write_scores
from advopenood.context import CleanRecord, RunContext
from advopenood.data import build_dataset, limit_dataset, make_loader, stack
from advopenood.models import weights_hash
from advopenood.outputs import Bullets, Figure, Results, Paragraph, Section, Table
from advopenood.plots import ood_matrix, plot_roc, roc_sets
from advopenood.report import asr_section, build_report, eps_label, read_asr, write_report
from advopenood.store import AdvStore, library_versions
from advopenood_plugins.bintest import bintest_section, read_bintest
from advopenood_plugins.gradcam import read_gradcam
from advopenood_plugins.ood_eval import compare_natural_adversarial, ood_plots, read_ood

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
    config = {"name": "tiny", "seed": 0, "data": {"dataset": "cifar10"}, "attacks": list(attacks)}
    ctx = RunContext(config=config, out=out, model=cifar_model, device=CPU, seed=0, dataset="cifar10", arch="resnet20",
                     id_set=id_set, fit_set=id_set, ood_sets={"texture": ood_set}, adv_sets=adv_sets,
                     clean=CleanRecord(y.numpy(), pred), batch_size=N, backend="builtin", scores=scores,
                     extras={"progress": False})
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
        "config": config, "seed": 0, "versions": library_versions(), "clean_acc": clean_acc,
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
    for attack, part in ood[ood["attack"] != "none"].groupby("attack"):
        below = sorted(d.upper() for d, a in zip(part["detector"], part["auroc"]) if a < 50)
        line = next(s for s in md.splitlines() if re.match(rf"- .*\b[Oo]n {attack.upper()}\b", s))
        if not below:
            assert line.startswith(f"- No detector falls below chance on {attack.upper()}")
        elif len(below) == len(part):
            assert line.startswith(f"- On {attack.upper()} every detector falls below chance")
        else:
            named = re.match(r"- (.*) falls? below chance", line).group(1)
            assert sorted(re.split(r", | and ", named)) == below
    asr = pd.read_csv(out / "asr.csv")
    strongest = [a.upper() for a in asr.loc[asr["asr"] == asr["asr"].max(), "attack"]]
    if len(strongest) == 1:
        assert f"{strongest[0]} is the strongest attack" in md
    else:
        assert f"{', '.join(strongest[:-1])} and {strongest[-1]} are the strongest attacks" in md
    summary = pd.read_csv(out / "gradcam_summary.csv")
    pgd = summary[(summary["attack"] == "pgd") & (summary["subset"] == "successful")].iloc[0]
    assert f"Under PGD, Grad-CAM attention changed (high L2, low SSIM) for {pgd['pct_changed']:.1f} %" in md
    assert "8/255" in md and "weights sha256" in md
    for link in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md):
        assert (out / link).is_file()
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
    import advopenood.report as report

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
        "On natural OOD sets (texture), KNN is the best detector (mean AUROC 90.0) and MLS the worst (70.0).",
        "MSP and MLS fall below chance (AUROC < 50) on PGD; the best is KNN (AUROC 60.0).",
        "No detector falls below chance on DF; the best is KNN (AUROC 75.0) and the worst MSP (55.0).",
        "Averaged over detectors, AUROC falls from 80.0 on natural OOD sets to 55.0 under attack: adversarial "
        "examples evade the detectors more than natural OOD does."]
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
     "evade the detectors more"),
    ([40.0, 35.0, 90.0], [80.0, 85.0, 95.0], "rises from 55.0 on natural OOD sets to 86.7 under attack",
     "flag adversarial examples more readily"),
    ([60.0, 60.0, 60.0], [60.0, 60.0, 60.0], "is 60.0 both on natural OOD sets and under attack", "as hard to detect"),
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


@pytest.mark.parametrize("asrs, expected", [
    ({"fgsm": 80.0, "pgd": 99.0, "df": 100.0}, "DF is the strongest attack (ASR 100.0 % of correctly classified "
                                              "images) and FGSM is the weakest attack (80.0 %)."),
    ({"fgsm": 80.0, "pgd": 100.0, "df": 100.0}, "PGD and DF are the strongest attacks (ASR 100.0 % of correctly "
                                               "classified images) and FGSM is the weakest attack (80.0 %)."),
    ({"pgd": 100.0, "df": 100.0}, "Every attack (PGD and DF) succeeds on 100.0 % of the correctly classified images."),
    ({"pgd": 97.5}, "PGD succeeds on 97.5 % of the correctly classified images."),
])
def test_asr_sentence_follows_the_numbers(asrs, expected):
    asr = pd.DataFrame({"attack": list(asrs), "asr": list(asrs.values()), "n": 60, "clean_acc": 98.0})
    assert read_asr(asr) == ["The classifier's clean accuracy is 98.0 % on 60 ID images.", expected]


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
    assert (tmp_path / "report.html").is_file()


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
    assert "| msp | 51.25 | 3 | True |" in md and "| knn |  | 4 | False |" in md


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
