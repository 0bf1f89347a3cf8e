"""Stage 1 of a run, prepare: the process (seeds, rank, device) and what the run reads (model, data sets)."""
from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from advopenood.config.plan import AttackSpec, RunPlan
from advopenood.data.datasets import build_dataset, limit_dataset, range_warning
from advopenood.models.classifier import Classifier, build_from_config, set_precision
from advopenood.models.training import trained_model
from advopenood.run.preflight import checkpoint_path

if TYPE_CHECKING:
    from advopenood.run.resolved import ResolvedRun


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def distributed() -> tuple[int, int]:
    """(rank, world size) under ``torchrun`` (torch.distributed env vars), else (0, 1); initialises the group."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() and os.environ.get("ADVOPENOOD_BACKEND") != "gloo"
                                else "gloo")
    return dist.get_rank(), dist.get_world_size()


def load_model(plan: RunPlan, fit_set, device: torch.device, progress: bool = True) -> Classifier:
    """The planned classifier: a checkpoint (relative to the data root), or, with ``model.train``, the
    architecture trained on the fit set on first use and cached."""
    ckpt = checkpoint_path(plan)
    if plan.model.train is not None and ckpt is None:
        return trained_model(plan.model, fit_set, plan.cache, seed=plan.seed, device=device, progress=progress)
    return build_from_config(plan.model, ckpt, device)


@dataclass(frozen=True)
class Setup:
    """How this process runs the resolved run (``run``: its plan, the one carrier of the run's settings, and every
    part built once): where it writes (``out``: the staging folder on rank 0; ``final``: the output folder), its
    rank and world size under torchrun, and the switches of this call."""

    run: ResolvedRun
    out: Path
    final: Path
    rank: int
    world_size: int
    progress: bool
    export_png: bool
    #: ``tables.tex``: ``headline`` (the headline tables) or ``all`` (every CSV too)
    latex: str = "headline"

    @property
    def plan(self) -> RunPlan:
        """The run's plan."""
        return self.run.plan

    @property
    def attacks(self) -> tuple[tuple[AttackSpec, Any], ...]:
        """Each attack spec with its attack, constructed once (:class:`advopenood.run.resolved.ResolvedRun`)."""
        return self.run.attacks

    @property
    def attack_only(self) -> bool:
        """Whether the run stops after the attack stage."""
        return self.run.attack_only


@dataclass(frozen=True)
class Inputs:
    """What a run reads: the model and the data sets, built from the plan by :func:`prepare`."""

    model: Classifier
    id_set: Any
    fit_set: Any
    ood_sets: dict[str, Any]
    #: one line per set whose pixels span a small share of their type's range (:func:`~advopenood.data.datasets.
    #: range_warning`); run.json's ``warnings``, the report and stderr show them
    warnings: tuple[str, ...] = ()


def prepare(plan: RunPlan, progress: bool = True, model: Classifier | None = None) -> Inputs:
    """Model, ID test set (limited), fit set and natural OOD sets of the plan (checked by the preflight); ``model``:
    the one the run loaded from its checkpoint when it was resolved (else it is trained here, or read from the
    model cache)."""
    m, d = plan.model, plan.data

    def build(spec: Any) -> Any:
        return build_dataset(spec, plan.data_root, m.in_channels, m.input_size, d.image_identity)

    id_set = limit_dataset(build(d.id), plan.limit, plan.seed)
    fit_set = limit_dataset(build(d.fit or d.id), d.fit_limit, plan.seed)
    ood_sets = {}
    for spec in d.ood:
        ds = build(spec)
        ood_sets[ds.name] = limit_dataset(ds, d.ood_limit or plan.limit, plan.seed)
    device = torch.device(plan.device)
    model = load_model(plan, fit_set, device, progress) if model is None else model
    model.precision = set_precision(model, device, plan.amp, plan.channels_last)
    sets = (id_set, fit_set, *ood_sets.values())
    warnings = tuple(dict.fromkeys(w for w in map(range_warning, sets) if w))  # the fit set may be the ID set
    return Inputs(model, id_set, fit_set, ood_sets, warnings)
