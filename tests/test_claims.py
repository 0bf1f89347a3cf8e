"""Claims as data (advopenood/claims.py): every comparison the report states and every number the end-of-run summary
prints is a claim in claims.json, re-read by `advopenood verify` from the tables; a direction is stated only where
the paired interval of the stated difference excludes 0; the summary quotes the table's own interval."""
from __future__ import annotations

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

#: a sentence that states a direction, in any wording the report has used: names, difference, first interval
DIRECTION = re.compile(r"On (?P<set>[^,]+), (?P<a>\S+?)'s (?P<what>[\w ]+?) is higher than (?P<b>\S+?)'s by "
                       r"(?P<d>-?[\d.]+) points \([^\[]*\[(?P<lo>[-+\d.]+), (?P<hi>[-+\d.]+)\]")


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory, session_cache):
    """A small demo run (60 images a set, two attacks, five detectors, the ood evaluator) and its stdout."""
    out = tmp_path_factory.mktemp("claims") / "run"
    import contextlib
    import io

    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        rc = main(["run", "--config", "demo", "--out", str(out), "--quiet", "--limit", "60", "--attack", "fgsm,pgd",
                   "--detectors", "msp,mls,ebo,knn,ash", "--analysis", ""])
    assert rc == 0
    return out, stdout.getvalue()


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
    row = ood[(ood["detector"].map(name) == det) & (ood["ood_set"] == where)].iloc[0]
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
                       ("detector_a", "detector_b", "delta_auroc", "delta_auroc_lo", "delta_auroc_hi"), "TEXTURES")
    assert claim.kind == "difference" and claim.names == ("ebo", "ash")
    assert claim.text.startswith("On TEXTURES, EBO's AUROC is higher than ASH's by 27.0 points")
    assert "[+23.1, +30.8]" in claim.text
    tie = pair_claim({**row, "delta_auroc_hi": 0.4}, "paired.csv", ("detector_a", "detector_b", "ood_set"),
                     claim.columns, "TEXTURES")
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
