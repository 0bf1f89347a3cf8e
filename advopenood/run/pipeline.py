"""The run: a short driver that enters each stage once, in the order data flows, each reading the frozen plan by
attribute and handing a typed result to the next.

prepare (:mod:`advopenood.run.prepare`) -> attack (:mod:`advopenood.run.attack`) -> detect
(:mod:`advopenood.run.detect`) -> evaluate (:mod:`advopenood.run.evaluate`) -> report
(:mod:`advopenood.run.report`), each taking the run resolved once (:mod:`advopenood.run.resolved`). Every name and
value is validated before any work starts; every output file is written atomically, so a failed or interrupted run
leaves no partial CSV and resumes from the attack store on the next start.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from advopenood import io as aio
from advopenood import registry
from advopenood.config.plan import RunPlan
from advopenood.errors import STORAGE_ERRNOS, StorageError, storage_error
from advopenood.evaluation.context import Outcome, RunContext, evolve
from advopenood.run.attack import attack
from advopenood.run.detect import detect
from advopenood.run.entries import write_entries
from advopenood.run.evaluate import evaluate
from advopenood.run.prepare import Inputs, Setup, distributed, prepare, seed_everything
from advopenood.run.report import report
from advopenood.run.resolved import ResolvedRun, resolve


def run(plan: RunPlan | Mapping[str, Any] | ResolvedRun, *, attack_only: bool = False, progress: bool = True,
        overwrite: bool = False, export_png: bool = False, latex: str = "headline") -> RunContext:
    """Run the whole pipeline (or only the attack stage) and write every output under the output folder.

    ``plan``: a run resolved by :func:`advopenood.run.resolved.resolve` (what the CLI passes; it carries its own
    ``attack_only`` and ``overwrite``), or a plan or raw config mapping, resolved here with those two switches.
    The resolution runs the preflight (:func:`advopenood.run.preflight.preflight`) first; nothing is written when it
    fails. Outputs go to a staging folder beside the output folder and replace the previous run's files (those its
    ``manifest.json`` lists) at the end, so the folder only ever shows one run's files. The output folder is its
    real path (:func:`advopenood.io.resolve_output`: a symbolic link to a folder is followed). A full, read-only
    or over-quota file system anywhere in the run raises :class:`~advopenood.errors.StorageError` (one line) and
    commits nothing; so does a commit that cannot complete (:class:`advopenood.io.CommitError`: it is undone).
    ``latex``: what ``tables.tex`` holds (:data:`advopenood.outputs.latex.MODES`).
    Under ``torchrun`` every rank shares the attack stage and the detector stage (fit pass and scoring, sharded
    by batch through the store); rank 0 alone merges the scores, evaluates and writes outputs.
    """
    resolved = plan if isinstance(plan, ResolvedRun) else resolve(plan, attack_only=attack_only, overwrite=overwrite)
    try:
        return _locked(resolved, progress=progress, export_png=export_png, latex=latex)
    except StorageError:  # already its one line (a commit that was undone: advopenood.io.CommitError)
        raise
    except Exception as exc:
        failure = storage_error(exc)
        if failure is None:
            raise
        raise StorageError(storage_message(failure, resolved.output, resolved.plan.cache)) from exc


def storage_message(exc: OSError, final: Path, cache: Path) -> str:
    """The one line of a run stopped by a full, read-only or over-quota file system: what, where, and that the
    previous outputs are as they were."""
    where = f"writing {exc.filename!r}" if exc.filename else \
        f"writing under {str(final)!r} or the cache {str(cache)!r} (the system named no file)"
    return (f"{STORAGE_ERRNOS[exc.errno]} ({errno.errorcode[exc.errno]}) {where}; the run stopped and committed "
            f"nothing: the previous outputs in {str(final)!r} are as they were, and the store keeps every finished "
            "shard; free space (or make it writable) and run the same command again")


def _locked(resolved: ResolvedRun, *, progress: bool, export_png: bool, latex: str) -> RunContext:
    """The run under the output folder's lock (rank 0), into a staging folder that is committed at the end or
    removed."""
    plan, final, t0 = resolved.plan, resolved.output, resolved.started
    rank, world_size = distributed()
    for note in plan.notes() if rank == 0 else []:  # after the preflight: a refusal stays one line
        print(f"advopenood: note: {note}", file=sys.stderr)
    with aio.OutputLock(final) if rank == 0 else contextlib.nullcontext():
        if rank == 0:
            aio.check_output_folder(final)
        seed_everything(plan.seed)
        progress = progress and rank == 0
        inputs = prepare(plan, progress, resolved.model)
        inputs = dataclasses.replace(inputs, warnings=(*inputs.warnings, *unloaded()))
        for line in inputs.warnings if rank == 0 else ():
            print(f"advopenood: warning: {line}", file=sys.stderr)
        setup = Setup(resolved, aio.begin_output(final) if rank == 0 else final, final, rank, world_size, progress,
                      export_png, latex)
        timings = {"setup": time.perf_counter() - t0}
        try:
            return _stages(setup, inputs, list(resolved.plugins), timings, t0)
        except BaseException:
            if rank == 0:  # nothing half-written stays behind; finished shards and scores are in the store
                aio.discard_output(setup.out)
            raise


def _stages(setup: Setup, inputs: Inputs, plugins: list[tuple[str, Any]], timings: dict[str, float],
            t0: float) -> RunContext:
    """attack -> detect -> evaluate -> report into the staging folder, then the commit (rank 0); each stage takes
    the one before's result and returns its own. The context returned carries the run's :class:`Outcome`."""
    attacked = attack(setup, inputs)
    ctx = attacked.ctx
    timings["attacks"] = attacked.seconds
    detected = None if setup.attack_only else detect(ctx)
    if detected is not None:
        ctx = detected.ctx
        timings["detectors"] = detected.seconds
    if setup.rank != 0:
        return ctx
    evaluated = None if setup.attack_only else evaluate(ctx, plugins, attacked.asr)
    if evaluated is not None:  # what the plugins did, returned by the stage: the context the report reads
        timings.update(evaluated.seconds)
        ctx = evolve(ctx, plugin_errors={**ctx.plugin_errors, **evaluated.errors},
                                  traces={**ctx.traces, **evaluated.traces},
                                  nothing_computed={**ctx.nothing_computed, **evaluated.nothing_computed})
    reported = report(setup, ctx, timings, t0, detected, evaluated)
    if setup.plan.benchmark is not None and evaluated is not None:  # committed with the files they are read from
        write_entries(setup.out, setup.final)
    kept: dict[str, str] = {}
    aio.commit_output(setup.out, setup.final, kept=kept)
    return evolve(ctx, out=setup.final, outcome=Outcome(reported.summary, reported.export, kept))


def unloaded() -> list[str]:
    """One warning line per plugin package that failed to load (:func:`advopenood.registry.failures`), naming each
    entry point and why. A run that selects none of its plugins loses nothing and goes ahead (exit 0), saying so in
    run.json's ``warnings``, the report and stderr; one that selects one is refused before it starts."""
    lines: dict[str, list[str]] = {}
    for failure in registry.failures():
        lines.setdefault(failure.package, []).append(f"its {failure.kind} entry point {failure.entry} failed to load: "
                                                     f"{failure.reason}")
    return [f"plugin package {package} not loaded (the run selects none of its plugins): {'; '.join(why)}"
            for package, why in lines.items()]
