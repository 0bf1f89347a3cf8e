"""Preflight time: from a fresh interpreter to the end of every check, per pack config (target: under 3 s).

Run: ``python benchmarks/bench_preflight.py``. Each config is checked in a new process (imports included, as a
user's failing command would pay them): load the YAML and validate it with the flags, then resolve the run
(:func:`advopenood.run.resolved.resolve`: :func:`advopenood.run.preflight.preflight` (folders, data headers,
backend), then the checkpoint loaded and every plugin constructed). The median of three runs is reported.
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile

from _common import DATA

CONFIGS = ("cifar10_resnet20", "cifar10_resnet18", "mead_cifar10", "sweep_linf", "adaptive_cifar10", "demo")
CODE = """
import time
t0 = time.perf_counter()
from advopenood.config.loading import load_plan
from advopenood.run.resolved import resolve
resolve(load_plan({name!r}, data_root={root!r}, out={out!r}, cache_dir={cache!r}))
print(time.perf_counter() - t0)
"""


def main() -> None:
    from advopenood.config.loading import packaged_configs

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in [c for c in CONFIGS if c in packaged_configs()]:
            code = CODE.format(name=name, root=str(DATA), out=f"{tmp}/out-{name}", cache=f"{tmp}/cache")
            times = []
            for _ in range(3):
                done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
                times.append(float(done.stdout.strip().splitlines()[-1]))
            results[name] = statistics.median(times)
            print(f"{name:20s} {results[name]:6.2f} s")
    worst = max(results, key=results.get)
    print(f"SUMMARY preflight: slowest {worst} {results[worst]:.2f} s (target < 3 s), "
          f"median over configs {statistics.median(results.values()):.2f} s")


if __name__ == "__main__":
    main()
