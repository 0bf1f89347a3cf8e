"""What a run's settings leave out or ignore is said at its start (stderr), in run.json (``notes``) and in the report
(issue 39, items 11 and 12): resamples under DeLong or no interval, a run without detectors, one without attacks."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from conftest import pack_config

from advopenood.cli.main import main

NO_EFFECT = "ci.resamples 50 (--ci-resamples) has no effect under ci.method {}: {}, no resample is drawn"
NO_DETECTOR = ("no detector is selected (detectors is empty): nothing is scored, so there is no OOD table (ood.csv "
               "has no rows); select some with --detectors (e.g. msp) or detectors: in the config")
NO_ATTACK = ("no attack is selected (attacks is empty): no adversarial set is made, so asr.csv has no rows and every "
             "table covers the natural OOD sets only")


@pytest.mark.parametrize("flags, note", [
    (["--ci", "delong", "--ci-resamples", "50"], NO_EFFECT.format("delong", "DeLong's intervals are analytic")),
    (["--ci", "none", "--ci-resamples", "50"], NO_EFFECT.format("none", "no interval is computed")),
    (["--detectors", ""], NO_DETECTOR),
    (["--attack", ""], NO_ATTACK),
], ids=["delong-resamples", "none-resamples", "no-detectors", "no-attacks"])
def test_a_setting_with_nothing_to_act_on_is_said(flags, note, tmp_path, capsys, data_root, session_cache):
    out = tmp_path / "out"
    rc = main(["run", "--config", pack_config(tmp_path / "cfg", data_root), "--out", str(out), "--quiet", *flags])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert err.splitlines() == [f"advopenood: note: {note}"]
    info = json.loads((out / "run.json").read_text())
    assert info["notes"] == [note]
    assert f"- {note}" in (out / "report.md").read_text()
    ood = pd.read_csv(out / "ood.csv")
    if "--ci-resamples" in flags:  # taken as given, and the intervals are the method's
        assert info["config"]["ci"] == {"method": flags[1], "resamples": 50}
        assert {c.split(";")[0] for c in ood["ci"]} == {flags[1]} and len(ood) > 0  # "; at a bound: ..." where one is
        assert ood["auroc_lo"].notna().all() == (flags[1] == "delong")
    if "--detectors" in flags:
        assert ood.empty and len(pd.read_csv(out / "asr.csv")) == 1
    if "--attack" in flags:
        assert pd.read_csv(out / "asr.csv").empty and set(ood["attack"].fillna("none")) == {"none"}


def test_too_few_resamples_for_a_bootstrap_are_refused_in_one_line(tmp_path, capsys, data_root):
    rc = main(["run", "--config", pack_config(tmp_path / "cfg", data_root), "--out", str(tmp_path / "out"),
               "--ci-resamples", "50"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == ["advopenood: error: ci.resamples: 50 resamples are too few for a bootstrap: its "
                               "percentiles would be too coarse for a 95 % interval; valid choices: at least 100, or "
                               "ci.method delong or none, which draw no resamples (from the flag --ci-resamples)"]
    assert not (tmp_path / "out").exists()


def test_a_run_with_every_setting_in_use_and_the_attack_command_have_no_notes(tmp_path, capsys, data_root,
                                                                               session_cache):
    """The ``attack`` command scores no detector by design: it says nothing about it."""
    config = pack_config(tmp_path / "cfg", data_root)
    assert main(["attack", "--config", config, "--out", str(tmp_path / "attack"), "--quiet"]) == 0
    assert main(["run", "--config", config, "--out", str(tmp_path / "run"), "--quiet", "--ci", "delong"]) == 0
    assert "note" not in capsys.readouterr().err
    for out in ("attack", "run"):
        assert json.loads((tmp_path / out / "run.json").read_text())["notes"] == []
