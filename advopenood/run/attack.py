"""Stage 2 of a run, attack: the clean pass, one adversarial set per attack spec (through the store) and
``asr.csv``; its output is the :class:`~advopenood.evaluation.context.RunContext` the later stages fill."""
from __future__ import annotations

import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from advopenood import io as aio
from advopenood.attacks.store import AdvSet, AdvStore, shard_record
from advopenood.capabilities import bind_attack
from advopenood.config.plan import AttackSpec, RunPlan, source_set
from advopenood.data.datasets import make_loader
from advopenood.errors import UsageError, reraise_storage_error
from advopenood.evaluation.context import CleanRecord, RunContext
from advopenood.evaluation.intervals import IntervalPolicy
from advopenood.models.classifier import Classifier, weights_hash
from advopenood.outputs.names import attack_family
from advopenood.run.prepare import Inputs, Setup

ASR_COLUMNS = ["dataset", "arch", "attack", "eps", "n", "clean_acc", "clean_acc_lo", "clean_acc_hi", "asr", "asr_lo", "asr_hi", "asr_all", "asr_all_lo",
               "asr_all_hi", "ci", "mean_linf", "mean_l2", "seed", "source", "protocol"]


@dataclass(frozen=True)
class Attacked:
    """What the attack stage hands on: the run's context (clean record, adversarial sets, attack failures), the
    ASR table (rank 0; ``None`` on other ranks) and the stage's seconds."""

    ctx: RunContext
    asr: pd.DataFrame | None
    seconds: float


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
            policy: IntervalPolicy = IntervalPolicy()) -> dict[str, Any]:
    """One row of asr.csv. ``asr``: share of clean-correct samples whose attack succeeded (adv_pred != y);
    ``asr_all``: share of all samples misclassified after the attack (the paper's Table 3 convention).
    Norms are means over successful adversarial examples. Percentages. For an OOD->ID set (``source`` not
    ``"id"``) both are the share of OOD images the attack made the detector accept. Unless the interval ``policy``'s
    method (the plan's ``ci.method``) is ``none``, ``asr_lo`` / ``asr_hi`` and ``asr_all_lo`` / ``asr_all_hi`` hold
    Wilson's 95 % interval (:meth:`advopenood.evaluation.intervals.IntervalPolicy.wilson`; empty for a share of no
    images) and ``ci`` says ``wilson``."""
    r = adv.records
    correct = (r.clean_pred == r.y).to_numpy() if adv.source == "id" else np.ones(len(r), dtype=bool)
    success = r.success.to_numpy().astype(bool)
    hit = r[success]
    nan = float("nan")
    wanted = policy.method != "none"
    asr_lo, asr_hi = policy.wilson(int(success[correct].sum()), int(correct.sum()))
    all_lo, all_hi = policy.wilson(int(success.sum()), len(success))
    return {"dataset": dataset, "arch": arch, "attack": adv.set_name, "eps": adv.eps, "n": len(r),
            "clean_acc": clean_acc, "asr": 100.0 * success[correct].mean() if correct.any() else nan,
            "asr_lo": asr_lo, "asr_hi": asr_hi, "asr_all": 100.0 * success.mean() if len(success) else nan,
            "asr_all_lo": all_lo, "asr_all_hi": all_hi, "ci": "wilson" if wanted else "none",
            "mean_linf": hit.linf.mean() if len(hit) else float("nan"),
            "mean_l2": hit.l2.mean() if len(hit) else float("nan"), "seed": seed, "source": adv.source,
            "protocol": protocol}


def clean_interval(clean: CleanRecord, policy: IntervalPolicy) -> tuple[float, float]:
    """Wilson's 95 % interval on the clean accuracy (asr.csv's ``clean_acc_lo`` / ``clean_acc_hi``; NaN under
    ``ci: none`` or without images): the one interval the report and the summary quote for it."""
    n = len(clean.y)
    if not n:
        return float("nan"), float("nan")
    return policy.wilson(int((clean.pred == clean.y).sum()), n)


@dataclass(frozen=True)
class Bound:
    """One attack spec made ready: the attack (built, bound to the fit set) and the images it attacks."""

    spec: AttackSpec
    attack: Any
    source: str
    data: Any


def _bind(plan: RunPlan, spec: AttackSpec, attack: Any, model: Classifier, id_set, fit_set,
          ood_sets: dict[str, Any], device: torch.device, fitted: Any = None) -> Bound:
    """The attack of one spec (constructed when the run was resolved), bound to the fit set and (``fitted``: the
    run's handle on its detector) to the run's fitted detector, and its source set."""
    source, data = source_set(spec, id_set, ood_sets)
    bind_attack(attack, model, fit_set, seed=plan.seed, batch_size=plan.batch_size, device=device,
                detector_params=plan.param_section("detector_params"), fitted=fitted)
    return Bound(spec, attack, source, data)


def _one_set(plan: RunPlan, bound: Bound, store: AdvStore, model: Classifier, model_hash: str, *,
             device: torch.device, rank: int, world_size: int, progress: bool) -> AdvSet:
    """The adversarial set of one bound spec: generated or read from the store, checked."""
    spec, attack = bound.spec, bound.attack
    adv = store.generate(bound.data, model, attack, model_hash=model_hash, seed=plan.seed, device=device,
                         rank=rank, world_size=world_size, progress=progress,
                         recompute=plan.recomputes(spec.set_name), label=spec.set_name)
    adv.set_name, adv.source = spec.set_name, bound.source
    adv.quantize = plan.protocol_spec.quantize
    adv.see(model, attack, plan.batch_size, device)
    return adv


def duration(seconds: float) -> str:
    """``40 s``, ``7 min``, ``1.5 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


#: the images of the probe's one timed batch per attack family with no measured cost (:func:`probe_costs`)
PROBE_IMAGES = 8


def probe_costs(plan: RunPlan, bound: list[Bound], model: Classifier,
                device: torch.device) -> dict[str, float | str]:
    """Per attack family of ``bound``'s attacks (:func:`advopenood.outputs.names.attack_family`), seconds per image:
    its first set's attack, as the run will call it, run once untimed on one image (the one-off work of its first
    call, which the run pays once and not per shard: fitting and calibrating its detector, a feature anchor, the
    first pass's allocations), then timed on one batch of :data:`PROBE_IMAGES` images (fewer where a shard or the
    set is smaller: a shard is one call of the attack), the whole of a shard's work but writing it
    (:func:`advopenood.attacks.store.shard_record`: loading the rows, the attack, the output check, the clean and
    adversarial predictions and the attack's own success test, which the set's measured seconds include). The
    estimate of a set no earlier run measured is that cost per image times its images, as an earlier run's
    measured cost is used. A fit of a cost per call plus a cost per image through batches of 2 and 8, used
    before, took the per-image cost's fall from 2 to 8 images for a fixed cost per call, while past the probe's
    sizes a CPU's cost per image rises again with the batch (activations leave the cache), and put every 200-image
    set 14-36 % under its measured time on quiet cores (``benchmarks/bench_probe.py``: 0.74-0.76 per run; this
    probe: 1.05-1.06, every set 0.96-1.16). A family whose probe raises (an attack that fails, or returns what
    :func:`~advopenood.attacks.store.check_attack_output` refuses) is probed once, under the rule that guards a
    set (:func:`_guard`), and has, instead of a cost, that rule's one line: its sets then have no estimate and fail
    or succeed on their own, each under the run's guard, at the cost of their own outputs only."""
    out: dict[str, float | str] = {}
    failed: dict[str, str] = {}
    for b in bound:
        family = attack_family(b.attack.name)
        if family in out or not len(b.data):
            continue
        seconds = _guard(failed, None, 1, family, lambda b=b: _per_image(plan, b, model, device))
        out[family] = failed[family] if seconds is None else seconds
    return out


def _per_image(plan: RunPlan, b: Bound, model: Classifier, device: torch.device) -> float:
    """Seconds per image of one timed batch of ``b``'s shard work, after one untimed image (:func:`probe_costs`)."""
    shard_record(b.data, np.arange(1), model, b.attack, plan.seed, device)  # the one-off work, untimed
    k = min(PROBE_IMAGES, plan.shard_size, len(b.data))
    t = time.perf_counter()
    shard_record(b.data, np.arange(k), model, b.attack, plan.seed, device)
    return (time.perf_counter() - t) / k


def plan_lines(plan: RunPlan, bound: list[Bound], store: AdvStore, model_hash: str, device: torch.device,
               model: Classifier | None = None) -> list[str]:
    """What the attack stage will do: one line for the sets read whole from the store, one per set to generate
    with an estimate from the per-image cost measured in an earlier run (:meth:`advopenood.attacks.store.AdvStore.cost`)
    or, where none did and ``model`` is given, from a probe of its attack family (:func:`probe_costs`), and a
    total; then the stages after it."""
    lines, total, unknown, stored = [], 0.0, [], []
    todo = {b.spec.set_name: store.pending(b.data, b.attack, model_hash=model_hash, seed=plan.seed,
                                           recompute=plan.recomputes(b.spec.set_name)) for b in bound}
    costs = {b.spec.set_name: store.cost(b.attack, model_hash, device) for b in bound}
    fresh = [b for b in bound if todo[b.spec.set_name] and costs[b.spec.set_name] is None]
    probed = probe_costs(plan, fresh, model, device) if fresh and model is not None else {}
    for b in bound:
        name, n = b.spec.set_name, todo[b.spec.set_name]
        if not n:
            stored.append(name)
            continue
        head = f"plan: attack {name} on {len(b.data)} images of {b.source}: {n} to generate, "
        cost, probe = costs[name], probed.get(attack_family(b.attack.name))
        if cost is not None:
            total += cost * n
            lines.append(head + f"about {duration(cost * n)} ({cost:.3g} s per image, measured in an earlier run)")
        elif isinstance(probe, str):
            unknown.append(name)
            lines.append(head + f"no estimate (the probe of its family {attack_family(b.attack.name)} failed: "
                                f"{probe})")
        elif probe is not None:
            total += probe * n
            lines.append(head + f"about {duration(probe * n)} ({probe:.3g} s per image, probed on a batch of its "
                                f"family {attack_family(b.attack.name)})")
        else:
            unknown.append(name)
            lines.append(head + f"no estimate yet (no earlier run of {b.attack.name} with these parameters on this "
                                "model and device)")
    if stored:
        lines.insert(0, f"plan: {len(stored)} set{'s' if len(stored) != 1 else ''} read from the store, nothing to "
                        "generate")
    if unknown:
        known = f"about {duration(total)} for the sets with an estimate, " if total else ""
        lines.append(f"plan: attacks in all: {known}no estimate for {len(unknown)} set(s)")
    elif total:
        lines.append(f"plan: attacks in all: about {duration(total)}"
                     + (f" ({len(probed)} attack famil{'ies' if len(probed) != 1 else 'y'} probed)" if probed else ""))
    after = [f"{len(plan.detectors)} detector(s)", *([f"evaluators {', '.join(plan.evaluators)}"] if plan.evaluators
                                                     else []),
             *([f"analyses {', '.join(plan.analyses)}"] if plan.analyses else [])]
    if plan.detectors or plan.evaluators or plan.analyses:
        lines.append("plan: then " + "; ".join(after) + " (scores of earlier runs are read from the store)")
    return lines


def _guard(errors: dict[str, str] | None, traces: dict[str, str] | None, world_size: int, label: str,
           make: Any) -> Any:
    """``make()``; with ``errors`` (one process only) an exception other than a UsageError or a full, read-only or
    over-quota file system costs only its set: ``errors[label]`` gets one line, ``traces[label]`` the traceback,
    and None is returned."""
    try:
        return make()
    except UsageError:
        raise
    except Exception as exc:
        reraise_storage_error(exc)  # a full disk or store is the run's failure, not the attack's
        if errors is None or world_size > 1:
            raise
        errors[label] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300] or type(exc).__name__}"
        if traces is not None:
            traces[label] = traceback.format_exc()
        return None


def generate_sets(plan: RunPlan, model: Classifier, id_set, device: torch.device, *,
                  attacks: tuple[tuple[AttackSpec, Any], ...], fit_set, ood_sets: dict[str, Any], rank: int = 0,
                  world_size: int = 1, progress: bool = True, errors: dict[str, str] | None = None,
                  traces: dict[str, str] | None = None, handles: Mapping[str, Any] | None = None
                  ) -> dict[str, AdvSet]:
    """One adversarial set per spec of ``attacks`` (each with its attack, constructed once when the run was
    resolved), from the store when it is already there.

    Detector-aware attacks are bound to the fit set (:func:`advopenood.capabilities.bind_attack`) first, and to
    the run's fitted detector (``handles``: set name -> the run's handle on the attacked detector,
    :class:`advopenood.detection.bank.FittedDetector`; under torchrun fitted now, on every rank, when the set has
    shards to generate); then, with ``progress`` on rank 0, the plan of the stage goes to stderr
    (:func:`plan_lines`). Under torchrun each rank
    attacks the shards ``i % world_size == rank`` into the shared store; after a barrier rank 0 writes the
    manifests, and every rank sees the complete sets.
    With ``errors`` (one process only), an attack that raises (or whose output fails
    :func:`advopenood.attacks.store.check_attack_output`) costs only its set: the set is left out, ``errors``
    gets ``attack:<set>`` -> one line and ``traces`` its traceback; otherwise (and for a UsageError, or an OSError
    of a full, read-only or over-quota file system: :func:`advopenood.errors.storage_error`) it raises.
    """
    store = AdvStore(plan.cache / "adv", shard_size=plan.shard_size)
    model_hash = weights_hash(model)
    handles = dict(handles or {})
    bound = [b for b in (_guard(errors, traces, world_size, f"attack:{spec.set_name}",
                                lambda spec=spec, made=made: _bind(plan, spec, made, model, id_set, fit_set,
                                                                   ood_sets, device, handles.get(spec.set_name)))
                         for spec, made in attacks) if b is not None]
    for b in bound if world_size > 1 else ():  # a sharded fit is collective: never inside one rank's shard
        if b.spec.set_name in handles and store.pending(b.data, b.attack, model_hash=model_hash, seed=plan.seed,
                                                        recompute=plan.recomputes(b.spec.set_name)):
            handles[b.spec.set_name].prefit()
    if progress and rank == 0:
        for line in plan_lines(plan, bound, store, model_hash, device, model):
            print(f"advopenood: {line}", file=sys.stderr, flush=True)
    sets: dict[str, AdvSet] = {}
    for b in bound:
        adv = _guard(errors, traces, world_size, f"attack:{b.spec.set_name}",
                     lambda b=b: _one_set(plan, b, store, model, model_hash, device=device, rank=rank,
                                          world_size=world_size, progress=progress))
        if adv is not None:
            sets[b.spec.set_name] = adv
    if world_size > 1:
        import torch.distributed as dist

        dist.barrier()
        if rank == 0:
            for adv in sets.values():
                store.finalize(adv)
        dist.barrier()
    return sets


def attack(setup: Setup, inputs: Inputs) -> Attacked:
    """The stage: clean pass and adversarial sets (an attack that raises costs only its set), the run's context,
    and on rank 0 ``asr.csv`` (the core's own table)."""
    plan, rank = setup.plan, setup.rank
    device, seed, bs = torch.device(plan.device), plan.seed, plan.batch_size
    model, id_set = inputs.model, inputs.id_set
    t = time.perf_counter()
    model_hash = weights_hash(model)
    for bank in setup.run.banks():  # the run's detectors read this model and fit on this fit set
        bank.bind(model, inputs.fit_set, model_hash=model_hash, rank=rank, world_size=setup.world_size,
                  progress=setup.progress)
    clean = clean_predictions(model, id_set, bs, device, setup.progress, plan.num_workers)
    errors: dict[str, str] = {}
    traces: dict[str, str] = {}
    adv_sets = generate_sets(plan, model, id_set, device, attacks=setup.attacks, fit_set=inputs.fit_set,
                             ood_sets=inputs.ood_sets, rank=rank, world_size=setup.world_size,
                             progress=setup.progress, errors=errors, traces=traces, handles=setup.run.handles)
    seconds = time.perf_counter() - t
    ctx = RunContext(plan, setup.out, model, id_set, inputs.fit_set, inputs.ood_sets, adv_sets, clean, rank=rank,
                     progress=setup.progress, plugin_errors=errors, warnings=list(inputs.warnings), traces=traces,
                     bank=setup.run.bank, attacks={spec.set_name: made for spec, made in setup.attacks})
    if rank != 0:
        return Attacked(ctx, None, seconds)
    rows = [asr_row(a, ctx.dataset, ctx.arch, seed, clean.accuracy, ctx.protocol, ctx.intervals)
            for a in adv_sets.values()]
    clean_lo, clean_hi = clean_interval(clean, ctx.intervals)
    asr = pd.DataFrame([{**r, "clean_acc_lo": clean_lo, "clean_acc_hi": clean_hi} for r in rows], columns=ASR_COLUMNS)
    aio.write_csv(setup.out / "asr.csv", asr)
    return Attacked(ctx, asr, seconds)
