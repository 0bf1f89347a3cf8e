"""Shared helpers for the benchmarks: the benchmark pack and the real CIFAR ResNet-20."""
from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("ADVOPENOOD_TEST_DATA", REPO.parent / "shared" / "data"))


def median_time(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``repeats`` calls (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def cifar(n: int):
    """The pretrained ResNet-20 and ``n`` CIFAR-10 test images with labels."""
    from advopenood.data.datasets import build_dataset, stack
    from advopenood.models.classifier import build_model

    model = build_model("resnet20", 10, DATA / "resnet20_cifar10.pt")
    x, y = stack(build_dataset({"kind": "npz", "path": "cifar10_test.npz", "name": "cifar10"}, DATA, 3, 32), range(n))
    return model, x, y


def pack_config(fit_limit: int | None) -> dict:
    """The pack's ResNet-20 config (``configs/cifar10_resnet20.yaml``) as plain dicts, with ``fit_limit`` fit rows."""
    from advopenood.config.loading import load_config
    from advopenood.config.schema import thaw

    raw = thaw(load_config(str(REPO / "configs" / "cifar10_resnet20.yaml"))[0])
    raw["data"]["fit_limit"] = fit_limit
    return raw


def timed_run(cfg, out: Path) -> tuple[float, dict]:
    """``advopenood.run.pipeline.run`` of ``cfg`` into ``out``: its wall seconds and its ``run.json``."""
    from advopenood.config.loading import apply_overrides
    from advopenood.run.pipeline import run

    t = time.perf_counter()
    run(apply_overrides(cfg, out=str(out)), progress=False)
    wall = time.perf_counter() - t
    return wall, json.loads((out / "run.json").read_text())
