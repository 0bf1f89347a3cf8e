"""The run plan: the validated config with every name and default resolved, read by attribute.

:func:`advopenood.config.loading.validate` builds a :class:`RunPlan` once, from YAML and flags, and nothing in a
run validates it again; :func:`advopenood.run.resolved.resolve` makes it the run's
:class:`~advopenood.run.resolved.ResolvedRun`, the preflight checks it, the pipeline executes it, plugins read it
(``ctx.plan``) and ``run.json``'s ``config`` is its dump. Nothing downstream reads raw config dictionaries. The
attack specs (one per adversarial set) are resolved here too (:func:`expand_attacks`): configuration only; the plan
constructs no plugin (:func:`advopenood.run.resolved.resolve` constructs each attack once).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import PrivateAttr

from advopenood import registry
from advopenood.capabilities import is_family, requires_attacks
from advopenood.config import protocols
from advopenood.config.schema import RunConfig, parse_eps, thaw
from advopenood.errors import UsageError
from advopenood.io import os_path


class RunPlan(RunConfig):
    """A validated run: :class:`~advopenood.config.schema.RunConfig`'s fields with ``detectors``, ``evaluators``
    and ``analyses`` resolved to registered names (``all`` expanded), the plugin parameter sections keyed by
    lower-case name, and derived settings as properties. Frozen; built by
    :func:`advopenood.config.loading.validate`."""

    _source: str = PrivateAttr("config")
    _folder: Path | None = PrivateAttr(None)
    _positions: dict = PrivateAttr(default_factory=dict)

    @property
    def source(self) -> str:
        """The YAML file (or ``config``) the plan came from, for error messages."""
        return self._source

    @property
    def folder(self) -> Path | None:
        """The folder of that YAML file (relative data roots are resolved against it)."""
        return self._folder

    @property
    def positions(self) -> dict:
        """``key path -> (line, column)`` of every key written in the YAML file."""
        return self._positions

    @cached_property
    def protocol_spec(self) -> protocols.Protocol:
        """The named protocol's core settings (positives rule, quantization)."""
        return protocols.get(self.protocol)

    @cached_property
    def attack_specs(self) -> tuple[AttackSpec, ...]:
        """One spec per adversarial set, parameters fully resolved (:func:`expand_attacks`): configuration, no
        attack constructed."""
        return tuple(expand_attacks(self, self.model.input_size))

    @property
    def cache(self) -> Path:
        """The store's folder (:func:`cache_dir`)."""
        return cache_dir(self)

    @property
    def output(self) -> Path:
        """The run's output folder: ``out``, else ``runs/<name>``."""
        return os_path(Path(self.out or Path("runs") / self.name).expanduser())

    @property
    def data_root(self) -> Path | None:
        """The folder data paths and the checkpoint are relative to."""
        return os_path(self.data.root) if self.data.root else None

    def params(self, section: str, name: str | None) -> dict[str, Any]:
        """A plain copy of ``<section>.<name>`` (e.g. ``params("detector_params", "knn")``); empty when unset."""
        return thaw(getattr(self, section).get(name) or {}) if name else {}

    def param_section(self, section: str) -> dict[str, dict[str, Any]]:
        """A plain copy of a whole parameter section, name -> :meth:`params` (e.g. ``detector_params`` for the
        detector bank), so no caller thaws the plan itself."""
        return {name: self.params(section, name) for name in getattr(self, section)}

    def recomputes(self, name: str) -> bool:
        """Whether this run recomputes the stored work of attack set or detector ``name`` (``recompute``)."""
        return "all" in self.recompute or name in self.recompute

    def notes(self) -> list[str]:
        """What the plan's settings leave out or ignore, for a run to say at its start (stderr), in ``run.json``
        (``notes``) and in the report: resamples that no interval draws, a protocol's own table without its evaluator
        (with the command that writes it), no attack, no detector for the selected evaluators (the ``attack`` and
        ``bintest`` commands select none of either, by design)."""
        notes = [self.ci.unused_note()] if self.ci.unused_note() else []
        if not self.attack_specs:
            notes.append("no attack is selected (attacks is empty): no adversarial set is made, so asr.csv has no "
                         "rows and every table covers the natural OOD sets only")
        spec = self.protocol_spec
        if spec.evaluator and spec.evaluator not in self.evaluators:
            notes.append(f"protocol {spec.name} writes its table through the {spec.evaluator} evaluator, which this "
                         f"run does not select, so it has no such table; its protocol runs as: {spec.command}")
        if not self.detectors and self.evaluators:
            notes.append("no detector is selected (detectors is empty): nothing is scored, so there is no OOD table "
                         "(ood.csv has no rows); select some with --detectors (e.g. msp) or detectors: in the config")
        return notes

    def dump(self) -> dict[str, Any]:
        """The plan as plain JSON types: ``run.json``'s ``config``, and the input of a re-validation."""
        return self.model_dump(mode="json")

    def on_device(self, device: str) -> RunPlan:
        """This plan on ``device`` (a rank's ``cuda:<LOCAL_RANK>`` under torchrun): a copy of the validated values,
        not validated again; its attack specs (which do not depend on the device) are kept."""
        return self.model_copy(update={"device": device})

    def replace(self, **changes: Any) -> RunPlan:
        """A new plan with ``changes`` applied and validated again (the source and positions kept); for callers
        that change a plan's settings (a run changes none: :meth:`on_device` is a copy)."""
        plan = RunPlan.model_validate({**self.dump(), **changes})
        plan._source, plan._folder, plan._positions = self._source, self._folder, self._positions
        return plan


def attack_norm(spec: AttackSpec) -> str:
    """The norm an attack set's eps is measured in: its ``norm`` parameter (AutoAttack's), else its class's."""
    return str(spec.params.get("norm") or registry.get("attacks", spec.attack).norm).lower()


def takes_run_eps(name: str, params: dict[str, Any]) -> bool:
    """Whether the config's ``eps`` (one budget for the run) applies to attack ``name``: a bounded Linf attack that
    is not a patch attack (whose eps bounds the pixels inside its patch)."""
    cls = registry.get("attacks", name)
    norm = str(params.get("norm") or cls.norm).lower()
    return bool(cls.bounded) and norm == "linf" and getattr(cls, "threat", norm) != "patch"


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


def expand_attacks(plan: RunConfig, input_size: int) -> list[AttackSpec]:
    """The plan's ``attacks`` (names or ``{name, eps, params, label}``) -> one spec per (attack, eps).

    Parameters, lowest precedence first: the attack's ``defaults``, the protocol's ``protocol_defaults``,
    ``attack_params.<family>``, ``attack_params.<name>``, the entry's ``params``; an eps list gives one set per
    eps, named ``<attack>@<eps>``. A registered *family* (:class:`~advopenood.capabilities.AttackFamily`, e.g. one
    attack per selected detector) stands for its members, each taking the family's ``attack_params`` and the
    entry's eps and params. Parameters are checked against the attack's declared ones without constructing it
    (:func:`advopenood.registry.check_declared`); :func:`advopenood.run.resolved.resolve` constructs each attack
    once, which checks the values.
    """
    from advopenood.attacks.base import attack_params

    specs: list[AttackSpec] = []
    by_name = plan.attack_params
    for entry, family in attack_entries(plan):
        name = entry["name"]
        params = attack_params(name, input_size, plan.protocol, thaw(by_name.get(family) or {}),
                               thaw(by_name.get(name) or {}), thaw(entry.get("params") or {}))
        eps_list = entry.get("eps")
        own = eps_list is not None or any("eps" in (source or {}) for source in (
            by_name.get(family), by_name.get(name), entry.get("params")))
        if plan.eps is not None and not own and takes_run_eps(name, params):
            eps_list = plan.eps
        eps_list = params.get("eps") if eps_list is None else eps_list
        eps_list = list(eps_list) if isinstance(eps_list, (list, tuple)) else [eps_list]
        for eps in eps_list:
            full = {**params, "eps": None if eps is None else parse_eps(eps)}
            registry.check_declared("attacks", name, full)
            label = entry.get("label") or name
            specs.append(AttackSpec(f"{label}@{full['eps']:.4g}" if len(eps_list) > 1 else label, name, full))
    names = [s.set_name for s in specs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UsageError(f"attack set {dup[0]!r} appears twice; give entries distinct eps or a 'label'")
    return specs


def attack_entries(plan: Any) -> list[tuple[dict[str, Any], str | None]]:
    """The plan's ``attacks`` as ``(entry, family)``, families replaced by their members, then the attacks the
    plan's evaluators and analyses require (:class:`~advopenood.capabilities.RequiresAttacks`) whose set name the
    plan does not already hold. ``plan``: the run plan, or any object with its ``attacks`` and ``detectors``
    attributes (``members(plan)``). Every evaluator's and analysis' parameters are checked against its
    constructor's and its declared bounds (:func:`advopenood.registry.check_declared`: a list where a name is
    declared, or a count beyond its bound, is one line), a requiring plugin's before ``required_attacks`` reads
    them."""
    out = _configured_entries(plan)
    labels = {e.get("label") or e["name"] for e, _ in out}
    for kind, section in (("evaluators", "evaluator_params"), ("analyses", "analysis_params")):
        for name in getattr(plan, kind, ()):
            obj = registry.get(kind, name)
            params = thaw((getattr(plan, section, None) or {}).get(name) or {})
            registry.check_declared(kind, name, params)  # every plugin's: its declared bounds hold at plan time
            if not requires_attacks(obj):
                continue
            for entry, family in obj.required_attacks(plan, params):
                entry = {**entry, "name": str(entry["name"]).lower()}
                label = entry.get("label") or entry["name"]
                if label not in labels:
                    labels.add(label)
                    out.append((entry, family))
    return out


def _configured_entries(plan: Any) -> list[tuple[dict[str, Any], str | None]]:
    """The plan's own ``attacks`` as ``(entry, family)``, families replaced by their members."""
    out: list[tuple[dict[str, Any], str | None]] = []
    for entry in plan.attacks:
        entry = {"name": entry} if isinstance(entry, str) else thaw(entry)
        entry["name"] = str(entry.get("name", ""))
        cls = registry.get("attacks", entry["name"])
        if not is_family(cls):
            out.append((entry, None))
            continue
        members = cls.members(plan)
        if not members:
            raise UsageError(f"attack {entry['name']!r} stands for {cls.hint or 'several attacks'}, but this config "
                             f"selects none; valid choices: {cls.remedy or 'name its members'}")
        out += [({**entry, "name": m}, entry["name"]) for m in members]
    return out


def cache_dir(plan: Any = None) -> Path:
    """Where adversarial sets and trained models live: the plan's ``cache_dir``, then $ADVOPENOOD_CACHE, then
    ~/.cache/advopenood."""
    chosen = getattr(plan, "cache_dir", None)
    return os_path(Path(chosen or os.environ.get("ADVOPENOOD_CACHE") or "~/.cache/advopenood").expanduser())


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
