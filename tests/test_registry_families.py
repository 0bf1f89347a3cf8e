"""Families, not generated classes (issue 41, item 5): a family is registered once with a name prefix and resolves
its names at look-up, each made once per registry; ``advopenood list`` shows families, ``--all`` every name; the
registry is an instance a test takes fresh; the names a family generates stay reserved (issue 39)."""
from __future__ import annotations

import pytest

from advopenood import registry
from advopenood.capabilities import is_differentiable
from advopenood.cli.main import main
from advopenood.errors import UsageError


def counting_family(reg: registry.Registry, calls: list[str]) -> None:
    """A third party's family ``zzwrap_<detector>`` on ``reg``, for detectors with a differentiable score, whose
    factory records every call."""

    def make(detector: str) -> type:
        calls.append(detector)
        return type(f"zzwrap_{detector}", (), {"__doc__": f"Wraps {detector}.", "__module__": "zz_family.plugins"})

    reg.family("attacks", "zzwrap_", make, accepts=is_differentiable, source="zz_family.plugins",
               hint="a detector with a differentiable score")


def test_a_family_name_is_made_once_per_name_and_registry(fresh_registry):
    """Looking a name up again, listing every name and the built-in families' deepest names never call a factory
    twice for one name; a fresh registry makes its own."""
    calls: list[str] = []
    counting_family(fresh_registry, calls)
    first = registry.get("attacks", "zzwrap_msp")
    for _ in range(3):
        assert registry.get("attacks", "zzwrap_msp") is first and registry.resolves("attacks", "zzwrap_ross_msp")
    assert calls == ["msp", "ross_msp"]
    listed = registry.names("attacks")
    registry.names("attacks")
    wrapped = sorted(n.removeprefix("zzwrap_") for n in listed if n.startswith("zzwrap_"))
    assert sorted(calls) == wrapped and "zzwrap_knn" in listed and "zzwrap_ross_knn" in listed
    assert "zzwrap_smoothed_ebo" in listed and "zzwrap_nosuch" not in listed and "zzwrap_negentropy" not in listed
    deep = registry.get("attacks", "adaptive_apgd_eot_ross_msp")
    assert registry.get("attacks", "adaptive_apgd_eot_ross_msp") is deep
    assert sum(key == ("attacks", "adaptive_apgd_eot_ross_msp") for key in fresh_registry.made) == 1
    with registry.using(registry.default().copy()) as other:
        assert registry.get("attacks", "zzwrap_msp") is not first and len(calls) == len(wrapped) + 1
    assert other is not fresh_registry


def test_one_look_up_makes_only_what_it_names(fresh_registry):
    """Resolving one generated name makes that plugin and its base's chain, not the ~1,000 others (the providers
    of 0.1 generated every name on every look-up)."""
    registry.get("attacks", "robust_apgd_aux_ood_eot_smoothed_knn")
    assert sorted(key for _, key in fresh_registry.made) == ["robust_apgd_aux_ood_eot_smoothed_knn", "smoothed_knn"]


def test_a_family_name_follows_its_base_plugin(fresh_registry):
    """A detector registered later has its generated names; unregistered, they stop resolving (none is served
    stale), and registered again as another class, they are made again from it."""
    plain = type("zzbase", (), {"__doc__": "A detector.", "__module__": "zz_base"})
    assert not registry.resolves("detectors", "ross_zzbase")
    registry.register("detectors", "zzbase")(plain)
    assert registry.get("detectors", "ross_zzbase").base_name == "zzbase"
    assert not registry.resolves("attacks", "adaptive_zzbase")  # no differentiable score
    registry.unregister("detectors", "zzbase")
    assert not registry.resolves("detectors", "ross_zzbase") and "ross_zzbase" not in registry.names("detectors")
    with pytest.raises(UsageError, match="unknown detector 'ross_zzbase'"):
        registry.get("detectors", "ross_zzbase")


def test_a_third_party_family_reserves_its_names(fresh_registry):
    counting_family(fresh_registry, [])
    with pytest.raises(UsageError) as caught:
        registry.register("attacks", "zzwrap_msp")(type("Impostor", (), {"__module__": "zz_late"}))
    assert str(caught.value) == ("attack 'zzwrap_msp' of zz_late takes a name that zz_family.plugins generates "
                                 "(zzwrap_<detector>); declare overrides = True on it to replace the generated one on "
                                 "purpose, or rename it")
    with pytest.raises(UsageError, match="family 'zzwrap_<detector>' is registered twice, by zz_family.plugins and "
                                         "zz_other"):
        fresh_registry.family("attacks", "zzwrap_", lambda d: None, accepts=bool, source="zz_other")


def test_the_fixtures_registry_is_its_own(fresh_registry, empty_registry):
    """``empty_registry`` is the default inside the test; ``fresh_registry`` (set up first) is not touched by it."""
    assert registry.default() is empty_registry and registry.names("detectors") == []
    registry.register("detectors", "zzonly")(type("Only", (), {"__doc__": "Only.", "__module__": "zz_only"}))
    assert "zzonly" not in fresh_registry.table["detectors"] and "msp" in fresh_registry.table["detectors"]
    assert registry.registered("detectors", "zzonly") and not registry.registered("detectors", "msp")


# ------------------------------------------------------------------------------------------------------- list

def _listed(capsys, *argv: str) -> list[str]:
    assert main(["list", *argv]) == 0
    return capsys.readouterr().out.splitlines()


def test_list_attacks_shows_families_in_at_most_80_lines(capsys):
    lines = _listed(capsys, "attacks")
    first = {line.split()[0]: line for line in lines}
    assert len(lines) <= 80 and "adaptive_msp" not in first and "adaptive" not in first
    assert "'adaptive' selects one per selected detector" in first["adaptive_<detector>"]
    assert "For a randomised detector with a differentiable score." in first["robust_id_eot_<detector>"]
    assert {"pgd", "fgsm", "square", "hekal_min_<detector>", "robust_square_ood_<detector>"} <= set(first)
    detectors = {line.split()[0] for line in _listed(capsys, "detectors")}
    assert {"msp", "ross_<detector>", "smoothed_<detector>"} <= detectors and "ross_msp" not in detectors


@pytest.mark.parametrize("kind", registry.KINDS)
def test_list_all_prints_every_name_that_resolves_first(capsys, kind):
    lines = _listed(capsys, kind, "--all")
    assert [line.split()[0] for line in lines] == registry.names(kind)
    assert all(len(line.split(None, 1)) == 2 for line in lines)  # a description on each
    if kind == "attacks":
        line = next(s for s in lines if s.split()[0] == "adaptive_ood_eot_smoothed_msp")
        assert registry.entries(kind)["adaptive_ood_eot_smoothed_msp"].description in line
