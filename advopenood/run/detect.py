"""Stage 3 of a run, detect: every detector's confidences on ID, natural OOD and every adversarial set (one shared
network pass per set, through the score store), and ``scores/<detector>.npz``."""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from advopenood import io as aio
from advopenood.data.datasets import make_loader
from advopenood.detection.scorecache import ScoreCache
from advopenood.detection.scoring import score_all
from advopenood.evaluation.context import RunContext
from advopenood.models.classifier import weights_hash


def score(ctx: RunContext, progress: bool, world_size: int = 1) -> None:
    """Detector confidences for ID, natural OOD and every adversarial set (one shared pass per set); score
    vectors already in the store (``<cache>/scores``) are read back instead of computed. Under torchrun every
    rank calls it and scores its share (:func:`advopenood.detectors.score_all`)."""
    plan = ctx.plan
    if not plan.detectors:
        return
    bs, workers = ctx.batch_size, plan.num_workers
    sets: dict[str, Callable[[], Any]] = {"id": lambda: make_loader(ctx.id_set, bs, workers)}
    identities: dict[str, dict[str, Any]] = {"id": ctx.id_set.identity()}
    for name, ds in ctx.ood_sets.items():
        sets[name] = lambda ds=ds: make_loader(ds, bs, workers)
        identities[name] = ds.identity()
    for name, adv in ctx.adv_sets.items():
        sets[name] = lambda adv=adv: adv.iter_batches(bs)
        identities[name] = {"adv": adv.key, "quantize": adv.quantize}
    result = score_all(list(plan.detectors), plan.detector_backend, ctx.model, ctx.fit_set, sets,
                       batch_size=bs, device=ctx.device, seed=ctx.seed, params=plan.param_section("detector_params"),
                       progress=progress, cache=ScoreCache(plan.cache / "scores"), identities=identities,
                       model_hash=weights_hash(ctx.model), rank=ctx.rank, world_size=world_size,
                       recompute={d for d in plan.detectors if plan.recomputes(d)})
    ctx.scores, ctx.detector_errors, ctx.backend, ctx.bank = result.scores, result.errors, result.backend, result.bank
    ctx.traces.update({f"detector:{k}": v for k, v in result.traces.items()})
    ctx.backends = dict(result.backends)
    ctx.extras["detector_work"] = result.work


def write_scores(ctx: RunContext) -> None:
    """``scores/<detector>.npz`` for every scored detector: one float64 confidence array per set (``id``, each
    natural OOD set, each adversarial set, in sample order) and, per adversarial set, ``<set>.success`` (success
    of the images the detectors scored, :meth:`RunContext.success`) and ``<set>.positive`` (the protocol's OOD
    positives, :meth:`RunContext.ood_positives`), so that every table can be re-derived (``advopenood verify``)."""
    masks = {}
    for name in ctx.adv_sets:
        masks[f"{name}.success"] = ctx.success(name)
        masks[f"{name}.positive"] = ctx.ood_positives(name)
    for det, by_set in ctx.scores.items():
        arrays = {name: np.asarray(conf, dtype=np.float64) for name, conf in by_set.items()}
        aio.write_npz(ctx.out / "scores" / f"{det}.npz", {**arrays, **masks})


def detect(ctx: RunContext, world_size: int) -> float:
    """The stage: scores into ``ctx`` (every rank scores its share) and, on rank 0, the score files; its seconds."""
    t = time.perf_counter()
    score(ctx, ctx.progress, world_size)
    if ctx.rank == 0:
        write_scores(ctx)
    return time.perf_counter() - t
