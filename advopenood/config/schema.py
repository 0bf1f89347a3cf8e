"""Run configuration: a typed schema (pydantic) over YAML files and CLI overrides.

Every key at every level is declared in :class:`RunConfig`; an unknown key, a wrong type or an out-of-range
value is refused with one line naming its full path, the closest valid key or the valid choices, and its
YAML line and column. The validated config is a read-only mapping (:class:`Config`): the rest of the code
reads it and never mutates it, and ``run.json`` records it in full. Plugin parameters
(``attack_params.<name>`` and the like) are checked by constructing the plugins (:mod:`advopenood.run.preflight`).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, Field, ValidationInfo, field_validator, model_validator

from advopenood.config import protocols
from advopenood.data.specs import DATA_KINDS, DataSpec  # noqa: F401  (DATA_KINDS: the loader's messages)
from advopenood.errors import UsageError
from advopenood.flags import (CI_METHODS, MAX_RESAMPLES, MIN_RESAMPLES, parse_eps,  # noqa: F401  (re-exported)
                              too_few_resamples)
from advopenood.models.specs import ModelSpec
from advopenood.spec import StrictModel, choice_message


def thaw(value: Any) -> Any:
    """Plain dicts and lists of a plan, a section, a mapping or a sequence (for JSON, YAML and parameters)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="python")
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(v) for v in value]
    return value


BACKENDS = ("auto", "openood", "pytorch-ood")
DEVICE_PATTERN = r"^(cpu|cuda(:\d+)?)$"
SEED_MAX = 2**63 - 1


def _eps_value(value: Any) -> Any:
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        try:
            return parse_eps(value)
        except UsageError as exc:
            raise ValueError(str(exc)) from None
    return value


def _names(value: Any) -> Any:
    """``"a,b"`` or ``["a", "b"]`` -> names, as written (names are case-sensitive: the registry suggests the
    lower-case one for ``MSP``); an empty string selects none. An item that is not a string is left for the
    validator to refuse."""
    if isinstance(value, str):
        value = [v for v in value.split(",") if v.strip()]
    if isinstance(value, (list, tuple)):
        return tuple(v.strip() if isinstance(v, str) else v for v in value)
    return value


Eps = Annotated[float, BeforeValidator(_eps_value)]
Names = Annotated[tuple[str, ...], BeforeValidator(_names)]
Params = dict[str, dict[str, Any]]





_BENCHMARK_NAMES = ("cifar10", "cifar100", "imagenet200", "imagenet")


class DataSection(StrictModel):
    """``data``: the ID test set, the fit (training) set, natural OOD sets, and the folder they are under."""

    root: str | None = None
    dataset: str | None = None
    #: an OpenOOD v1.5 benchmark: fills id, fit and ood from its image lists (advopenood.data.benchmarks)
    benchmark: Literal["cifar10", "cifar100", "imagenet200", "imagenet"] | None = None
    #: the benchmark's OOD groups to read (default: those OpenOOD's download script ships)
    groups: tuple[Literal["near", "far", "csid"], ...] | None = None
    id: DataSpec | None = None
    fit: DataSpec | None = None
    fit_limit: int | None = Field(None, ge=1)
    ood_limit: int | None = Field(None, ge=1)
    ood: tuple[DataSpec, ...] = ()
    #: what identifies an image-list set's images in the store's keys (advopenood.data.datasets.ImglistDataset):
    #: ``stat`` (each file's size and modification time) or ``content`` (each file's SHA-256; slower)
    image_identity: Literal["stat", "content"] = "stat"

    @model_validator(mode="before")
    @classmethod
    def _benchmark(cls, value: Any) -> Any:
        if isinstance(value, Mapping) and value.get("benchmark") in _BENCHMARK_NAMES:
            from advopenood.data.benchmarks import expand

            return expand(value)
        return value

    @model_validator(mode="after")
    def _has_id(self) -> "DataSection":
        if self.id is None:
            raise ValueError("data needs id (the ID test set) or benchmark "
                             f"(valid choices: {', '.join(_BENCHMARK_NAMES)})")
        return self


class AttackEntry(StrictModel):
    """One entry of ``attacks``: a name, optional eps (a list gives a sweep), parameters and an output label."""

    name: str
    eps: Eps | Annotated[tuple[Eps, ...], Field(min_length=1)] | None = None
    params: dict[str, Any] = {}
    label: str | None = None

    @field_validator("name")
    @classmethod
    def _strip(cls, value: str) -> str:
        return value.strip()


#: the bootstrap's default resamples per cell, and the fewest it takes
RESAMPLES = 2000


class CISection(StrictModel):
    """``ci``: the 95 % interval beside every metric (:mod:`advopenood.evaluation.intervals`)."""

    #: ``bootstrap`` (stratified percentile bootstrap), ``delong`` (AUROC only) or ``none``
    method: Literal[CI_METHODS] = "bootstrap"  # type: ignore[valid-type]
    #: bootstrap resamples per cell (100 to :data:`MAX_RESAMPLES` under ``bootstrap``; ``delong`` and ``none``
    #: draw none)
    resamples: int = Field(RESAMPLES, ge=1, le=MAX_RESAMPLES)

    @field_validator("resamples")
    @classmethod
    def _enough(cls, value: int, info: ValidationInfo) -> int:
        if info.data.get("method", "bootstrap") == "bootstrap" and value < MIN_RESAMPLES:
            raise ValueError(too_few_resamples(value))
        return value

    def unused_note(self) -> str:
        """The note for a ``resamples`` other than the default under a method that draws none (empty otherwise)."""
        if self.method == "bootstrap" or self.resamples == RESAMPLES:
            return ""
        why = "DeLong's intervals are analytic" if self.method == "delong" else "no interval is computed"
        return (f"ci.resamples {self.resamples} (--ci-resamples) has no effect under ci.method {self.method}: {why}, "
                "no resample is drawn")


class ReportSection(StrictModel):
    """``report``: how the readable report is laid out."""

    #: the evaluator whose headline table opens the report (one of the run's evaluators); None: the first selected
    #: evaluator with a specific headline (:func:`advopenood.capabilities.lead_evaluator`)
    lead: str | None = None


class RunConfig(StrictModel):
    """A whole run. Every key is listed here; anything else is an error."""

    name: str = "run"
    protocol: str = "strong"
    #: a signed 64-bit integer (torch's generators refuse seeds of 2**64 and above)
    seed: int = Field(0, ge=0, le=SEED_MAX)
    device: str = Field("cpu", pattern=DEVICE_PATTERN)
    batch_size: int = Field(128, ge=1)
    shard_size: int = Field(256, ge=1)
    num_workers: int = Field(0, ge=0)
    limit: int | None = Field(None, ge=1)
    out: str | None = None
    cache_dir: str | None = None
    #: mixed precision (bfloat16 autocast) for attacks and the shared pass on a GPU; a no-op on the CPU
    amp: bool = False
    #: channels-last memory format for the model and its inputs (GPU convolutions); a no-op on the CPU
    channels_last: bool = False
    model: ModelSpec
    data: DataSection
    attacks: tuple[Union[str, AttackEntry], ...] = ("fgsm", "pgd", "df", "mpgd")
    #: the one budget of every bounded Linf attack (not a patch attack) that is given no eps of its own
    #: (``attack_params``, an entry's eps); None: each attack's default (8/255 at 32 px, 4/255 at 224 px)
    eps: Eps | None = None
    attack_params: Params = {}
    detectors: Names = ("all",)
    detector_backend: Literal[BACKENDS] = "auto"  # type: ignore[valid-type]
    detector_params: Params = {}
    evaluators: Names = ("ood",)
    evaluator_params: Params = {}
    analyses: Names = ()
    analysis_params: Params = {}
    #: attack set names or detector names (or ``all``) whose stored work this run recomputes on purpose
    recompute: Names = ()
    ci: CISection = CISection()
    report: ReportSection = ReportSection()
    #: the standard benchmark (``name@version``) whose settings :func:`advopenood.config.benchmarks.apply_benchmark`
    #: gave this run (``advopenood run --benchmark``); such a run writes ``entries/<detector>.json``
    benchmark: str | None = None

    @field_validator("protocol")
    @classmethod
    def _known_protocol(cls, value: str) -> str:
        if value not in protocols.PROTOCOLS:
            raise ValueError(choice_message("protocol", value, list(protocols.PROTOCOLS)))
        return value

    @field_validator("num_workers")
    @classmethod
    def _workers(cls, value: int) -> int:
        cores = os.cpu_count() or 1
        if value > cores:
            raise ValueError(f"num_workers {value} exceeds the {cores} cores of this machine; valid choices: 0..{cores}")
        return value


