"""Run configuration: a typed schema (pydantic) over YAML files and CLI overrides.

Every key at every level is declared in :class:`RunConfig`; an unknown key, a wrong type or an out-of-range
value is refused with one line naming its full path, the closest valid key or the valid choices, and its
YAML line and column. A command's config and flags are validated once (:func:`load_plan`: the flags applied to
the raw YAML, the data root resolved once by :func:`resolve_data_root`, then :func:`validate`). The validated
config is a read-only :class:`RunPlan`: the rest of the code reads it and never mutates it, and ``run.json`` records
it in full. Plugin parameters (``attack_params.<name>`` and the like) are checked by constructing the plugins
(the attacks as the plan's specs are resolved; the rest by :mod:`advopenood.run.resolved`).
"""
from __future__ import annotations

import difflib
import math
import sys
from collections.abc import Iterator, Mapping
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from advopenood import registry
from advopenood.capabilities import is_randomised
from advopenood.config.packaged import packaged_configs
from advopenood.config.plan import RunPlan, check_one_threat
from advopenood.config.schema import DATA_KINDS, RunConfig, parse_eps, thaw
from advopenood.errors import UsageError
from advopenood.params import MAX_DRAWS
from advopenood.spec import choice_message

# --- YAML with positions ---------------------------------------------------------------------------------------


#: where each key of a raw config came from: ``(line, column)`` in its file, or the CLI flag that set it
Positions = Mapping[tuple, Union[tuple[int, int], str]]


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


#: The most YAML nodes a config may stand for with its aliases expanded: a document whose aliases multiply
#: (a "billion laughs") is refused before anything expands it.
MAX_YAML_NODES = 100_000


def _check_nodes(node: yaml.Node, label: str, sizes: dict[int, int | None], path: tuple = ()) -> int:
    """The number of nodes ``node`` stands for with aliases expanded (``sizes``: memo by node id; None while a node
    is being counted). A UsageError for a key written twice in one mapping, an alias inside its own anchor, or more
    than :data:`MAX_YAML_NODES` nodes."""
    where = f"{label} line {node.start_mark.line + 1}, column {node.start_mark.column + 1}"
    if id(node) in sizes:
        known = sizes[id(node)]
        if known is None:
            raise UsageError(f"config {label}: {_dotted(path) or 'the document'} ({where}) refers to itself through "
                             "a YAML alias; valid input: a finite mapping")
        return known
    sizes[id(node)] = None
    if isinstance(node, yaml.ScalarNode) and node.tag == FLOAT_TAG and not math.isfinite(_yaml_float(node.value)):
        raise UsageError(f"config {label}: {_dotted(path) or 'the document'} is {node.value} ({where}); "
                         f"{FINITE}")
    size, seen = 1, {}  # seen: (tag, key) -> its line
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                if (key.tag, key.value) in seen:
                    raise UsageError(f"config {label}: key {_dotted(path + (key.value,))} is written twice (lines "
                                     f"{seen[key.tag, key.value]} and {key.start_mark.line + 1}); valid input: each "
                                     "key once per mapping")
                seen[key.tag, key.value] = key.start_mark.line + 1
            size += _check_nodes(key, label, sizes, path) + _check_nodes(value, label, sizes, path + (key.value,))
    elif isinstance(node, yaml.SequenceNode):
        size += sum(_check_nodes(item, label, sizes, path + (i,)) for i, item in enumerate(node.value))
    if size > MAX_YAML_NODES:
        raise UsageError(f"config {label}: {_dotted(path) or 'the document'} ({where}) expands to more than "
                         f"{MAX_YAML_NODES} values through YAML aliases; valid input: a config of at most "
                         f"{MAX_YAML_NODES} values")
    sizes[id(node)] = size
    return size


FLOAT_TAG = "tag:yaml.org,2002:float"
#: the valid choices of a number: NaN and the infinities are refused at plan time (a saved plan would write them as
#: null, which reads back as the parameter's default)
FINITE = "valid choices: a finite number (not NaN or an infinity)"


def _yaml_float(text: str) -> float:
    """The value of a YAML float scalar as written (``.nan``, ``-.inf``, ``1e999``, ``1_000.5``); 0.0 for a form
    this reads no value from (sexagesimal ``1:30.5``, finite whatever it is)."""
    plain = text.replace("_", "").lower().replace(".inf", "inf").replace(".nan", "nan")
    try:
        return float(plain)
    except ValueError:
        return 0.0


def _check_finite(value: Any, loc: tuple, source: str, positions: Positions) -> None:
    """No NaN or infinite number anywhere in a raw config (a mapping given in Python, CLI flags applied): a one-line
    UsageError names the first with its key path."""
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"{_dotted(loc)}: {value!r} is not a finite number{_where(loc, source, positions)}; {FINITE}")
    items = value.items() if isinstance(value, Mapping) else enumerate(value) if isinstance(value, (list, tuple)) \
        else ()
    for key, item in items:
        _check_finite(item, loc + (key,), source, positions)


def _read_yaml(text: str, label: str) -> tuple[dict[str, Any], dict[tuple, tuple[int, int]]]:
    """The mapping of a YAML config and the position of each key, checked (:func:`_check_nodes`) before it is
    constructed."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            _check_nodes(node, label, {})
        positions = dict(_positions(node)) if node is not None else {}
        raw = (loader.construct_document(node) if node is not None else None) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(f"config {label} is not valid YAML{where}: {problem}") from None
    except RecursionError:
        raise UsageError(f"config {label} nests too deeply; valid input: a config of a few levels") from None
    finally:
        loader.dispose()
    if not isinstance(raw, dict):
        raise UsageError(f"config {label} must be a YAML mapping of keys (name, model, data, ...), "
                         f"not {type(raw).__name__}")
    return raw, positions


def read_config(spec: str) -> tuple[dict[str, Any], Path, str, dict[tuple, tuple[int, int]]]:
    """The raw mapping of a YAML config from a path or a packaged name (``demo``, ``cifar10_resnet20``), not yet
    validated: ``(raw, the file's folder, its label for messages, the position of each key)``."""
    path = Path(spec).expanduser()
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"config {spec!r} cannot be read: {exc}") from None
        folder, label = path.parent.resolve(), path.name
    else:
        name = Path(spec).name.removesuffix(".yaml")
        packaged = resources.files("advopenood.configs") / f"{name}.yaml"
        if not packaged.is_file():
            raise UsageError(f"config {spec!r} not found; valid choices: a YAML path or one of "
                             f"{', '.join(packaged_configs())}")
        text, folder, label = packaged.read_text(encoding="utf-8"), Path(str(packaged)).parent, f"{name}.yaml"
    raw, positions = _read_yaml(text, label)
    return raw, folder, label, positions


def resolve_data_root(raw: dict[str, Any], folder: Path | None, flag: str | None = None) -> None:
    """Set ``data.root`` of a raw config, in place, to the folder a run reads: ``--data-root`` (``flag``) when
    given, else the config's own root with ``~`` expanded, a relative one taken relative to the config file's
    ``folder`` (when there is one). The one place a data root is resolved; a ``data`` that is not a mapping is left
    for the validator to refuse."""
    data = raw.get("data")
    if not isinstance(data, dict):
        return
    root = data.get("root")
    if flag is not None:
        data["root"] = str(Path(flag).expanduser().resolve())
    elif isinstance(root, str) and root:
        path = Path(root).expanduser()
        data["root"] = str((folder / path).resolve() if folder is not None and not path.is_absolute() else path)


def load_config(spec: str) -> tuple[RunPlan, Path | None]:
    """Read and validate a YAML config from a path or a packaged name (``demo``, ``cifar10_resnet20``).

    A relative ``data.root`` is taken relative to the config file's folder. Returns (config, its folder).
    """
    raw, folder, label, positions = read_config(spec)
    resolve_data_root(raw, folder)
    return validate(raw, source=label, folder=folder, positions=positions), folder


def load_plan(spec: str, benchmark: Any = None, **flags: Any) -> RunPlan:
    """The run plan of a YAML config (:func:`read_config`) with CLI ``flags`` (:func:`apply_overrides`'
    keywords) applied to the raw config, validated once: what ``advopenood run`` and the other commands run. With
    ``benchmark`` (:class:`advopenood.config.benchmarks.Benchmark`) everything it fixes is set from it first
    (:func:`~advopenood.config.benchmarks.apply_benchmark`; a note names the config keys it replaced)."""
    raw, folder, label, positions = read_config(spec)
    from advopenood.config.benchmarks import benchmarked

    raw, replaced = benchmarked(raw, label, benchmark)
    if replaced:
        print(f"advopenood: note: benchmark {benchmark.key} replaced the config's {', '.join(replaced)}",
              file=sys.stderr)
    return _overridden(raw, folder, label, positions, **flags)


def check_config(spec: str, benchmark: Any = None, **flags: Any) -> RunPlan:
    """What :func:`load_plan` checks without a plugin or torch, for the CLI to refuse a bad run before they load:
    the YAML file (found, readable, valid, each key once) and every key and value of the schema, the flags applied
    (a bad value a flag set is named by its flag). The plugin names and parameters, the budgets' attacks and the
    architecture are left to :func:`load_plan`; the plan returned (its names not resolved) is for the preflight's
    checks of folders and files (:func:`advopenood.run.preflight.precheck`), not for a run."""
    raw, folder, label, positions = read_config(spec)
    from advopenood.config.benchmarks import benchmarked

    raw, _ = benchmarked(raw, label, benchmark)
    return _overridden(raw, folder, label, positions, plugins=False, **flags)


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
        elif isinstance(item, int) or (i == len(loc) - 1 and isinstance(node, dict)):  # else a union member's name
            out.append(item)
    return tuple(out)


def _wrong_member(err: dict[str, Any], raw: Any) -> bool:
    """Whether ``err`` is a union member refusing the value's shape outright (``attacks[0]`` is a mapping, so the
    ``str`` member's error is not the one to report)."""
    if not str(err["type"]).endswith("_type"):
        return False
    node, loc = raw, tuple(err["loc"])
    for i, item in enumerate(loc):
        if isinstance(node, dict) and item in node or isinstance(node, list) and isinstance(item, int) \
                and item < len(node):
            node = node[item]
        elif i == len(loc) - 1:  # the last step is a union member's name, not a key of the input
            return True
    return False


def _dotted(loc: tuple) -> str:
    text = ""
    for item in loc:
        text += f"[{item}]" if isinstance(item, int) else (f".{item}" if text else str(item))
    return text


def _where(loc: tuple, source: str, positions: Positions) -> str:
    """`` (file line L, column C)`` of ``loc`` or its closest ancestor written in the file, `` (from the flag
    --seed)`` where a CLI flag set it (:func:`_flagged`), else ``""``."""
    for n in range(len(loc), 0, -1):
        if loc[:n] in positions:
            if isinstance(positions[loc[:n]], str):
                return f" (from the flag {positions[loc[:n]]})"
            line, col = positions[loc[:n]]
            return f" ({source} line {line}, column {col})"
    return ""


def _flagged(positions: dict[tuple, Any], loc: tuple, flag: str) -> None:
    """Record that ``flag`` set the key ``loc`` (in place): its file positions, and those of the keys below it, no
    longer say where its value came from."""
    for key in [k for k in positions if k[:len(loc)] == loc]:
        del positions[key]
    positions[loc] = flag


def _error_line(err: dict[str, Any], raw: dict[str, Any], source: str,
                positions: Positions) -> str:
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


def validate(raw: Any, *, source: str = "config", folder: Path | None = None,
             positions: Positions | None = None, plugins: bool = True) -> RunPlan:
    """Validate a raw config (a mapping, or a plan to re-check) into the :class:`RunPlan` (plugin names checked
    against the registry, ``all`` expanded): one validation, the resolved names put in by a copy.

    The first problem raises a UsageError of one line: its key path, what is wrong, the valid keys or
    choices, and the YAML line and column when the key came from a file. With ``plugins`` False, only what needs
    no plugin and no torch (:func:`check_config`): the names stay unresolved and the architecture unchecked.
    """
    raw = raw.dump() if isinstance(raw, RunPlan) else thaw(raw)
    positions = dict(positions or {})
    _check_finite(raw, (), source, positions)
    try:
        plan = RunPlan.model_validate(raw, context={"plugins": plugins})
    except ValidationError as exc:
        # a typo explains the rest; a union member that does not take the value's shape explains nothing
        errors = sorted(exc.errors(), key=lambda e: (e["type"] != "extra_forbidden", _wrong_member(e, raw)))
        raise UsageError(_error_line(errors[0], raw, source, positions)) from None
    if not plugins:
        plan._source, plan._folder, plan._positions = source, folder, positions
        return plan
    resolved: dict[str, Any] = {kind: registry.parse_names(kind, list(getattr(plan, kind)))
                                for kind in ("detectors", "evaluators", "analyses")}
    for section, kind in (("attack_params", "attacks"), ("detector_params", "detectors"),
                          ("evaluator_params", "evaluators"), ("analysis_params", "analyses")):
        resolved[section] = {str(k): v for k, v in getattr(plan, section).items()}
        for name in resolved[section]:
            if not registry.resolves(kind, name):
                where = _where((section, name), source, positions)
                singular = kind[:-1] if kind != "analyses" else "analysis"
                message = choice_message(singular, name, registry.names(kind), f"advopenood list {kind}")
                raise UsageError(f"{section}.{name}{where}: {message}")
    lead = plan.report.lead
    if lead is not None and lead not in resolved["evaluators"]:
        where = _where(("report", "lead"), source, positions)
        raise UsageError(f"report.lead{where}: {lead!r} is not an evaluator of this run; valid choices: "
                         f"{', '.join(resolved['evaluators']) or 'none (the run selects no evaluator)'}")
    # the resolved names and keys are already-validated values: a copy, not a second validation
    plan = plan.model_copy(update={**{kind: tuple(resolved[kind]) for kind in ("detectors", "evaluators", "analyses")},
                                   **{k: v for k, v in resolved.items() if k.endswith("_params")}})
    plan._source, plan._folder, plan._positions = source, folder, positions
    check_noise_draws(plan)
    return plan


def check_noise_draws(plan: RunPlan, built: Mapping[str, Any] | None = None) -> None:
    """Every randomised detector (:class:`~advopenood.capabilities.Randomised`) the plan selects or gives parameters
    takes at most :data:`~advopenood.params.MAX_DRAWS` random draws per confidence (the documented bound), else a
    one-line UsageError naming the parameter that set them: read from the parameter its class names, nothing built
    (:meth:`~advopenood.capabilities.Randomised.declared_draws`); with ``built`` (the detectors
    :func:`advopenood.run.resolved.resolve` builds once), the ``draws`` of those whose class names none."""
    for name in built if built is not None else dict.fromkeys([*plan.detectors, *plan.detector_params]):
        cls, params = registry.get("detectors", name), plan.params("detector_params", name)
        draws = cls.declared_draws(params) if is_randomised(cls) else None
        if built is not None:
            det = built[name]
            draws = det.draws if is_randomised(det) and type(det).declared_draws(params) is None else None
        if draws is not None and draws > MAX_DRAWS:
            loc = ("detector_params", name, *[key for key, value in params.items() if value == draws][:1])
            raise UsageError(f"{_dotted(loc)}{_where(loc, plan.source, plan.positions)}: detector {name!r} would "
                             f"take {draws} noise draws per confidence; valid choices: at most {MAX_DRAWS} (the "
                             "documented bound on draws)")


def apply_overrides(plan: RunPlan | Mapping[str, Any], *, config_dir: Path | None = None, **flags: Any) -> RunPlan:
    """Apply CLI flags (:func:`_overridden`'s keywords) to a plan (or a raw config mapping) and validate the result
    once (a new :class:`RunPlan`; ``plan`` is not changed). A relative ``data.root`` is taken relative to
    ``config_dir`` when given."""
    if isinstance(plan, RunPlan):
        return _overridden(plan.dump(), config_dir, plan.source, plan.positions, plan.folder, **flags)
    return _overridden(thaw(plan), config_dir, **flags)


def _overridden(raw: dict[str, Any], config_dir: Path | None, source: str = "config",
                positions: Positions | None = None, folder: Path | None = None, *,
                data_root: str | None = None, out: str | None = None, protocol: str | None = None,
                attack: str | None = None, eps: str | None = None, detectors: str | None = None,
                detector_backend: str | None = None, evaluator: str | None = None, analysis: str | None = None,
                limit: int | None = None, device: str | None = None, seed: int | None = None,
                cache_dir: str | None = None, shard_size: int | None = None, num_workers: int | None = None,
                amp: bool | None = None, channels_last: bool | None = None, recompute: str | None = None,
                ci: str | None = None, ci_resamples: int | None = None, plugins: bool = True) -> RunPlan:
    """A raw config (changed in place) with the CLI's flags applied, its data root resolved once
    (:func:`resolve_data_root`) and the whole validated once (:func:`validate`, ``source``, ``positions`` and
    ``folder`` for its messages: a bad value a flag set is named by its flag, ``--seed``, not by the file's line of
    the key it replaced); with ``eps``, one threat model per budget (:func:`check_one_threat`). With ``plugins``
    False (:func:`check_config`) ``eps`` is not applied: which attacks take a budget is the plugins' to say."""
    positions = dict(positions or {})
    resolve_data_root(raw, config_dir, data_root)
    if data_root is not None and isinstance(raw.get("data"), dict):
        _flagged(positions, ("data", "root"), "--data-root")
    _override_attacks(raw, attack, eps if plugins else None, positions)
    for key, value, flag in (("protocol", protocol, "--protocol"), ("detectors", detectors, "--detectors"),
                             ("detector_backend", detector_backend, "--detector-backend"), ("limit", limit, "--limit"),
                             ("device", device, "--device"), ("seed", seed, "--seed"),
                             ("cache_dir", cache_dir, "--cache-dir"), ("out", out, "--out"),
                             ("shard_size", shard_size, "--shard-size"), ("num_workers", num_workers, "--num-workers"),
                             ("evaluators", evaluator, "--evaluator"), ("analyses", analysis, "--analysis"),
                             ("amp", amp, "--amp"), ("channels_last", channels_last, "--amp"),
                             ("recompute", recompute, "--recompute")):
        if value is not None:
            raw[key] = value
            _flagged(positions, (key,), flag)
    given = raw.get("ci")
    if (ci is not None or ci_resamples is not None) and (given is None or isinstance(given, Mapping)):
        raw["ci"] = {**(given or {}), **{k: v for k, v in (("method", ci), ("resamples", ci_resamples))
                                         if v is not None}}  # any other ci is the validator's to refuse
        for key, value, flag in (("method", ci, "--ci"), ("resamples", ci_resamples, "--ci-resamples")):
            if value is not None:
                _flagged(positions, ("ci", key), flag)
    result = validate(raw, source=source, folder=folder, positions=positions, plugins=plugins)
    if eps is not None and plugins:
        check_one_threat(list(result.attack_specs), f"--eps {eps}")
    return result


def _override_attacks(raw: dict[str, Any], attack: str | None, eps: str | None,
                      positions: dict[tuple, Any]) -> None:
    """``--attack`` replaces the raw config's ``attacks``; ``--eps`` gives each bounded entry its budget(s) (each
    recorded in ``positions`` as the flag's, :func:`_flagged`). An entry of a shape no attack has is left for the
    validator to refuse."""
    if attack is not None:
        raw["attacks"] = [a.strip() for a in attack.split(",") if a.strip()]
        _flagged(positions, ("attacks",), "--attack")
    if eps is None:
        return
    values = [parse_eps(e) for e in str(eps).split(",") if e.strip()]
    if not values:
        raise UsageError(f"--eps {eps!r} names no budget; valid choices: a float in (0, 1] or a fraction like "
                         "8/255, comma-separated for a sweep")
    if attack is not None:
        _check_eps_applies(raw["attacks"], eps)
    entries = raw.get("attacks", RunConfig.model_fields["attacks"].default)
    if isinstance(entries, (list, tuple)):
        raw["attacks"] = [_with_eps(a, values) if isinstance(a, str) or isinstance(a, dict)
                          and isinstance(a.get("name"), str) else a for a in entries]
        for i, entry in enumerate(raw["attacks"]):
            if isinstance(entry, dict) and "eps" in entry:
                _flagged(positions, ("attacks", i, "eps"), "--eps")


def _check_eps_applies(attacks: list[str], eps: str) -> None:
    """``--eps`` with an ``--attack`` list of minimal-perturbation attacks only (DeepFool, CW: ``bounded = False``,
    no budget) is refused: the flag would apply to nothing. (With a bounded attack beside them the run goes on and
    says which sets it did not apply to.)"""
    free = [n for n in attacks if not getattr(registry.get("attacks", n), "bounded", True)]
    if free and len(free) == len(attacks):
        listed = ", ".join(repr(n) for n in free)
        raise UsageError(f"--eps {eps} does not apply to {listed}: a minimal-perturbation attack has no budget "
                         "(its eps stays none); valid choices: drop --eps, or add a bounded attack (pgd, fgsm, ...)")


def _with_eps(entry: Any, values: list[float]) -> Any:
    """Give a bounded attack entry the CLI's eps (DeepFool and other minimal attacks keep eps=None)."""
    entry = {"name": entry} if isinstance(entry, str) else dict(entry)
    if registry.get("attacks", entry["name"]).bounded:
        entry["eps"] = values if len(values) > 1 else values[0]
    return entry
