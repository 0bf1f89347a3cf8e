"""Run configuration: a typed schema (pydantic) over YAML files and CLI overrides.

Every key at every level is declared in :class:`RunConfig`; an unknown key, a wrong type or an out-of-range
value is refused with one line naming its full path, the closest valid key or the valid choices, and its
YAML line and column. The validated config is a read-only mapping (:class:`Config`): the rest of the code
reads it and never mutates it, and ``run.json`` records it in full. Plugin parameters
(``attack_params.<name>`` and the like) are checked by constructing the plugins (:mod:`advopenood.run.preflight`).
"""
from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from fractions import Fraction
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from advopenood.config import protocols
from advopenood.errors import UsageError

BACKENDS = ("auto", "openood", "pytorch-ood")
DEVICE_PATTERN = r"^(cpu|cuda(:\d+)?)$"


def parse_eps(text: str | float) -> float:
    """``0.03``, ``8/255`` -> float; a UsageError names the bad value."""
    try:
        return float(Fraction(str(text).strip())) if "/" in str(text) else float(text)
    except (ValueError, ZeroDivisionError):
        raise UsageError(f"eps {text!r} is not a number; valid choices: a float in (0, 1] or a fraction like 8/255") from None


def _eps_value(value: Any) -> Any:
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        try:
            return parse_eps(value)
        except UsageError as exc:
            raise ValueError(str(exc)) from None
    return value


def _names(value: Any) -> Any:
    """``"a,b"`` or ``["a", "b"]`` -> lower-case names; an empty string selects none."""
    if isinstance(value, str):
        value = [v for v in value.split(",") if v.strip()]
    if isinstance(value, (list, tuple)):
        return tuple(str(v).strip().lower() for v in value)
    return value


Eps = Annotated[float, BeforeValidator(_eps_value)]
Names = Annotated[tuple[str, ...], BeforeValidator(_names)]
Params = dict[str, dict[str, Any]]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TrainSpec(_Strict):
    """``model.train``: train the architecture on the fit set on first use (cached by recipe and data)."""

    epochs: int = Field(30, ge=1)
    lr: float = Field(0.01, gt=0)
    batch: int = Field(64, ge=1)
    #: mixup's Beta parameter (Zhang et al. 2018); 0 trains without mixup
    mixup: float = Field(0.0, ge=0)


class ModelSpec(_Strict):
    """``model``: architecture, classes, input layout, normalisation, and a checkpoint or a training recipe."""

    arch: str
    num_classes: int = Field(10, ge=2)
    in_channels: Literal[1, 3] = 3
    input_size: int = Field(32, ge=8)
    checkpoint: str | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[Annotated[float, Field(gt=0)], ...] | None = None
    train: TrainSpec | None = None

    @field_validator("arch")
    @classmethod
    def _known_arch(cls, value: str) -> str:
        from advopenood.models.classifier import ARCHS
        from advopenood.models.backbones import TIMM_PREFIX, check_timm_name

        if value.startswith(TIMM_PREFIX):
            try:
                check_timm_name(value[len(TIMM_PREFIX):])
            except UsageError as exc:
                raise ValueError(str(exc)) from None
            return value
        if value not in ARCHS:
            raise ValueError(_choice_message("architecture", value, list(ARCHS) + [f"{TIMM_PREFIX}<name>"]))
        return value

    @model_validator(mode="after")
    def _channels(self) -> "ModelSpec":
        for key in ("mean", "std"):
            value = getattr(self, key)
            if value is not None and len(value) != self.in_channels:
                raise ValueError(f"{key} has {len(value)} values but in_channels is {self.in_channels}")
        return self


class _DataSpec(_Strict):
    name: str | None = None
    #: OpenOOD's group of a natural set (near-OOD, far-OOD, covariate-shifted ID); default: by name for data.dataset
    group: Literal["near", "far", "csid", "other"] | None = None


class NpzSpec(_DataSpec):
    """An ``.npz`` file holding ``x`` (uint8, NHWC or NHW) and ``y`` (int labels)."""

    kind: Literal["npz"]
    path: str
    #: resize the shorter side to ``pre_size``, then centre-crop to the input size (as OpenOOD's test
    #: preprocessing); unset: the whole image is resized to the input size
    pre_size: int | None = Field(None, ge=8)


class IdxSpec(_DataSpec):
    """MNIST-style IDX image and label files."""

    kind: Literal["idx"]
    images: str
    labels: str


class OpenOODSpec(_DataSpec):
    """An OpenOOD image list under the data root (``benchmark_imglist/...``) and its image folder."""

    kind: Literal["openood"]
    imglist: str
    images: str = "images_classic"
    #: OpenOOD's test preprocessing: resize the shorter side to ``pre_size``, centre-crop to the input size
    pre_size: int | None = Field(None, ge=8)


class TorchvisionSpec(_DataSpec):
    """A torchvision dataset by name, read from the data root."""

    kind: Literal["torchvision"]
    dataset: str | None = None
    split: str | None = None
    download: bool = False


class DemoSpec(_DataSpec):
    """A data set embedded in the installed packages (the demo's)."""

    kind: Literal["demo"]
    split: Literal["train", "test"] = "test"
    name_as: str | None = None


DataSpec = Annotated[Union[NpzSpec, IdxSpec, OpenOODSpec, TorchvisionSpec, DemoSpec], Field(discriminator="kind")]
DATA_KINDS = ("npz", "idx", "openood", "torchvision", "demo")


_BENCHMARK_NAMES = ("cifar10", "cifar100", "imagenet200", "imagenet")


class DataSection(_Strict):
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


class AttackEntry(_Strict):
    """One entry of ``attacks``: a name, optional eps (a list gives a sweep), parameters and an output label."""

    name: str
    eps: Eps | tuple[Eps, ...] | None = None
    params: dict[str, Any] = {}
    label: str | None = None

    @field_validator("name")
    @classmethod
    def _lower(cls, value: str) -> str:
        return value.strip().lower()


class RunConfig(_Strict):
    """A whole run. Every key is listed here; anything else is an error."""

    name: str = "run"
    protocol: str = "strong"
    seed: int = Field(0, ge=0)
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

    @field_validator("protocol")
    @classmethod
    def _known_protocol(cls, value: str) -> str:
        if value not in protocols.PROTOCOLS:
            raise ValueError(_choice_message("protocol", value, list(protocols.PROTOCOLS)))
        return value

    @field_validator("num_workers")
    @classmethod
    def _workers(cls, value: int) -> int:
        cores = os.cpu_count() or 1
        if value > cores:
            raise ValueError(f"num_workers {value} exceeds the {cores} cores of this machine; valid choices: 0..{cores}")
        return value


def _choice_message(what: str, value: str, valid: list[str]) -> str:
    """``unknown <what> 'x'; did you mean 'y'? valid choices: ...`` (the hint only when one is close)."""
    close = difflib.get_close_matches(value, valid, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ";"
    return f"unknown {what} {value!r}{hint} valid choices: {', '.join(valid)}"
