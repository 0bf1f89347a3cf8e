"""Run configuration: a typed schema (pydantic) over YAML files and CLI overrides.

Every key at every level is declared in :class:`RunConfig`; an unknown key, a wrong type or an out-of-range
value is refused with one line naming its full path, the closest valid key or the valid choices, and its
YAML line and column. The validated config is a read-only mapping (:class:`Config`): the rest of the code
reads it and never mutates it, and ``run.json`` records it in full. Plugin parameters
(``attack_params.<name>`` and the like) are checked by constructing the plugins (:mod:`advopenood.preflight`).
"""
from __future__ import annotations

import difflib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from advopenood import protocols, registry
from advopenood.capabilities import is_family, requires_attacks
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
        from advopenood.models import ARCHS, TIMM_PREFIX, ZOO_PREFIX, check_timm_name

        if value.startswith((TIMM_PREFIX, ZOO_PREFIX)):
            try:
                if value.startswith(TIMM_PREFIX):
                    check_timm_name(value[len(TIMM_PREFIX):])
                else:
                    from advopenood.robustbench_zoo import check_zoo_name

                    check_zoo_name(value[len(ZOO_PREFIX):])
            except UsageError as exc:
                raise ValueError(str(exc)) from None
            return value
        if value not in ARCHS:
            raise ValueError(_choice_message("architecture", value, list(ARCHS) + [
                f"{TIMM_PREFIX}<name>", f"{ZOO_PREFIX}<dataset>/<threat>/<model_id>"]))
        return value

    @model_validator(mode="after")
    def _channels(self) -> "ModelSpec":
        for key in ("mean", "std"):
            value = getattr(self, key)
            if value is not None and len(value) != self.in_channels:
                raise ValueError(f"{key} has {len(value)} values but in_channels is {self.in_channels}")
        if self.arch.startswith("robustbench:"):
            from advopenood.robustbench_zoo import zoo_normalisation

            try:
                zoo_normalisation(self.mean, self.std, self.in_channels)
            except UsageError as exc:
                raise ValueError(str(exc)) from None
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
    #: an OpenOOD v1.5 benchmark: fills id, fit and ood from its image lists (advopenood.openood_benchmarks)
    benchmark: Literal["cifar10", "cifar100", "imagenet200", "imagenet"] | None = None
    #: the benchmark's OOD groups to read (default: those OpenOOD's download script ships)
    groups: tuple[Literal["near", "far", "csid"], ...] | None = None
    id: DataSpec | None = None
    fit: DataSpec | None = None
    fit_limit: int | None = Field(None, ge=1)
    ood_limit: int | None = Field(None, ge=1)
    ood: tuple[DataSpec, ...] = ()
    #: what identifies an image-list set's images in the store's keys (advopenood.data.ImglistDataset):
    #: ``stat`` (each file's size and modification time) or ``content`` (each file's SHA-256; slower)
    image_identity: Literal["stat", "content"] = "stat"

    @model_validator(mode="before")
    @classmethod
    def _benchmark(cls, value: Any) -> Any:
        if isinstance(value, Mapping) and value.get("benchmark") in _BENCHMARK_NAMES:
            from advopenood.openood_benchmarks import expand

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


# --- the validated, read-only config -------------------------------------------------------------------------


def freeze(value: Any) -> Any:
    """Mappings -> :class:`Frozen`, lists -> tuples, recursively."""
    if isinstance(value, Mapping):
        return Frozen(value)
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """The inverse of :func:`freeze`: plain dicts and lists (for JSON, YAML and overrides)."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(v) for v in value]
    return value


class Frozen(Mapping):
    """A read-only mapping; nested mappings and sequences are read-only too."""

    def __init__(self, data: Mapping[str, Any] = ()):
        self._data = {k: freeze(v) for k, v in dict(data).items()}

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"Frozen({self._data!r})"


class Config(Frozen):
    """A validated run config, read-only. ``source`` names the YAML it came from; ``folder`` is that file's folder."""

    def __init__(self, data: Mapping[str, Any], source: str = "", folder: Path | None = None,
                 positions: Mapping[tuple, tuple[int, int]] | None = None):
        super().__init__(data)
        self.source, self.folder, self.positions = source, folder, dict(positions or {})


# --- YAML with positions ---------------------------------------------------------------------------------------


def _positions(node: yaml.Node, path: tuple = ()) -> Iterator[tuple[tuple, tuple[int, int]]]:
    """``(path, (line, column))`` of every key and list item of a composed YAML document, 1-based."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            sub = path + (key.value,)
            yield sub, (key.start_mark.line + 1, key.start_mark.column + 1)
            yield from _positions(value, sub)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield path + (i,), (item.start_mark.line + 1, item.start_mark.column + 1)
            yield from _positions(item, path + (i,))


def _read_yaml(text: str, label: str) -> tuple[dict[str, Any], dict[tuple, tuple[int, int]]]:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(f"config {label} is not valid YAML{where}: {problem}") from None
    if not isinstance(raw, dict):
        raise UsageError(f"config {label} must be a YAML mapping of keys (name, model, data, ...), "
                         f"not {type(raw).__name__}")
    return raw, dict(_positions(node)) if node is not None else {}


def packaged_configs() -> list[str]:
    """Names of the configs shipped inside the package (``advopenood.configs``)."""
    return sorted(p.name[:-5] for p in resources.files("advopenood.configs").iterdir() if p.name.endswith(".yaml"))


def load_config(spec: str) -> tuple[Config, Path | None]:
    """Read and validate a YAML config from a path or a packaged name (``demo``, ``cifar10_resnet20``).

    A relative ``data.root`` is taken relative to the config file's folder. Returns (config, its folder).
    """
    path = Path(spec).expanduser()
    if path.is_file():
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"config {spec!r} cannot be read: {exc}") from None
        folder, label = path.parent.resolve(), path.name
    else:
        name = Path(spec).name.removesuffix(".yaml")
        packaged = resources.files("advopenood.configs") / f"{name}.yaml"
        if not packaged.is_file():
            raise UsageError(f"config {spec!r} not found; valid choices: a YAML path or one of "
                             f"{', '.join(packaged_configs())}")
        text, folder, label = packaged.read_text(), Path(str(packaged)).parent, f"{name}.yaml"
    raw, positions = _read_yaml(text, label)
    root = (raw.get("data") or {}).get("root") if isinstance(raw.get("data"), dict) else None
    if isinstance(root, str) and not Path(root).expanduser().is_absolute():
        raw["data"]["root"] = str((folder / root).resolve())
    return validate(raw, source=label, folder=folder, positions=positions), folder


# --- validation --------------------------------------------------------------------------------------------------


def _unwrap(tp: Any) -> Any:
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    return tp


def _step(tp: Any, item: Any) -> Any:
    """The type at ``item`` below ``tp`` (a field, a list item, a dict value, or a union member by tag/name)."""
    tp = _unwrap(tp)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        field = tp.model_fields.get(str(item))
        return field.annotation if field is not None else None
    origin, args = get_origin(tp), get_args(tp)
    if origin in (list, tuple) and isinstance(item, int):
        return args[0]
    if origin is dict:
        return args[1]
    if origin is Union or str(origin) == "types.UnionType":
        for arg in args:
            arg = _unwrap(arg)
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                kind = arg.model_fields.get("kind")
                if arg.__name__ == item or (kind is not None and item in get_args(kind.annotation)):
                    return arg
        for arg in args:
            found = _step(arg, item)
            if found is not None:
                return found
    return None


def _clean_loc(raw: Any, loc: tuple) -> tuple:
    """A pydantic error location without union tags and member names: the path as the user wrote it."""
    out, node = [], raw
    for i, item in enumerate(loc):
        if isinstance(node, dict) and item in node:
            node = node[item]
            out.append(item)
        elif isinstance(node, list) and isinstance(item, int) and item < len(node):
            node = node[item]
            out.append(item)
        elif i == len(loc) - 1 or not isinstance(node, (dict, list)) or isinstance(item, int):
            out.append(item)
    return tuple(out)


def _dotted(loc: tuple) -> str:
    text = ""
    for item in loc:
        text += f"[{item}]" if isinstance(item, int) else (f".{item}" if text else str(item))
    return text


def _where(loc: tuple, source: str, positions: Mapping[tuple, tuple[int, int]]) -> str:
    """`` (file line L, column C)`` of ``loc`` or its closest ancestor written in the file, else ``""``."""
    for n in range(len(loc), 0, -1):
        if loc[:n] in positions:
            line, col = positions[loc[:n]]
            return f" ({source} line {line}, column {col})"
    return ""


def _error_line(err: dict[str, Any], raw: dict[str, Any], source: str,
                positions: Mapping[tuple, tuple[int, int]]) -> str:
    loc = _clean_loc(raw, tuple(err["loc"]))
    where = _where(loc, source, positions)
    path = _dotted(loc)
    kind = err["type"]
    if kind == "extra_forbidden":
        parent: Any = RunConfig
        for item in err["loc"][:-1]:
            parent = _step(parent, item) if parent is not None else None
        parent = _unwrap(parent)
        valid = list(parent.model_fields) if isinstance(parent, type) and issubclass(parent, BaseModel) else []
        close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
        prefix = _dotted(loc[:-1])
        hint = f"; did you mean {prefix + '.' if prefix else ''}{close[0]}?" if close else ""
        return f"unknown key {path}{hint}{where}; valid keys here: {', '.join(valid)}"
    if kind == "missing":
        return f"missing key {path}{where}"
    if kind == "union_tag_not_found":
        return f"{path} has no 'kind'{where}; valid choices: {', '.join(DATA_KINDS)}"
    if kind == "union_tag_invalid":
        return f"{path}.kind {err['ctx'].get('tag')!r} is not a data kind{where}; valid choices: {', '.join(DATA_KINDS)}"
    message = str(err["msg"]).removeprefix("Value error, ")
    if kind == "literal_error":
        message = f"{err['input']!r} is not valid; valid choices: {err['ctx']['expected']}"
    elif kind == "string_pattern_mismatch" and loc == ("device",):
        message = f"{err['input']!r} is not a device; valid choices: cpu, cuda, cuda:N"
    elif "input" in err and not isinstance(err["input"], (dict, list)) and kind != "value_error":
        message = f"{message} (got {err['input']!r})"
    return f"{path}: {message}{where}"


def validate(raw: Mapping[str, Any], *, source: str = "config", folder: Path | None = None,
             positions: Mapping[tuple, tuple[int, int]] | None = None) -> Config:
    """Validate a raw config mapping into a read-only :class:`Config` (plugin names checked against the registry).

    The first problem raises a UsageError of one line: its key path, what is wrong, the valid keys or
    choices, and the YAML line and column when the key came from a file.
    """
    raw = thaw(raw)
    positions = positions or {}
    try:
        model = RunConfig.model_validate(raw)
    except ValidationError as exc:
        errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")  # a typo explains the rest
        raise UsageError(_error_line(errors[0], raw, source, positions)) from None
    data = model.model_dump(mode="python")
    data["attacks"] = [a if isinstance(a, str) else {k: v for k, v in a.items() if v not in (None, {})}
                       for a in data["attacks"]]
    section = data["data"]  # data entries keep only the keys given or defaulted, so readers' .get(key, default) works
    for key in ("id", "fit"):
        if section[key] is not None:
            section[key] = {k: v for k, v in section[key].items() if v is not None}
    section["ood"] = [{k: v for k, v in spec.items() if v is not None} for spec in section["ood"]]
    data["detectors"] = registry.parse_names("detectors", list(data["detectors"]))
    data["evaluators"] = registry.parse_names("evaluators", list(data["evaluators"]))
    data["analyses"] = registry.parse_names("analyses", list(data["analyses"]))
    for section, kind in (("attack_params", "attacks"), ("detector_params", "detectors"),
                          ("evaluator_params", "evaluators"), ("analysis_params", "analyses")):
        data[section] = {str(k).lower(): v for k, v in data[section].items()}
        for name in data[section]:
            if name not in registry.entries(kind):
                where = _where((section, name), source, positions)
                singular = kind[:-1] if kind != "analyses" else "analysis"
                raise UsageError(f"{section}.{name}{where}: " + _choice_message(singular, name, registry.names(kind)))
    return Config(data, source=source, folder=folder, positions=positions)


def apply_overrides(cfg: Mapping[str, Any], *, data_root: str | None = None, out: str | None = None,
                    protocol: str | None = None, attack: str | None = None, eps: str | None = None,
                    detectors: str | None = None, detector_backend: str | None = None, evaluator: str | None = None,
                    analysis: str | None = None, limit: int | None = None, device: str | None = None,
                    seed: int | None = None, cache_dir: str | None = None, shard_size: int | None = None,
                    num_workers: int | None = None, config_dir: Path | None = None, amp: bool | None = None,
                    channels_last: bool | None = None, recompute: str | None = None) -> Config:
    """Apply CLI flags to a config and validate the result (a new :class:`Config`; ``cfg`` is not changed)."""
    raw = thaw(cfg)
    if data_root is not None:
        raw["data"]["root"] = str(Path(data_root).expanduser().resolve())
    elif raw["data"].get("root") and config_dir is not None and not Path(raw["data"]["root"]).is_absolute():
        raw["data"]["root"] = str((config_dir / raw["data"]["root"]).resolve())
    if attack is not None:
        raw["attacks"] = [a.strip().lower() for a in attack.split(",") if a.strip()]
    if eps is not None:
        values = [parse_eps(e) for e in str(eps).split(",") if e.strip()]
        raw["attacks"] = [_with_eps(a, values) for a in raw["attacks"]]
    for key, value in (("protocol", protocol), ("detectors", detectors), ("detector_backend", detector_backend),
                       ("limit", limit), ("device", device), ("seed", seed), ("cache_dir", cache_dir), ("out", out),
                       ("shard_size", shard_size), ("num_workers", num_workers), ("evaluators", evaluator),
                       ("analyses", analysis), ("amp", amp), ("channels_last", channels_last)):
        if value is not None:
            raw[key] = value
    if recompute is not None:
        raw["recompute"] = recompute
    result = validate(raw, source=cfg.source, folder=cfg.folder, positions=cfg.positions) \
        if isinstance(cfg, Config) else validate(raw)
    if eps is not None:
        check_one_threat(expand_attacks(result, int(result["model"]["input_size"])), f"--eps {eps}")
    return result


def attack_norm(spec: AttackSpec) -> str:
    """The norm an attack set's eps is measured in: its ``norm`` parameter (AutoAttack's), else its class's."""
    return str(spec.params.get("norm") or registry.get("attacks", spec.attack).norm).lower()


def check_one_threat(specs: list[AttackSpec], what: str) -> None:
    """A budget given once (``--eps``) must not reach bounded attacks of different norms:
    an L2 attack would silently get an Linf budget (a one-line UsageError)."""
    norms: dict[str, str] = {}
    for spec in specs:
        if registry.get("attacks", spec.attack).bounded:
            norms.setdefault(attack_norm(spec), spec.set_name)
    if len(norms) > 1:
        listed = ", ".join(f"{name} ({norm})" for norm, name in norms.items())
        raise UsageError(f"{what} would give attacks of different threat models the same budget: {listed}; "
                         "valid choices: one norm per --eps, or each attack's eps in attack_params / its entry")


def _with_eps(entry: Any, values: list[float]) -> Any:
    """Give a bounded attack entry the CLI's eps (DeepFool and other minimal attacks keep eps=None)."""
    entry = {"name": entry} if isinstance(entry, str) else dict(entry)
    if registry.get("attacks", entry["name"]).bounded:
        entry["eps"] = values if len(values) > 1 else values[0]
    return entry


# --- attack specs ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttackSpec:
    """One adversarial set to generate: registry name, full parameters and the set's name in outputs."""

    set_name: str
    attack: str
    params: dict[str, Any]


def expand_attacks(cfg: Mapping[str, Any], input_size: int) -> list[AttackSpec]:
    """Config ``attacks`` (names or ``{name, eps, params, label}``) -> one spec per (attack, eps).

    Parameters, lowest precedence first: the attack's ``defaults``, the protocol's ``protocol_defaults``,
    ``attack_params.<family>``, ``attack_params.<name>``, the entry's ``params``; an eps list gives one set per
    eps, named ``<attack>@<eps>``. A registered *family* (:class:`~advopenood.capabilities.AttackFamily`, e.g. one
    attack per selected detector) stands for its members, each taking the family's ``attack_params`` and the
    entry's eps and params. Parameters are validated by constructing the attack.
    """
    from advopenood.attacks import attack_params, build_attack

    specs: list[AttackSpec] = []
    by_name = cfg.get("attack_params") or {}
    for entry, family in attack_entries(cfg):
        name = entry["name"]
        params = attack_params(name, input_size, str(cfg.get("protocol", "strong")), thaw(by_name.get(family) or {}),
                               thaw(by_name.get(name) or {}), thaw(entry.get("params") or {}))
        eps_list = entry.get("eps")
        eps_list = params.get("eps") if eps_list is None else eps_list
        eps_list = list(eps_list) if isinstance(eps_list, (list, tuple)) else [eps_list]
        for eps in eps_list:
            full = {**params, "eps": None if eps is None else parse_eps(eps)}
            build_attack(name, full)
            label = entry.get("label") or name
            specs.append(AttackSpec(f"{label}@{full['eps']:.4g}" if len(eps_list) > 1 else label, name, full))
    names = [s.set_name for s in specs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UsageError(f"attack set {dup[0]!r} appears twice; give entries distinct eps or a 'label'")
    return specs


def attack_entries(cfg: Mapping[str, Any]) -> list[tuple[dict[str, Any], str | None]]:
    """Config ``attacks`` as ``(entry, family)`` with lower-case names, families replaced by their members, then the
    attacks the configured evaluators and analyses require (:class:`~advopenood.capabilities.RequiresAttacks`)
    whose set name the config does not already hold."""
    out = _configured_entries(cfg)
    labels = {e.get("label") or e["name"] for e, _ in out}
    for kind, section in (("evaluators", "evaluator_params"), ("analyses", "analysis_params")):
        for name in cfg.get(kind) or []:
            obj = registry.get(kind, name)
            if not requires_attacks(obj):
                continue
            for entry, family in obj.required_attacks(cfg, thaw((cfg.get(section) or {}).get(name) or {})):
                entry = {**entry, "name": str(entry["name"]).lower()}
                label = entry.get("label") or entry["name"]
                if label not in labels:
                    labels.add(label)
                    out.append((entry, family))
    return out


def _configured_entries(cfg: Mapping[str, Any]) -> list[tuple[dict[str, Any], str | None]]:
    """Config ``attacks`` as ``(entry, family)`` with lower-case names, families replaced by their members."""
    out: list[tuple[dict[str, Any], str | None]] = []
    for entry in cfg.get("attacks") or []:
        entry = {"name": entry} if isinstance(entry, str) else thaw(entry)
        entry["name"] = str(entry.get("name", "")).lower()
        cls = registry.get("attacks", entry["name"])
        if not is_family(cls):
            out.append((entry, None))
            continue
        members = cls.members(cfg)
        if not members:
            raise UsageError(f"attack {entry['name']!r} stands for {cls.hint or 'several attacks'}, but this config "
                             f"selects none; valid choices: {cls.remedy or 'name its members'}")
        out += [({**entry, "name": m}, entry["name"]) for m in members]
    return out


def cache_dir(cfg: Mapping[str, Any]) -> Path:
    """Where adversarial sets and trained models live: config, then $ADVOPENOOD_CACHE, then ~/.cache/advopenood."""
    return Path(cfg.get("cache_dir") or os.environ.get("ADVOPENOOD_CACHE") or "~/.cache/advopenood").expanduser()
