"""``advopenood verify RUN`` re-derives a run's tables from its files and fails on any changed number."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from advopenood.cli.main import main
from advopenood.evaluation.verify import as_csv_float, compare


@pytest.fixture(scope="module", params=["strong", "lorenz2024"])
def demo_run(request, session_cache, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("verify") / request.param
    assert main(["run", "--config", "demo", "--out", str(out), "--quiet", "--limit", "80", "--protocol", request.param,
                 "--attack", "fgsm,pgd", "--eps", "16/255", "--detectors", "msp,ebo,knn,mds",
                 "--analysis", "", "--ci-resamples", "200"]) == 0  # verify re-runs every resample as a loop
    return out


def _copy(run: Path, tmp_path: Path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(run, target)
    return target


def test_an_untouched_run_verifies(demo_run, capsys):
    assert main(["verify", str(demo_run)]) == 0
    assert "0 difference(s)" in capsys.readouterr().out


def _edit_csv(path: Path, row: dict, column: str, value) -> None:
    df = pd.read_csv(path)
    match = np.ones(len(df), dtype=bool)
    for key, want in row.items():
        match &= (df[key] == want).to_numpy()
    assert match.sum() == 1
    if isinstance(value, float):
        df[column] = df[column].astype(float)
    df.loc[match, column] = value
    df.to_csv(path, index=False, float_format="%.6g")


EDITS = {
    "ood auroc last digit": ("ood.csv", {"detector": "msp", "attack": "pgd"}, "auroc", lambda v: v + 1e-3),
    "ood fpr95 of a natural set": ("ood.csv", {"detector": "knn", "ood_set": "textures"}, "fpr95", lambda v: v - 1),
    "ood n_ood": ("ood.csv", {"detector": "ebo", "attack": "fgsm"}, "n_ood", lambda v: v - 1),
    "leaderboard adv_auroc": ("leaderboard.csv", {"detector": "mds"}, "adv_auroc", lambda v: v + 0.5),
    "asr": ("asr.csv", {"attack": "fgsm"}, "asr", lambda v: v - 0.5),
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_one_changed_number_is_a_difference(edit, demo_run, tmp_path, capsys):
    run = _copy(demo_run, tmp_path)
    table, row, column, change = EDITS[edit]
    old = pd.read_csv(run / table)
    match = np.logical_and.reduce([(old[k] == v).to_numpy() for k, v in row.items()])
    _edit_csv(run / table, row, column, change(old.loc[match, column].iloc[0]))
    assert main(["verify", str(run)]) == 1
    lines = [line for line in capsys.readouterr().out.splitlines() if "DIFFERENCE" in line]
    cells = [line for line in lines if "claims.json" not in line]  # a claim quoting the cell disagrees with it too
    assert len(cells) == 1 and table in cells[0] and column in cells[0]
    assert all(f"is not {table}'s" in line for line in lines if line not in cells)


def test_a_tampered_success_mask(demo_run, tmp_path, capsys):
    """Under ``strong`` the positives are the successful rows: a flipped ``success`` mask no longer matches
    ``positive`` and msp's pgd row no longer re-derives. Under ``lorenz2024`` every row is a positive and no
    table reads ``success``: the run still verifies."""
    run = _copy(demo_run, tmp_path)
    path = run / "scores" / "msp.npz"
    with np.load(path) as d:
        arrays = {k: d[k] for k in d.files}
    arrays["pgd.success"] = ~arrays["pgd.success"]
    np.savez(path, **arrays)
    protocol = json.loads((run / "run.json").read_text())["protocol"]["name"]
    rc = main(["verify", str(run)])
    out = capsys.readouterr().out
    if protocol == "strong":
        assert rc == 1 and "pgd.positive does not follow" in out and "'msp', 'attack': 'pgd'" in out
    else:
        assert rc == 0


@pytest.mark.parametrize("sub, said", [("", "is not a run folder (no run.json)"), ("gone", "does not exist;")])
def test_a_folder_without_run_json_is_refused_in_one_line(tmp_path, capsys, sub, said):
    """A folder without run.json is not a run folder; a path that does not exist is said not to exist."""
    assert main(["verify", str(tmp_path / sub)]) == 2
    err = capsys.readouterr().err
    assert f"{str(tmp_path / sub)!r} {said}" in err and len(err.strip().splitlines()) == 1


def test_compare_reports_missing_and_extra_rows():
    want = pd.DataFrame({"k": ["a", "b"], "v": [1.0, 2.0]})
    have = pd.DataFrame({"k": ["b", "c"], "v": [2.0, 3.0]})
    lines = compare(want, have, ["k"], ["v"])
    assert any("'a'" in line and "missing" in line for line in lines)
    assert any("'c'" in line and "not derivable" in line for line in lines)


@pytest.mark.parametrize("value", [70.45404663923182, 8.333333333333332, 0.1, 99.99999949, 1e-7])
def test_numbers_are_compared_as_the_csv_holds_them(value):
    assert not compare(pd.DataFrame({"k": [1], "v": [value]}), pd.DataFrame({"k": [1], "v": [as_csv_float(value)]}),
                       ["k"], ["v"])
    assert compare(pd.DataFrame({"k": [1], "v": [value]}),
                   pd.DataFrame({"k": [1], "v": [as_csv_float(value) * (1 + 3e-6)]}), ["k"], ["v"], atol=0.0)


@pytest.mark.parametrize("table", ["leaderboard", "table_ood"])
def test_markdown_tables_carry_the_protocol_like_their_csv(demo_run, table):
    header = (demo_run / f"{table}.md").read_text().splitlines()[0]
    protocol = json.loads((demo_run / "run.json").read_text())["protocol"]["name"]
    assert "protocol" in [c.strip() for c in header.strip("|").split("|")]
    assert f"| {protocol} |" in (demo_run / f"{table}.md").read_text()
    assert "protocol" in pd.read_csv(demo_run / f"{table}.csv").columns
