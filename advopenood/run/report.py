"""Stage 5 of a run, report: the OpenOOD export (``--export-png``), ``tables.tex``, ``run.json``, the readable
report and ``errors.log``, all into the staging folder the driver then commits; it returns :class:`Reported`."""
from __future__ import annotations

import platform
import sys
import time
from dataclasses import dataclass
from typing import Any, Mapping

from advopenood import io as aio
from advopenood import registry
from advopenood.capabilities import headline_of, lead_evaluator
from advopenood.claims import write_claims
from advopenood.config import protocols
from advopenood.detection.bank import evaluation_noise_seeds
from advopenood.evaluation.context import RunContext
from advopenood.evaluation.metrics import sample_note
from advopenood.models.classifier import weights_hash
from advopenood.outputs.latex import write_latex
from advopenood.outputs.report import write_report
from advopenood.provenance import library_versions
from advopenood.run.detect import Detected
from advopenood.run.evaluate import Evaluated
from advopenood.run.prepare import Setup
from advopenood.run.summary import summary_claims


@dataclass(frozen=True)
class Reported:
    """What the report stage hands on: the summary's lines (its claims rendered, :mod:`advopenood.run.summary`) and
    one line per exported set (``--export-png``)."""

    summary: tuple[str, ...]
    export: tuple[str, ...]


def log_failures(ctx: RunContext) -> None:
    """``errors.log`` with the traceback of every failed detector and plugin (none written when all ran)."""
    failures = ctx.failures
    if not failures:
        return
    parts = [f"== {label}: {reason}\n{ctx.traces.get(label, '')}" for label, reason in failures.items()]
    aio.write_text(ctx.out / "errors.log", "\n".join(parts))


def _sample(ctx: RunContext) -> Any:
    """run.json's ``sample``: the note on the smallest set evaluated."""
    sizes = [len(v) for v in ctx.ood_sets.values()] + [len(a.records) for a in ctx.adv_sets.values()]
    return sample_note(len(ctx.id_set), min(sizes, default=len(ctx.id_set)))


def lead(plan: Any) -> dict[str, str] | None:
    """run.json's ``lead``: the evaluator whose headline opens the report (``report.lead``, else
    :func:`~advopenood.capabilities.lead_evaluator` over the selected evaluators' declared headlines) and that
    headline's section title; None when no selected evaluator declares a headline."""
    declared = {e: headline_of(registry.get("evaluators", e)) for e in plan.evaluators}
    name = lead_evaluator(plan.evaluators, declared, plan.report.lead)
    if name is None or declared.get(name) is None:
        return None
    return {"evaluator": name, "section": declared[name].section}


def run_info(ctx: RunContext, timings: dict[str, float], detector_work: Mapping[str, int] | None = None
             ) -> dict[str, Any]:
    """run.json: config, seed, versions, cache keys, whether attacks were generated or reused (``detector_work``:
    the detect stage's, :class:`Detected`), timings, and the plan's notes
    (:meth:`~advopenood.config.plan.RunPlan.notes`)."""
    adv = ctx.adv_sets.values()
    return {
        "config": ctx.plan.dump(),
        "protocol": protocols.get(ctx.protocol).as_dict(),
        "seed": ctx.seed,
        "versions": {**library_versions(), "python": sys.version.split()[0], "platform": platform.platform()},
        "model": {"arch": ctx.arch, "weights_sha256": weights_hash(ctx.model)},
        "precision": getattr(ctx.model, "precision", {}),
        "data": {"id": ctx.id_set.identity(), "fit": ctx.fit_set.identity(),
                 "ood": {k: v.identity() for k, v in ctx.ood_sets.items()}},
        "clean_acc": ctx.clean.accuracy,
        "sample": _sample(ctx),
        "attacks": {name: {"attack": a.attack, "key": a.key, "path": str(a.path), "params": a.params,
                           "source": a.source, "quantize": a.quantize, **a.stats}
                    for name, a in ctx.adv_sets.items()},
        "attack_work": {"shards_generated": sum(a.stats.get("generated", 0) for a in adv),
                        "shards_reused": sum(a.stats.get("reused", 0) for a in adv)},
        "detector_work": dict(detector_work or {}),
        "interval_work": ctx.intervals.store.work if ctx.intervals.store is not None else {},
        "detector_backend": ctx.backend,
        "detector_backends": ctx.backends,
        "detector_errors": ctx.detector_errors,
        "evaluation_noise_seed": evaluation_noise_seeds({name: det for name, det in getattr(ctx.bank, "built",
                                                                                            {}).items()
                                                         if name in ctx.scores}),
        "plugin_errors": ctx.plugin_errors,
        "plugin_overrides": registry.overrides(),
        "nothing_computed": ctx.nothing_computed,
        "warnings": ctx.warnings,
        "notes": ctx.plan.notes(),
        "lead": lead(ctx.plan),
        "timings_s": timings,
    }


def report(setup: Setup, ctx: RunContext, timings: dict[str, float], t0: float, detected: Detected | None = None,
           evaluated: Evaluated | None = None) -> Reported:
    """The stage (rank 0): export, ``tables.tex`` (the headline tables, or with ``--latex all`` every CSV),
    ``claims.json`` (the evaluate stage's claims and the summary's, :mod:`advopenood.claims`),
    ``run.json`` (with the detect stage's work and the total time since ``t0``), the report (not for an attack-only
    run; ``detected`` and ``evaluated`` are None there) and ``errors.log``."""
    export: list[str] = []
    if setup.export_png:
        from advopenood.run.export import export_openood

        export = export_openood(ctx)
    write_latex(setup.out, setup.latex, (lead(ctx.plan) or {}).get("section"))
    headline = summary_claims(setup.out)
    write_claims(setup.out, list(evaluated.claims) if evaluated is not None else [], headline)
    timings["total"] = time.perf_counter() - t0
    aio.write_json(setup.out / "run.json", run_info(ctx, timings, detected.work if detected is not None else None))
    if not setup.attack_only:
        write_report(setup.out)
    log_failures(ctx)
    return Reported(tuple(c.text for c in headline), tuple(export))
