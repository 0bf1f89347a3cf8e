"""The run: model and data -> adversarial sets (cached) -> ASR table -> detector scores -> evaluators -> analyses.

Every name and value is validated before any work starts; every output file is written atomically, so a
failed or interrupted run leaves no partial CSV and resumes from the attack store on the next start.
"""
from __future__ import annotations

import platform
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from advopenood import io as aio
from advopenood import outputs, protocols, registry
from advopenood.attacks import build_attack
from advopenood.capabilities import bind_attack
from advopenood.config import AttackSpec, Config, cache_dir, expand_attacks, thaw, validate
from advopenood.context import CleanRecord, RunContext
from advopenood.data import build_dataset, limit_dataset, make_loader
from advopenood.detectors import score_all
from advopenood.errors import UsageError
from advopenood.models import Classifier, build_from_config, set_precision, weights_hash
from advopenood.preflight import checkpoint_path, output_dir, preflight
from advopenood.scorecache import ScoreCache
from advopenood.store import AdvSet, AdvStore, library_versions
from advopenood.training import trained_model

ASR_COLUMNS = ["dataset", "arch", "attack", "eps", "n", "clean_acc", "asr", "asr_all", "mean_linf", "mean_l2", "seed",
               "source", "protocol"]


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators."""
    import random

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def load_model(cfg: Mapping[str, Any], fit_set, device: torch.device, progress: bool = True) -> Classifier:
    """The configured classifier: a checkpoint (relative to the data root), or, with ``model.train``, the
    architecture trained on the fit set on first use and cached."""
    m = cfg["model"]
    ckpt = checkpoint_path(cfg)
    if m.get("train") is not None and ckpt is None:
        return trained_model(m, fit_set, cache_dir(cfg), seed=int(cfg["seed"]), device=device, progress=progress)
    return build_from_config(m, ckpt, device)


def clean_predictions(model: Classifier, ds, batch_size: int, device: torch.device, progress: bool,
                      workers: int = 0) -> CleanRecord:
    """Clean-ID labels and predictions, one batched pass."""
    ys, preds = [], []
    with torch.no_grad():
        for x, y in tqdm(make_loader(ds, batch_size, workers), desc="clean pass", disable=not progress, leave=False):
            preds.append(model(x.to(device)).argmax(1).cpu())
            ys.append(y)
    return CleanRecord(torch.cat(ys).numpy(), torch.cat(preds).numpy())


def asr_row(adv: AdvSet, dataset: str, arch: str, seed: int, clean_acc: float, protocol: str) -> dict[str, Any]:
    """One row of asr.csv. ``asr``: share of clean-correct samples whose attack succeeded (adv_pred != y);
    ``asr_all``: share of all samples misclassified after the attack (the paper's Table 3 convention).
    Norms are means over successful adversarial examples. Percentages. For an OOD->ID set (``source`` not
    ``"id"``) both are the share of OOD images the attack made the detector accept."""
    r = adv.records
    correct = (r.clean_pred == r.y).to_numpy() if adv.source == "id" else np.ones(len(r), dtype=bool)
    success = r.success.to_numpy().astype(bool)
    hit = r[success]
    return {"dataset": dataset, "arch": arch, "attack": adv.set_name, "eps": adv.eps, "n": len(r),
            "clean_acc": clean_acc, "asr": 100.0 * success[correct].mean() if correct.any() else float("nan"),
            "asr_all": 100.0 * success.mean(), "mean_linf": hit.linf.mean() if len(hit) else float("nan"),
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


def source_name(spec: AttackSpec, ood_names: list[str]) -> str:
    """The images an attack perturbs: ``"id"`` (the ID test set), or for OOD->ID attacks (class ``source``
    ``"ood"``) the natural OOD set named by its ``ood_set`` parameter, default the config's first."""
    if registry.get("attacks", spec.attack).source == "id":
        return "id"
    name = spec.params.get("ood_set") or next(iter(ood_names), None)
    if name not in ood_names:
        raise UsageError(f"attack {spec.set_name!r} perturbs natural OOD images, but ood_set {name!r} is not one of the "
                         f"run's OOD sets; valid choices: {', '.join(ood_names) or 'none (add data.ood to the config)'}")
    return str(name)


def check_sources(specs: list[AttackSpec], ood_names: list[str]) -> None:
    """Every OOD->ID attack names one of the run's natural OOD sets."""
    for spec in specs:
        source_name(spec, ood_names)


def source_set(spec: AttackSpec, id_set, ood_sets: dict[str, Any]) -> tuple[str, Any]:
    """``(source name, dataset)`` an attack perturbs (:func:`source_name`)."""
    name = source_name(spec, list(ood_sets))
    return (name, id_set) if name == "id" else (name, ood_sets[name])


def generate_sets(cfg: Mapping[str, Any], specs: list[AttackSpec], model: Classifier, id_set, device: torch.device,
                  *, fit_set, ood_sets: dict[str, Any], rank: int = 0, world_size: int = 1,
                  progress: bool = True) -> dict[str, AdvSet]:
    """One adversarial set per spec, from the store when it is already there.

    Detector-aware attacks are bound to the fit set (:func:`advopenood.capabilities.bind_attack`). Under torchrun
    each rank attacks the shards ``i % world_size == rank`` into the shared store; after a barrier rank 0 writes the manifests, and every rank sees the complete sets.
    """
    store = AdvStore(cache_dir(cfg) / "adv", shard_size=int(cfg["shard_size"]))
    model_hash = weights_hash(model)
    sets: dict[str, AdvSet] = {}
    for spec in specs:
        attack = build_attack(spec.attack, spec.params)
        source, data = source_set(spec, id_set, ood_sets)
        bind_attack(attack, model, fit_set, seed=int(cfg["seed"]), batch_size=int(cfg["batch_size"]), device=device,
                    detector_params=cfg.get("detector_params"))
        redo = "all" in cfg["recompute"] or spec.set_name in cfg["recompute"]
        adv = store.generate(data, model, attack, model_hash=model_hash, seed=int(cfg["seed"]), device=device,
                             rank=rank, world_size=world_size, progress=progress, recompute=redo)
        adv.set_name, adv.source = spec.set_name, source
        adv.quantize = protocols.get(str(cfg["protocol"])).quantize
        adv.see(model, attack, int(cfg["batch_size"]), device)
        sets[spec.set_name] = adv
    if world_size > 1:
        import torch.distributed as dist

        dist.barrier()
        if rank == 0:
            for adv in sets.values():
                store.finalize(adv)
        dist.barrier()
    return sets


def prepare(cfg: Mapping[str, Any], progress: bool = True) -> tuple[Classifier, Any, Any, dict[str, Any], list[AttackSpec]]:
    """Model, ID test set (limited), fit set and natural OOD sets, and the attack specs (checked by the preflight)."""
    m, d = cfg["model"], cfg["data"]
    size, channels = int(m["input_size"]), int(m["in_channels"])
    specs = expand_attacks(cfg, size)
    root = Path(d["root"]) if d.get("root") else None
    how = str(d.get("image_identity") or "stat")
    id_set = limit_dataset(build_dataset(d["id"], root, channels, size, how), cfg["limit"], int(cfg["seed"]))
    fit_set = build_dataset(d.get("fit") or d["id"], root, channels, size, how)
    fit_set = limit_dataset(fit_set, d.get("fit_limit"), int(cfg["seed"]))
    ood_sets = {}
    for spec in d.get("ood") or []:
        ds = build_dataset(spec, root, channels, size, how)
        ood_sets[ds.name] = limit_dataset(ds, d.get("ood_limit") or cfg["limit"], int(cfg["seed"]))
    device = torch.device(cfg["device"])
    model = load_model(cfg, fit_set, device, progress)
    model.precision = set_precision(model, device, bool(cfg.get("amp")), bool(cfg.get("channels_last")))
    return model, id_set, fit_set, ood_sets, specs


def build_plugins(cfg: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """``(timing label, plugin)`` for every configured evaluator and analysis, constructed with its parameters
    before any work, so that a bad parameter stops the run before anything is computed."""
    plugins = []
    for kind, section, label in (("evaluators", "evaluator_params", "evaluator"),
                                 ("analyses", "analysis_params", "analysis")):
        plugins += [(f"{label}:{name}", registry.create(kind, name, **thaw(cfg[section].get(name) or {})))
                    for name in cfg[kind]]
    return plugins


def run(cfg: Mapping[str, Any], *, attack_only: bool = False, progress: bool = True, overwrite: bool = False,
        export_png: bool = False) -> RunContext:
    """Run the whole pipeline (or only the attack stage) and write every output under the output folder.

    The preflight (:func:`advopenood.preflight.preflight`) runs first; nothing is written when it fails. Outputs
    go to a staging folder beside the output folder and replace the previous run's files (those its
    ``manifest.json`` lists) at the end, so the folder only ever shows one run's files.
    Under ``torchrun`` every rank shares the attack stage and the detector stage (fit pass and scoring, sharded
    by batch through the store); rank 0 alone merges the scores, evaluates and writes outputs.
    """
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    cfg = cfg if isinstance(cfg, Config) else validate(cfg)
    preflight(cfg, overwrite=overwrite, attack_only=attack_only)
    seed = int(cfg["seed"])
    seed_everything(seed)
    rank, world_size = distributed()
    progress = progress and rank == 0
    cfg = Config({**cfg, "device": str(rank_device(str(cfg["device"]), rank))}, cfg.source, cfg.folder, cfg.positions)
    model, id_set, fit_set, ood_sets, specs = prepare(cfg, progress)
    plugins = [] if attack_only else build_plugins(cfg)
    final = output_dir(cfg)
    out = aio.begin_output(final) if rank == 0 else final
    timings["setup"] = time.perf_counter() - t0
    try:
        return _execute(cfg, model, id_set, fit_set, ood_sets, specs, plugins, out, final, rank, world_size,
                        timings, t0, attack_only=attack_only, progress=progress, export_png=export_png)
    except BaseException:
        if rank == 0:  # nothing half-written stays behind; finished shards and scores are in the store
            aio.discard_output(out)
        raise


def _execute(cfg: Config, model: Classifier, id_set, fit_set, ood_sets: dict[str, Any], specs: list[AttackSpec],
             plugins: list[tuple[str, Any]], out: Path, final: Path, rank: int, world_size: int,
             timings: dict[str, float], t0: float, *, attack_only: bool, progress: bool,
             export_png: bool) -> RunContext:
    """The stages of :func:`run` after the set-up, writing into the staging folder ``out``."""
    device = torch.device(cfg["device"])
    seed = int(cfg["seed"])
    bs = int(cfg["batch_size"])

    t = time.perf_counter()
    clean = clean_predictions(model, id_set, bs, device, progress, int(cfg["num_workers"]))
    adv_sets = generate_sets(cfg, specs, model, id_set, device, fit_set=fit_set, ood_sets=ood_sets, rank=rank,
                             world_size=world_size, progress=progress)
    timings["attacks"] = time.perf_counter() - t
    dataset, arch = str(cfg["data"].get("dataset") or id_set.name), model.arch
    ctx = RunContext(cfg, out, model, device, seed, dataset, arch, id_set, fit_set, ood_sets, adv_sets, clean,
                     batch_size=bs, protocol=str(cfg["protocol"]), rank=rank, progress=progress)
    if rank != 0:
        if not attack_only:
            _score(ctx, progress, world_size)
        return ctx
    asr = pd.DataFrame([asr_row(a, dataset, arch, seed, clean.accuracy, ctx.protocol) for a in adv_sets.values()],
                       columns=ASR_COLUMNS)
    aio.write_csv(out / "asr.csv", asr)

    if not attack_only:
        from advopenood.report import asr_section

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
        from advopenood.export import export_openood

        ctx.extras["export"] = export_openood(ctx)
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
    if not ctx.config["detectors"]:
        return
    bs, workers = ctx.batch_size, int(ctx.config["num_workers"])
    sets: dict[str, Callable[[], Any]] = {"id": lambda: make_loader(ctx.id_set, bs, workers)}
    identities: dict[str, dict[str, Any]] = {"id": ctx.id_set.identity()}
    for name, ds in ctx.ood_sets.items():
        sets[name] = lambda ds=ds: make_loader(ds, bs, workers)
        identities[name] = ds.identity()
    for name, adv in ctx.adv_sets.items():
        sets[name] = lambda adv=adv: adv.iter_batches(bs)
        identities[name] = {"adv": adv.key, "quantize": adv.quantize}
    result = score_all(list(ctx.config["detectors"]), ctx.config["detector_backend"], ctx.model, ctx.fit_set, sets,
                       batch_size=bs, device=ctx.device, seed=ctx.seed, params=thaw(ctx.config["detector_params"]),
                       progress=progress, cache=ScoreCache(cache_dir(ctx.config) / "scores"), identities=identities,
                       model_hash=weights_hash(ctx.model), rank=ctx.rank, world_size=world_size,
                       recompute=set(ctx.config["detectors"]) if "all" in ctx.config["recompute"]
                       else set(ctx.config["recompute"]))
    ctx.scores, ctx.detector_errors, ctx.backend, ctx.bank = result.scores, result.errors, result.backend, result.bank
    ctx.traces.update({f"detector:{k}": v for k, v in result.traces.items()})
    ctx.backends = dict(result.backends)
    ctx.extras["detector_work"] = result.work


def run_plugin(ctx: RunContext, label: str, plugin: Callable[[RunContext], Any]) -> list[outputs.Section]:
    """Run one evaluator or analysis and write its outputs; its sections for the report.

    A plugin that raises costs only its own outputs: the files it wrote are removed, its failure is recorded in
    ``ctx.plugin_errors`` (one line; the traceback goes to ``errors.log``) and the run goes on."""
    before = set(aio.files_under(ctx.out))
    try:
        return outputs.collect(ctx.out, plugin(ctx), ctx.protocol, label.split(":", 1)[1])
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
    from advopenood.report import write_report

    write_report(out)


def run_info(ctx: RunContext, timings: dict[str, float]) -> dict[str, Any]:
    """run.json: config, seed, versions, cache keys, whether attacks were generated or reused, timings."""
    return {
        "config": thaw(ctx.config),
        "protocol": protocols.get(ctx.protocol).as_dict(),
        "seed": ctx.seed,
        "versions": {**library_versions(), "python": sys.version.split()[0], "platform": platform.platform()},
        "model": {"arch": ctx.arch, "weights_sha256": weights_hash(ctx.model)},
        "precision": getattr(ctx.model, "precision", {}),
        "data": {"id": ctx.id_set.identity(), "fit": ctx.fit_set.identity(),
                 "ood": {k: v.identity() for k, v in ctx.ood_sets.items()}},
        "clean_acc": ctx.clean.accuracy,
        "attacks": {name: {"attack": a.attack, "key": a.key, "path": str(a.path), "params": a.params, "source": a.source,
                            "quantize": a.quantize, **a.stats}
                    for name, a in ctx.adv_sets.items()},
        "attack_work": {"shards_generated": sum(a.stats.get("generated", 0) for a in ctx.adv_sets.values()),
                        "shards_reused": sum(a.stats.get("reused", 0) for a in ctx.adv_sets.values())},
        "detector_work": ctx.extras.get("detector_work", {}),
        "detector_backend": ctx.backend,
        "detector_backends": ctx.backends,
        "detector_errors": ctx.detector_errors,
        "plugin_errors": ctx.plugin_errors,
        "timings_s": timings,
    }
