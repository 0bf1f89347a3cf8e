"""What a run hands to evaluator and analysis plugins.

Evaluators and analyses are registered classes (``advopenood.evaluators`` / ``advopenood.analyses``)
constructed with their config section (``evaluator_params.<name>`` / ``analysis_params.<name>``) as keyword
arguments and called as ``plugin(ctx) -> advopenood.outputs.results.Results`` (``plugin(ctx, products)`` when it
declares shared tables it reads, ``needs``: :mod:`advopenood.evaluation.products`): its ``tables`` (file name under
``ctx.out`` -> DataFrame, e.g. ``"ood.csv"``) are written atomically by the pipeline, its ``figures`` are the
plots it saved under ``ctx.plot_dir`` (through :func:`advopenood.io.save_figure`), and its ``sections`` are its
part of the report. A plain ``dict[str, pandas.DataFrame]`` is read as tables only.
"""
from __future__ import annotations

import dataclasses
import functools
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Protocol, runtime_checkable

import numpy as np
import torch
from torch.utils.data import Dataset

from advopenood.attacks.store import AdvSet
from advopenood import registry
from advopenood.capabilities import is_id_negative
from advopenood.config import protocols
from advopenood.data.datasets import dataset_name
from advopenood.evaluation.intervals import IntervalPolicy
from advopenood.evaluation.intervalstore import FOLDER, IntervalStore
from advopenood.models.classifier import Classifier

if TYPE_CHECKING:
    from advopenood.config.plan import RunPlan
    from advopenood.detection.bank import DetectorBank


@dataclass
class CleanRecord:
    """Clean-ID predictions of the classifier: labels ``y`` and predictions ``pred`` for the evaluated rows."""

    y: np.ndarray
    pred: np.ndarray

    @property
    def accuracy(self) -> float:
        """Top-1 accuracy in percent."""
        return float(100.0 * np.mean(self.pred == self.y)) if len(self.y) else float("nan")


@dataclass(frozen=True)
class Outcome:
    """What a finished run tells its caller beside its files (the command line prints it): the summary's lines
    (the report stage's :class:`advopenood.run.report.Reported`), one line per set the OpenOOD export wrote
    (``--export-png``) and the files the commit kept aside (path -> kept path, :func:`advopenood.io.commit_output`)."""

    summary: tuple[str, ...] = ()
    export: tuple[str, ...] = ()
    kept: Mapping[str, str] = field(default_factory=dict)


@runtime_checkable
class RunView(Protocol):
    """What an evaluator or analysis may read of a run: a read-only view (the core hands plugins a frozen
    :class:`RunContext`, which satisfies it; a plugin reads, never writes). ``scores[detector][set_name]`` holds
    per-sample detector confidences (higher = more in-distribution, OpenOOD's convention); set names are ``"id"``,
    the natural OOD set names and the attack set names (``adv_sets`` keys). The run's settings are the plan's
    (``plan``, their one carrier: seed, device, batch size, protocol, every parameter section); ``seed``,
    ``device``, ``batch_size``, ``protocol``, ``dataset`` and ``arch`` read them from it, for plugins that read them
    directly."""

    @property
    def plan(self) -> RunPlan: ...
    @property
    def out(self) -> Path: ...
    @property
    def model(self) -> Classifier: ...
    @property
    def device(self) -> torch.device: ...
    @property
    def seed(self) -> int: ...
    @property
    def dataset(self) -> str: ...
    @property
    def arch(self) -> str: ...
    @property
    def id_set(self) -> Dataset: ...
    @property
    def fit_set(self) -> Dataset: ...
    @property
    def ood_sets(self) -> Mapping[str, Dataset]: ...
    @property
    def adv_sets(self) -> Mapping[str, AdvSet]: ...
    @property
    def clean(self) -> CleanRecord: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def protocol(self) -> str: ...
    @property
    def rank(self) -> int: ...
    @property
    def progress(self) -> bool: ...
    @property
    def backend(self) -> str: ...
    @property
    def backends(self) -> Mapping[str, str]: ...
    @property
    def scores(self) -> Mapping[str, Mapping[str, np.ndarray]]: ...
    @property
    def selection(self) -> Mapping[str, Mapping[str, np.ndarray]]: ...
    @property
    def detector_errors(self) -> Mapping[str, str]: ...
    @property
    def bank(self) -> DetectorBank | None: ...
    @property
    def attacks(self) -> Mapping[str, Any]: ...
    @property
    def intervals(self) -> IntervalPolicy: ...
    @property
    def positive_sets(self) -> dict[str, AdvSet]: ...
    @property
    def id_adv_sets(self) -> dict[str, AdvSet]: ...
    @property
    def positives_rule(self) -> str: ...
    @property
    def plot_dir(self) -> Path: ...

    def choice_scores(self, detector: str) -> Mapping[str, np.ndarray]: ...

    def backend_of(self, detector: str) -> str: ...

    def success(self, name: str) -> np.ndarray: ...

    def ood_positives(self, name: str) -> np.ndarray: ...


@dataclass(frozen=True)
class RunContext:
    """What a run hands its plugins (a :class:`RunView`): frozen, each stage returns a new one
    (``dataclasses.replace``) instead of writing into it. ``scores[detector][set_name]`` holds per-sample detector
    confidences (higher = more in-distribution, OpenOOD's convention); set names are ``"id"``, the natural OOD set
    names and the attack names (``adv_sets`` keys). ``scores`` is empty when no detector was selected.

    The plan (on this process's device: :func:`advopenood.run.resolved.resolve`) is the one carrier of the run's
    settings: ``seed``, ``device``, ``batch_size``, ``protocol``, ``dataset`` and ``arch`` are read-only properties
    derived from it, not fields of their own (a context built with them as keywords puts them into its plan, with a
    DeprecationWarning: :func:`plan_with`)."""

    #: the run plan (:class:`advopenood.config.plan.RunPlan`): every setting, typed, read by attribute
    plan: RunPlan
    out: Path
    model: Classifier
    id_set: Dataset
    fit_set: Dataset
    ood_sets: dict[str, Dataset]
    adv_sets: dict[str, AdvSet]
    clean: CleanRecord
    #: this process's torchrun rank: not a setting of the run (each rank's plan is the same but for its device)
    rank: int = 0
    progress: bool = True
    backend: str = ""
    #: what computed each detector's scores (``openood``, ``pytorch-ood`` or ``plugin:<distribution>``)
    backends: dict[str, str] = field(default_factory=dict)
    scores: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    #: ``selection[detector][set_name]`` for every randomised detector: its confidences from the attack stream (the
    #: noise its attacks draw), which a worst case over sets chooses on (:meth:`choice_scores`)
    selection: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    detector_errors: dict[str, str] = field(default_factory=dict)
    #: evaluators and analyses that raised (``evaluator:<name>`` / ``analysis:<name>`` -> one line), and attack sets
    #: whose attack raised or returned impossible images (``attack:<set>``); their outputs are not written, every
    #: other output is
    plugin_errors: dict[str, str] = field(default_factory=dict)
    #: one line per input set that looks wrong but may be meant (e.g. pixels spanning a small share of their type's
    #: range); run.json's ``warnings`` and the report show them
    warnings: list[str] = field(default_factory=list)
    #: evaluators and analyses that ran but returned nothing (label -> why: :attr:`Results.empty_reason`)
    nothing_computed: dict[str, str] = field(default_factory=dict)
    #: the traceback of each failure (``detector:<name>`` or the plugin's label), for ``errors.log``
    traces: dict[str, str] = field(default_factory=dict)
    #: the run's detectors (:class:`advopenood.detectors.DetectorBank`, constructed once, fitted on first need);
    #: ``bank.score(sets)`` scores new sets
    bank: DetectorBank | None = None
    #: the run's attacks by set name, as constructed once and bound (an analysis runs these, never a rebuilt copy)
    attacks: Mapping[str, Any] = field(default_factory=dict)
    #: set on the context a finished run returns (:func:`advopenood.run.pipeline.run`); empty before
    outcome: Outcome = field(default_factory=Outcome)

    @property
    def seed(self) -> int:
        """The run's seed (``plan.seed``)."""
        return self.plan.seed

    @property
    def device(self) -> torch.device:
        """This process's device (``plan.device``: the run's plan is put on ``cuda:<LOCAL_RANK>`` under torchrun)."""
        return torch.device(self.plan.device)

    @property
    def batch_size(self) -> int:
        """The run's batch size (``plan.batch_size``)."""
        return self.plan.batch_size

    @property
    def protocol(self) -> str:
        """The named evaluation protocol (``plan.protocol``: ``strong``, ``lorenz2024``, ``mahmood2021``); every CSV
        carries it."""
        return self.plan.protocol

    @property
    def dataset(self) -> str:
        """The ID data set's name in every table: ``plan.data.dataset``, else the name of the ID set's entry
        (:func:`advopenood.data.datasets.dataset_name` of ``plan.data.id``)."""
        return self.plan.data.dataset or dataset_name(self.plan.data.id)

    @property
    def arch(self) -> str:
        """The classifier's architecture (``plan.model.arch``, from which the run builds its model)."""
        return self.plan.model.arch

    @property
    def config(self) -> dict[str, Any]:
        """The plan as plain dicts (``plan.dump()``), for plugins written against the earlier mapping API; read
        ``ctx.plan`` instead."""
        return self.plan.dump()

    @property
    def intervals(self) -> IntervalPolicy:
        """The run's interval policy (:class:`~advopenood.evaluation.intervals.IntervalPolicy`): the plan's ``ci``
        and the run seed, its bootstrap replicates stored under ``<cache>/intervals``; built once per plan (another
        plan set on this context gets its own)."""
        memo = self.__dict__.get("_intervals")
        if memo is None or memo[0] is not self.plan:
            policy = IntervalPolicy.of(self.plan.ci, self.seed, IntervalStore(self.plan.cache / FOLDER))
            memo = self.__dict__["_intervals"] = (self.plan, policy)
        return memo[1]

    @property
    def positive_sets(self) -> dict[str, AdvSet]:
        """The adversarial sets whose images count as OOD: every set except those of attacks that declare
        :class:`~advopenood.capabilities.IdNegatives` (ID images pushed to look OOD, which stay ID negatives)."""
        return {name: adv for name, adv in self.adv_sets.items()
                if not is_id_negative(registry.get("attacks", adv.attack))}

    @property
    def id_adv_sets(self) -> dict[str, AdvSet]:
        """The adversarial sets made from the ID test images (row ``i`` = ``id_set`` row ``i``), without the
        OOD->ID sets, whose rows are natural OOD images, and without ID-negative sets (:attr:`positive_sets`)."""
        return {name: adv for name, adv in self.positive_sets.items() if adv.source == "id"}

    def choice_scores(self, detector: str) -> dict[str, np.ndarray]:
        """The confidences a worst case over sets chooses each image's set on, by set: for a randomised detector
        the attack stream's (:attr:`selection`), so that no evaluation draw chooses what it then scores (Athalye
        et al. 2018; Tramer et al. 2020: evaluation noise independent of every draw that chose the example); for a
        deterministic one its scores themselves. The value chosen is always read from :attr:`scores`."""
        return self.selection.get(detector) or self.scores[detector]

    def backend_of(self, detector: str) -> str:
        """The ``backend`` column of a detector's rows: what computed its scores."""
        return self.backends.get(detector, self.backend)

    @property
    def failures(self) -> dict[str, str]:
        """Every failed plugin of the run, ``attack:<set>``, ``detector:<name>``, ``evaluator:<name>`` or
        ``analysis:<name>`` -> one line; a run with failures exits with code 3."""
        return {**{f"detector:{k}": v for k, v in self.detector_errors.items()}, **self.plugin_errors}

    def success(self, name: str) -> np.ndarray:
        """Per-row success of adversarial set ``name`` on the images the detectors score (after the protocol's
        quantization: an 8-bit truncated image can stop being adversarial), ``AdvSet.seen_success``. Evaluators
        that select successful examples use this mask, never the stored float-image ``success``."""
        return self.adv_sets[name].seen_success

    @property
    def positives_rule(self) -> str:
        """Which rows of an ID->ID adversarial set are OOD positives under the run's protocol: ``successful``
        (protocol ``strong``, ``mahmood2021``) or ``all`` (``lorenz2024``: "all attacked test images")."""
        return protocols.get(self.protocol).ood_positives

    def ood_positives(self, name: str) -> np.ndarray:
        """The rows of adversarial set ``name`` that count as OOD under the run's protocol: every row for an OOD->ID
        set (its images are OOD) or under ``positives_rule == "all"``, else :meth:`success`. Every built-in
        evaluator selects its positives through this one rule."""
        adv = self.adv_sets[name]
        if adv.source != "id" or self.positives_rule == "all":
            return np.ones(len(adv), dtype=bool)
        return self.success(name)

    @property
    def plot_dir(self) -> Path:
        """Where a plugin saves its figures (``<out>/plots``); the evaluate stage makes it while each plugin runs
        (:func:`advopenood.run.evaluate.run_plugin`): reading it writes nothing."""
        return self.out / "plots"


#: the settings a context repeated beside its plan until 0.3 (issue 51): each is now a property read from the plan
PLAN_SETTINGS = ("device", "seed", "batch_size", "protocol", "dataset", "arch")


def plan_with(plan: RunPlan, **settings: Any) -> RunPlan:
    """``plan`` with run settings of :data:`PLAN_SETTINGS` put in (``device``, ``seed``, ``batch_size`` and
    ``dataset``, ``arch`` as ``data.dataset`` and ``model.arch``): a copy of the validated values, not validated
    again (as :meth:`~advopenood.config.plan.RunPlan.on_device`), except for ``protocol``, on which the attack specs
    depend (:meth:`~advopenood.config.plan.RunPlan.replace`, validated once more)."""
    if "protocol" in settings and settings["protocol"] != plan.protocol:
        plan = plan.replace(protocol=settings["protocol"])
    top: dict[str, Any] = {k: str(v) if k == "device" else v for k, v in settings.items()
                           if k in ("device", "seed", "batch_size")}
    if "dataset" in settings:
        top["data"] = plan.data.model_copy(update={"dataset": settings["dataset"]})
    if "arch" in settings:
        top["model"] = plan.model.model_copy(update={"arch": settings["arch"]})
    return plan.model_copy(update=top) if top else plan


_fields_init = RunContext.__init__


@functools.wraps(_fields_init)
def _init(self: RunContext, *args: Any, **kwargs: Any) -> None:
    """The fields' ``__init__``; the keywords of :data:`PLAN_SETTINGS` (deprecated) go into the plan
    (:func:`plan_with`), with a DeprecationWarning."""
    moved = {key: kwargs.pop(key) for key in PLAN_SETTINGS if key in kwargs}
    if moved:
        warnings.warn(f"RunContext({', '.join(f'{k}=' for k in moved)}...) is deprecated since 0.3: the plan carries "
                      "the run's settings (ctx.seed, ctx.device, ... read it); pass plan= a plan that holds them "
                      "(RunPlan.replace, RunPlan.on_device)", DeprecationWarning, stacklevel=2)
        if args:
            args = (plan_with(args[0], **moved), *args[1:])
        else:
            kwargs["plan"] = plan_with(kwargs["plan"], **moved)
    _fields_init(self, *args, **kwargs)


RunContext.__init__ = _init  # type: ignore[method-assign]


def evolve(ctx: RunContext, **changes: Any) -> RunContext:
    """``dataclasses.replace(ctx, **changes)`` that keeps ``ctx``'s interval policy (its store counts the run's
    interval work, ``run.json``'s ``interval_work``), so that a later stage's context is the same run's."""
    new = dataclasses.replace(ctx, **changes)
    if "_intervals" in ctx.__dict__:
        new.__dict__["_intervals"] = ctx.__dict__["_intervals"]
    return new
