"""Detector work in the store: a first run, an identical re-run, and a re-run with one detector parameter changed.

Run: ``python benchmarks/bench_detector_cache.py [--limit 500] [--fit-limit N]`` (CIFAR pack, ResNet-20, PGD +
DeepFool, all 16 detectors, a fresh temporary cache; ``--fit-limit`` fits on N of the 10k training images).
Wall times are of the whole ``run`` (setup, attacks, detectors, evaluators, report). Targets (issue 17): the identical re-run takes at most 10 % of the first
run's wall time with zero attack and detector work; changing one detector's parameter costs a detector stage of
at most 1/8 of the first run's.
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
    parser.add_argument("--detectors", default="all")
    parser.add_argument("--fit-limit", type=int, default=None, help="fit-set images (default: all 10k)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        raw = pack_config(args.fit_limit)
        cfg = apply_overrides(raw, data_root=str(DATA), attack="pgd,df", limit=args.limit, cache_dir=tmp,
                              detectors=args.detectors, evaluator="ood")
        first, info1 = timed_run(cfg, Path(tmp) / "first")
        second, info2 = timed_run(cfg, Path(tmp) / "second")
        raw["detector_params"] = {"knn": {"K": 10}}
        changed_cfg = apply_overrides(raw, data_root=str(DATA), attack="pgd,df", limit=args.limit, cache_dir=tmp,
                                      detectors=args.detectors, evaluator="ood")
        changed, info3 = timed_run(changed_cfg, Path(tmp) / "changed")
    det1, det3 = info1["timings_s"]["detectors"], info3["timings_s"]["detectors"]
    for label, wall, info in (("first", first, info1), ("identical re-run", second, info2),
                              ("knn K changed", changed, info3)):
        print(f"{label:17s} {wall:8.2f} s  detectors {info['timings_s'].get('detectors', 0):7.2f} s  "
              f"attack_work {info['attack_work']}  detector_work {info['detector_work']}")
    print(f"SUMMARY detector cache: identical re-run / first = {second / first:.3f}x (target <= 0.10; attack shards "
          f"generated {info2['attack_work']['shards_generated']}, detector fits {info2['detector_work']['fitted']}, "
          f"score sets computed {info2['detector_work']['score_sets_computed']}); one parameter changed: detector "
          f"stage {det3 / det1:.3f}x of the first (target <= 0.125; fit pass reused "
          f"{info3['detector_work'].get('fit_pass_reused', 0)}); {args.limit} images, PGD + DeepFool, "
          f"detectors {args.detectors}, fit {args.fit_limit or 'all 10k'}")


if __name__ == "__main__":
    main()
