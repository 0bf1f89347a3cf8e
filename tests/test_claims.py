"""Claims as data (advopenood/claims.py): every comparison the report states and every number the end-of-run summary
prints is a claim in claims.json, re-read by `advopenood verify` from the tables; a direction is stated only where
the paired interval of the stated difference excludes 0; the summary quotes the table's own interval."""
from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from advopenood.claims import STATED, Claim, name, pair_claim
from advopenood.cli.main import main
from advopenood.evaluation.verify import verify_run
from advopenood_plugins.evaluators.robust_auroc.paired import read_robust_paired
from advopenood_plugins.kit.paired import PAIRED_CLAIM_COLUMNS

#: a sentence that states a direction, in any wording the report has used: names, difference, first interval
DIRECTION = re.compile(r"On (?P<set>[^,]+), (?P<a>\S+?)'s (?P<what>[\w ]+?) is higher than (?P<b>\S+?)'s by "
                       r"(?P<d>-?[\d.]+) points \([^\[]*\[(?P<lo>[-+\d.]+), (?P<hi>[-+\d.]+)\]")


@pytest.fixture()
def demo_run(small_demo_run):
    """The session's small demo run (conftest.SMALL_DEMO: 60 images a set, two attacks, five detectors, the ood
    evaluator) and its stdout."""
    return small_demo_run


def _pairs(out: Path) -> dict[tuple[str, str, str], tuple[float, float, float]]:
    """paired.csv as ``(set, a, b) -> (a - b, lo, hi)`` in both orders, display names as the report shows them."""
    table = pd.read_csv(out / "paired.csv")
    pairs = {}
    for r in table.to_dict("records"):
        a, b, where = name(r["detector_a"]), name(r["detector_b"]), name(r["ood_set"])
        d, lo, hi = r["delta_auroc"], r["delta_auroc_lo"], r["delta_auroc_hi"]
        pairs[(where, a, b)], pairs[(where, b, a)] = (d, lo, hi), (-d, -hi, -lo)
    return pairs


def test_every_direction_in_the_report_rests_on_its_own_interval(demo_run):
    """Every "A is higher than B" sentence of report.md quotes A - B and the interval of A - B from paired.csv, and
    that interval lies above 0 (today's sentences kept B - A's interval after swapping the names)."""
    out, _ = demo_run
    text = (out / "report.md").read_text()
    pairs = _pairs(out)
    found = [m.groupdict() for m in DIRECTION.finditer(text)]
    assert found and text.count("is higher than") == len(found)
    for m in found:
        d, lo, hi = pairs[(m["set"], m["a"], m["b"])]
        assert float(m["lo"]) > 0 and lo > 0, m
        assert math.isclose(float(m["d"]), round(d, 1), abs_tol=0.051), m
        assert math.isclose(float(m["lo"]), round(lo, 1), abs_tol=0.051), m
        assert math.isclose(float(m["hi"]), round(hi, 1), abs_tol=0.051), m


def test_the_summary_quotes_the_tables_interval_and_method(demo_run):
    """The summary's AUROC is ood.csv's cell with ood.csv's interval (the run's bootstrap, named), not DeLong's."""
    out, stdout = demo_run
    line = next(s for s in stdout.splitlines() if "AUROC" in s)
    det, where = re.search(r"(\w+), on (\w+)", line).groups()
    lo, hi = (float(v) for v in re.search(r"95 % interval ([\d.]+) to ([\d.]+)", line).groups())
    ood = pd.read_csv(out / "ood.csv")
    row = ood[(ood["detector"].map(name) == det) & (ood["ood_set"].map(name) == where)].iloc[0]
    assert (lo, hi) == (round(row["auroc_lo"], 1), round(row["auroc_hi"], 1)), line
    assert row["ci"] in line
    assert "most robust" not in stdout


def test_an_untouched_run_verifies_with_its_claims(demo_run):
    out, _ = demo_run
    claims = json.loads((out / "claims.json").read_text())
    assert {c["kind"] for c in claims["claims"]} >= {"difference"} and len(claims["summary"]) == 3
    found = verify_run(out)
    assert found.differences == [] and found.files == []


def _edit_claim(run: Path, change) -> str:
    """Change the first report claim of a kind ``change`` handles; the sentence it had."""
    path = run / "claims.json"
    data = json.loads(path.read_text())
    claim = next(c for c in data["claims"] if c["kind"] == "difference")
    text = claim["text"]
    change(claim)
    path.write_text(json.dumps(data))
    return text


EDITS = {
    "number": lambda c: c.update(value=c["value"] + 1.0),
    "number and its sentence": lambda c: c.update(value=c["value"] + 1.0, text=Claim.from_dict(
        {**c, "value": c["value"] + 1.0}).text),
    "interval": lambda c: c.update(lo=c["lo"] - 0.5),
    "sign": lambda c: c.update(names=c["names"][::-1]),
    "test": lambda c: c.update(kind="no_difference"),
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_verify_fails_on_an_edited_claim(demo_run, tmp_path, edit):
    out, _ = demo_run
    run = tmp_path / "run"
    shutil.copytree(out, run)
    text = _edit_claim(run, EDITS[edit])
    diffs = verify_run(run).differences
    assert diffs and any(text[:60] in line or "claims.json" in line for line in diffs), diffs


@pytest.mark.parametrize("old, new", [("is higher than", "is lower than"), ("95 % paired interval [+", "95 % paired "
                                                                                                        "interval [-")])
def test_verify_fails_on_an_edited_sentence_of_the_report(demo_run, tmp_path, old, new):
    out, _ = demo_run
    run = tmp_path / "run"
    shutil.copytree(out, run)
    report = (run / "report.md").read_text()
    (run / "report.md").write_text(report.replace(old, new, 1))
    diffs = verify_run(run).differences
    assert len(diffs) == 1 and "report.md" in diffs[0] and "not the sentence of any claim" in diffs[0], diffs


def test_a_swapped_pair_states_its_own_difference_and_interval():
    """paired.csv's ash - ebo = -27.0 [-30.8, -23.1] reads EBO - ASH = +27.0 [+23.1, +30.8]."""
    row = {"detector_a": "ash", "detector_b": "ebo", "ood_set": "textures", "delta_auroc": -27.0,
           "delta_auroc_lo": -30.8, "delta_auroc_hi": -23.1, "ci": "bootstrap-2000"}
    claim = pair_claim(row, "paired.csv", ("detector_a", "detector_b", "ood_set"),
                       ("detector_a", "detector_b", "delta_auroc", "delta_auroc_lo", "delta_auroc_hi"), "textures")
    assert claim.kind == "difference" and claim.names == ("ebo", "ash")
    assert claim.text.startswith("On textures, EBO's AUROC is higher than ASH's by 27.0 points")
    assert "[+23.1, +30.8]" in claim.text
    tie = pair_claim({**row, "delta_auroc_hi": 0.4}, "paired.csv", ("detector_a", "detector_b", "ood_set"),
                     claim.columns, "textures")
    assert tie.kind == "no_difference" and "no difference shown" in tie.text and "higher" not in tie.text


def test_robust_readings_name_no_highest_without_a_paired_test():
    """All robust AUROCs 0 with intervals containing 0: ties, no "highest robust AUROC is X's"."""
    rows = [{"ood_set": "tin", "eps": 8 / 255, "method": "pgd", "detector_a": a, "family_a": "adaptive",
             "detector_b": b, "family_b": "adaptive", "twin": False, "robust_auroc_a": 0.0, "robust_auroc_b": 0.0,
             "delta_robust_auroc": 0.0, "delta_robust_auroc_lo": 0.0, "delta_robust_auroc_hi": 0.0,
             "ci": "bootstrap-2000", "significant": False} for a, b in [("knn", "msp"), ("knn", "mls"), ("mls", "msp")]]
    readings = [str(r) for r in read_robust_paired(pd.DataFrame(rows))]
    assert not any("highest" in r for r in readings)
    assert any("3 of 3 pair(s) of detectors tie" in r for r in readings)
    assert not any(STATED.search(r) for r in readings if isinstance(r, str))  # a plain sentence is no claim


def test_table_ood_has_an_interval_beside_every_number(demo_run):
    """table_ood.csv: every FPR95 / AUROC cell has its 95 % interval; an attack's cell (one set) has ood.csv's,
    the natural sets' mean (all far-OOD in the demo) the leaderboard's far mean's: one number, one interval."""
    out, _ = demo_run
    table = pd.read_csv(out / "table_ood.csv").set_index("detector")
    ood = pd.read_csv(out / "ood.csv")
    board = pd.read_csv(out / "leaderboard.csv").set_index("detector")
    metrics = [c for c in table.columns if c.endswith((" FPR95", " AUROC"))]
    assert metrics and all(f"{c} lo" in table and f"{c} hi" in table for c in metrics)
    for r in ood[ood["attack"] != "none"].to_dict("records"):
        col = f"{r['dataset']} {r['attack']} AUROC"
        assert (table.loc[r["detector"], f"{col} lo"], table.loc[r["detector"], f"{col} hi"]) == \
            (r["auroc_lo"], r["auroc_hi"]), (r["detector"], col)
    for det in table.index:
        assert (table.loc[det, "digits none AUROC lo"], table.loc[det, "digits none AUROC hi"]) == \
            (board.loc[det, "far_auroc_lo"], board.loc[det, "far_auroc_hi"]), det


def test_verify_fails_on_an_edited_table_ood_bound(demo_run, tmp_path):
    out, _ = demo_run
    run = tmp_path / "run"
    shutil.copytree(out, run)
    table = pd.read_csv(run / "table_ood.csv")
    table.loc[0, "digits none AUROC lo"] -= 1.0
    table.to_csv(run / "table_ood.csv", index=False)
    diffs = verify_run(run).differences
    assert len(diffs) == 1 and "table_ood.csv" in diffs[0] and "digits none AUROC lo" in diffs[0], diffs


#: a reading that ranks or compares (any wording the report has used or might): it must be a claim's sentence
RANKING = re.compile(r"\b(best|worst detector|strongest|weakest|highest|stronger|weaker|is first|can be first|"
                     r"higher than|lower than|the most|most robust)\b")


def test_no_reading_of_the_report_ranks_without_a_claim_that_supports_it(demo_run):
    """Every reading (bullet) of report.md that ranks or compares is a claim's sentence, word for word; each
    ``first`` claim names exactly the detectors paired.csv's intervals leave unbeaten, each ``difference`` rests on
    an interval above 0, and no superlative is stated at all (issue 40: "X is the best detector", "the best is",
    "the strongest attack" were printed without a test)."""
    out, _ = demo_run
    claims = json.loads((out / "claims.json").read_text())["claims"]
    texts = {c["text"]: c for c in claims}
    readings = [line[2:] for line in (out / "report.md").read_text().splitlines() if line.startswith("- ")]
    ranked = [s for s in readings if RANKING.search(s)]
    assert ranked and all(s in texts for s in ranked), [s for s in ranked if s not in texts]
    assert not any(re.search(r"\b(best|strongest|weakest|highest)\b", s) for s in readings)
    # the demo's 60 images a side are below min_conclusive: no set is ranked, each states its range and size instead
    assert not [c for c in claims if c["kind"] == "first"]
    sets = set(pd.read_csv(out / "ood.csv")["ood_set"])
    assert sum("no rank is stated" in s for s in readings) == len(sets)
    assert all(c["lo"] > 0 for c in claims if c["kind"] == "difference")
    asr = pd.read_csv(out / "asr.csv")
    values = [c for c in claims if c["kind"] == "value" and c["table"] == "asr.csv"]
    assert len(values) == len(asr) and all(c["text"] in readings for c in values)


KIND_EDITS = {
    "value (asr): bound": ("value", lambda c: c.update(lo=c["lo"] - 1.0)),
}


def test_verify_checks_a_first_claim_against_the_holm_adjusted_pairs():
    """``check_first`` re-derives who can be first from ``p_holm`` (not the per-comparison intervals): the claim the
    headline makes passes; one naming other detectors, with another worst rank, resting on the per-comparison
    intervals, or on a set below min_conclusive is named."""
    from advopenood.evaluation.verify_first import check_first
    from advopenood_plugins.evaluators.ood.headline import first_claim, rank_ranges

    ood = pd.DataFrame({"detector": ["msp", "mls", "knn"], "ood_set": "tin", "auroc": [70.0, 80.0, 90.0],
                        "n_id": 200, "n_ood": 200})
    paired = pd.DataFrame({"ood_set": "tin", "detector_a": ["knn", "knn", "mls"], "detector_b": ["mls", "msp", "msp"],
                           "delta_auroc": [10.0, 20.0, 10.0], "delta_auroc_lo": [2.0, 5.0, 1.0],
                           "delta_auroc_hi": [18.0, 35.0, 19.0], "p_holm": [0.01, 0.01, 0.2]})
    claim = first_claim(rank_ranges(ood.set_index("detector")["auroc"], paired, "tin"), "tin")
    assert claim.names == ("knn",) and claim.hi == 1.0 and not check_first(claim, paired, ood, 100)
    for edit in ({"names": ("mls",)}, {"hi": 2.0}):
        assert check_first(dataclasses.replace(claim, **edit), paired, ood, 100)
    per_comparison = paired.assign(p_holm=0.5)  # the intervals exclude 0, the simultaneous tests do not
    assert check_first(claim, per_comparison, ood, 100)
    assert any("min_conclusive" in line for line in check_first(claim, paired, ood.assign(n_id=60), 100))


def test_a_first_claim_added_below_min_conclusive_is_a_difference(demo_run, tmp_path):
    """The demo (60 images a side) states no first; one typed into claims.json and report.md, re-derivable from
    paired.csv as it is, is a difference that names min_conclusive."""
    from advopenood.evaluation.verify_first import derive_first

    out, _ = demo_run
    run = tmp_path / "run"
    shutil.copytree(out, run)
    names, ranked, worst = derive_first("textures", pd.read_csv(run / "paired.csv"), pd.read_csv(run / "ood.csv"))
    claim = Claim("first", "paired.csv", (("ood_set", "textures"),), PAIRED_CLAIM_COLUMNS, "textures", float(ranked),
                  1.0, worst, "holm", tuple(names))
    data = json.loads((run / "claims.json").read_text())
    data["claims"].append(claim.as_dict())
    (run / "claims.json").write_text(json.dumps(data))
    _reseal(run)
    diffs = verify_run(run).differences
    assert any(claim.text in line and "min_conclusive" in line for line in diffs), diffs


@pytest.mark.parametrize("edit", list(KIND_EDITS))
def test_verify_fails_on_an_edited_claim_of_the_new_kinds(demo_run, tmp_path, edit):
    out, _ = demo_run
    run = tmp_path / "run"
    shutil.copytree(out, run)
    kind, change = KIND_EDITS[edit]
    data = json.loads((run / "claims.json").read_text())
    claim = next(c for c in data["claims"] if c["kind"] == kind and c["table"] in ("paired.csv", "asr.csv"))
    text = claim["text"]
    change(claim)
    (run / "claims.json").write_text(json.dumps(data))
    diffs = verify_run(run).differences
    assert diffs and all(text in line for line in diffs), diffs


@pytest.mark.parametrize("old, new", [("no rank is stated;", "MSP is first;"), ("of the correctly classified images: ",
                                                                         "of the correctly classified images: 1")])
def test_verify_fails_on_an_edited_ranking_or_rate_in_the_report(demo_run, tmp_path, old, new):
    out, _ = demo_run
    run = tmp_path / "run"
    shutil.copytree(out, run)
    report = (run / "report.md").read_text()
    assert old in report
    (run / "report.md").write_text(report.replace(old, new, 1))
    diffs = verify_run(run).differences
    assert len(diffs) == 1 and "not the sentence of any claim" in diffs[0], diffs


def test_a_superlative_typed_into_the_report_is_caught(demo_run, tmp_path):
    out, _ = demo_run
    run = tmp_path / "run"
    shutil.copytree(out, run)
    report = (run / "report.md").read_text()
    (run / "report.md").write_text(report.replace("\n- ", "\n- On textures, KNN is the best detector.\n- ", 1))
    diffs = verify_run(run).differences
    assert len(diffs) == 1 and "KNN is the best detector" in diffs[0], diffs


def test_first_claims_follow_the_paired_tests():
    """One detector shown above all: "is first"; one unbeaten but not above all: "only X can be first"; none
    separated: a tie of all, named as such."""
    from advopenood_plugins.evaluators.ood.headline import read_headline

    ood = pd.DataFrame({"detector": ["msp", "mls", "knn"], "ood_set": "tin", "attack": "none", "dataset": "cifar10",
                        "arch": "resnet20", "backend": "builtin", "auroc": [70.0, 80.0, 90.0]})

    def paired(bounds):
        return pd.DataFrame([{"ood_set": "tin", "detector_a": a, "detector_b": b, "delta_auroc": (lo + hi) / 2,
                              "delta_auroc_lo": lo, "delta_auroc_hi": hi, "significant": lo > 0 or hi < 0,
                              "p_holm": 0.01 if lo > 0 or hi < 0 else 0.5}
                             for (a, b), (lo, hi) in bounds.items()])

    cases = [({("knn", "mls"): (2, 9), ("knn", "msp"): (5, 20), ("mls", "msp"): (-1, 8)}, ["knn"], 1.0,
              "On tin: KNN is first; the paired tests, Holm-adjusted over every pair on the set, show it higher than "
              "every other detector"),
             ({("knn", "mls"): (-1, 9), ("knn", "msp"): (5, 20), ("mls", "msp"): (1, 8)}, ["knn", "mls"], None,
              "On tin: 2 of 3 detectors can be first, no paired difference shown among them (Holm-adjusted over every "
              "pair on the set): KNN and MLS"),
             ({("knn", "mls"): (-1, 9), ("knn", "msp"): (-5, 20), ("mls", "msp"): (-1, 8)}, ["knn", "mls", "msp"],
              None, "On tin: 3 of 3 detectors can be first")]
    for bounds, first, worst, text in cases:
        [claim] = [c for c in read_headline(ood, paired(bounds)) if isinstance(c, Claim)]
        assert claim.kind == "first" and list(claim.names) == first and claim.text.startswith(text)
        assert claim.hi == worst if worst else math.isnan(claim.hi)
        assert STATED.search(claim.text)


def test_plugin_readings_state_no_winner_without_a_paired_test():
    """mead, smoothed and gradcam tables hold no paired test of one detector or attack against another: their
    readings name no best, strongest or "most" (issue 40)."""
    from advopenood_plugins.analyses.gradcam.report import read_gradcam
    from advopenood_plugins.evaluators.mead.report import read_mead
    from advopenood_plugins.evaluators.smoothed.report import read_smoothed

    mead = pd.DataFrame({"setting": "mead", "norm": "linf", "eps": 8 / 255, "detector": ["msp", "knn"],
                         "auroc": [40.0, 70.0]})
    smoothed = pd.DataFrame([{"detector": "smoothed_msp", "n": 64, "sigma": 0.1, "statistic": "mean", "eps": 8 / 255,
                              "direction": "ood->id", "auroc_baseline": math.nan, "baseline": "msp",
                              "auroc_plain": 60.0, "auroc_eot": 50.0, "eot_samples": 8, "plain_attack": "pgd"}])
    summary = pd.DataFrame({"attack": ["fgsm", "pgd"], "subset": "all", "n": 40, "pct_changed": [10.0, 80.0],
                            "pct_moved": [20.0, 10.0], "pct_unchanged": [70.0, 10.0], "l2_median": 0.01,
                            "ssim_median": 0.9})
    lines = read_mead(mead) + read_smoothed(smoothed) + read_gradcam(summary)
    assert len(lines) == 4
    assert not any(re.search(r"\b(best|strongest|stronger|weakest|most)\b", s) for s in lines), lines
    assert "EOT - plain = -10.0 points" in lines[1] and "report the lower AUROC" in lines[1]


# --------------------------------------------------------------- issue 49: claims are data all the way down

def _reseal(run: Path) -> None:
    """``manifest.json`` written again with the digests of the files as they are now, as a hand that edited them
    would: the checks of the content alone must find what was changed."""
    from advopenood.io import sha256_file

    manifest = json.loads((run / "manifest.json").read_text())
    manifest["files"] = {rel: sha256_file(run / rel) for rel in manifest["files"] if (run / rel).is_file()}
    (run / "manifest.json").write_text(json.dumps(manifest))


def _say(run: Path, old: str, new: str, where: tuple[str, ...] = ("report.md",)) -> None:
    """``new`` in place of the sentence ``old`` in the files ``where``."""
    for fname in where:
        text = (run / fname).read_text()
        assert old in text or json.dumps(old)[1:-1] in text, (fname, old)
        (run / fname).write_text(text.replace(old, new).replace(json.dumps(old)[1:-1], json.dumps(new)[1:-1]))


ADDED = {
    "a bullet: outperforms": ("bullet", "MSP outperforms EBO on texture."),
    "a bullet: most robust": ("bullet", "MSP is the most robust detector under FGSM."),
    "a bullet: better on every set": ("bullet", "KNN is better than MDS on every set."),
    "a paragraph: the best": ("paragraph", "MSP is the best detector."),
    "a difference-shaped bullet without an interval": ("bullet",
                                                      "On textures, KNN's AUROC is higher than MSP's by 3.2 points."),
}


def test_a_sentence_added_to_the_report_is_a_difference(demo_run, tmp_path):
    """Issue 49: sentences typed into report.md passed with 0 differences once the manifest was written again.
    Every line of report.md is the writer's rendering of the run's files or a claim's sentence; each added bullet
    and paragraph is one difference that names it (the five cases at once, each named)."""
    out, _ = demo_run
    run = tmp_path / "run"
    shutil.copytree(out, run)
    report = (run / "report.md").read_text()
    for kind, text in ADDED.values():
        report = report.replace("\n- ", f"\n- {text}\n- ", 1) if kind == "bullet" else \
            report.replace("\n## Details\n", f"\n{text}\n\n## Details\n", 1)
    (run / "report.md").write_text(report)
    _reseal(run)
    found = verify_run(run)
    assert found.files == []
    assert sorted(found.differences) == sorted(
        f"report.md: {text!r}: not the sentence of any claim of claims.json, nor a line the report renders from the "
        f"run's files ({'a stated comparison' if STATED.search(text) else 'a sentence'} added or edited by hand)"
        for _, text in ADDED.values())


def test_a_sentence_added_to_the_reports_sections_too_is_a_difference(demo_run, tmp_path):
    """The same bullet added to report_sections.json as well, and the report written again from it (report.md and
    report.html are its rendering), is no sentence the ood evaluator renders from its tables: one difference,
    naming it and its section."""
    from advopenood.outputs.report import write_report

    out, _ = demo_run
    run = tmp_path / "run"
    shutil.copytree(out, run)
    claim = next(c for c in json.loads((run / "claims.json").read_text())["claims"] if c["kind"] == "difference")
    added = "MSP outperforms EBO on texture."
    sections = json.loads((run / "report_sections.json").read_text())
    bullets = next(i for s in sections["sections"] for i in s["items"] if claim["text"] in i.get("items", []))
    bullets["items"].insert(bullets["items"].index(claim["text"]) + 1, added)
    (run / "report_sections.json").write_text(json.dumps(sections))
    write_report(run)
    assert f"- {added}" in (run / "report.md").read_text()
    _reseal(run)
    found = verify_run(run)
    assert found.differences == [f"report_sections.json: section 'Paired comparisons': {added!r} is not a sentence "
                                 "the run's files render (the section, or a table it reads, was edited)"]


def _difference(data: dict) -> dict:
    return next(c for c in data["claims"] if c["kind"] == "difference" and c["row"]["ood_set"] == "textures")


def _where_names_another_set(data: dict) -> tuple[dict, str]:
    claim = _difference(data)
    return claim, {**claim, "where": "blobs", "text": claim["text"].replace("On textures,", "On blobs,")}


def _note_asserts_more(data: dict) -> tuple[dict, str]:
    claim = _difference(data)
    note = ", so MSP is the strongest detector overall"
    return claim, {**claim, "note": note, "text": claim["text"][:-1] + note + "."}


def _first_points_at_another_row(data: dict) -> tuple[dict, str]:
    claim = _difference(data)
    return claim, {**claim, "row": {**claim["row"], "ood_set": "blobs"}}


def _rate_names_another_attack(data: dict) -> tuple[dict, str]:
    claim = next(c for c in data["claims"] if c["table"] == "asr.csv" and c["where"].startswith("FGSM's"))
    return claim, {**claim, "where": claim["where"].replace("FGSM", "PGD"), "text": claim["text"].replace("FGSM", "PGD")}


def _summary_on_another_row(data: dict, run: Path) -> tuple[dict, str]:
    """The summary's largest worst-case AUROC moved to another detector's worst row, its numbers, description and
    sentence all that row's: only the selection (which detector's worst is largest) is false."""
    claim = next(c for c in data["summary"] if c["table"] == "ood.csv")
    ood = pd.read_csv(run / "ood.csv")
    rows = ood[(ood["positives"] != "natural") & (ood["detector"] != claim["row"]["detector"])]
    other = rows.loc[rows["auroc"].idxmin()]
    where = claim["where"].replace(f"{name(claim['row']['detector'])}, on {claim['row']['ood_set']}",
                                   f"{name(other['detector'])}, on {other['ood_set']}")
    value, lo, hi = (float(other[c]) for c in ("auroc", "auroc_lo", "auroc_hi"))
    return claim, {**claim, "row": {"detector": other["detector"], "ood_set": other["ood_set"]}, "where": where,
                   "value": value, "lo": lo, "hi": hi,
                   "text": f"{where}: {value:.1f} % (95 % interval {lo:.1f} to {hi:.1f}, {claim['method']}, ood.csv)"}


FREE_TEXT = {
    "a where that names another set": (_where_names_another_set, "its where 'blobs' is not its row's place"),
    "a note that asserts more": (_note_asserts_more, "no subject derives a note"),
    "cells that point at another row": (_first_points_at_another_row, "is not its row's place 'blobs'"),
    "a rate's where that names another attack": (_rate_names_another_attack, "is not asr.csv's \"FGSM's success"),
    "the summary's claim on a row it does not select": (_summary_on_another_row, "is not ood.csv's largest"),
}


@pytest.mark.parametrize("case", list(FREE_TEXT))
def test_a_claims_free_text_is_checked_against_its_cells(case, demo_run, tmp_path):
    """Issue 49: a claim whose ``where`` names another set, whose note carries an extra assertion, or whose cells
    point at another row re-rendered and passed (claims.json and report.md changed alike, the manifest written
    again). ``where`` is derived from the row's cells and a note from nothing, so each is a difference naming the
    claim; so is a value whose description names another attack and a summary claim on a row its selection does
    not pick."""
    out, _ = demo_run
    run = tmp_path / "run"
    shutil.copytree(out, run)
    data = json.loads((run / "claims.json").read_text())
    change, said = FREE_TEXT[case]
    claim, changed = change(data, run) if change is _summary_on_another_row else change(data)
    old = claim["text"]
    claim.clear()
    claim.update(changed)
    (run / "claims.json").write_text(json.dumps(data))
    if old != changed["text"] and old in (run / "report.md").read_text():
        _say(run, old, changed["text"])
    _reseal(run)
    diffs = verify_run(run).differences
    assert any(said in line and f"claims.json: {changed['text']!r}" in line for line in diffs), diffs


MALFORMED = {
    "not JSON": lambda text: "{not json",
    "a list": lambda text: "[]",
    "claims: null": lambda text: json.dumps({**json.loads(text), "claims": None}),
    "entries that are not objects": lambda text: json.dumps({**json.loads(text), "claims": [1, "x", None]}),
    "a value claim's kind changed to first": lambda text: text.replace('"kind": "value"', '"kind": "first"', 1),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_claims_json_is_one_finding(case, demo_run, tmp_path, capsys):
    """Issue 49: each of these ended verify in a traceback (an IndexError for the kind changed to ``first``); each
    is now one DIFFERENCE line on claims.json, exit 1."""
    out, _ = demo_run
    run = tmp_path / "run"
    shutil.copytree(out, run)
    (run / "claims.json").write_text(MALFORMED[case]((run / "claims.json").read_text()))
    _reseal(run)
    assert main(["verify", str(run)]) == 1
    captured = capsys.readouterr()
    lines = [line for line in captured.out.splitlines() if "DIFFERENCE" in line or "FILE" in line]
    assert len(lines) == 1 and "DIFFERENCE: claims.json: " in lines[0] and "Traceback" not in captured.err, lines
