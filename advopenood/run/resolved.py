"""The start of a run: the config and the flags resolved once into one frozen :class:`ResolvedRun`, the one
builder of everything the run uses.

:func:`resolve` takes the plan validated once (:func:`advopenood.config.loading.load_plan`: the YAML and the CLI's
flags, the data root resolved once there; or a raw mapping, validated here), puts it on this process's device (a
copy, not validated again), runs the preflight on it (:func:`advopenood.run.preflight.preflight`: the checks that
build nothing), then builds each part of the run once, which is its check: the model from its checkpoint, each
attack (with its spec), each detector (the run's :class:`~advopenood.detection.scoring.RunBank`, fitted once on
first need), each evaluator and analysis. The run owns them: the stages and the plugins receive these objects, and
a detector-aware attack is bound to the bank's fitted detector. Nothing validates the plan again or constructs a
part twice.
"""
from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from advopenood.attacks.base import build_attack
from advopenood.capabilities import is_detector_aware
from advopenood.config.loading import apply_overrides, check_noise_draws
from advopenood.config.plan import AttackSpec, RunPlan, cache_dir, check_sources
from advopenood.data.datasets import dataset_name
from advopenood.detection.bank import FittedDetector
from advopenood.detection.openood_backend import OpenOODPostprocessor, resolve_backend
from advopenood.detection.scorecache import ScoreCache
from advopenood.detection.scoring import RunBank, build_bank
from advopenood.run.preflight import build_plugins, load_checkpoint, preflight

#: the backend of a detector an attack fits for itself: the pytorch-ood implementation, differentiable
ATTACK_BACKEND = "pytorch-ood"


@dataclass(frozen=True)
class ResolvedRun:
    """One run, resolved: the validated plan on this process's device (the run's one carrier of its settings), the
    output folder's real path, the model loaded from its checkpoint (None when it is trained on first use, in the
    prepare stage), each attack spec with its constructed attack, the run's detectors (``bank``; None without
    detectors), the detectors the run's attacks target that the bank does not hold (``targets``: e.g. an attack on a
    detector the run does not score, or on the pytorch-ood twin of an OpenOOD postprocessor), the handle each
    detector-aware attack is bound to (``handles``: set name -> :class:`FittedDetector`), the constructed evaluators
    and analyses (``(timing label, plugin)``, none in an attack-only run), whether the run stops after the attack
    stage, and when its resolution started (``time.perf_counter()``, the start of ``run.json``'s ``setup`` time)."""

    plan: RunPlan
    output: Path
    attacks: tuple[tuple[AttackSpec, Any], ...]
    plugins: tuple[tuple[str, Any], ...]
    attack_only: bool
    started: float
    model: Any = None
    bank: RunBank | None = None
    targets: RunBank | None = None
    handles: Mapping[str, FittedDetector] | None = None

    def banks(self) -> tuple[RunBank, ...]:
        """The run's detector banks (its own, and that of the attacks' other targets)."""
        return tuple(b for b in (self.bank, self.targets) if b is not None)


def rank_device(device: str) -> torch.device:
    """``cuda`` becomes ``cuda:<LOCAL_RANK>`` under torchrun; other devices are kept."""
    if device == "cuda" and "LOCAL_RANK" in os.environ:
        return torch.device(f"cuda:{os.environ['LOCAL_RANK']}")
    return torch.device(device)


def _bank(plan: RunPlan, names: list[str], backend: str) -> RunBank:
    """The detectors ``names`` constructed once with the run's ``detector_params``, seed, batch size and device
    (:func:`~advopenood.detection.scoring.build_bank`); a randomised one whose class declares no draws parameter
    (checked at plan time otherwise: :func:`advopenood.config.loading.check_noise_draws`) has its ``draws`` checked
    against the bound here."""
    params = plan.param_section("detector_params")
    bank = build_bank(names, backend, params, num_classes=plan.model.num_classes, device=plan.device, seed=plan.seed,
                      batch_size=plan.batch_size, cache=ScoreCache(cache_dir(plan) / "scores"),
                      recompute={d for d in names if plan.recomputes(d)})
    check_noise_draws(plan, bank.built)
    return bank


def _targets(plan: RunPlan, attacks: tuple[tuple[AttackSpec, Any], ...], bank: RunBank | None
             ) -> tuple[RunBank | None, dict[str, FittedDetector]]:
    """The bank of the detectors the run's detector-aware attacks target beyond ``bank`` (None when there are none)
    and each such attack's handle: the run's own fitted detector when the bank holds a differentiable one by that
    name (not an OpenOOD postprocessor), else the other bank's (the pytorch-ood implementation)."""
    aware = {spec.set_name: attack.detector for spec, attack in attacks if is_detector_aware(attack)}
    own = {name for name in set(aware.values())
           if bank is not None and name in bank.order and not isinstance(bank.built.get(name), OpenOODPostprocessor)}
    rest = [name for name in dict.fromkeys(aware.values()) if name not in own]
    targets = _bank(plan, rest, ATTACK_BACKEND) if rest else None
    return targets, {set_name: (bank if name in own else targets).handle(name) for set_name, name in aware.items()}


def resolve(config: RunPlan | Mapping[str, Any], flags: Mapping[str, Any] | None = None, *,
            attack_only: bool = False, overwrite: bool = False) -> ResolvedRun:
    """The run of ``config`` (a plan, e.g. the CLI's from :func:`advopenood.config.loading.load_plan`, or a raw
    config mapping) with ``flags`` (:func:`advopenood.config.loading.apply_overrides`' keywords; a plan without
    flags is not validated again), checked by the preflight and with every part built once; a one-line
    UsageError for the first problem, before any work."""
    started = time.perf_counter()
    if isinstance(config, RunPlan) and not flags:
        plan = config
    else:
        plan = apply_overrides(config, **dict(flags or {}))
    device = str(rank_device(plan.device))
    plan = plan if device == plan.device else plan.on_device(device)
    with torch.random.fork_rng(devices=[]):  # building draws initial weights: the run's seeded stream is untouched
        # the parts that need no file first: a bad parameter value is refused before any data file is read
        attacks = tuple((spec, build_attack(spec.attack, spec.params)) for spec in plan.attack_specs)
        check_sources([spec for spec, _ in attacks], [dataset_name(s) for s in plan.data.ood])
        plugins = () if attack_only else tuple(build_plugins(plan))
        output = preflight(plan, overwrite=overwrite)
        model = load_checkpoint(plan)
        backend = resolve_backend(plan.detector_backend) if plan.detectors else ATTACK_BACKEND
        bank = _bank(plan, list(plan.detectors), backend) if plan.detectors else None
        targets, handles = _targets(plan, attacks, bank)
    return ResolvedRun(plan, output, attacks, plugins, attack_only, started, model, bank, targets, handles)
