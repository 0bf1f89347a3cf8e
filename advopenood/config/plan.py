"""Run configuration: a typed schema (pydantic) over YAML files and CLI overrides.

Every key at every level is declared in :class:`RunConfig`; an unknown key, a wrong type or an out-of-range
value is refused with one line naming its full path, the closest valid key or the valid choices, and its
YAML line and column. The validated config is a read-only mapping (:class:`Config`): the rest of the code
reads it and never mutates it, and ``run.json`` records it in full. Plugin parameters
(``attack_params.<name>`` and the like) are checked by constructing the plugins (:mod:`advopenood.run.preflight`).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from advopenood import registry
from advopenood.capabilities import is_family
from advopenood.errors import UsageError
from advopenood.config.frozen import thaw
from advopenood.config.schema import parse_eps


def attack_norm(spec: AttackSpec) -> str:
    """The norm an attack set's eps is measured in: its ``norm`` parameter (AutoAttack's), else its class's."""
    return str(spec.params.get("norm") or registry.get("attacks", spec.attack).norm).lower()


def check_one_threat(specs: list[AttackSpec], what: str) -> None:
    """A budget given once (``--eps``) must not reach bounded attacks of different norms:
    an L2 attack would silently get an Linf budget (a one-line UsageError)."""
    norms: dict[str, str] = {}
    for spec in specs:
        if registry.get("attacks", spec.attack).bounded:
            norms.setdefault(attack_norm(spec), spec.set_name)
    if len(norms) > 1:
        listed = ", ".join(f"{name} ({norm})" for norm, name in norms.items())
        raise UsageError(f"{what} would give attacks of different threat models the same budget: {listed}; "
                         "valid choices: one norm per --eps, or each attack's eps in attack_params / its entry")


# --- attack specs ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttackSpec:
    """One adversarial set to generate: registry name, full parameters and the set's name in outputs."""

    set_name: str
    attack: str
    params: dict[str, Any]


def expand_attacks(cfg: Mapping[str, Any], input_size: int) -> list[AttackSpec]:
    """Config ``attacks`` (names or ``{name, eps, params, label}``) -> one spec per (attack, eps).

    Parameters, lowest precedence first: the attack's ``defaults``, the protocol's ``protocol_defaults``,
    ``attack_params.<family>``, ``attack_params.<name>``, the entry's ``params``; an eps list gives one set per
    eps, named ``<attack>@<eps>``. A registered *family* (:class:`~advopenood.capabilities.AttackFamily`, e.g. one
    attack per selected detector) stands for its members, each taking the family's ``attack_params`` and the
    entry's eps and params. Parameters are validated by constructing the attack.
    """
    from advopenood.attacks.base import attack_params, build_attack

    specs: list[AttackSpec] = []
    by_name = cfg.get("attack_params") or {}
    for entry, family in attack_entries(cfg):
        name = entry["name"]
        params = attack_params(name, input_size, str(cfg.get("protocol", "strong")), thaw(by_name.get(family) or {}),
                               thaw(by_name.get(name) or {}), thaw(entry.get("params") or {}))
        eps_list = entry.get("eps")
        eps_list = params.get("eps") if eps_list is None else eps_list
        eps_list = list(eps_list) if isinstance(eps_list, (list, tuple)) else [eps_list]
        for eps in eps_list:
            full = {**params, "eps": None if eps is None else parse_eps(eps)}
            build_attack(name, full)
            label = entry.get("label") or name
            specs.append(AttackSpec(f"{label}@{full['eps']:.4g}" if len(eps_list) > 1 else label, name, full))
    names = [s.set_name for s in specs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UsageError(f"attack set {dup[0]!r} appears twice; give entries distinct eps or a 'label'")
    return specs


def attack_entries(cfg: Mapping[str, Any]) -> list[tuple[dict[str, Any], str | None]]:
    """Config ``attacks`` as ``(entry, family)`` with lower-case names, families replaced by their members."""
    out: list[tuple[dict[str, Any], str | None]] = []
    for entry in cfg.get("attacks") or []:
        entry = {"name": entry} if isinstance(entry, str) else thaw(entry)
        entry["name"] = str(entry.get("name", "")).lower()
        cls = registry.get("attacks", entry["name"])
        if not is_family(cls):
            out.append((entry, None))
            continue
        members = cls.members(cfg)
        if not members:
            raise UsageError(f"attack {entry['name']!r} stands for {cls.hint or 'several attacks'}, but this config "
                             f"selects none; valid choices: {cls.remedy or 'name its members'}")
        out += [({**entry, "name": m}, entry["name"]) for m in members]
    return out


def cache_dir(cfg: Mapping[str, Any]) -> Path:
    """Where adversarial sets and trained models live: config, then $ADVOPENOOD_CACHE, then ~/.cache/advopenood."""
    return Path(cfg.get("cache_dir") or os.environ.get("ADVOPENOOD_CACHE") or "~/.cache/advopenood").expanduser()


def source_name(spec: AttackSpec, ood_names: list[str]) -> str:
    """The images an attack perturbs: ``"id"`` (the ID test set), or for OOD->ID attacks (class ``source``
    ``"ood"``) the natural OOD set named by its ``ood_set`` parameter, default the config's first."""
    if registry.get("attacks", spec.attack).source == "id":
        return "id"
    name = spec.params.get("ood_set") or next(iter(ood_names), None)
    if name not in ood_names:
        raise UsageError(f"attack {spec.set_name!r} perturbs natural OOD images, but ood_set {name!r} is not one of the "
                         f"run's OOD sets; valid choices: {', '.join(ood_names) or 'none (add data.ood to the config)'}")
    return str(name)


def check_sources(specs: list[AttackSpec], ood_names: list[str]) -> None:
    """Every OOD->ID attack names one of the run's natural OOD sets."""
    for spec in specs:
        source_name(spec, ood_names)


def source_set(spec: AttackSpec, id_set, ood_sets: dict[str, Any]) -> tuple[str, Any]:
    """``(source name, dataset)`` an attack perturbs (:func:`source_name`)."""
    name = source_name(spec, list(ood_sets))
    return (name, id_set) if name == "id" else (name, ood_sets[name])
