"""The detector stage: the shared fit pass, fitting every detector (:func:`fit_detectors`) and scoring every
set (:func:`score_all`), with stored fit passes, fitted states, set passes and score vectors read back, and
sharding over torchrun ranks."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from torch import Tensor
from torch.utils.data import Dataset

from advopenood.data.datasets import make_loader
from advopenood.detection.bank import (
    FIT_WORK,
    DetectorBank,
    LazyBank,
    ScoreResult,
    _barrier,
    _detector_key,
    _fail,
    backend_label,
    FittedDetector,
    build_detectors,
    fit_subset,
    join_batches,
    reads_outputs_only,
)
from advopenood.detection.openood_backend import resolve_backend
from advopenood.detection.outputs import (
    FitPass,
    Outputs,
    collect_outputs,
    fc_layer,
    merge_fit_passes,
    take_rows,
)
from advopenood.detection.postprocessor import Postprocessor
from advopenood.detection.scorecache import ScoreCache, fit_pass_key, set_pass_key
from advopenood.capabilities import is_randomised
from advopenood.errors import UsageError
from advopenood.provenance import canonical_key


def run_fit_pass(model: nn.Module, fit_data: Dataset, *, batch_size: int, device: torch.device,
                 reducers: dict[str, Callable[[list[Tensor]], Tensor]], cache: ScoreCache | None, model_hash: str,
                 rank: int = 0, world_size: int = 1, progress: bool = True) -> tuple[FitPass, bool]:
    """The shared fit pass, and whether it was computed (False: read from the store).

    Logits, features and labels are stored (never the tap statistics, which only fitting detectors without a
    stored state need: then the pass runs again with taps). Under torchrun each rank runs the batches
    ``b % world_size == rank`` and the ranks exchange their shares through the store.
    """
    key = fit_pass_key(model_hash=model_hash, model=model, fit_identity=fit_data.identity(), batch_size=batch_size)
    if cache is not None and not reducers:
        stored = cache.load_tensors("fitpass", key)
        if stored is not None:
            return FitPass(Outputs(stored["logits"], stored["features"]), stored["labels"]).to(device), False
    loader = make_loader(fit_data, batch_size)
    if cache is None or world_size == 1:
        result = collect_outputs(model, loader, device, desc="fit pass", progress=progress, reducers=reducers)
    else:
        share = collect_outputs(model, loader, device, desc="fit pass", progress=progress, reducers=reducers,
                                select=lambda b: b % world_size == rank)
        run_key = canonical_key({"fit-pass": key, "stats": sorted(reducers), "world": world_size})
        cache.save_part(run_key, rank, share.to(torch.device("cpu")).state())
        _barrier(world_size)
        result = merge_fit_passes([FitPass.from_state(p) for p in cache.load_parts(run_key, world_size)]).to(device)
        _barrier(world_size)
        if rank == 0:
            cache.drop_parts(run_key)
    if cache is not None and rank == 0:
        cache.save_tensors("fitpass", key, {"logits": result.outputs.logits, "features": result.outputs.features,
                                            "labels": result.labels})
    return result, True


def check_classes(labels: Tensor, num_classes: int) -> None:
    """Raise ValueError unless the fit ``labels`` hold every class ``0..num_classes-1`` (a detector that declares
    ``needs_all_classes`` fits per-class statistics: a class it never saw would be scored against the others)."""
    missing = sorted(set(range(num_classes)) - set(torch.as_tensor(labels).long().unique().tolist()))
    if missing:
        listed = ", ".join(map(str, missing[:5])) + (", ..." if len(missing) > 5 else "")
        raise ValueError(f"the fit set covers {num_classes - len(missing)} of the model's {num_classes} classes (no "
                         f"image of class {listed}); this detector fits per-class statistics and needs every class "
                         "in data.fit")


def fit_detectors(names: list[str], backend: str, model: nn.Module, fit_set: Dataset, *, batch_size: int,
                  device: torch.device, seed: int, params: dict[str, dict] | None = None,
                  progress: bool = True, cache: ScoreCache | None = None, model_hash: str = "",
                  rank: int = 0, world_size: int = 1, refit: set[str] | None = None,
                  built: dict[str, Postprocessor] | None = None) -> DetectorBank:
    """Fit every detector in ``names`` with one shared pass over the fit set: the detectors of ``built`` (constructed
    once for the run, :class:`RunBank`; fitted in place), else each built here from ``params``.

    A detector that fails to build or fit is skipped with its reason in ``errors``; the others go on.
    An unknown detector name (or parameter) raises :class:`~advopenood.errors.UsageError` before any work.
    With a ``cache``, stored fitted states are read back and the fit pass's outputs too when no detector left
    to fit needs the tapped maps; the bank's ``work`` counts ``fits_computed``, ``fit_states_reused``,
    ``fit_pass_computed`` and ``fit_pass_reused``. Under torchrun (``world_size > 1``, with a cache) every
    rank calls this; the fit pass is sharded by batch and every rank ends with the same fitted detectors.
    ``refit``: detectors fitted again even when a fitted state is stored.
    """
    resolved = resolve_backend(backend)
    keys = [n.strip().lower() for n in names]
    device = torch.device(device)
    num_classes = fc_layer(model).out_features
    errors: dict[str, str] = {}
    traces: dict[str, str] = {}
    seconds: dict[str, float] = {}
    work = dict(FIT_WORK)
    if built is None:
        built, errors, traces = build_detectors(keys, resolved, params, num_classes=num_classes, device=device,
                                                seed=seed, batch_size=batch_size, progress=progress)
    dets = {k: built[k] for k in keys if k in built}
    model.eval()

    fitting = [k for k, d in dets.items() if d.requires_fit]
    det_keys = {k: _detector_key(dets[k], k, resolved, model_hash, fit_set, seed, batch_size) for k in fitting} \
        if cache is not None else {}
    fitting = _restore_states(dets, fitting, det_keys, model, cache, refit or set(), work)
    if fitting:
        sizes = [dets[k].fit_size for k in fitting]
        fit_data = fit_subset(fit_set, seed, None if None in sizes else max(sizes))
        fit_pass = FitPass(Outputs(torch.empty(0), torch.empty(0)), torch.empty(0, dtype=torch.long))
        if any(dets[k].shared_fit for k in fitting):
            reducers = {k: dets[k].tap_statistics for k in fitting if dets[k].needs_taps and dets[k].shared_fit}
            fit_pass, computed = run_fit_pass(model, fit_data, batch_size=batch_size, device=device, reducers=reducers,
                                              cache=cache, model_hash=model_hash, rank=rank, world_size=world_size,
                                              progress=progress)
            work["fit_pass_computed" if computed else "fit_pass_reused"] += 1
        for key in fitting:
            start = time.perf_counter()
            try:
                _fit_one(dets[key], key, model, fit_data, fit_pass, batch_size=batch_size, num_classes=num_classes)
                work["fits_computed"] += 1
                state = dets[key].fit_state()
                if cache is not None and state is not None and rank == 0:
                    cache.save_tensors(f"state-{key}", det_keys[key], state)
            except Exception as exc:  # skipped with its reason
                _fail(errors, traces, key, "fit", exc)
                del dets[key]
            seconds[key] = seconds.get(key, 0.0) + time.perf_counter() - start
    bank = DetectorBank(model, dets, keys, errors, resolved, device, seconds, work)
    bank.traces.update(traces)
    return bank


def _restore_states(dets: dict[str, Postprocessor], fitting: list[str], det_keys: dict[str, str], model: nn.Module,
                    cache: ScoreCache | None, refit: set[str], work: dict[str, int]) -> list[str]:
    """The detectors of ``fitting`` still to fit: the others' fitted states are read back from the store."""
    left = list(fitting)
    for key in fitting:
        if key in refit:
            continue
        state = cache.load_tensors(f"state-{key}", det_keys[key]) if cache is not None else None
        if state is not None:
            dets[key].load_fit_state(model, state)
            left.remove(key)
            work["fit_states_reused"] += 1
    return left


def _fit_one(det: Postprocessor, key: str, model: nn.Module, fit_data: Dataset, fit_pass: FitPass, *,
             batch_size: int, num_classes: int) -> None:
    """Fit one detector from the shared fit pass (or its own batches of the fit data)."""
    n = det.rows_needed(len(fit_data))
    batches = lambda n=n: take_rows(make_loader(fit_data, batch_size), n)  # noqa: E731
    outputs, labels = fit_pass.for_detector(key, n)
    if det.needs_all_classes:
        check_classes(labels if det.shared_fit else torch.cat([torch.as_tensor(y) for _, y in batches()]), num_classes)
    det.fit(model, outputs, labels, batches)


class RunBank(LazyBank):
    """The run's detectors: each constructed once (:func:`~advopenood.detection.bank.build_detectors`, when the run is
    resolved), fitted once on first need (a stored fitted state read back where there is one), then scored by the
    detect stage, handed to the attacks that target them (:meth:`handle`) and to the analyses (``ctx.bank``).
    :meth:`bind` gives it the run's model and fit set (the prepare stage builds them); nothing else constructs or
    fits a copy of a detector."""

    def __init__(self, built: dict[str, Postprocessor], order: list[str], errors: dict[str, str],
                 traces: dict[str, str], backend: str, device: torch.device, *, seed: int, batch_size: int,
                 progress: bool = True, cache: ScoreCache | None = None, recompute: set[str] | None = None):
        super().__init__(self._fit_built, order, errors, backend, None, torch.device(device))
        self.built = built
        self.traces.update(traces)
        self.seed, self.batch_size, self.progress, self.cache = int(seed), int(batch_size), bool(progress), cache
        self.recompute = set(recompute or ())
        self.fit_set: Dataset | None = None
        self.model_hash, self.rank, self.world_size = "", 0, 1
        self._handles: dict[str, FittedDetector] = {}

    def bind(self, model: nn.Module, fit_set: Dataset, *, model_hash: str, rank: int = 0, world_size: int = 1,
             progress: bool | None = None) -> None:
        """The model the detectors read and the fit set they fit on; ``rank`` / ``world_size``: how fits are
        sharded (under torchrun every rank fits the same detectors at the same point); ``progress``: whether fits
        show progress bars (the run's switch)."""
        if world_size > 1 and self.cache is None:
            raise UsageError("sharded scoring over torchrun ranks needs the shared store (a ScoreCache)")
        self.model, self.fit_set, self.model_hash = model, fit_set, model_hash
        self.rank, self.world_size = rank, world_size
        if progress is not None:
            self.progress = bool(progress)
            for det in self.built.values():
                det.progress = self.progress

    def unshard(self) -> None:
        """Later fits run on this process alone (the analyses' fits, on rank 0 after the detect stage)."""
        self.rank, self.world_size = 0, 1

    def _fit_built(self, names: list[str]) -> DetectorBank:
        if self.model is None or self.fit_set is None:
            raise RuntimeError("the run's detectors are fitted after bind(model, fit_set, ...)")
        return fit_detectors(names, self.backend, self.model, self.fit_set, batch_size=self.batch_size,
                             device=self.device, seed=self.seed, progress=self.progress, cache=self.cache,
                             model_hash=self.model_hash, rank=self.rank, world_size=self.world_size,
                             refit=self.recompute, built=self.built)

    def key(self, name: str) -> str:
        """The store key of detector ``name``'s fitted state and scores (:func:`~advopenood.detection.scorecache.
        detector_key`)."""
        return _detector_key(self.built[name], name, self.backend, self.model_hash, self.fit_set, self.seed,
                             self.batch_size)

    def fitted(self, name: str) -> Postprocessor:
        """Detector ``name``, fitted (once: on its first need); a RuntimeError with its reason when it failed."""
        self.fit([name])
        if name not in self.dets:
            raise RuntimeError(f"detector {name!r}: {self.errors.get(name, 'it did not fit')}")
        return self.dets[name]

    def handle(self, name: str) -> FittedDetector:
        """The one handle on detector ``name`` that the run's attacks on it share (:class:`FittedDetector`)."""
        if name not in self._handles:
            self._handles[name] = FittedDetector(self, name)
        return self._handles[name]


def build_bank(names: list[str], backend: str, params: dict[str, dict] | None, *, num_classes: int,
               device: torch.device | str, seed: int, batch_size: int, progress: bool = True,
               cache: ScoreCache | None = None, recompute: set[str] | None = None) -> RunBank:
    """The :class:`RunBank` of the detectors ``names`` (a resolved ``backend``), each constructed once with its
    ``params`` entry (:func:`~advopenood.detection.bank.build_detectors`), fitted on first need (from ``cache``
    where it holds the fitted state): a run's bank, the bank of the detectors its attacks target, and
    ``eval-ood``'s bank of the detectors its detector-aware attacks target."""
    keys = [n.strip().lower() for n in names]
    built, errors, traces = build_detectors(keys, backend, params, num_classes=num_classes, device=device, seed=seed,
                                            batch_size=batch_size)
    return RunBank(built, keys, errors, traces, backend, torch.device(device), seed=seed, batch_size=batch_size,
                   progress=progress, cache=cache, recompute=recompute)


def score_all(names: list[str], backend: str, model: nn.Module, fit_set: Dataset,
              sets: dict[str, Callable[[], Iterable[tuple[Tensor, Tensor]]]], *, batch_size: int,
              device: torch.device, seed: int, params: dict[str, dict] | None = None,
              progress: bool = True, cache: ScoreCache | None = None,
              identities: dict[str, dict[str, Any]] | None = None, model_hash: str = "",
              rank: int = 0, world_size: int = 1, recompute: set[str] | None = None) -> ScoreResult:
    """Construct (:func:`~advopenood.detection.bank.build_detectors`), fit and score every detector in ``names`` with
    one shared network pass per batch: :func:`score_bank` on a new :class:`RunBank` (a run scores the bank it
    resolved instead).

    ``sets`` maps a set name to a zero-argument callable yielding ``(x, y)`` batches of [0, 1] images. With a
    ``cache`` (and each set's identity in ``identities``), score vectors already in the store are read back,
    only the detectors with a missing vector are fitted (from the stored fit pass and states where possible),
    and only the missing vectors are computed; ``work`` counts both. Each scored set's logits and features are
    stored too (one process only): when every detector missing a vector of that set scores from those alone
    (:func:`reads_outputs_only`), they are read back instead of running the network. The returned bank (a
    :class:`LazyBank`) fits the rest when an analysis needs them.

    Under torchrun (``world_size > 1``; needs a ``cache``, the shared store) every rank calls this: the fit
    pass is sharded by batch, each rank scores the batches ``b % world_size == rank`` of every set and writes
    its share to the store, and rank 0 merges them into the score vectors, bit-identical to one process's
    (same batches, same fitted detectors). Only rank 0's result holds the scores.

    ``recompute``: detectors whose stored work (score vectors, fitted state) is ignored, computed again and
    replaced; the sets they score run their network pass again.
    """
    bank = build_bank(names, resolve_backend(backend), params, num_classes=fc_layer(model).out_features,
                      device=device, seed=seed, batch_size=batch_size, progress=progress, cache=cache,
                      recompute=recompute)
    bank.bind(model, fit_set, model_hash=model_hash, rank=rank, world_size=world_size, progress=progress)
    return score_bank(bank, sets, identities or {}, progress)


def score_bank(bank: RunBank, sets: dict[str, Callable[[], Iterable[tuple[Tensor, Tensor]]]],
               identities: dict[str, dict[str, Any]], progress: bool = True) -> ScoreResult:
    """Every detector of the run's ``bank`` (bound: :meth:`RunBank.bind`) scored on ``sets`` (:func:`score_all`
    states the rules); the bank's detectors are fitted here only where a score vector is missing from the store."""
    if bank.cache is None:
        bank.fit_all()
        return _score_unstored(bank, sets, bank.order, bank.backend, progress)
    return _score_stored(bank, sets, identities, progress)


def _score_stored(bank: RunBank, sets: dict[str, Callable[[], Iterable[tuple[Tensor, Tensor]]]],
                  identities: dict[str, dict[str, Any]], progress: bool) -> ScoreResult:
    """:func:`score_bank` with a store: stored score vectors read back, only the missing ones computed (this rank's
    share under torchrun, merged on rank 0); later fits (the analyses', on rank 0) run unsharded."""
    keys, resolved, cache, recompute = bank.order, bank.backend, bank.cache, bank.recompute
    rank, world_size, model = bank.rank, bank.world_size, bank.model
    det_keys = {key: bank.key(key) for key in keys if key in bank.built}
    found = _stored_scores(det_keys, sets, identities, cache, recompute)
    reused = sum(len(v) for v in found.values())
    need = [k for k in det_keys if len(found[k]) < len(sets)]
    bank.fit(need)
    bank.unshard()
    todo = {set_name: [k for k in need if set_name not in found[k] and k in bank.dets] for set_name in sets}
    select = None if world_size == 1 else (lambda b: b % world_size == rank)
    share, pass_work = _score_sets(bank, sets, todo, identities, cache, recompute, select, progress, model=model,
                                   model_hash=bank.model_hash, batch_size=bank.batch_size, device=bank.device,
                                   world_size=world_size)
    fitted = lambda: len([k for k in need if k not in bank.errors])  # noqa: E731
    if world_size > 1:
        share = _merged_shares(share, bank, cache, todo, need, det_keys, {k: identities[k] for k in sets}, rank,
                               world_size)
    # every rank scores its share of the attack-stream confidences (their exchange is a barrier too)
    selection, selection_work = _stored_selection(bank, det_keys, bank.built, sets, identities, cache, recompute,
                                                  progress, rank=rank, world_size=world_size)
    if share is None:
        return ScoreResult({}, bank.errors, resolved, bank.seconds, bank,
                           {**FIT_WORK, **bank.work, **pass_work, "fitted": fitted()})
    computed = _store_computed(share, found, bank, cache, det_keys, identities)
    scores = {k: found[k] for k in keys if k in det_keys and k not in bank.errors}
    return ScoreResult(scores, bank.errors, resolved, bank.seconds, bank,
                       {**FIT_WORK, **bank.work, **pass_work, "fitted": fitted(),
                        "fits_reused": len(det_keys) - len(need),
                        "score_sets_computed": computed, "score_sets_reused": reused, **selection_work}, bank.traces,
                       {k: backend_label(k, resolved) for k in keys}, selection)


def selection_key(det_key: str) -> str:
    """The store key of a randomised detector's attack-stream confidences (:func:`attack_stream_bank`): its
    evaluation key (which holds the run's seed, whence the attack stream's) marked with the stream."""
    return canonical_key({"scores": det_key, "noise_stream": "attack"})


def attack_stream_bank(bank: DetectorBank, names: Iterable[str]) -> DetectorBank:
    """The fitted randomised detectors ``names`` of ``bank``, each drawing from the attack stream
    (:meth:`~advopenood.capabilities.Randomised.for_attack`): the same fitted state, other noise."""
    dets = {k: bank.dets[k].for_attack() for k in names if k in bank.dets}
    return DetectorBank(bank.model, dets, list(dets), {}, bank.backend, bank.device, {})


def _selection_failed(bank: DetectorBank, twins: DetectorBank) -> None:
    """A detector whose attack-stream scoring failed is dropped from the run with its reason: its worst cases over
    sets could not choose without evaluation noise."""
    for key, reason in twins.errors.items():
        bank.drop(key, f"{reason} (its attack-stream confidences, on which every worst case over sets chooses)")
        bank.traces[key] = twins.traces.get(key, "")


def _stored_selection(bank: DetectorBank, det_keys: dict[str, str], constructed: dict[str, Postprocessor],
                      sets: dict[str, Callable[[], Iterable[tuple[Tensor, Tensor]]]],
                      identities: dict[str, dict[str, Any]], cache: ScoreCache, recompute: set[str], progress: bool,
                      *, rank: int, world_size: int) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, int]]:
    """Every randomised detector's attack-stream confidences of every set (:func:`attack_stream_bank`), read from
    the store or computed (this rank's share under torchrun, merged on rank 0), and the work counters."""
    sel_keys = {k: selection_key(det_keys[k]) for k in det_keys
                if k not in bank.errors and is_randomised(constructed[k])}
    found = _stored_scores(sel_keys, sets, identities, cache, recompute)
    work = {"selection_sets_computed": 0, "selection_sets_reused": sum(len(v) for v in found.values())}
    need = [k for k in sel_keys if len(found[k]) < len(sets)]
    if not need:
        return {k: found[k] for k in sel_keys}, work
    bank.fit(need)
    twins = attack_stream_bank(bank, need)
    select = None if world_size == 1 else (lambda b: b % world_size == rank)
    todo = {name: [k for k in need if name not in found[k]] for name in sets}
    share = {name: twins.score_batches(f"{name} (attack noise)", make(), todo[name], progress, select)
             for name, make in sets.items() if todo[name]}
    if world_size > 1:
        share = _merged_shares(share, twins, cache, todo, need, sel_keys, {k: identities[k] for k in sets}, rank,
                               world_size) or {}
    _selection_failed(bank, twins)
    work["selection_sets_computed"] = _store_computed(share, found, twins, cache, sel_keys, identities)
    return {k: found[k] for k in sel_keys if k not in bank.errors}, work


def _score_unstored(bank: DetectorBank, sets: dict[str, Callable[[], Iterable[tuple[Tensor, Tensor]]]],
                    keys: list[str], resolved: str, progress: bool) -> ScoreResult:
    """:func:`score_all` without a store: every set scored by the freshly fitted bank."""
    scores = bank.score(sets, progress)
    computed = sum(len(v) for v in scores.values())
    twins = attack_stream_bank(bank, [k for k, d in bank.dets.items() if is_randomised(d)])
    selection: dict[str, dict[str, np.ndarray]] = {k: {} for k in twins.dets}
    for name, make in sets.items():
        for key, by_batch in twins.score_batches(f"{name} (attack noise)", make(), list(twins.dets), progress).items():
            selection[key][name] = join_batches(by_batch)
    _selection_failed(bank, twins)
    scores = {k: v for k, v in scores.items() if k in bank.dets}
    return ScoreResult(scores, bank.errors, bank.backend, bank.seconds, bank,
                       {**bank.work, "fitted": len(bank.dets), "fits_reused": 0, "score_sets_computed": computed,
                        "score_sets_reused": 0, "selection_sets_computed": sum(len(v) for v in selection.values()),
                        "selection_sets_reused": 0}, bank.traces, {k: backend_label(k, resolved) for k in keys},
                       {k: v for k, v in selection.items() if k in bank.dets})


def _stored_scores(det_keys: dict[str, str], sets: dict[str, Any], identities: dict[str, dict[str, Any]],
                   cache: ScoreCache, recompute: set[str]) -> dict[str, dict[str, np.ndarray]]:
    """The score vectors already in the store, detector -> set -> confidences (none for a detector recomputed)."""
    found: dict[str, dict[str, np.ndarray]] = {k: {} for k in det_keys}
    for key, det_key in det_keys.items():
        if key in recompute:
            continue
        for set_name in sets:
            cached = cache.load(key, det_key, identities[set_name])
            if cached is not None:
                found[key][set_name] = cached
    return found


def _score_sets(bank: DetectorBank, sets: dict[str, Callable[[], Iterable[tuple[Tensor, Tensor]]]],
                todo: dict[str, list[str]], identities: dict[str, dict[str, Any]], cache: ScoreCache,
                recompute: set[str], select: Callable[[int], bool] | None, progress: bool,
                **pass_settings: Any) -> tuple[dict[str, dict[str, dict[int, np.ndarray]]], dict[str, int]]:
    """Each set's missing score vectors (this rank's batches), one network pass per set or its stored pass; the
    confidences by set, detector and batch, and the pass counters."""
    share: dict[str, dict[str, dict[int, np.ndarray]]] = {}
    pass_work = {"set_passes_computed": 0, "set_passes_reused": 0}
    for set_name, make_batches in sets.items():
        who = [k for k in todo[set_name] if k in bank.dets]  # a detector that failed on an earlier set is gone
        if not who:
            continue
        stored, record, pass_key = _set_pass(bank, who, cache, recompute, identities[set_name], **pass_settings)
        share[set_name] = bank.score_batches(set_name, make_batches(), who, progress, select, stored, record)
        pass_work["set_passes_reused" if stored is not None else "set_passes_computed"] += 1
        if record and any(k in bank.dets for k in who):
            cache.save_tensors("setpass", pass_key, {"logits": torch.cat([o.logits for o in record]),
                                                     "features": torch.cat([o.features for o in record])})
    return share, pass_work


def _set_pass(bank: DetectorBank, who: list[str], cache: ScoreCache, recompute: set[str], identity: dict[str, Any], *,
              model: nn.Module, model_hash: str, batch_size: int, device: torch.device,
              world_size: int) -> tuple[Outputs | None, list[Outputs] | None, str | None]:
    """A set's stored network pass when every detector ``who`` scores from logits and features alone, and the list
    to record a fresh pass into (one process keeps each scored set's logits and features, so that a detector whose
    parameter changed scores from them without a network pass), ``None`` for either when not applicable; and the
    pass's store key (one process only)."""
    pass_key = set_pass_key(model_hash=model_hash, model=model, identity=identity,
                            batch_size=batch_size) if world_size == 1 else None
    stored = None
    if pass_key is not None and not recompute & set(who) and all(reads_outputs_only(bank.dets[k]) for k in who):
        tensors = cache.load_tensors("setpass", pass_key)
        if tensors is not None:
            stored = Outputs(tensors["logits"].to(device), tensors["features"].to(device))
    return stored, ([] if pass_key is not None and stored is None else None), pass_key


def _merged_shares(share: dict[str, dict[str, dict[int, np.ndarray]]], bank: DetectorBank, cache: ScoreCache,
                   todo: dict[str, list[str]], need: list[str], det_keys: dict[str, str],
                   identities: dict[str, dict[str, Any]], rank: int,
                   world_size: int) -> dict[str, dict[str, dict[int, np.ndarray]]] | None:
    """Under torchrun: every rank's scored batches exchanged through the store; rank 0 gets them all (failures on
    any rank dropped from the bank), the other ranks ``None``."""
    run_key = canonical_key({"score": det_keys, "sets": identities, "world": world_size})
    tensors = {set_name: {key: {b: torch.as_tensor(np.ascontiguousarray(conf)) for b, conf in by_batch.items()}
                          for key, by_batch in by_det.items()} for set_name, by_det in share.items()}
    cache.save_part(run_key, rank, {"scores": tensors, "errors": {k: bank.errors[k] for k in need
                                                                   if k in bank.errors}})
    _barrier(world_size)
    if rank != 0:
        return None
    parts = cache.load_parts(run_key, world_size)
    cache.drop_parts(run_key)
    for part in parts:
        for key, reason in part["errors"].items():
            bank.drop(key, reason)
    return {set_name: {key: {b: conf.numpy() for part in parts for b, conf in part["scores"].get(set_name, {})
                             .get(key, {}).items()} for key in who if key in bank.dets}
            for set_name, who in todo.items() if who}


def _store_computed(share: dict[str, dict[str, dict[int, np.ndarray]]], found: dict[str, dict[str, np.ndarray]],
                    bank: DetectorBank, cache: ScoreCache, det_keys: dict[str, str],
                    identities: dict[str, dict[str, Any]]) -> int:
    """The computed score vectors joined into ``found`` and stored; how many."""
    computed = 0
    for set_name, by_det in share.items():
        for key, by_batch in by_det.items():
            if key not in bank.dets:
                continue
            found[key][set_name] = join_batches(by_batch)
            cache.save(key, det_keys[key], identities[set_name], found[key][set_name])
            computed += 1
    return computed
