"""Cache: a second identical run vs the first (the attack stage should cost ~0 the second time).

Run: ``python benchmarks/bench_cache.py [--limit 500]`` (CIFAR pack, PGD-10 + FGSM, a fresh temporary cache).
"""
from __future__ import annotations

import argparse
import tempfile
import time

from _common import DATA, REPO
from advopenood.config.loading import apply_overrides, load_config
from advopenood.config.schema import thaw
from advopenood.run.pipeline import run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = thaw(load_config(str(REPO / "configs" / "cifar10_resnet20.yaml"))[0])
        cfg["attack_params"] = {"pgd": {"steps": 10}}
        cfg = apply_overrides(cfg, data_root=str(DATA), attack="pgd,fgsm", limit=args.limit, cache_dir=tmp,
                              out=f"{tmp}/out")
        times, work = [], []
        for _ in range(2):
            t = time.perf_counter()
            ctx = run(cfg, attack_only=True, progress=False)
            times.append(time.perf_counter() - t)
            work.append(sum(a.stats["generated"] for a in ctx.adv_sets.values()))
    print(f"first run  {times[0]:7.2f} s, {work[0]} shards generated")
    print(f"second run {times[1]:7.2f} s, {work[1]} shards generated")
    print(f"SUMMARY cache: second / first = {times[1] / times[0]:.3f}x ({args.limit} images, PGD-10 + FGSM)")


if __name__ == "__main__":
    main()
