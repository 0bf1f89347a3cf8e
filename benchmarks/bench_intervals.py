"""Cost of the 95 % intervals: the ``ood`` evaluator's metric work with ``--ci none``, ``delong`` and ``bootstrap``.

16 detectors x 8 OOD sets x 1,000 images per side (ID and OOD), synthetic scores shaped like real ones (ID ~ N(1, 1),
OOD ~ N(d, 1) with d in [-0.5, 0.8] per cell, rounded to 3 decimals so that ties occur as with saturated softmax
scores). Timed: what the evaluator computes per run for its tables (``metric_row`` on every cell, then the
leaderboard with its group means), not the plots, which intervals do not touch. Prints each method's time and its
ratio to ``none`` side by side; ends with one ``SUMMARY`` line (target: bootstrap / none <= 1.10).

    python benchmarks/bench_intervals.py [--images 1000] [--resamples 2000]
"""
from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

import numpy as np
import pandas as pd

from advopenood.evaluation.intervals import cell_key
from advopenood_plugins.evaluators.ood.plugin import leaderboard, metric_row

DETECTORS, SETS = 16, 8


def scores(images: int) -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]:
    """Synthetic (ID, OOD) confidences per (detector, set)."""
    rng = np.random.default_rng(0)
    return {(d, s): (np.round(rng.normal(1.0, 1.0, images), 3), np.round(rng.normal(rng.uniform(-0.5, 0.8), 1.0,
                                                                                    images), 3))
            for d in range(DETECTORS) for s in range(SETS)}


def evaluate(cells: dict, method: str, resamples: int) -> float:
    """Seconds for every cell's row and the leaderboard under ``method``."""
    ctx = SimpleNamespace(plan=SimpleNamespace(ci=SimpleNamespace(method=method, resamples=resamples)), seed=0)
    t = time.perf_counter()
    reps: dict = {}
    rows = []
    for (d, s), (conf_id, conf_ood) in cells.items():
        det, name = f"det{d}", f"set{s}"
        rows.append({"dataset": "synthetic", "arch": "none", "detector": det, "backend": "x", "ood_set": name,
                     "group": "near" if s < 4 else "far",
                     **metric_row(conf_id, conf_ood, ctx, cell_key("ood", det, name), reps)})
    leaderboard(pd.DataFrame(rows), 90.0, replicates=reps)
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--resamples", type=int, default=2000)
    args = parser.parse_args()
    cells = scores(args.images)
    times = {m: evaluate(cells, m, args.resamples) for m in ("none", "delong", "bootstrap")}
    print(f"{DETECTORS} detectors x {SETS} sets x {args.images} images per side, {args.resamples} resamples")
    print(f"{'method':<10} {'seconds':>9} {'/ none':>8}")
    for method, seconds in times.items():
        print(f"{method:<10} {seconds:9.2f} {seconds / times['none']:8.2f}")
    print(f"SUMMARY intervals cost: bootstrap/none = {times['bootstrap'] / times['none']:.2f}x, delong/none = "
          f"{times['delong'] / times['none']:.2f}x (target <= 1.10)")


if __name__ == "__main__":
    main()
