"""Memory: peak RSS of the attack stage for 1k vs 10k CIFAR images (FGSM), measured in child processes.

Shards stream to disk and are read back one at a time, so 10x the images must cost far less than 10x the
memory. Run: ``python benchmarks/bench_memory.py``.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile

from _common import DATA, REPO

PROBE = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
         "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")


def peak_rss_mb(limit: int, cache: str) -> float:
    cmd = [sys.executable, "-m", "advopenood.cli.main", "attack", "--config", str(REPO / "configs" / "cifar10_resnet20.yaml"),
           "--data-root", str(DATA), "--attack", "fgsm", "--limit", str(limit), "--cache-dir", cache,
           "--out", f"{cache}/out{limit}", "--quiet"]
    done = subprocess.run([sys.executable, "-c", PROBE, *cmd], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[-1]) / 1024


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        small, large = peak_rss_mb(1000, tmp), peak_rss_mb(10000, tmp)
    print(f"1k images  peak RSS {small:8.1f} MiB")
    print(f"10k images peak RSS {large:8.1f} MiB")
    print(f"SUMMARY memory: 10k / 1k peak RSS = {large / small:.2f}x for 10x the images (target: far below 10x)")


if __name__ == "__main__":
    main()
