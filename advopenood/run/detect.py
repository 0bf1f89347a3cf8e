"""Stage 3 of a run, detect: every detector's confidences on ID, natural OOD and every adversarial set (one shared
network pass per set, through the score store), and ``scores/<detector>.npz``; it returns :class:`Detected`."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from advopenood import io as aio
from advopenood.data.datasets import make_loader
from advopenood.detection.bank import ScoreResult
from advopenood.detection.scoring import score_bank
from advopenood.evaluation.context import RunContext, evolve


@dataclass(frozen=True)
class Detected:
    """What the detect stage hands on: the context the evaluators read (the attack stage's, with every
    detector's confidences, its failures, the backends and the fitted bank), ``run.json``'s ``detector_work`` and
    the stage's seconds."""

    ctx: RunContext
    work: Mapping[str, int]
    seconds: float

    @property
    def scores(self) -> dict[str, dict[str, np.ndarray]]:
        """``scores[detector][set]``: per-sample confidences (higher = more ID)."""
        return self.ctx.scores

    @property
    def errors(self) -> dict[str, str]:
        """The detectors that failed, one line each."""
        return self.ctx.detector_errors


def with_scores(ctx: RunContext, result: ScoreResult) -> RunContext:
    """A new context: ``ctx`` with the detectors' scores, failures (their tracebacks added), backends and bank."""
    traces = {**ctx.traces, **{f"detector:{k}": v for k, v in result.traces.items()}}
    return evolve(ctx, scores=result.scores, selection=result.selection,
                               detector_errors=result.errors, backend=result.backend,
                               backends=dict(result.backends), bank=result.bank, traces=traces)


def score(ctx: RunContext, progress: bool) -> ScoreResult | None:
    """Detector confidences for ID, natural OOD and every adversarial set (one shared pass per set) from the run's
    detectors (``ctx.bank``, constructed once when the run was resolved, bound in the attack stage); score vectors
    already in the store (``<cache>/scores``) are read back instead of computed; None without detectors. Under
    torchrun every rank calls it and scores its share (:func:`advopenood.detection.scoring.score_bank`)."""
    plan, bank = ctx.plan, ctx.bank
    if not plan.detectors or bank is None:
        return None
    bs, workers = ctx.batch_size, plan.num_workers
    sets: dict[str, Callable[[], Any]] = {"id": lambda: make_loader(ctx.id_set, bs, workers)}
    identities: dict[str, dict[str, Any]] = {"id": ctx.id_set.identity()}
    for name, ds in ctx.ood_sets.items():
        sets[name] = lambda ds=ds: make_loader(ds, bs, workers)
        identities[name] = ds.identity()
    for name, adv in ctx.adv_sets.items():
        sets[name] = lambda adv=adv: adv.iter_batches(bs)
        identities[name] = {"adv": adv.key, "quantize": adv.quantize}
    return score_bank(bank, sets, identities, progress)


def write_scores(ctx: RunContext) -> None:
    """``scores/<detector>.npz`` for every scored detector: one float64 confidence array per set (``id``, each
    natural OOD set, each adversarial set, in sample order) and, per adversarial set, ``<set>.success`` (success
    of the images the detectors scored, :meth:`RunContext.success`) and ``<set>.positive`` (the protocol's OOD
    positives, :meth:`RunContext.ood_positives`), so that every table can be re-derived (``advopenood verify``); for
    a randomised detector also ``<set>.select`` per set: its attack-stream confidences
    (:attr:`RunContext.selection`), on which every worst case over sets chooses."""
    masks = {}
    for name in ctx.adv_sets:
        masks[f"{name}.success"] = ctx.success(name)
        masks[f"{name}.positive"] = ctx.ood_positives(name)
    for det, by_set in ctx.scores.items():
        arrays = {name: np.asarray(conf, dtype=np.float64) for name, conf in by_set.items()}
        arrays.update({f"{name}.select": np.asarray(conf, dtype=np.float64)
                       for name, conf in ctx.selection.get(det, {}).items()})
        aio.write_npz(ctx.out / "scores" / f"{det}.npz", {**arrays, **masks})


def detect(ctx: RunContext) -> Detected:
    """The stage: the scores (every rank scores its share) in a new context and, on rank 0, the score files."""
    t = time.perf_counter()
    result = score(ctx, ctx.progress)
    scored = ctx if result is None else with_scores(ctx, result)
    if ctx.rank == 0:
        write_scores(scored)
    return Detected(scored, dict(result.work) if result is not None else {}, time.perf_counter() - t)
