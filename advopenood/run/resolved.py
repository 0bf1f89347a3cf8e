"""The start of a run: the config and the flags resolved once into one frozen :class:`ResolvedRun`.

:func:`resolve` takes the plan validated once (:func:`advopenood.config.loading.load_plan`: the YAML and the CLI's
flags, the data root resolved once there; or a raw mapping, validated here), puts it on this process's
device (a copy, not validated again), runs the preflight on it (:func:`advopenood.run.preflight.preflight`), and
constructs each attack (with its spec) and each evaluator and analysis once. The pipeline's stages take what it
holds; nothing validates the plan again or constructs a plugin twice.
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from advopenood.config.loading import apply_overrides
from advopenood.config.plan import AttackSpec, RunPlan
from advopenood.run.preflight import build_plugins, preflight
from advopenood.run.prepare import rank_device


@dataclass(frozen=True)
class ResolvedRun:
    """One run, resolved: the validated plan on this process's device, the output folder's real path, each attack
    spec with its constructed attack, the constructed evaluators and analyses (``(timing label, plugin)``, none in
    an attack-only run), whether the run stops after the attack stage, and when its resolution started
    (``time.perf_counter()``, the start of ``run.json``'s ``setup`` time)."""

    plan: RunPlan
    output: Path
    attacks: tuple[tuple[AttackSpec, Any], ...]
    plugins: tuple[tuple[str, Any], ...]
    attack_only: bool
    started: float


def resolve(config: RunPlan | Mapping[str, Any], flags: Mapping[str, Any] | None = None, *,
            attack_only: bool = False, overwrite: bool = False) -> ResolvedRun:
    """The run of ``config`` (a plan, e.g. the CLI's from :func:`advopenood.config.loading.load_plan`, or a raw
    config mapping) with ``flags`` (:func:`advopenood.config.loading.apply_overrides`' keywords; a plan without
    flags is not validated again), checked by the preflight and with every plugin constructed; a one-line
    UsageError for the first problem, before any work."""
    started = time.perf_counter()
    if isinstance(config, RunPlan) and not flags:
        plan = config
    else:
        plan = apply_overrides(config, **dict(flags or {}))
    device = str(rank_device(plan.device))
    plan = plan if device == plan.device else plan.on_device(device)
    output = preflight(plan, overwrite=overwrite)
    plugins = () if attack_only else tuple(build_plugins(plan))
    return ResolvedRun(plan, output, plan.take_attacks(), plugins, attack_only, started)
