"""The ``hekal2026`` evaluator (ROSS's Table 2) on a tiny real run: CIFAR-10 ResNet-20, 16 images against Textures,
``hekal_min`` / ``hekal_max`` at 8/255 and 16/255 under ``--protocol hekal2026``, GEN and ROSS over GEN."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from advopenood.cli.main import main
from advopenood.evaluation import oracle
from conftest import assert_section_rerendered, edited_copy, pack_config

STD = [0.229, 0.224, 0.225]  # pack_config's normalisation
EPS = [8 / 255, 16 / 255]


@pytest.fixture(scope="module")
def hekal_run(data_root, session_cache, tmp_path_factory):
    folder = tmp_path_factory.mktemp("hekal")
    cfg = pack_config(folder / "cfg", data_root, {
        "limit": 16, "batch_size": 16,
        "data.fit": {"kind": "npz", "path": "cifar10_train_10k.npz", "name": "cifar10_train"}, "data.fit_limit": 200,
        "attacks": [{"name": "hekal_min", "eps": EPS}, {"name": "hekal_max", "eps": EPS}],
        "attack_params": {"hekal_min": {"steps": 2}, "hekal_max": {"steps": 2}},
        "detectors": "gen,ross_gen", "detector_params": {"ross_gen": {"n": 3, "val_size": 32}},
        "evaluators": ["ood", "hekal2026"]})
    out = folder / "out"
    assert main(["run", "--config", cfg, "--protocol", "hekal2026", "--ci-resamples", "200", "--out", str(out),
                 "--quiet"]) == 0
    return out


def test_the_table_has_a_row_per_detector_set_eps_and_objective(hekal_run):
    table = pd.read_csv(hekal_run / "table_hekal2026.csv")
    assert list(table.columns) == ["detector", "ood_set", "eps", "eps_units", "eps_pixel", "objective", "attack",
                                   "through", "clip", "left_range", "n_id", "n_ood", "auroc", "auroc_lo", "auroc_hi",
                                   "fpr95", "fpr95_lo", "fpr95_hi", "ci", "protocol"]
    assert sorted(zip(table.detector, table.objective, table.eps.fillna(0).round(4))) == sorted(
        [(d, "No Attack", 0.0) for d in ("gen", "ross_gen")]
        + [(d, o, round(e, 4)) for d in ("gen", "ross_gen") for o in ("PGD-Min", "PGD-Max") for e in EPS])
    attacked = table[table.attack != "none"]
    assert (attacked.eps_units == "normalised").all() and (~attacked["clip"].astype(bool)).all()
    np.testing.assert_allclose(attacked.eps_pixel, attacked.eps * max(STD), rtol=1e-5)
    assert (attacked.left_range > 0).any()
    assert dict(zip(attacked.detector, attacked.through)) == {"gen": "self", "ross_gen": "base"}
    assert (table.protocol == "hekal2026").all() and (table.ood_set == "texture").all()
    assert (table.n_id == 16).all() and (table.n_ood == 16).all()
    assert (hekal_run / "table_hekal2026.md").is_file()


def test_each_row_scores_the_sets_it_names(hekal_run):
    """No Attack: clean ID vs clean OOD; PGD-Min: the attacked ID set vs clean OOD; PGD-Max: clean ID vs the
    attacked OOD set; the No Attack row's interval is ood.csv's."""
    table = pd.read_csv(hekal_run / "table_hekal2026.csv")
    ood = pd.read_csv(hekal_run / "ood.csv")
    for r in table.to_dict("records"):
        with np.load(hekal_run / "scores" / f"{r['detector']}.npz") as s:
            conf_id = s[r["attack"]] if r["objective"] == "PGD-Min" else s["id"]
            conf_ood = s[r["attack"]] if r["objective"] == "PGD-Max" else s["texture"]
        assert r["auroc"] == pytest.approx(oracle.auroc(conf_id, conf_ood), abs=1e-4)
        assert r["fpr95"] == pytest.approx(oracle.fpr95(conf_id, conf_ood), abs=1e-4)
    clean = table[table.attack == "none"].merge(ood[ood.attack == "none"], on=["detector", "ood_set"])
    np.testing.assert_allclose(clean.auroc_lo_x, clean.auroc_lo_y, atol=1e-4)


def test_the_sets_are_stored_outside_the_pixel_range_and_count_as_the_robust_sets_do(hekal_run):
    info = json.loads((hekal_run / "run.json").read_text())
    assert info["protocol"]["name"] == "hekal2026" and info["protocol"]["ood_positives"] == "all"
    ood = pd.read_csv(hekal_run / "ood.csv")
    assert not ood.ood_set.str.startswith("hekal_min").any()  # ID negatives: never OOD positives
    assert ood.ood_set.str.startswith("hekal_max").any()


def test_an_untouched_run_verifies(hekal_run, capsys):
    assert main(["verify", str(hekal_run)]) == 0
    assert "0 difference(s)" in capsys.readouterr().out


def test_verify_rerenders_the_table_2_section(hekal_run, tmp_path):
    """Issue 49, item 2: a sentence added to the Table 2 section passed, the section taken as saved; verify renders
    it again from table_hekal2026.csv."""
    assert_section_rerendered(hekal_run, tmp_path, "Hekal et al. 2026 (ROSS), Table 2")


@pytest.mark.parametrize("column, row", [("auroc", 1), ("fpr95_hi", 2), ("left_range", 1)])
def test_an_edited_cell_fails_verify(hekal_run, tmp_path, capsys, column, row):
    copy = edited_copy(hekal_run, tmp_path, "table_hekal2026.csv", column, delta=-0.5, row=row)
    assert main(["verify", str(copy)]) == 1
    assert column in capsys.readouterr().out


@pytest.mark.parametrize("edit, rc", [(False, 0), (True, 1)])
def test_verify_in_a_fresh_process(hekal_run, tmp_path, edit, rc):
    """A new process finds the hekal2026 hook through the entry points and re-derives the table from the files."""
    import subprocess
    import sys

    run = edited_copy(hekal_run, tmp_path, "table_hekal2026.csv", "auroc", delta=-0.5, row=1) if edit else hekal_run
    done = subprocess.run([sys.executable, "-m", "advopenood.cli", "verify", str(run)], capture_output=True, text=True)
    assert done.returncode == rc, done.stdout + done.stderr
    assert "not installed here" not in done.stdout
    lines = [line for line in done.stdout.splitlines() if "DIFFERENCE" in line]
    assert len(lines) == (1 if edit else 0) and all("table_hekal2026.csv" in line for line in lines), done.stdout


# ------------------------------------------------------------------ nothing to compute (issue 39, item 10)

def _reason(what: str) -> str:
    from advopenood.config.protocols import HEKAL_COMMAND

    return f"{what}; ROSS's Table 2 runs as: {HEKAL_COMMAND}"


@pytest.mark.parametrize("changes, what", [
    ({}, "no hekal_min or hekal_max attack ran in this run"),
    ({"attacks": [{"name": "hekal_min_gen", "eps": 8 / 255, "params": {"steps": 1}}], "detectors": "msp"},
     "the detectors its attacks attack are not scored in this run (hekal_min_gen on gen); add them to --detectors "
     "(scored: msp)"),
], ids=["no-hekal-attack", "attacked-detector-not-scored"])
def test_without_its_sets_the_evaluator_says_what_is_missing(changes, what, tmp_path, capsys, data_root,
                                                             session_cache):
    """It once wrote a header-only table, exit 0, no word."""
    cfg = pack_config(tmp_path / "cfg", data_root, {**changes, "evaluators": ["ood", "hekal2026"]})
    out = tmp_path / "out"
    assert main(["run", "--config", cfg, "--protocol", "hekal2026", "--out", str(out), "--quiet"]) == 0
    reason = _reason(what)
    assert f"advopenood: evaluator:hekal2026 had nothing to compute: {reason}" in capsys.readouterr().err
    info = json.loads((out / "run.json").read_text())
    assert info["nothing_computed"] == {"evaluator:hekal2026": reason}
    report = (out / "report.md").read_text()
    assert "hekal2026: nothing to compute" in report and reason in report
    assert not (out / "table_hekal2026.csv").exists() and (out / "ood.csv").is_file()
    assert main(["verify", str(out)]) == 0  # nothing to compute: no table is expected


def test_the_protocol_without_its_evaluator_says_so_at_the_start(tmp_path, capsys, data_root, session_cache):
    """``--protocol hekal2026`` alone ran the config's attacks and wrote no Table 2 without a word."""
    from advopenood.config.protocols import HEKAL_COMMAND

    out = tmp_path / "out"
    assert main(["run", "--config", pack_config(tmp_path / "cfg", data_root), "--protocol", "hekal2026", "--out",
                 str(out), "--quiet"]) == 0
    note = ("protocol hekal2026 writes its table through the hekal2026 evaluator, which this run does not select, so "
            f"it has no such table; its protocol runs as: {HEKAL_COMMAND}")
    assert capsys.readouterr().err.splitlines() == [f"advopenood: note: {note}"]
    assert json.loads((out / "run.json").read_text())["notes"] == [note]
    assert note in (out / "report.md").read_text()


def test_the_command_in_help_and_messages_is_a_valid_run_of_their_protocol(data_root):
    import shlex
    import subprocess
    import sys

    from advopenood.cli.main import _plan, build_parser
    from advopenood.config.protocols import HEKAL_COMMAND

    done = subprocess.run([sys.executable, "-m", "advopenood.cli", "run", "--help"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and HEKAL_COMMAND in " ".join(done.stdout.split())
    words = shlex.split(HEKAL_COMMAND)
    assert words[:2] == ["advopenood", "run"]
    plan = _plan(build_parser().parse_args([*words[1:], "--data-root", str(data_root)]))
    assert plan.protocol == "hekal2026" and "hekal2026" in plan.evaluators and plan.notes() == []
    sets = {(s.attack, round(float(s.params["eps"]) * 255)) for s in plan.attack_specs}
    assert sets == {(f"hekal_{side}_{det}", eps) for side in ("min", "max") for det in ("gen", "ross_gen")
                    for eps in (2, 4, 8, 16)}
