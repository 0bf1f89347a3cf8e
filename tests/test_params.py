"""Typed plugin parameters (issue 32, item 4): attacks and detectors read ``self.p``, a frozen model whose fields
have their defaults' (or declared) types, validated when the plugin is built, i.e. at plan time."""
from __future__ import annotations

import re
from pathlib import Path

import pydantic
import pytest

from advopenood import registry
from advopenood.attacks.base import build_attack
from advopenood.errors import UsageError
from advopenood.params import Params, typed
from advopenood_plugins.kit.attacks import rel_stepsize

REPO = Path(__file__).resolve().parents[1]


def test_a_value_reads_with_its_default_type_and_cannot_change():
    p = typed("attack 'x'", {"steps": 3, "eps": 1, "lam": [1.0, 4.0], "rel": None},
              {"steps": 40, "eps": 0.03, "lam": [0.0], "rel": None}, {"rel": float | None})
    assert (p.steps, p.eps, p.lam, p.rel) == (3, 1.0, [1.0, 4.0], None)
    assert type(p.eps) is float and type(p.steps) is int
    with pytest.raises(pydantic.ValidationError):
        p.steps = 4


def test_a_value_its_declared_type_refuses_is_one_usage_error():
    with pytest.raises(UsageError, match=r"^parameter rel of attack 'x' is 'abc'; input should be a valid number"):
        typed("attack 'x'", {"rel": "abc"}, {"rel": None}, {"rel": float | None})


@pytest.mark.parametrize("name, given, field, want", [
    ("pgd", {"eps": 8 / 255, "steps": 7}, "steps", 7),
    ("pgd", {"eps": 1, "steps": 7}, "eps", 1.0),                         # an int eps reads as a float
    ("pgd", {"rel_stepsize": 1}, "rel_stepsize", 1.0),                    # declared float | None on the base
    ("mpgd", {"position_seed": 3}, "position_seed", 3),                   # declared on MaskedPGD
    ("apgd_ce", {"n_iter": 5}, "n_iter", 5),
    ("adaptive_eot_smoothed_msp", {"eot": 2, "lam": [1]}, "eot", 2),      # declared on the EOT mixin
])
def test_an_attack_reads_its_parameters_typed(name, given, field, want):
    attack = build_attack(name, given)
    value = getattr(attack.p, field)
    assert isinstance(attack.p, Params) and value == want and type(value) is type(want)


@pytest.mark.parametrize("name, given, field, want", [
    ("odin", {"temperature": 10}, "temperature", 10),
    ("knn", {"K": 7}, "K", 7),
    ("knn", {"fit_size": 100}, "fit_size", 100),
    ("smoothed_msp", {"sigma": 1}, "sigma", 1.0),
    ("ross_gen", {"lam": 0}, "lam", 0.0),
])
def test_a_detector_reads_its_parameters_typed(name, given, field, want):
    det = registry.create("detectors", name, **given)
    value = getattr(det.p, field)
    assert value == want and type(value) is type(want)


@pytest.mark.parametrize("params", [{"rel_stepsize": None, "steps": 10}, {"rel_stepsize": 0.1, "steps": 10}])
def test_the_kit_step_size_takes_typed_or_plain_parameters(params):
    expected = 0.25 if params["rel_stepsize"] is None else 0.1
    assert rel_stepsize(params) == pytest.approx(expected)
    assert rel_stepsize(typed("t", params, {"rel_stepsize": None, "steps": 1}, {"rel_stepsize": float | None})) \
        == pytest.approx(expected)


CAST = re.compile(r"\b(?:int|float|bool|str)\((?:self\.)?(?:p|params)\[")


@pytest.mark.parametrize("path", sorted([*(REPO / "plugins" / "attacks").glob("*.py"),
                                         *(REPO / "plugins" / "detectors").glob("*.py"),
                                         *(REPO / "plugins" / "kit").glob("*.py")]),
                         ids=lambda p: str(p.relative_to(REPO)))
def test_attacks_and_detectors_use_their_parameters_without_casts(path):
    assert not [line.strip() for line in path.read_text().splitlines() if CAST.search(line)]
