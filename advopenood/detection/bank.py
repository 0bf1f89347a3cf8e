"""Building detectors through one factory (:func:`create_detector`) and the :class:`DetectorBank` that scores
any set with one shared network pass per batch; a detector that fails is skipped with its reason."""
from __future__ import annotations

import inspect
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from torch import Tensor
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from advopenood import registry
from advopenood.capabilities import is_randomised
from advopenood.data.datasets import Subset, seeded_prefix
from advopenood.detection.openood_backend import (
    OpenOODPostprocessor,
    _construct_plain,
    _PlainDetector,
)
from advopenood.detection.outputs import Outputs, pass_outputs
from advopenood.detection.postprocessor import Postprocessor
from advopenood.detection.scorecache import detector_key
from advopenood.errors import UsageError, reraise_storage_error
from advopenood.provenance import distribution_version, ships_with_core


def create_detector(name: str, backend: str, params: dict[str, Any] | None = None, *, num_classes: int = 10,
                    device: torch.device | str = "cpu", seed: int = 0, batch_size: int = 128,
                    progress: bool = False) -> Postprocessor:
    """The detector registered as ``name`` for a resolved ``backend``; unknown names raise a UsageError."""
    obj = registry.get("detectors", name)
    params = dict(params or {})
    key = name.strip().lower()
    if backend == "openood" and inspect.isclass(obj) and issubclass(obj, Postprocessor) and obj.openood_name:
        det: Postprocessor = OpenOODPostprocessor(obj, **params)
    elif inspect.isclass(obj) and issubclass(obj, Postprocessor):
        det = obj(**params)
    else:
        det = _PlainDetector(key, _construct_plain(key, obj, params, num_classes))
    det.device = torch.device(device)
    det.seed = int(seed)
    det.batch_size = int(batch_size)
    det.progress = bool(progress)
    return det


def evaluation_noise_seeds(dets: dict[str, Postprocessor]) -> dict[str, int]:
    """The seed of the evaluation noise of every randomised detector of ``dets`` (the run's, as constructed once:
    :meth:`~advopenood.capabilities.Randomised.evaluation_noise_seed`; ``run.json``'s ``evaluation_noise_seed``)."""
    return {name: det.evaluation_noise_seed() for name, det in dets.items() if is_randomised(det)}


def backend_label(name: str, resolved: str) -> str:
    """What computes detector ``name``'s scores, for the ``backend`` column: ``openood`` (OpenOOD's own class),
    ``pytorch-ood`` (a built-in implementation, checked against pytorch-ood), or ``plugin:<distribution==version>``
    (``plugin:<module>`` when no installed distribution ships it) for a third party's detector."""
    obj = registry.get("detectors", name)
    cls = obj if inspect.isclass(obj) else type(obj)
    module, builtin = cls.__module__, ships_with_core(cls)
    if module.split(".")[0] == "openood" or (resolved == "openood" and issubclass(cls, Postprocessor)
                                               and cls.openood_name and builtin):
        return "openood"
    if builtin:
        return "pytorch-ood"
    return f"plugin:{distribution_version(cls) or module}"


# ----------------------------------------------------------------------------------------------- score_all


@dataclass
class ScoreResult:
    """Per-sample confidences ``scores[detector][set]`` (float64, set order), skipped detectors with a
    one-line reason, the resolved backend, seconds spent per detector (fit + score, shared pass apart) and
    the fitted :class:`DetectorBank`, which scores further sets.

    ``work`` (``run.json``'s ``detector_work``): ``fitted`` detectors set up this run vs ``fits_reused`` (all
    their score vectors stored); of those set up, ``fits_computed`` ran their fit and ``fit_states_reused``
    read a stored fitted state; ``fit_pass_computed`` / ``fit_pass_reused`` whether the fit pass ran or was
    read back; ``set_passes_computed`` / ``set_passes_reused`` scored sets whose network pass ran or whose
    stored logits and features were read back (one process only; see :func:`score_all`);
    ``score_sets_computed`` / ``score_sets_reused`` (detector, set) score vectors."""

    scores: dict[str, dict[str, np.ndarray]]
    errors: dict[str, str]
    backend: str
    seconds: dict[str, float] = field(default_factory=dict)
    bank: DetectorBank | None = None
    work: dict[str, int] = field(default_factory=dict)
    #: the traceback of each failure in ``errors`` (for the run's log file; ``errors`` holds one line each)
    traces: dict[str, str] = field(default_factory=dict)
    #: what computed each detector's scores (:func:`backend_label`)
    backends: dict[str, str] = field(default_factory=dict)
    #: ``selection[detector][set]``, for every randomised detector (:class:`~advopenood.capabilities.Randomised`):
    #: its confidences from the attack stream, on which a worst case over sets chooses each image's set before it
    #: reads that set's evaluation-stream confidence from ``scores`` (no evaluation draw chooses what it scores)
    selection: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)


def _reason(stage: str, exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{stage} failed: {type(exc).__name__}: {text[:300]}"


def _fail(errors: dict[str, str], traces: dict[str, str], key: str, stage: str, exc: BaseException) -> None:
    """Record a detector's failure: one line in ``errors``, the current traceback in ``traces``; an OSError of a
    full, read-only or over-quota file system is raised again instead (the run's failure, not the detector's)."""
    reraise_storage_error(exc)
    errors[key] = _reason(stage, exc)
    traces[key] = traceback.format_exc()


def fit_rows(n: int, fit_size: int | None, seed: int) -> np.ndarray:
    """Fit-set rows in a seeded random order, the first ``fit_size`` of them (all when None).

    Every detector fits on a prefix of the same order, so one pass serves all fit sizes, and NNGuide's
    1 % bank (the first rows, as in OpenOOD) is a seeded random subset even when the data is class-sorted.
    """
    return seeded_prefix(n, fit_size, seed, sort=False)


def fit_subset(fit_set: Dataset, seed: int, fit_size: int | None = None) -> Subset:
    """The fit rows :func:`score_all` uses, in its order (:func:`fit_rows`)."""
    return Subset(fit_set, fit_rows(len(fit_set), fit_size, seed))


def reads_outputs_only(det: Postprocessor) -> bool:
    """Whether a detector scores from a batch's logits and features alone (no own pass, taps, input gradient or
    maps), so that a set's stored outputs can stand in for the network pass."""
    return not (det.own_pass or det.needs_taps or det.needs_input_grad or det.needs_maps)


class DetectorBank:
    """Fitted detectors that score any set with one shared network pass per batch (:func:`fit_detectors`).

    A run keeps its bank (``RunContext.bank``), so analyses score new sets (e.g. adversarial examples they
    make themselves) without fitting again. A detector that fails to score is dropped with its reason in ``errors``.
    ``work`` counts the fit work done and read back (:func:`fit_detectors`).
    """

    def __init__(self, model: nn.Module, dets: dict[str, Postprocessor], order: list[str], errors: dict[str, str],
                 backend: str, device: torch.device, seconds: dict[str, float], work: dict[str, int] | None = None):
        self.model, self.dets, self.order, self.errors = model, dets, order, errors
        self.backend, self.device, self.seconds = backend, device, seconds
        self.work = dict(work or {})
        self.traces: dict[str, str] = {}

    @property
    def names(self) -> list[str]:
        """Detectors that are fitted and have not failed, in the requested order."""
        return [k for k in self.order if k in self.dets]

    def score_batches(self, set_name: str, batches: Iterable[tuple[Tensor, Tensor]], only: Iterable[str] | None = None,
                      progress: bool = True, select: Callable[[int], bool] | None = None,
                      stored: Outputs | None = None, record: list[Outputs] | None = None
                      ) -> dict[str, dict[int, np.ndarray]]:
        """``scores[detector][batch index]`` (float64) for the batches of one set that ``select`` accepts (all
        by default: under torchrun, a rank's share), one shared network pass per batch.

        ``stored``: the whole set's logits and features from an earlier pass (:func:`reads_outputs_only`
        detectors only); each batch's rows are read from it instead of a network pass. ``record``: a list that
        receives each batch's logits and features (on the CPU), for the store."""
        chosen = None if only is None else set(only)
        active = [k for k in self.dets if chosen is None or k in chosen]
        taps = any(self.dets[k].needs_taps for k in active)
        parts: dict[str, dict[int, np.ndarray]] = {k: {} for k in active}
        offset = 0
        for b, (x, _) in enumerate(tqdm(batches, desc=f"score {set_name}", unit="batch", disable=not progress,
                                        leave=False)):
            if not active:
                break
            rows = slice(offset, offset + len(x))
            offset += len(x)
            if select is not None and not select(b):
                continue
            if stored is not None:
                if rows.stop > len(stored.logits):
                    raise ValueError(f"the stored pass of {set_name!r} has {len(stored.logits)} rows; the set has more")
                x, out = x.to(self.device), stored.rows(rows)
                graph = out
            else:
                x, graph, out = pass_outputs(self.model, x.to(self.device), taps,
                                             any(self.dets[k].needs_input_grad for k in active))
                if record is not None:
                    record.append(Outputs(out.logits.cpu(), out.features.cpu()))
            for key in list(active):
                start = time.perf_counter()
                try:
                    det = self.dets[key]
                    conf = det.score(self.model, x, graph if det.needs_input_grad else out)
                    conf = torch.as_tensor(conf).detach().reshape(-1).cpu().double().numpy()
                    if len(conf) != len(x):
                        raise ValueError(f"{len(conf)} scores for a batch of {len(x)}")
                    parts[key][b] = conf
                except Exception as exc:  # skipped with its reason
                    reraise_storage_error(exc)
                    self.traces[key] = traceback.format_exc()
                    self.drop(key, _reason(f"scoring {set_name!r}", exc))
                    active.remove(key)
                    parts.pop(key)
                self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - start
        if stored is not None and active and offset != len(stored.logits):
            raise ValueError(f"the stored pass of {set_name!r} has {len(stored.logits)} rows; the set has {offset}")
        return parts

    def drop(self, key: str, reason: str) -> None:
        """Skip a detector from now on, with its reason in ``errors``."""
        self.errors[key] = reason
        self.dets.pop(key, None)

    def score(self, sets: dict[str, Callable[[], Iterable[tuple[Tensor, Tensor]]]], progress: bool = True,
              only: Iterable[str] | None = None) -> dict[str, dict[str, np.ndarray]]:
        """``scores[detector][set]`` (float64, sample order) for zero-argument callables yielding ``(x, y)``;
        ``only`` restricts the detectors."""
        chosen = None if only is None else set(only)
        scores: dict[str, dict[str, np.ndarray]] = {k: {} for k in self.dets if chosen is None or k in chosen}
        for set_name, make_batches in sets.items():
            for key, by_batch in self.score_batches(set_name, make_batches(), list(scores), progress).items():
                scores[key][set_name] = join_batches(by_batch)
        return {k: scores[k] for k in self.order if k in scores and k in self.dets}


def join_batches(by_batch: dict[int, np.ndarray]) -> np.ndarray:
    """One score vector from per-batch scores, in batch order."""
    return np.concatenate([by_batch[b] for b in sorted(by_batch)]) if by_batch else np.zeros(0, dtype=np.float64)


class LazyBank(DetectorBank):
    """A :class:`DetectorBank` whose detectors are fitted on first need: a run whose scores all come from the
    store fits nothing, and an analysis that scores new sets (``score``, ``dets``) fits them then."""

    def __init__(self, fit: Callable[[list[str]], DetectorBank], order: list[str], errors: dict[str, str],
                 backend: str, model: nn.Module, device: torch.device):
        super().__init__(model, {}, order, errors, backend, device, {})
        self._fit, self._fitted = fit, set()

    def fit(self, names: Iterable[str]) -> None:
        """Fit the named detectors that are not fitted yet (failures go to ``errors``)."""
        todo = [k for k in names if k not in self._fitted and k not in self.errors]
        if todo:
            bank = self._fit(todo)
            self._fitted |= set(todo)
            self.dets.update(bank.dets)
            self.errors.update(bank.errors)
            self.traces.update(bank.traces)
            for k, v in bank.seconds.items():
                self.seconds[k] = self.seconds.get(k, 0.0) + v
            for k, v in bank.work.items():
                self.work[k] = self.work.get(k, 0) + v

    @property
    def names(self) -> list[str]:
        return [k for k in self.order if k not in self.errors]

    def fit_all(self) -> None:
        self.fit(self.order)

    def score(self, sets: dict[str, Callable[[], Iterable[tuple[Tensor, Tensor]]]], progress: bool = True,
              only: Iterable[str] | None = None) -> dict[str, dict[str, np.ndarray]]:
        self.fit(self.order if only is None else list(only))
        return super().score(sets, progress, only)


def _barrier(world_size: int) -> None:
    if world_size > 1:
        import torch.distributed as dist

        dist.barrier()


def detector_params(params: dict[str, dict] | None) -> dict[str, dict]:
    """``params`` keyed by lower-case detector name; a UsageError for parameters given for an unknown detector
    (checked without constructing anything: the run constructs each detector once, :func:`create_detector`)."""
    params = {str(k).lower(): dict(v or {}) for k, v in (params or {}).items()}
    stray = sorted(set(params) - set(registry.names("detectors")))
    if stray:
        raise UsageError(f"parameters given for unknown detector {stray[0]!r}; "
                         f"valid choices: {', '.join(registry.names('detectors'))}")
    return params


def build_detectors(names: list[str], backend: str, params: dict[str, dict] | None, **settings: Any
                    ) -> tuple[dict[str, Postprocessor], dict[str, str], dict[str, str]]:
    """Every detector of ``names`` constructed once with its parameters (:func:`create_detector`; ``settings``: its
    ``num_classes``, ``device``, ``seed``, ``batch_size``, ``progress``): ``(built, errors, traces)``, a detector
    that fails to build skipped with its reason in ``errors``. An unknown name or parameter (a UsageError) raises,
    as do parameters given for an unknown detector (:func:`detector_params`)."""
    params = detector_params(params)
    built: dict[str, Postprocessor] = {}
    errors: dict[str, str] = {}
    traces: dict[str, str] = {}
    for key in [n.strip().lower() for n in names]:
        try:
            built[key] = create_detector(key, backend, params.get(key), **settings)
        except UsageError:
            raise
        except Exception as exc:  # a broken detector is skipped, never fatal for the others
            _fail(errors, traces, key, "construction", exc)
    return built, errors, traces


class FittedDetector:
    """A run's detector as an attack on it holds it (:meth:`advopenood.capabilities.DetectorAware.use_fitted`;
    ``bank``: the run's :class:`~advopenood.detection.scoring.RunBank`): :meth:`get` is the bank's fitted detector
    itself (fitted on first need), not a copy; ``memo`` keeps what the run's attacks derive from it (e.g. its
    calibration on the fit set), shared by all of them."""

    def __init__(self, bank: Any, name: str):
        self.bank, self.name = bank, name
        self.memo: dict[str, Any] = {}

    def get(self) -> Postprocessor:
        """The fitted detector."""
        return self.bank.fitted(self.name)

    def prefit(self) -> None:
        """Fit it now (under torchrun every rank calls this at the same point, before any rank's attack needs it)."""
        self.bank.fit([self.name])


#: Fit work counters of :func:`fit_detectors` (``DetectorBank.work``), all zero.
FIT_WORK = {"fits_computed": 0, "fit_states_reused": 0, "fit_pass_computed": 0, "fit_pass_reused": 0}


def _detector_key(det: Postprocessor, key: str, backend: str, model_hash: str, fit_set: Dataset, seed: int,
                  batch_size: int) -> str:
    return detector_key(model_hash=model_hash, name=key, backend=backend, detector=det, params=det.params,
                        fit_identity=fit_set.identity(), seed=seed, batch_size=batch_size)
