"""The budget each attack set actually has (issue 30, items 3 and 4): ``--eps`` never silently skips an attack
named with it, the config's ``eps`` gives the demo's attacks one budget, and outputs state each set's budget."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from advopenood.cli.main import main
from advopenood.config.loading import apply_overrides, load_config

SIXTEEN = 16 / 255


@pytest.mark.parametrize("attacks, refused", [
    ("df", "'df'"),
    ("cw", "'cw'"),
    ("df,cw", "'df', 'cw'"),
])
def test_eps_with_only_minimal_attacks_is_refused(attacks, refused, capsys):
    rc = main(["run", "--config", "demo", "--attack", attacks, "--eps", "8/255"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "Traceback" not in err[0], err
    assert f"--eps 8/255 does not apply to {refused}" in err[0] and "no budget" in err[0]


def _budgets(attack: str | None = None, **settings) -> dict[str, float | None]:
    plan, folder = load_config("demo")
    plan = apply_overrides(plan.model_copy(update=settings) if settings else plan, config_dir=folder, attack=attack,
                           detectors="msp")
    return {spec.set_name: spec.params.get("eps") for spec in plan.attack_specs}


@pytest.mark.parametrize("attack, expected", [
    # the demo's own attacks: FGSM and PGD at the demo's 16/255, DeepFool without a budget, mPGD's patch at 1.0
    (None, {"fgsm": SIXTEEN, "pgd": SIXTEEN, "df": None, "mpgd": 1.0}),
    # the detector-adaptive attacks and other Linf attacks at the same budget as PGD (they defaulted to 8/255)
    ("pgd,adaptive,adaptive_ood,adaptive_apgd,mim,square,autoattack",
     {"pgd": SIXTEEN, "adaptive_msp": SIXTEEN, "adaptive_ood_msp": SIXTEEN, "adaptive_apgd_msp": SIXTEEN,
      "mim": SIXTEEN, "square": SIXTEEN, "autoattack": SIXTEEN}),
    # an L2 attack keeps its own (L2) default: the config's eps is an Linf budget
    ("mead_pgd_ce_l2", {"mead_pgd_ce_l2": 0.25}),
])
def test_the_demo_gives_every_linf_attack_one_budget(attack, expected):
    got = _budgets(attack)
    assert got.keys() == expected.keys()
    for name, eps in expected.items():
        assert (got[name] is None and eps is None) or math.isclose(got[name], eps), (name, got[name])


def test_an_attacks_own_eps_wins_over_the_configs():
    got = _budgets("pgd,fgsm", attack_params={"pgd": {"eps": 8 / 255}})
    assert math.isclose(got["pgd"], 8 / 255) and math.isclose(got["fgsm"], SIXTEEN)


@pytest.mark.parametrize("attack", [[], ["--attack", "pgd,df"]])
def test_eps_skips_a_minimal_attack_and_says_so(attack, tmp_path, capsys, session_cache):
    """``--eps`` with DeepFool among the attacks (the config's or the flag's): the run goes on, stderr notes that
    DeepFool has no budget, asr.csv leaves its eps empty and the report shows ``none``."""
    out = tmp_path / "run"
    rc = main(["run", "--config", "demo", "--out", str(out), "--quiet", "--limit", "8", "--detectors", "msp",
               "--evaluator", "ood", "--analysis", "", "--eps", "8/255", *attack])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "--eps 8/255 did not apply to 'df' (minimal-perturbation attacks have no budget" in err
    asr = pd.read_csv(out / "asr.csv").set_index("attack")
    assert math.isnan(asr.loc["df", "eps"]) and math.isclose(asr.loc["pgd", "eps"], 8 / 255, rel_tol=1e-5)
    report = (out / "report.md").read_text()
    assert "| DF | none |" in report
