"""Run configuration: YAML files (a path, or the name of a config shipped with the package) plus CLI overrides."""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from fractions import Fraction
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from advopenood import protocols, registry
from advopenood.errors import UsageError

DEFAULTS: dict[str, Any] = {
    "name": "run",
    "protocol": "strong",
    "seed": 0,
    "device": "cpu",
    "batch_size": 128,
    "shard_size": 256,
    "limit": None,
    "out": None,
    "cache_dir": None,
    "model": {"num_classes": 10, "in_channels": 3, "input_size": 32, "checkpoint": None},
    "data": {"root": None, "fit_limit": None, "ood": []},
    "attacks": ["fgsm", "pgd", "df", "mpgd"],
    "attack_params": {},
    "detectors": "all",
    "detector_backend": "auto",
    "detector_params": {},
    "evaluators": ["ood"],
    "evaluator_params": {},
    "analyses": [],
    "analysis_params": {},
}
BACKENDS = ("auto", "openood", "pytorch-ood")
DEVICES = ("cpu", "cuda")


def packaged_configs() -> list[str]:
    """Names of the configs shipped inside the package (``advopenood.configs``)."""
    return sorted(p.name[:-5] for p in resources.files("advopenood.configs").iterdir() if p.name.endswith(".yaml"))


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def load_config(spec: str) -> tuple[dict[str, Any], Path | None]:
    """Read a YAML config from a path or a packaged name (``demo``, ``cifar10_resnet20``); returns (config, its folder)."""
    path = Path(spec).expanduser()
    if path.is_file():
        text, folder = path.read_text(), path.parent.resolve()
    else:
        name = Path(spec).name.removesuffix(".yaml")
        packaged = resources.files("advopenood.configs") / f"{name}.yaml"
        if not packaged.is_file():
            raise UsageError(f"config {spec!r} not found; valid choices: a YAML path or one of {', '.join(packaged_configs())}")
        text, folder = packaged.read_text(), Path(str(packaged)).parent
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise UsageError(f"config {spec!r} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise UsageError(f"config {spec!r} must be a YAML mapping, not {type(raw).__name__}")
    return _merge(DEFAULTS, raw), folder


def parse_eps(text: str | float) -> float:
    """``0.03``, ``8/255`` -> float; a UsageError names the bad value."""
    try:
        return float(Fraction(str(text).strip())) if "/" in str(text) else float(text)
    except (ValueError, ZeroDivisionError):
        raise UsageError(f"eps {text!r} is not a number; valid choices: a float in (0, 1] or a fraction like 8/255") from None


@dataclass(frozen=True)
class AttackSpec:
    """One adversarial set to generate: registry name, full parameters and the set's name in outputs."""

    set_name: str
    attack: str
    params: dict[str, Any]


def expand_attacks(cfg: dict[str, Any], input_size: int) -> list[AttackSpec]:
    """Config ``attacks`` (names or ``{name, eps, params, label}``) -> one spec per (attack, eps).

    ``attack_params.<name>`` applies to every entry of that attack; an eps list gives one set per eps,
    named ``<attack>@<eps>``. A registered *family* (a class with ``members(cfg) -> [names]``, e.g. ``adaptive``:
    ``adaptive_<det>`` for each selected detector) stands for its members, each taking the family's
    ``attack_params`` and the entry's eps and params. Parameters are validated by constructing the attack.
    """
    specs: list[AttackSpec] = []
    for entry, family in attack_entries(cfg):
        name = entry["name"]
        cls = registry.get("attacks", name)
        params = {**cls.defaults(input_size), **cls.protocol_defaults(str(cfg["protocol"]), input_size),
                  **(cfg["attack_params"].get(family) or {}),
                  **(cfg["attack_params"].get(name) or {}), **(entry.get("params") or {})}
        eps_list = entry.get("eps", params.get("eps"))
        eps_list = eps_list if isinstance(eps_list, list) else [eps_list]
        for eps in eps_list:
            full = {**params, "eps": None if eps is None else parse_eps(eps)}
            cls(**full)
            label = entry.get("label", name)
            specs.append(AttackSpec(f"{label}@{full['eps']:.4g}" if len(eps_list) > 1 else label, name, full))
    names = [s.set_name for s in specs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UsageError(f"attack set {dup[0]!r} appears twice; give entries distinct eps or a 'label'")
    return specs


def attack_entries(cfg: dict[str, Any]) -> list[tuple[dict[str, Any], str | None]]:
    """Config ``attacks`` as ``(entry, family)`` with lower-case names, families replaced by their members."""
    out: list[tuple[dict[str, Any], str | None]] = []
    for entry in cfg["attacks"] or []:
        entry = {"name": entry} if isinstance(entry, str) else dict(entry)
        entry["name"] = str(entry.get("name", "")).lower()
        cls = registry.get("attacks", entry["name"])
        if not hasattr(cls, "members"):
            out.append((entry, None))
            continue
        members = cls.members(cfg)
        if not members:
            chosen = ", ".join(cfg.get("detectors") or []) or "none"
            raise UsageError(f"attack {entry['name']!r} stands for one attack per selected detector, but no selected "
                             f"detector ({chosen}) has one; valid choices: select built-in detectors (--detectors "
                             "mds,knn) or name the attacks (adaptive_mds)")
        out += [({**entry, "name": m}, entry["name"]) for m in members]
    return out


def apply_overrides(cfg: dict[str, Any], *, data_root: str | None = None, out: str | None = None,
                    protocol: str | None = None, attack: str | None = None, eps: str | None = None, detectors: str | None = None,
                    detector_backend: str | None = None, evaluator: str | None = None, analysis: str | None = None,
                    limit: int | None = None, device: str | None = None, seed: int | None = None,
                    cache_dir: str | None = None, shard_size: int | None = None, config_dir: Path | None = None) -> dict[str, Any]:
    """Apply CLI flags to a loaded config and validate every name and value before any work starts."""
    cfg = copy.deepcopy(cfg)
    if data_root is not None:
        cfg["data"]["root"] = str(Path(data_root).expanduser().resolve())
    elif cfg["data"].get("root") and config_dir is not None and not Path(cfg["data"]["root"]).is_absolute():
        cfg["data"]["root"] = str((config_dir / cfg["data"]["root"]).resolve())
    if attack is not None:
        cfg["attacks"] = [a.strip().lower() for a in attack.split(",") if a.strip()]
    if eps is not None:
        values = [parse_eps(e) for e in str(eps).split(",") if e.strip()]
        cfg["attacks"] = [_with_eps(a, values) for a in cfg["attacks"]]
    for key, value in (("protocol", protocol), ("detectors", detectors), ("detector_backend", detector_backend), ("limit", limit),
                       ("device", device), ("seed", seed), ("cache_dir", cache_dir), ("out", out),
                       ("shard_size", shard_size)):
        if value is not None:
            cfg[key] = value
    if evaluator is not None:
        cfg["evaluators"] = [e.strip() for e in evaluator.split(",") if e.strip()]
    if analysis is not None:
        cfg["analyses"] = [a.strip() for a in analysis.split(",") if a.strip()]
    validate(cfg)
    return cfg


def _with_eps(entry: Any, values: list[float]) -> Any:
    """Give a bounded attack entry the CLI's eps (DeepFool and other minimal attacks keep eps=None)."""
    entry = {"name": entry} if isinstance(entry, str) else dict(entry)
    if getattr(registry.get("attacks", entry["name"]), "bounded", True):
        entry["eps"] = values if len(values) > 1 else values[0]
    return entry


def validate(cfg: dict[str, Any]) -> None:
    """Raise a UsageError for the first bad name or value (attacks are validated by ``expand_attacks``)."""
    protocols.get(str(cfg["protocol"]))
    if cfg["detector_backend"] not in BACKENDS:
        raise UsageError(f"unknown detector backend {cfg['detector_backend']!r}; valid choices: {', '.join(BACKENDS)}")
    device = str(cfg["device"])
    if device.split(":")[0] not in DEVICES:
        raise UsageError(f"unknown device {device!r}; valid choices: {', '.join(DEVICES)}")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"device {device!r} is not available on this machine; valid choices: cpu")
    if cfg["limit"] is not None and int(cfg["limit"]) <= 0:
        raise UsageError(f"limit {cfg['limit']!r} must be a positive number of images")
    cfg["detectors"] = registry.parse_names("detectors", cfg["detectors"]) if cfg["detectors"] else []
    cfg["evaluators"] = registry.parse_names("evaluators", cfg["evaluators"])
    cfg["analyses"] = registry.parse_names("analyses", cfg["analyses"])


def cache_dir(cfg: dict[str, Any]) -> Path:
    """Where adversarial sets and trained demo models live: config, then $ADVOPENOOD_CACHE, then ~/.cache/advopenood."""
    return Path(cfg.get("cache_dir") or os.environ.get("ADVOPENOOD_CACHE") or "~/.cache/advopenood").expanduser()
