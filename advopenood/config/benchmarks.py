"""Standard benchmarks: what makes robust-OOD numbers comparable, named and versioned (data, not code).

A benchmark (``configs/benchmarks/<name>.yaml``, installed as ``advopenood.configs/benchmarks``) fixes the ID test
set and its images (the first ``images`` rows of the seeded permutation :func:`advopenood.data.datasets.
seeded_prefix`, by the SHA-256 of the index list and of the selected pixels), the fit set, the natural OOD sets with
their OpenOOD v1.5 groups (near / far), the threat model (norm, eps, sides attacked), and the evaluation (the
``robust_auroc`` evaluator's ``ensemble: standard`` with fixed iterations, EOT draws and Square queries, the
interval plan, the seed and protocol) under an evaluation version, as AutoAttack's ``standard`` version. Entries of
two benchmarks, or of two versions of one, are never compared (RobustBench, Croce et al. 2021: one table per
threat model). ``advopenood run --benchmark NAME --config MODEL.yaml`` takes the model (and the detectors'
parameters, device, batch size, data root) from the config and everything else from the benchmark
(:func:`apply_benchmark`); a flag that would change what the benchmark fixes is refused (:data:`FIXED_FLAGS`).
"""
from __future__ import annotations

import hashlib
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import Field, ValidationError

from advopenood.errors import UsageError, choice_message
from advopenood.spec import StrictModel

#: the run flags (argparse dest -> flag) a benchmark fixes: given with ``--benchmark``, each is refused by name
FIXED_FLAGS = {"limit": "--limit", "eps": "--eps", "attack": "--attack", "protocol": "--protocol", "seed": "--seed",
               "evaluator": "--evaluator", "analysis": "--analysis", "ci": "--ci", "ci_resamples": "--ci-resamples"}
#: the config keys the benchmark sets (a model config's own values for them are replaced, and the run says so)
FIXED_KEYS = ("seed", "protocol", "limit", "eps", "attacks", "attack_params", "evaluators", "evaluator_params",
              "analyses", "analysis_params", "ci")


class ImageSet(StrictModel):
    """One set of the benchmark: an ``.npz`` of the data pack (relative to the data root), the run's name for it,
    how many of its images (None: all) and their digests."""

    name: str
    path: str
    group: Literal["id", "fit", "near", "far"]
    #: the first ``images`` rows of the seeded permutation of the file's rows (None: every row)
    images: int | None = Field(None, ge=1)
    #: SHA-256 of the sorted row indices (int64, little-endian) and of the selected ``x`` (uint8, C order)
    index_digest: str
    image_digest: str


class Threat(StrictModel):
    """The threat model: norm, budget (a fraction of the pixel range, as written: ``8/255``) and sides attacked."""

    norm: Literal["linf"] = "linf"
    eps: str
    sides: Literal["both"] = "both"

    @property
    def value(self) -> float:
        """The budget as a number."""
        from advopenood.flags import parse_eps

        return float(parse_eps(self.eps))


class Evaluation(StrictModel):
    """The evaluation a benchmark fixes: the standard ensemble's budgets and the interval plan."""

    version: str
    ensemble: Literal["standard"] = "standard"
    pgd_steps: int = Field(ge=1)
    apgd_iterations: int = Field(ge=1)
    eot_draws: int = Field(ge=1)
    square_queries: int = Field(ge=1)
    ci_resamples: int = Field(ge=100)
    protocol: str = "strong"


class Benchmark(StrictModel):
    """A standard benchmark (module docstring)."""

    name: str
    version: str
    size: str
    description: str
    dataset: str
    seed: int = 0
    sets: tuple[ImageSet, ...]
    threat: Threat
    evaluation: Evaluation

    @property
    def key(self) -> str:
        """``name@version``: what an entry and a table are keyed by (``run.json``'s ``config.benchmark``)."""
        return f"{self.name}@{self.version}"

    def of(self, group: str) -> list[ImageSet]:
        """The sets of one group (``id``, ``fit``, ``near``, ``far``)."""
        return [s for s in self.sets if s.group == group]

    @property
    def ood(self) -> list[ImageSet]:
        """The natural OOD sets, near first."""
        return self.of("near") + self.of("far")

    def summary(self) -> str:
        """One line: what it fixes (``advopenood list benchmarks``)."""
        count = lambda s: "all" if s.images is None else str(s.images)  # noqa: E731
        ood = ", ".join(f"{s.name} ({s.group}, {count(s)})" for s in self.ood)
        ev = self.evaluation
        return (f"v{self.version}: {self.description}; ID {self.of('id')[0].name} ({count(self.of('id')[0])}), "
                f"OOD {ood}; {self.threat.norm} {self.threat.eps}, {self.threat.sides} sides; ensemble "
                f"{ev.ensemble} {ev.version} (APGD {ev.apgd_iterations} it., PGD {ev.pgd_steps} steps, EOT "
                f"{ev.eot_draws} draws, Square {ev.square_queries} queries), seed {self.seed}")


def _folder() -> Any:
    return resources.files("advopenood.configs").joinpath("benchmarks")


@lru_cache(maxsize=None)
def benchmarks() -> dict[str, Benchmark]:
    """Every shipped benchmark by name (``configs/benchmarks/*.yaml``)."""
    out = {}
    for path in sorted(_folder().iterdir(), key=lambda p: p.name):
        if path.name.endswith(".yaml"):
            try:
                bench = Benchmark.model_validate(yaml.safe_load(path.read_text()))
            except (ValidationError, yaml.YAMLError) as exc:  # a shipped file: a bug of ours, said in one line
                raise UsageError(f"benchmark file {path.name} is malformed: {str(exc).splitlines()[0]}") from None
            out[bench.name] = bench
    return out


def benchmark(name: str) -> Benchmark:
    """The shipped benchmark ``name``; a UsageError naming the valid ones."""
    known = benchmarks()
    if name not in known:
        raise UsageError(choice_message("benchmark", name, sorted(known), "advopenood list benchmarks"))
    return known[name]


def by_key(key: str) -> Benchmark | None:
    """The shipped benchmark of ``name@version``, None when no shipped benchmark has that name and version."""
    name, _, version = key.partition("@")
    found = benchmarks().get(name)
    return found if found is not None and found.version == version else None


def selection(n: int, images: int | None, seed: int) -> np.ndarray:
    """The row indices a set takes: the seeded prefix every ``--limit`` takes (sorted)."""
    from advopenood.data.datasets import seeded_prefix

    return seeded_prefix(n, images, seed)


def digests(x: np.ndarray, images: int | None, seed: int) -> tuple[str, str]:
    """``(index digest, image digest)`` of the rows a set takes from pixels ``x``."""
    idx = selection(len(x), images, seed).astype("<i8")
    return hashlib.sha256(idx.tobytes()).hexdigest(), hashlib.sha256(np.ascontiguousarray(x[idx]).tobytes()).hexdigest()


def check_images(bench: Benchmark, root: Path) -> None:
    """Every set's file is under ``root`` and holds the benchmark's images (both digests); a UsageError naming the
    first set that does not, before any work."""
    for s in bench.sets:
        path = root / s.path
        if not path.is_file():
            raise UsageError(f"benchmark {bench.key}: set {s.name!r} needs {str(path)!r}, which is not a file; valid "
                             "choices: --data-root (or the config's data.root) at the data pack")
        with np.load(path) as data:
            got = digests(data["x"], s.images, bench.seed)
        if got != (s.index_digest, s.image_digest):
            what = "index list" if got[0] != s.index_digest else "images"
            raise UsageError(f"benchmark {bench.key}: set {s.name!r} ({str(path)!r}) does not hold the benchmark's "
                             f"{what} (SHA-256 {got[0 if what == 'index list' else 1][:12]}..., the benchmark's "
                             f"{(s.index_digest if what == 'index list' else s.image_digest)[:12]}...); valid "
                             "choices: the data pack's file")


def apply_benchmark(raw: dict[str, Any], bench: Benchmark) -> tuple[dict[str, Any], list[str]]:
    """A model config's raw mapping with everything the benchmark fixes set from it, and the config keys whose
    values it replaced (a note). Kept from the config: ``name``, ``model``, ``data.root``, ``detectors``,
    ``detector_params``, ``detector_backend``, ``device``, ``batch_size``, ``num_workers``, ``out``, ``cache_dir``,
    ``amp``."""
    ev, size = bench.evaluation, {s.group: s.images for s in bench.sets}
    data = {"root": (raw.get("data") or {}).get("root"), "dataset": bench.dataset,
            "id": {"kind": "npz", "path": bench.of("id")[0].path, "name": bench.of("id")[0].name},
            "fit": {"kind": "npz", "path": bench.of("fit")[0].path, "name": bench.of("fit")[0].name},
            "fit_limit": size["fit"], "ood_limit": size.get("near") or size.get("far"),
            "ood": [{"kind": "npz", "path": s.path, "name": s.name, "group": s.group} for s in bench.ood]}
    fixed: dict[str, Any] = {
        "seed": bench.seed, "protocol": ev.protocol, "limit": size["id"], "eps": None, "attacks": [],
        "attack_params": {**{f"robust_{side}": {"steps": ev.pgd_steps} for side in ("id", "ood")},
                          **{f"robust_{m}_{side}": {"n_iter": ev.apgd_iterations}
                             for m in ("apgd", "apgd_aux") for side in ("id", "ood")}},
        "evaluators": ["ood", "robust_auroc"],
        "evaluator_params": {"robust_auroc": {"method": "pgd", "ensemble": ev.ensemble, "eps": bench.threat.value,
                                              "randomised_attacks": "eot", "eot": ev.eot_draws,
                                              "square_queries": ev.square_queries}},
        "analyses": [], "analysis_params": {}, "ci": {"method": "bootstrap", "resamples": ev.ci_resamples}}
    replaced = [k for k in FIXED_KEYS if k in raw and raw[k] != fixed[k]]
    replaced += ["data"] if {k: v for k, v in (raw.get("data") or {}).items() if k != "root"} else []
    out = {k: v for k, v in raw.items() if k not in FIXED_KEYS and k != "data"}
    out.update(fixed, data=data, benchmark=bench.key)
    return out, replaced


def check_flags(args: Any) -> None:
    """With ``--benchmark``: a UsageError naming the first flag that would change what the benchmark fixes."""
    for dest, flag in FIXED_FLAGS.items():
        if getattr(args, dest, None) is not None:
            raise UsageError(f"{flag} would change what benchmark {args.benchmark!r} fixes (advopenood list "
                             "benchmarks); valid choices: leave it out, or run without --benchmark")


def benchmarked(raw: dict[str, Any], label: str, bench: Benchmark | None) -> tuple[dict[str, Any], list[str]]:
    """A raw config with what ``bench`` fixes set from it (:func:`apply_benchmark`), and the config keys it
    replaced; a config that names a benchmark itself is refused (``label``: the config's name in the message)."""
    if raw.get("benchmark") is not None and (bench is None or raw["benchmark"] != bench.key):
        raise UsageError(f"{label}: benchmark {raw['benchmark']!r} is set by advopenood run --benchmark NAME, not by a "
                         "config; valid choices: remove the key")
    return (raw, []) if bench is None else apply_benchmark(raw, bench)
