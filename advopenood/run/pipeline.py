"""The run: model and data -> adversarial sets (cached) -> ASR table -> detector scores -> evaluators -> analyses.

Every name and value is validated before any work starts; every output file is written atomically, so a
failed or interrupted run leaves no partial CSV and resumes from the attack store on the next start.
"""
from __future__ import annotations

import contextlib
import platform
import sys
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from advopenood import io as aio
from advopenood import registry
from advopenood.attacks.base import build_attack
from advopenood.attacks.store import AdvSet, AdvStore
from advopenood.capabilities import bind_attack
from advopenood.config import protocols
from advopenood.config.loading import validate
from advopenood.config.plan import RunPlan, source_set
from advopenood.config.schema import thaw
from advopenood.data.datasets import build_dataset, limit_dataset, make_loader
from advopenood.detection.bank import evaluation_noise_seeds
from advopenood.detection.scorecache import ScoreCache
from advopenood.detection.scoring import score_all
from advopenood.errors import UsageError
from advopenood.evaluation.context import CleanRecord, RunContext
from advopenood.evaluation.intervals import wilson
from advopenood.evaluation.metrics import sample_note
from advopenood.models.classifier import (
    Classifier,
    build_from_config,
    set_precision,
    weights_hash,
)
from advopenood.models.training import trained_model
from advopenood.outputs import results as outputs
from advopenood.outputs.latex import write_latex
from advopenood.provenance import library_versions
from advopenood.run.preflight import build_plugins, checkpoint_path, preflight

ASR_COLUMNS = ["dataset", "arch", "attack", "eps", "n", "clean_acc", "asr", "asr_lo", "asr_hi", "asr_all", "asr_all_lo",
               "asr_all_hi", "ci", "mean_linf", "mean_l2", "seed", "source", "protocol"]


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators."""
    import random

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def load_model(plan: RunPlan, fit_set, device: torch.device, progress: bool = True) -> Classifier:
    """The planned classifier: a checkpoint (relative to the data root), or, with ``model.train``, the
    architecture trained on the fit set on first use and cached."""
    ckpt = checkpoint_path(plan)
    if plan.model.train is not None and ckpt is None:
        return trained_model(plan.model, fit_set, plan.cache, seed=plan.seed, device=device, progress=progress)
    return build_from_config(plan.model, ckpt, device)


def clean_predictions(model: Classifier, ds, batch_size: int, device: torch.device, progress: bool,
                      workers: int = 0) -> CleanRecord:
    """Clean-ID labels and predictions, one batched pass."""
    ys, preds = [], []
    with torch.no_grad():
        for x, y in tqdm(make_loader(ds, batch_size, workers), desc="clean pass", disable=not progress, leave=False):
            preds.append(model(x.to(device)).argmax(1).cpu())
            ys.append(y)
    return CleanRecord(torch.cat(ys).numpy(), torch.cat(preds).numpy())


def asr_row(adv: AdvSet, dataset: str, arch: str, seed: int, clean_acc: float, protocol: str,
            ci: str = "none") -> dict[str, Any]:
    """One row of asr.csv. ``asr``: share of clean-correct samples whose attack succeeded (adv_pred != y);
    ``asr_all``: share of all samples misclassified after the attack (the paper's Table 3 convention).
    Norms are means over successful adversarial examples. Percentages. For an OOD->ID set (``source`` not
    ``"id"``) both are the share of OOD images the attack made the detector accept. Unless ``ci`` (the plan's
    ``ci.method``) is ``none``, ``asr_lo`` / ``asr_hi`` and ``asr_all_lo`` / ``asr_all_hi`` hold Wilson's 95 %
    interval (:func:`advopenood.evaluation.intervals.wilson`; empty for a share of no images) and ``ci`` says
    ``wilson``."""
    r = adv.records
    correct = (r.clean_pred == r.y).to_numpy() if adv.source == "id" else np.ones(len(r), dtype=bool)
    success = r.success.to_numpy().astype(bool)
    hit = r[success]
    nan = float("nan")
    wanted = ci != "none"
    asr_lo, asr_hi = wilson(int(success[correct].sum()), int(correct.sum())) if wanted else (nan, nan)
    all_lo, all_hi = wilson(int(success.sum()), len(success)) if wanted else (nan, nan)
    return {"dataset": dataset, "arch": arch, "attack": adv.set_name, "eps": adv.eps, "n": len(r),
            "clean_acc": clean_acc, "asr": 100.0 * success[correct].mean() if correct.any() else nan,
            "asr_lo": asr_lo, "asr_hi": asr_hi, "asr_all": 100.0 * success.mean() if len(success) else nan,
            "asr_all_lo": all_lo, "asr_all_hi": all_hi, "ci": "wilson" if wanted else "none",
            "mean_linf": hit.linf.mean() if len(hit) else float("nan"),
            "mean_l2": hit.l2.mean() if len(hit) else float("nan"), "seed": seed, "source": adv.source,
            "protocol": protocol}


def distributed() -> tuple[int, int]:
    """(rank, world size) under ``torchrun`` (torch.distributed env vars), else (0, 1); initialises the group."""
    import os

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() and os.environ.get("ADVOPENOOD_BACKEND") != "gloo"
                                else "gloo")
    return dist.get_rank(), dist.get_world_size()


def rank_device(device: str, rank: int) -> torch.device:
    """``cuda`` becomes ``cuda:<LOCAL_RANK>`` under torchrun; other devices are kept."""
    import os

    if device == "cuda" and "LOCAL_RANK" in os.environ:
        return torch.device(f"cuda:{os.environ['LOCAL_RANK']}")
    return torch.device(device)


def generate_sets(plan: RunPlan, model: Classifier, id_set, device: torch.device, *, fit_set,
                  ood_sets: dict[str, Any], rank: int = 0, world_size: int = 1,
                  progress: bool = True, errors: dict[str, str] | None = None,
                  traces: dict[str, str] | None = None) -> dict[str, AdvSet]:
    """One adversarial set per spec, from the store when it is already there.

    Detector-aware attacks are bound to the fit set (:func:`advopenood.capabilities.bind_attack`). Under torchrun
    each rank attacks the shards ``i % world_size == rank`` into the shared store; after a barrier rank 0 writes the manifests, and every rank sees the complete sets.
    With ``errors`` (one process only), an attack that raises (or whose output fails
    :func:`advopenood.attacks.store.check_attack_output`) costs only its set: the set is left out, ``errors``
    gets ``attack:<set>`` -> one line and ``traces`` its traceback; otherwise (and for a UsageError) it raises.
    """
    store = AdvStore(plan.cache / "adv", shard_size=plan.shard_size)
    model_hash = weights_hash(model)
    sets: dict[str, AdvSet] = {}
    for spec in plan.attack_specs:
        try:
            attack = build_attack(spec.attack, spec.params)
            source, data = source_set(spec, id_set, ood_sets)
            bind_attack(attack, model, fit_set, seed=plan.seed, batch_size=plan.batch_size, device=device,
                        detector_params=thaw(plan.detector_params))
            adv = store.generate(data, model, attack, model_hash=model_hash, seed=plan.seed, device=device,
                                 rank=rank, world_size=world_size, progress=progress,
                                 recompute=plan.recomputes(spec.set_name))
            adv.set_name, adv.source = spec.set_name, source
            adv.quantize = plan.protocol_spec.quantize
            adv.see(model, attack, plan.batch_size, device)
        except UsageError:
            raise
        except Exception as exc:
            if errors is None or world_size > 1:
                raise
            label = f"attack:{spec.set_name}"
            errors[label] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300] or type(exc).__name__}"
            if traces is not None:
                traces[label] = traceback.format_exc()
            continue
        sets[spec.set_name] = adv
    if world_size > 1:
        import torch.distributed as dist

        dist.barrier()
        if rank == 0:
            for adv in sets.values():
                store.finalize(adv)
        dist.barrier()
    return sets


@dataclass
class Inputs:
    """What a run reads: the model and the data sets, built from the plan by :func:`prepare`."""

    model: Classifier
    id_set: Any
    fit_set: Any
    ood_sets: dict[str, Any]


def prepare(plan: RunPlan, progress: bool = True) -> Inputs:
    """Model, ID test set (limited), fit set and natural OOD sets of the plan (checked by the preflight)."""
    m, d = plan.model, plan.data
    build = lambda spec: build_dataset(spec, plan.data_root, m.in_channels, m.input_size, d.image_identity)  # noqa: E731
    id_set = limit_dataset(build(d.id), plan.limit, plan.seed)
    fit_set = limit_dataset(build(d.fit or d.id), d.fit_limit, plan.seed)
    ood_sets = {}
    for spec in d.ood:
        ds = build(spec)
        ood_sets[ds.name] = limit_dataset(ds, d.ood_limit or plan.limit, plan.seed)
    device = torch.device(plan.device)
    model = load_model(plan, fit_set, device, progress)
    model.precision = set_precision(model, device, plan.amp, plan.channels_last)
    return Inputs(model, id_set, fit_set, ood_sets)


def run(plan: RunPlan | Mapping[str, Any], *, attack_only: bool = False, progress: bool = True, overwrite: bool = False,
        export_png: bool = False) -> RunContext:
    """Run the whole pipeline (or only the attack stage) and write every output under the output folder.

    The preflight (:func:`advopenood.run.preflight.preflight`) runs first; nothing is written when it fails. Outputs
    go to a staging folder beside the output folder and replace the previous run's files (those its
    ``manifest.json`` lists) at the end, so the folder only ever shows one run's files.
    Under ``torchrun`` every rank shares the attack stage and the detector stage (fit pass and scoring, sharded
    by batch through the store); rank 0 alone merges the scores, evaluates and writes outputs.
    """
    t0 = time.perf_counter()
    plan = plan if isinstance(plan, RunPlan) else validate(plan)
    preflight(plan, overwrite=overwrite, attack_only=attack_only)
    rank, world_size = distributed()
    with aio.OutputLock(plan.output) if rank == 0 else contextlib.nullcontext():
        return _locked_run(plan, rank, world_size, t0, attack_only=attack_only, progress=progress,
                           export_png=export_png)


def _locked_run(plan: RunPlan, rank: int, world_size: int, t0: float, *, attack_only: bool, progress: bool,
                export_png: bool) -> RunContext:
    """:func:`run` once the output folder is locked (rank 0) and checked again under the lock."""
    if rank == 0:
        aio.check_output_folder(plan.output)
    seed_everything(plan.seed)
    progress = progress and rank == 0
    plan = plan.replace(device=str(rank_device(plan.device, rank)))
    inputs = prepare(plan, progress)
    plugins = [] if attack_only else build_plugins(plan)
    final = plan.output
    out = aio.begin_output(final) if rank == 0 else final
    timings = {"setup": time.perf_counter() - t0}
    try:
        return _execute(plan, inputs, plugins, out, final, rank, world_size, timings, t0, attack_only=attack_only,
                        progress=progress, export_png=export_png)
    except BaseException:
        if rank == 0:  # nothing half-written stays behind; finished shards and scores are in the store
            aio.discard_output(out)
        raise


def _execute(plan: RunPlan, inputs: Inputs, plugins: list[tuple[str, Any]], out: Path, final: Path, rank: int,
             world_size: int, timings: dict[str, float], t0: float, *, attack_only: bool, progress: bool,
             export_png: bool) -> RunContext:
    """The stages of :func:`run` after the set-up, writing into the staging folder ``out``."""
    device, seed, bs = torch.device(plan.device), plan.seed, plan.batch_size
    model, id_set = inputs.model, inputs.id_set

    t = time.perf_counter()
    clean = clean_predictions(model, id_set, bs, device, progress, plan.num_workers)
    attack_errors: dict[str, str] = {}
    attack_traces: dict[str, str] = {}
    adv_sets = generate_sets(plan, model, id_set, device, fit_set=inputs.fit_set, ood_sets=inputs.ood_sets, rank=rank,
                             world_size=world_size, progress=progress, errors=attack_errors, traces=attack_traces)
    timings["attacks"] = time.perf_counter() - t
    dataset, arch = plan.data.dataset or id_set.name, model.arch
    ctx = RunContext(plan, out, model, device, seed, dataset, arch, id_set, inputs.fit_set, inputs.ood_sets, adv_sets,
                     clean, batch_size=bs, protocol=plan.protocol, rank=rank, progress=progress)
    ctx.plugin_errors.update(attack_errors)
    ctx.traces.update(attack_traces)
    if rank != 0:
        if not attack_only:
            _score(ctx, progress, world_size)
        return ctx
    asr = pd.DataFrame([asr_row(a, dataset, arch, seed, clean.accuracy, ctx.protocol, plan.ci.method)
                        for a in adv_sets.values()],
                       columns=ASR_COLUMNS)
    aio.write_csv(out / "asr.csv", asr)

    if not attack_only:
        from advopenood.outputs.report import asr_section

        sections = [asr_section(outputs.as_written(asr))] if len(asr) else []
        t = time.perf_counter()
        _score(ctx, progress, world_size)
        write_scores(ctx)
        timings["detectors"] = time.perf_counter() - t
        for label, plugin in plugins:
            t = time.perf_counter()
            sections += run_plugin(ctx, label, plugin)
            timings[label] = time.perf_counter() - t
        outputs.write_sections(out, sections)
    if export_png:
        from advopenood.run.export import export_openood

        ctx.extras["export"] = export_openood(ctx)
    write_latex(out)  # every CSV of the run, the core's asr.csv included
    timings["total"] = time.perf_counter() - t0
    aio.write_json(out / "run.json", run_info(ctx, timings))
    if not attack_only:
        _report(out)
    log_failures(ctx)
    aio.commit_output(out, final)
    ctx.out = final
    return ctx


def _score(ctx: RunContext, progress: bool, world_size: int = 1) -> None:
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
                       batch_size=bs, device=ctx.device, seed=ctx.seed, params=thaw(plan.detector_params),
                       progress=progress, cache=ScoreCache(plan.cache / "scores"), identities=identities,
                       model_hash=weights_hash(ctx.model), rank=ctx.rank, world_size=world_size,
                       recompute={d for d in plan.detectors if plan.recomputes(d)})
    ctx.scores, ctx.detector_errors, ctx.backend, ctx.bank = result.scores, result.errors, result.backend, result.bank
    ctx.traces.update({f"detector:{k}": v for k, v in result.traces.items()})
    ctx.backends = dict(result.backends)
    ctx.extras["detector_work"] = result.work


def run_plugin(ctx: RunContext, label: str, plugin: Callable[[RunContext], Any]) -> list[outputs.Section]:
    """Run one evaluator or analysis and write its outputs; its sections for the report.

    A plugin that raises costs only its own outputs: the files it wrote are removed, its failure is recorded in
    ``ctx.plugin_errors`` (one line; the traceback goes to ``errors.log``) and the run goes on. A plugin that
    returns nothing is recorded in ``ctx.nothing_computed`` with its reason and gets a section saying so."""
    before = set(aio.files_under(ctx.out))
    try:
        result = outputs.as_results(plugin(ctx))
        if result.empty:
            reason = result.empty_reason or "it returned no table, figure or report section"
            ctx.nothing_computed[label] = reason
            result.sections = [outputs.nothing_section(label, reason)]
        return outputs.collect(ctx.out, result, ctx.protocol, label.split(":", 1)[1])
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:
        for rel in set(aio.files_under(ctx.out)) - before:
            (ctx.out / rel).unlink(missing_ok=True)
        text = " ".join(str(exc).split()) or type(exc).__name__
        ctx.plugin_errors[label] = f"{type(exc).__name__}: {text[:300]}"
        ctx.traces[label] = traceback.format_exc()
        return []


def log_failures(ctx: RunContext) -> None:
    """``errors.log`` with the traceback of every failed detector and plugin (none written when all ran)."""
    failures = ctx.failures
    if not failures:
        return
    parts = [f"== {label}: {reason}\n{ctx.traces.get(label, '')}" for label, reason in failures.items()]
    aio.write_text(ctx.out / "errors.log", "\n".join(parts))


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


def _report(out: Path) -> None:
    """The readable report from ``run.json`` and the sections the plugins returned (``report_sections.json``)."""
    from advopenood.outputs.report import write_report

    write_report(out)


def run_info(ctx: RunContext, timings: dict[str, float]) -> dict[str, Any]:
    """run.json: config, seed, versions, cache keys, whether attacks were generated or reused, timings."""
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
        "sample": sample_note(len(ctx.id_set), min([len(v) for v in ctx.ood_sets.values()]
                                                   + [len(a.records) for a in ctx.adv_sets.values()],
                                                   default=len(ctx.id_set))),
        "attacks": {name: {"attack": a.attack, "key": a.key, "path": str(a.path), "params": a.params, "source": a.source,
                            "quantize": a.quantize, **a.stats}
                    for name, a in ctx.adv_sets.items()},
        "attack_work": {"shards_generated": sum(a.stats.get("generated", 0) for a in ctx.adv_sets.values()),
                        "shards_reused": sum(a.stats.get("reused", 0) for a in ctx.adv_sets.values())},
        "detector_work": ctx.extras.get("detector_work", {}),
        "detector_backend": ctx.backend,
        "detector_backends": ctx.backends,
        "detector_errors": ctx.detector_errors,
        "evaluation_noise_seed": evaluation_noise_seeds(ctx.scores, thaw(ctx.plan.detector_params), ctx.seed),
        "plugin_errors": ctx.plugin_errors,
        "plugin_overrides": registry.overrides(),
        "nothing_computed": ctx.nothing_computed,
        "timings_s": timings,
    }
