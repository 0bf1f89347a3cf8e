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
    assert "0 difference(s), 0 file finding(s)" in capsys.readouterr().out


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


def test_one_changed_number_is_a_difference(demo_run, tmp_path, capsys):
    """Each edit of :data:`EDITS` (other cells, three of them in ``ood.csv``) in one copy verified once (one verify
    instead of one an edit: each re-runs every resample): every edit is one difference naming its table, column and
    row, there is no other difference of a cell, and a claim quoting an edited cell disagrees with that table."""
    run = _copy(demo_run, tmp_path)
    for table, row, column, change in EDITS.values():
        old = pd.read_csv(run / table)
        match = np.logical_and.reduce([(old[k] == v).to_numpy() for k, v in row.items()])
        _edit_csv(run / table, row, column, change(old.loc[match, column].iloc[0]))
    assert main(["verify", str(run)]) == 1
    lines = [line for line in capsys.readouterr().out.splitlines() if "DIFFERENCE" in line]
    cells = [line for line in lines if "claims.json" not in line]  # a claim quoting the cell disagrees with it too

    def names(line: str, table: str, row: dict, column: str) -> bool:
        return (f"DIFFERENCE: {table}: " in line and f" {column}: " in line
                and all(f"{k!r}: {v!r}" in line for k, v in row.items()))

    assert len(cells) == len(EDITS), cells
    assert all(sum(names(line, t, r, c) for line in cells) == 1 for t, r, c, _ in EDITS.values()), cells
    tables = {t for t, *_ in EDITS.values()}
    assert all(any(f"is not {t}'s" in line for t in tables) for line in lines if line not in cells), lines


def test_a_tampered_success_mask(demo_run, tmp_path, capsys):
    """Under ``strong`` the positives are the successful rows: a flipped ``success`` mask no longer matches
    ``positive`` and msp's pgd row no longer re-derives. Under ``lorenz2024`` every row is a positive and no
    table reads ``success``: every table still re-derives, and the changed score file is a file finding (its
    SHA-256 is not the one ``manifest.json`` recorded)."""
    run = _copy(demo_run, tmp_path)
    path = run / "scores" / "msp.npz"
    with np.load(path) as d:
        arrays = {k: d[k] for k in d.files}
    arrays["pgd.success"] = ~arrays["pgd.success"]
    np.savez(path, **arrays)
    protocol = json.loads((run / "run.json").read_text())["protocol"]["name"]
    rc = main(["verify", str(run)])
    out = capsys.readouterr().out
    changed = "FILE: scores/msp.npz: its SHA-256 is not the one manifest.json lists"
    assert rc == 1 and changed in out  # the file differs from the digest the run recorded, under both protocols
    if protocol == "strong":
        assert "pgd.positive does not follow" in out and "'msp', 'attack': 'pgd'" in out
    else:
        assert "DIFFERENCE" not in out


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


# ------------------------------------------------------------------ every row the run must have, every file's digest


def _findings(run: Path, capsys) -> tuple[int, list[str], list[str]]:
    """``(exit code, DIFFERENCE lines, FILE lines)`` of ``advopenood verify RUN``; a traceback fails the test."""
    code = main(["verify", str(run)])
    out = capsys.readouterr().out
    lines = out.splitlines()
    return code, [x for x in lines if "DIFFERENCE: " in x], [x for x in lines if "FILE: " in x]


def _reseal(run: Path) -> None:
    """Write ``manifest.json`` again with the digests of the files as they are now, as a hand that edited the tables
    would: the row checks alone must then find what was taken out."""
    import hashlib

    from advopenood.io import files_under

    files = {rel: hashlib.sha256((run / rel).read_bytes()).hexdigest() for rel in files_under(run)
             if rel != "manifest.json"}
    (run / "manifest.json").write_text(json.dumps({"advopenood_manifest": 1, "files": files}))


def test_a_detector_taken_out_of_every_table_is_missing(demo_run, tmp_path, capsys):
    """msp's rows are deleted from ood.csv and from every table derived from it, and the manifest is written again
    to match: verify derives the rows from run.json and the scores and names each missing one."""
    run = _copy(demo_run, tmp_path)
    for table, column in (("ood.csv", "detector"), ("leaderboard.csv", "detector"), ("table_ood.csv", "detector"),
                          ("paired.csv", "detector_a"), ("paired.csv", "detector_b")):
        df = pd.read_csv(run / table)
        df[df[column] != "msp"].to_csv(run / table, index=False, float_format="%.6g")
    _reseal(run)
    code, diffs, files = _findings(run, capsys)
    assert code == 1 and files == []
    for name in ("textures", "fgsm", "pgd"):
        attack = "none" if name == "textures" else name
        assert any(f"ood.csv: row {{'detector': 'msp', 'attack': '{attack}', 'ood_set': '{name}'}} is missing" in x
                   for x in diffs), diffs
    assert any("leaderboard.csv: row {'detector': 'msp'} is missing" in x for x in diffs)
    assert any("paired.csv: row {'detector_a': 'ebo', 'detector_b': 'msp', 'ood_set': 'pgd'} is missing" in x
               for x in diffs)


def test_one_deleted_row_is_named(demo_run, tmp_path, capsys):
    run = _copy(demo_run, tmp_path)
    df = pd.read_csv(run / "ood.csv")
    gone = (df["detector"] == "knn") & (df["ood_set"] == "fgsm")
    df[~gone].to_csv(run / "ood.csv", index=False, float_format="%.6g")
    code, found, files = _findings(run, capsys)
    diffs = [line for line in found if "claims.json" not in line]  # a claim that ranks the set's detectors, too
    assert code == 1
    assert diffs == ["advopenood verify: DIFFERENCE: ood.csv: row {'detector': 'knn', 'attack': 'fgsm', "
                     "'ood_set': 'fgsm'} is missing"]
    assert all("on fgsm" in line for line in found if line not in diffs), found
    assert len(files) == 1 and "ood.csv: its SHA-256 is not the one manifest.json lists" in files[0]


@pytest.mark.parametrize("extra", ["unknown detector", "repeated row"])
def test_an_extra_row_is_named(extra, demo_run, tmp_path, capsys):
    run = _copy(demo_run, tmp_path)
    df = pd.read_csv(run / "ood.csv")
    row = df[(df["detector"] == "ebo") & (df["ood_set"] == "textures")].copy()
    if extra == "unknown detector":
        row["detector"] = "nodet"
    pd.concat([df, row]).to_csv(run / "ood.csv", index=False, float_format="%.6g")
    code, found, _ = _findings(run, capsys)
    diffs = [line for line in found if "claims.json" not in line]  # a claim that ranks the set's detectors, too
    said = ("{'detector': 'nodet', 'attack': 'none', 'ood_set': 'textures'} is not derivable"
            if extra == "unknown detector" else "{'detector': 'ebo', 'attack': 'none', 'ood_set': 'textures'} is "
                                                "written 2 times")
    assert code == 1 and len(diffs) == 1 and f"ood.csv: row {said}" in diffs[0], diffs


def test_a_deleted_ood_csv_is_a_finding(demo_run, tmp_path, capsys):
    run = _copy(demo_run, tmp_path)
    (run / "ood.csv").unlink()
    code, diffs, files = _findings(run, capsys)
    assert code == 1
    assert "advopenood verify: DIFFERENCE: ood.csv: missing (the run wrote it)" in diffs
    assert "advopenood verify: FILE: ood.csv: listed in manifest.json but missing" in files


def test_a_renamed_set_is_a_finding(demo_run, tmp_path, capsys):
    run = _copy(demo_run, tmp_path)
    df = pd.read_csv(run / "ood.csv")
    df["ood_set"] = df["ood_set"].replace("textures", "texturez")
    df.to_csv(run / "ood.csv", index=False, float_format="%.6g")
    code, diffs, _ = _findings(run, capsys)
    assert code == 1
    for det in ("msp", "ebo", "knn", "mds"):
        assert any(f"row {{'detector': '{det}', 'attack': 'none', 'ood_set': 'textures'}} is missing" in x
                   for x in diffs)
        assert any(f"row {{'detector': '{det}', 'attack': 'none', 'ood_set': 'texturez'}} is not derivable" in x
                   for x in diffs)


def _drop(path: Path, column: str) -> None:
    pd.read_csv(path).drop(columns=[column]).to_csv(path, index=False, float_format="%.6g")


def _text(path: Path, column: str) -> None:
    df = pd.read_csv(path).astype({column: object})
    df.loc[0, column] = "high"
    df.to_csv(path, index=False, float_format="%.6g")


HOSTILE_TABLES = {
    "ood.csv without its ood_set column": ("ood.csv", lambda p: _drop(p, "ood_set"), "ood.csv: column 'ood_set' is missing"),
    "leaderboard without detector": ("leaderboard.csv", lambda p: _drop(p, "detector"),
                                     "leaderboard.csv: column 'detector' is missing"),
    "leaderboard without a metric": ("leaderboard.csv", lambda p: _drop(p, "far_auroc"),
                                     "leaderboard.csv: column 'far_auroc' is missing"),
    "an emptied paired.csv": ("paired.csv", lambda p: p.write_text(""), "paired.csv: cannot be read as a CSV table"),
    "an emptied asr.csv": ("asr.csv", lambda p: p.write_text(""), "asr.csv: cannot be read as a CSV table"),
    "a word in asr.csv": ("asr.csv", lambda p: _text(p, "asr"), "asr: written 'high'"),
    "a word in table_ood.csv": ("table_ood.csv", lambda p: _text(p, "digits fgsm AUROC"),
                                "'column': 'digits fgsm AUROC'} value: written 'high'"),
}


@pytest.mark.parametrize("hostile", list(HOSTILE_TABLES))
def test_a_damaged_table_is_a_finding_not_a_traceback(hostile, demo_run, tmp_path, capsys):
    run = _copy(demo_run, tmp_path)
    table, damage, said = HOSTILE_TABLES[hostile]
    damage(run / table)
    code, diffs, files = _findings(run, capsys)
    assert code == 1 and any(said in x for x in diffs), diffs
    assert any(f"FILE: {table}: its SHA-256 is not" in x for x in files)


def test_one_changed_byte_of_a_plot_is_a_file_finding(demo_run, tmp_path, capsys):
    run = _copy(demo_run, tmp_path)
    plot = sorted((run / "plots").glob("*.png"))[0]
    data = bytearray(plot.read_bytes())
    data[len(data) // 2] ^= 1
    plot.write_bytes(bytes(data))
    (run / "notes.txt").write_text("mine")
    code, diffs, files = _findings(run, capsys)
    rel = plot.relative_to(run).as_posix()
    assert code == 1 and diffs == []
    assert files == [f"advopenood verify: FILE: {rel}: its SHA-256 is not the one manifest.json lists (the file "
                     "changed after the run wrote it)",
                     "advopenood verify: FILE: notes.txt: not listed in manifest.json (the run did not write it)"]


def test_a_changed_store_shard_is_named_with_its_set(demo_run, tmp_path, capsys):
    """A shard whose bytes changed (one pixel of ``x_adv``; every record still reads) fails its checksum: the finding
    names the shard's path and the set. The run folder points at a private copy of the store."""
    run = _copy(demo_run, tmp_path)
    info = json.loads((run / "run.json").read_text())
    info["attacks"]["pgd"]["path"] = str(shutil.copytree(info["attacks"]["pgd"]["path"], tmp_path / "store"))
    (run / "run.json").write_text(json.dumps(info))
    _reseal(run)
    shard = tmp_path / "store" / "shard_00000.npz"
    with np.load(shard) as d:
        arrays = {k: d[k] for k in d.files}
    arrays["x_adv"][0, 0, 0, 0] = 1.0 - arrays["x_adv"][0, 0, 0, 0]
    np.savez(shard, **arrays)
    code, diffs, files = _findings(run, capsys)
    assert code == 1 and diffs == []
    assert files == [f"advopenood verify: FILE: store shard {str(shard)!r} of set 'pgd': fails its SHA-256 checksum "
                     "(it changed after the run wrote it)"]
