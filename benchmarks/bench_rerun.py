"""A first run and an identical re-run that reads every attack, score and interval back from the store.

Run: ``python benchmarks/bench_rerun.py [--limit 500] [--fit-limit N]`` (the pack's ``configs/cifar10_resnet20.yaml``: ResNet-20,
``--attack pgd,df``, all 16 detectors, the ``ood`` evaluator with its bootstrap of 2,000 resamples per cell, a fresh
temporary cache). Wall times are of the whole ``run``. Target (issue 41): the re-run takes at most 0.05x the first
run's wall time, with no attack, detector or bootstrap work (``run.json``'s ``attack_work``, ``detector_work``,
``interval_work``).
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _common import DATA, pack_config, timed_run
from advopenood.config.loading import apply_overrides


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=500)
    parser.add_argument("--attack", default="pgd,df")
    parser.add_argument("--fit-limit", type=int, default=None, help="fit-set images (default: all 10k)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        raw = pack_config(args.fit_limit)
        cfg = apply_overrides(raw, data_root=str(DATA), attack=args.attack, limit=args.limit, cache_dir=tmp)
        first, info1 = timed_run(cfg, Path(tmp) / "first")
        second, info2 = timed_run(cfg, Path(tmp) / "second")
        same = all((Path(tmp) / "first" / p.name).read_bytes() == p.read_bytes()
                   for p in sorted((Path(tmp) / "second").glob("*.csv")))
    for label, wall, info in (("first run", first, info1), ("re-run", second, info2)):
        t = info["timings_s"]
        print(f"{label:9s} {wall:8.2f} s  evaluator ood {t.get('evaluator:ood', 0):7.2f} s  "
              f"attack_work {info['attack_work']}  detector_work {info['detector_work']}  "
              f"interval_work {info['interval_work']}")
    print(f"SUMMARY re-run / first = {second / first:.3f}x (target <= 0.05; {second:.1f} s vs {first:.1f} s; re-run "
          f"bootstrap requests resampled {info2['interval_work'].get('computed')} of "
          f"{sum(info2['interval_work'].values())}, shards generated {info2['attack_work']['shards_generated']}, "
          f"score sets computed {info2['detector_work'].get('score_sets_computed')}; CSVs identical: {same}); "
          f"--attack {args.attack} --limit {args.limit}, fit {args.fit_limit or 'all 10k'}")


if __name__ == "__main__":
    main()
