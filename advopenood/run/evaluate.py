"""Stage 4 of a run, evaluate: every evaluator, then every analysis, on the run's context; each plugin's tables and
figures written, their report sections saved to ``report_sections.json``."""
from __future__ import annotations

import time
import traceback
from typing import Any, Callable

import pandas as pd

from advopenood import io as aio
from advopenood.errors import reraise_storage_error
from advopenood.evaluation.context import RunContext
from advopenood.outputs import results as outputs
from advopenood.outputs.report import asr_section


def run_plugin(ctx: RunContext, label: str, plugin: Callable[[RunContext], Any]) -> list[outputs.Section]:
    """Run one evaluator or analysis and write its outputs; its sections for the report.

    A plugin that raises costs only its own outputs: the files it wrote are removed, its failure is recorded in
    ``ctx.plugin_errors`` (one line; the traceback goes to ``errors.log``) and the run goes on, unless a full,
    read-only or over-quota file system is behind it (:func:`advopenood.errors.storage_error`): that fails the run.
    A plugin that returns nothing is recorded in ``ctx.nothing_computed`` with its reason and gets a section saying
    so; so is each part it names in :attr:`Results.skipped` (as ``<label>:<part>``)."""
    before = set(aio.files_under(ctx.out))
    try:
        result = outputs.as_results(plugin(ctx))
        if result.empty:
            reason = result.empty_reason or "it returned no table, figure or report section"
            ctx.nothing_computed[label] = reason
            result.sections = [outputs.nothing_section(label, reason)]
        for part, reason in result.skipped.items():
            ctx.nothing_computed[f"{label}:{part}"] = reason
            result.sections.append(outputs.nothing_section(f"{label}:{part}", reason))
        return outputs.collect(ctx.out, result, ctx.protocol, label.split(":", 1)[1])
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:
        reraise_storage_error(exc)  # a full disk is the run's failure, not the plugin's
        for rel in set(aio.files_under(ctx.out)) - before:
            (ctx.out / rel).unlink(missing_ok=True)
        text = " ".join(str(exc).split()) or type(exc).__name__
        ctx.plugin_errors[label] = f"{type(exc).__name__}: {text[:300]}"
        ctx.traces[label] = traceback.format_exc()
        return []


def evaluate(ctx: RunContext, plugins: list[tuple[str, Any]], asr: pd.DataFrame) -> dict[str, float]:
    """The stage: the ASR section, then each plugin in order (:func:`run_plugin`), their sections written; the
    seconds of each plugin by label."""
    sections = [asr_section(outputs.as_written(asr))] if len(asr) else []
    timings: dict[str, float] = {}
    for label, plugin in plugins:
        t = time.perf_counter()
        sections += run_plugin(ctx, label, plugin)
        timings[label] = time.perf_counter() - t
    outputs.write_sections(ctx.out, sections)
    ctx.extras["claims"] = [c for s in sections for c in s.claims]  # claims.json, with the summary's (report stage)
    return timings
