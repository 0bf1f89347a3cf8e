"""An evaluator or analysis with nothing to compute says so in the report, on stderr and in run.json, with its
reason (issue 30, item 2: ``--evaluator smoothed`` without its attacks once wrote nothing and said nothing)."""
from __future__ import annotations

import json

import pytest

from conftest import registered

from advopenood.cli.main import main
from advopenood.outputs.results import Results


class _Empty:
    """Returns nothing and gives no reason."""

    def __call__(self, ctx):
        return None


class _EmptyWithReason:
    """Returns nothing and says why."""

    def __call__(self, ctx):
        return Results(empty_reason="it needs the attack zzneeded")


PLUGINS = {("evaluators", "zzempty"): _Empty, ("analyses", "zzreason"): _EmptyWithReason}


@pytest.fixture(scope="module", autouse=True)
def _plugins():
    yield from registered(PLUGINS)


@pytest.mark.parametrize("detectors, smoothed_reason", [
    ("msp", "it needs a smoothed detector"),
    ("msp,smoothed_msp", "no plain or EOT adaptive attack on smoothed_msp in this run; it needs the attacks "
                         "adaptive_smoothed_msp and adaptive_eot_smoothed_msp"),
])
def test_a_plugin_with_nothing_to_compute_says_so(detectors, smoothed_reason, tmp_path, capsys, session_cache):
    out = tmp_path / "run"
    rc = main(["run", "--config", "demo", "--out", str(out), "--quiet", "--limit", "40", "--attack", "fgsm",
               "--eps", "16/255", "--detectors", detectors, "--evaluator", "ood,smoothed,zzempty",
               "--analysis", "zzreason"])
    err = capsys.readouterr().err
    assert rc == 0, err
    expected = {"evaluator:smoothed": smoothed_reason, "evaluator:zzempty": "it returned no table",
                "analysis:zzreason": "it needs the attack zzneeded"}
    info = json.loads((out / "run.json").read_text())
    assert set(info["nothing_computed"]) == set(expected)  # ood computed its tables: it is not named
    report = (out / "report.md").read_text()
    for label, reason in expected.items():
        assert info["nothing_computed"][label].startswith(reason)
        assert f"advopenood: {label} had nothing to compute: {reason}" in err
        name = label.split(":")[1]
        assert f"{name}: nothing to compute" in report and reason in report
    assert not (out / "table_smoothed.csv").exists() and (out / "ood.csv").is_file()
