"""Stage 4 of a run, evaluate: every evaluator, then every analysis, on the run's context; each plugin's tables and
figures written, their report sections saved to ``report_sections.json``; it returns :class:`Evaluated`. The shared
tables plugins declare (``needs``) are computed once per run (:class:`advopenood.evaluation.products.Products`)."""
from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import pandas as pd

from advopenood import io as aio
from advopenood.capabilities import headline_of
from advopenood.claims import Claim
from advopenood.errors import reraise_storage_error
from advopenood.evaluation.context import RunView
from advopenood.evaluation.products import Products, needs_of
from advopenood.outputs import results as outputs
from advopenood.outputs.report import asr_section


@dataclass(frozen=True)
class Evaluated:
    """What the evaluate stage hands on: the claims of the report's sections (for ``claims.json``), the seconds
    of each plugin by label, and what happened: the plugins that raised (``errors``: label -> one line; ``traces``:
    label -> traceback, for ``errors.log``) and what returned nothing (``nothing_computed``: label, or
    ``<label>:<part>``, -> why)."""

    claims: tuple[Claim, ...]
    seconds: dict[str, float]
    errors: Mapping[str, str] = field(default_factory=dict)
    traces: Mapping[str, str] = field(default_factory=dict)
    nothing_computed: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PluginRun:
    """What one evaluator or analysis did (:func:`run_plugin`): its report sections, its failure (one line and the
    traceback; None when it did not raise) and what it computed nothing for (label -> why)."""

    sections: list[outputs.Section]
    error: str | None = None
    trace: str = ""
    nothing_computed: Mapping[str, str] = field(default_factory=dict)


def call_plugin(ctx: RunView, plugin: Callable[..., Any], products: Products | None) -> Any:
    """``plugin(ctx, supplied)`` for a plugin that declares products (``needs``), each computed once per run by
    ``products``; ``plugin(ctx)`` for one that declares none."""
    needs = needs_of(plugin)
    if not needs:
        return plugin(ctx)
    return plugin(ctx, (products or Products(ctx)).supply(needs))


def run_plugin(ctx: RunView, label: str, plugin: Callable[..., Any], products: Products | None = None) -> PluginRun:
    """Run one evaluator or analysis (:func:`call_plugin`) and write its outputs; what it did.

    A plugin that raises costs only its own outputs: the files it wrote are removed, its failure is returned (one
    line; the traceback goes to ``errors.log``) and the run goes on, unless a full, read-only or over-quota file
    system is behind it (:func:`advopenood.errors.storage_error`): that fails the run. A plugin that returns nothing
    is returned in ``nothing_computed`` with its reason and gets a section saying so; so is each part it names in
    :attr:`Results.skipped` (as ``<label>:<part>``). The ``plots`` folder (``ctx.plot_dir``) exists while the
    plugin runs and is removed again when it stays empty."""
    before = set(aio.files_under(ctx.out))
    plots = ctx.out / "plots"
    made = not plots.exists()
    plots.mkdir(parents=True, exist_ok=True)
    try:
        result = outputs.as_results(call_plugin(ctx, plugin, products))
        nothing: dict[str, str] = {}
        if result.empty:
            reason = result.empty_reason or "it returned no table, figure or report section"
            nothing[label] = reason
            result.sections = [outputs.nothing_section(label, reason)]
        for part, reason in result.skipped.items():
            nothing[f"{label}:{part}"] = reason
            result.sections.append(outputs.nothing_section(f"{label}:{part}", reason))
        return PluginRun(marked(outputs.collect(ctx.out, result, ctx.protocol, label.split(":", 1)[1]), plugin),
                         nothing_computed=nothing)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:
        reraise_storage_error(exc)  # a full disk is the run's failure, not the plugin's
        for rel in set(aio.files_under(ctx.out)) - before:
            (ctx.out / rel).unlink(missing_ok=True)
        text = " ".join(str(exc).split()) or type(exc).__name__
        return PluginRun([], f"{type(exc).__name__}: {text[:300]}", traceback.format_exc())
    finally:
        if made and plots.is_dir() and not any(plots.iterdir()):
            plots.rmdir()


def marked(sections: list[outputs.Section], plugin: Any) -> list[outputs.Section]:
    """``sections`` with the one the plugin declares as its headline (:func:`advopenood.capabilities.headline_of`:
    the section of that title) marked ``headline``, so that the report's first screen and ``tables.tex`` hold it."""
    declared = headline_of(plugin)
    if declared is None:
        return sections
    return [outputs.Section(s.title, s.items, s.source, True) if s.title == declared.section else s for s in sections]


def evaluate(ctx: RunView, plugins: list[tuple[str, Any]], asr: pd.DataFrame) -> Evaluated:
    """The stage: the ASR section, then each plugin in order (:func:`run_plugin`, the run's products shared),
    their sections written; their claims, each plugin's seconds (a product counts in the first plugin that
    needs it), their failures and what they computed nothing for."""
    sections = [asr_section(outputs.as_written(asr))] if len(asr) else []
    timings: dict[str, float] = {}
    errors: dict[str, str] = {}
    traces: dict[str, str] = {}
    nothing: dict[str, str] = {}
    products = Products(ctx)
    for label, plugin in plugins:
        t = time.perf_counter()
        done = run_plugin(ctx, label, plugin, products)
        sections += done.sections
        nothing.update(done.nothing_computed)
        if done.error is not None:
            errors[label], traces[label] = done.error, done.trace
        timings[label] = time.perf_counter() - t
    outputs.write_sections(ctx.out, sections)
    return Evaluated(tuple(c for s in sections for c in s.claims), timings, errors, traces, nothing)
