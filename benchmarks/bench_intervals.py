"""The bootstrap kernel: the four metrics' 2,000 resamples of a 1,000 + 1,000 cell, today's kernel against the one
it replaced, side by side in one run; ``--evaluator`` adds the ``ood`` evaluator's metric work under ``--ci none``,
``delong`` and ``bootstrap``.

Kernel: one cell's whole bootstrap as :func:`advopenood.evaluation.intervals.metric_intervals` computes it (the seeded
draws, the four metrics of every resample, the percentile interval), against the BASELINE below: a verbatim copy of
the kernel of commit fe084c2 (all draws at once, a float grid of the pooled distinct scores, 250 resamples a block),
kept here only to be measured against and by ``tests/test_intervals.py``. The two run alternately ``--repeats`` times
(after one warm-up each); medians of the wall times are compared. The same run checks that both give the same
numbers: AUROC and FPR95 of every resample bit for bit, AUPR (its sums run in another order) and every interval end
as the CSVs write them (``%.6g``). Scores: ``synthetic`` (ID ~ N(1, 1), OOD ~ N(0.3, 1), rounded to 3 decimals so
that ties occur as with saturated softmax scores) or ``msp`` (the pack's ResNet-20 on CIFAR-10 test images vs
Textures).

``--evaluator``: 16 detectors x 8 OOD sets x ``--images`` per side, synthetic scores, what the evaluator computes per
run for its tables (``metric_row`` on every cell, then the leaderboard with its group means), not the plots; each
method's time and its ratio to ``none``.

    python benchmarks/bench_intervals.py [--scores synthetic|msp] [--images 1000] [--resamples 2000] [--repeats 7]
                                         [--evaluator]
"""
from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace
from typing import Callable, Iterable

import numpy as np
import pandas as pd

from advopenood.evaluation import intervals
from advopenood.evaluation.intervals import cell_key
from advopenood.evaluation.metrics import TPR_LEVEL

DETECTORS, SETS = 16, 8
KEY = "ood|msp|texture"


# ------------------------------------------------------------------------------------------------------------------
# BASELINE: the bootstrap kernel of commit fe084c2 (advopenood/evaluation/intervals.py: draw, _finite, _grid,
# _pr_area, _fpr95, replicates), its code copied unchanged apart from the names (baseline_*), docstrings and comments.
# Not used by the package; measured against here and compared with in tests/test_intervals.py.

BASELINE_BLOCK = 250


def baseline_draw(rng: np.random.Generator, n_id: int, n_ood: int, resamples: int) -> tuple[np.ndarray, np.ndarray]:
    return rng.integers(0, n_id, (resamples, n_id)), rng.integers(0, n_ood, (resamples, n_ood))


def _baseline_finite(conf: np.ndarray) -> np.ndarray:
    finite = np.isfinite(conf)
    if finite.all():
        return conf
    lo, hi = (conf[finite].min(), conf[finite].max()) if finite.any() else (0.0, 0.0)
    span = max(hi - lo, 1.0)
    return np.where(conf == np.inf, hi + span, np.where(conf == -np.inf, lo - span, conf))


def _baseline_grid(inv: np.ndarray, idx: np.ndarray, size: int) -> np.ndarray:
    rows = idx.shape[0]
    flat = (inv[idx] + size * np.arange(rows)[:, None]).ravel()
    return np.bincount(flat, minlength=rows * size).reshape(rows, size).astype(np.float64)


def _baseline_pr_area(tp: np.ndarray, fp: np.ndarray) -> np.ndarray:
    total = tp + fp
    precision = np.divide(tp, total, out=np.ones_like(tp), where=total > 0)
    recall = tp / tp[:, -1:]
    first = recall[:, 0] * (precision[:, 0] + 1.0)
    rest = np.einsum("ij,ij->i", np.diff(recall, axis=1), precision[:, 1:] + precision[:, :-1])
    return (first + rest) / 2.0


def _baseline_fpr95(g_id: np.ndarray, g_ood: np.ndarray, fp: np.ndarray, tp: np.ndarray) -> np.ndarray:
    rows, size = g_id.shape
    cols = np.arange(size)
    present = (g_id + g_ood) > 0
    nxt = np.where(present, cols, size)
    nxt = np.minimum.accumulate(nxt[:, ::-1], axis=1)[:, ::-1]
    nxt = np.concatenate([nxt[:, 1:], np.full((rows, 1), size)], axis=1)
    last = nxt == size
    safe = np.minimum(nxt, size - 1)
    same = (np.take_along_axis(g_id, safe, 1) == g_id) & (np.take_along_axis(g_ood, safe, 1) == g_ood)
    first = cols[None, :] == np.argmax(present, axis=1)[:, None]
    kept = present & (first | last | ~same)
    reached = tp / tp[:, -1:] >= TPR_LEVEL
    start = np.argmax(reached, axis=1)
    at = np.argmax(kept & (cols[None, :] >= start[:, None]), axis=1)
    return fp[np.arange(rows), at] / fp[:, -1]


def baseline_replicates(conf_id: np.ndarray, conf_ood: np.ndarray, idx_id: np.ndarray, idx_ood: np.ndarray,
                        metrics: Iterable[str] = intervals.METRICS) -> dict[str, np.ndarray]:
    wanted = tuple(metrics)
    conf_id = np.asarray(conf_id, dtype=np.float64).ravel()
    conf_ood = np.asarray(conf_ood, dtype=np.float64).ravel()
    pooled = _baseline_finite(np.concatenate([conf_id, conf_ood]))
    values, inv = np.unique(pooled, return_inverse=True)
    inv_id, inv_ood = inv[:len(conf_id)], inv[len(conf_id):]
    n_id, n_ood, size = idx_id.shape[1], idx_ood.shape[1], len(values)
    out: dict[str, list[np.ndarray]] = {m: [] for m in wanted}
    for start in range(0, len(idx_id), BASELINE_BLOCK):
        g_id = _baseline_grid(inv_id, idx_id[start:start + BASELINE_BLOCK], size)
        g_ood = _baseline_grid(inv_ood, idx_ood[start:start + BASELINE_BLOCK], size)
        c_id, c_ood = np.cumsum(g_id, axis=1), np.cumsum(g_ood, axis=1)
        if "auroc" in wanted:
            below = np.einsum("ij,ij->i", g_ood, c_id) - 0.5 * np.einsum("ij,ij->i", g_ood, g_id)
            out["auroc"].append(100.0 * (n_id * n_ood - below) / (n_id * n_ood))
        if "fpr95" in wanted:
            out["fpr95"].append(100.0 * _baseline_fpr95(g_id, g_ood, c_id, c_ood))
        if "aupr_out" in wanted:
            out["aupr_out"].append(100.0 * _baseline_pr_area(c_ood, c_id))
        if "aupr_in" in wanted:
            out["aupr_in"].append(100.0 * _baseline_pr_area((n_id - c_id + g_id)[:, ::-1],
                                                            (n_ood - c_ood + g_ood)[:, ::-1]))
    return {m: np.concatenate(v) if v else np.empty(0) for m, v in out.items()}


def baseline_bootstrap(conf_id: np.ndarray, conf_ood: np.ndarray, seed: int, key: str, resamples: int
                       ) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """The baseline's ``metric_intervals`` for ``bootstrap``: draw, replicates, percentiles."""
    idx_id, idx_ood = baseline_draw(intervals.generator(seed, key), len(conf_id), len(conf_ood), resamples)
    reps = baseline_replicates(conf_id, conf_ood, idx_id, idx_ood)
    bounds = {}
    for m, values in reps.items():
        bounds[f"{m}_lo"], bounds[f"{m}_hi"] = intervals.percentile(values)
    return bounds, reps

# END OF BASELINE
# ------------------------------------------------------------------------------------------------------------------


def cell(kind: str, images: int) -> tuple[np.ndarray, np.ndarray]:
    """One cell's (ID, OOD) confidences (module docstring)."""
    if kind == "synthetic":
        rng = np.random.default_rng(0)
        return np.round(rng.normal(1.0, 1.0, images), 3), np.round(rng.normal(0.3, 1.0, images), 3)
    import torch

    from advopenood.data.datasets import build_dataset, stack
    from advopenood.models.classifier import build_model

    from _common import DATA

    model = build_model("resnet20", 10, DATA / "resnet20_cifar10.pt").eval()

    def msp(path: str, name: str) -> np.ndarray:
        x, _ = stack(build_dataset({"kind": "npz", "path": path, "name": name}, DATA, 3, 32), range(images))
        with torch.no_grad():
            return torch.softmax(model(x), 1).max(1).values.numpy().astype(np.float64)

    return msp("cifar10_test.npz", "cifar10"), msp("texture_test.npz", "texture")


def alternate(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, tuple[list[float], list[float]]]:
    """``(wall times, CPU times)`` of each function, run in turn ``repeats`` times after one warm-up each (the CPU
    time of this process is the steadier figure on a shared machine)."""
    for fn in fns.values():
        fn()
    times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            wall, cpu = time.perf_counter(), time.process_time()
            fn()
            times[name][0].append(time.perf_counter() - wall)
            times[name][1].append(time.process_time() - cpu)
    return times


def same_numbers(conf_id: np.ndarray, conf_ood: np.ndarray, resamples: int) -> tuple[list[str], float, bool]:
    """``(metrics equal bit for bit, max |AUPR difference|, every replicate and bound equal at %.6g)``."""
    old_bounds, old = baseline_bootstrap(conf_id, conf_ood, 0, KEY, resamples)
    new_bounds, new, _ = intervals.metric_intervals(conf_id, conf_ood, "bootstrap", 0, KEY, resamples)
    exact = [m for m in intervals.METRICS if np.array_equal(old[m], new[m])]
    worst = max(float(np.max(np.abs(old[m] - new[m]))) for m in ("aupr_in", "aupr_out"))
    csv = all(f"{a:.6g}" == f"{b:.6g}" for m in intervals.METRICS for a, b in zip(old[m], new[m]))
    csv = csv and all(f"{old_bounds[c]:.6g}" == f"{new_bounds[c]:.6g}" for c in old_bounds)
    return exact, worst, csv


def kernel(args: argparse.Namespace) -> str:
    """Time and compare the two kernels on one cell; the SUMMARY line."""
    conf_id, conf_ood = cell(args.scores, args.images)
    times = alternate({
        "baseline (fe084c2)": lambda: baseline_bootstrap(conf_id, conf_ood, 0, KEY, args.resamples),
        "today": lambda: intervals.metric_intervals(conf_id, conf_ood, "bootstrap", 0, KEY, args.resamples)},
        args.repeats)
    print(f"bootstrap of one cell: {args.images} + {args.images} {args.scores} scores, {args.resamples} resamples, "
          f"four metrics; {args.repeats} alternating runs")
    print(f"{'kernel':<20} {'median wall ms':>15} {'min':>7} {'max':>7} {'median CPU ms':>14} {'min':>7}")
    for name, (wall, cpu) in times.items():
        print(f"{name:<20} {1e3 * statistics.median(wall):15.1f} {1e3 * min(wall):7.1f} {1e3 * max(wall):7.1f} "
              f"{1e3 * statistics.median(cpu):14.1f} {1e3 * min(cpu):7.1f}")
    (old, old_cpu), (new, new_cpu) = ((statistics.median(w), statistics.median(c)) for w, c in times.values())
    exact, worst, csv = same_numbers(conf_id, conf_ood, args.resamples)
    print(f"bit for bit: {', '.join(exact) or 'none'}; max |AUPR difference| {worst:.2g} points; "
          f"every replicate and interval end equal at %.6g: {csv}")
    return (f"SUMMARY bootstrap kernel ({args.resamples} resamples, {args.images} + {args.images}, four metrics): "
            f"today {1e3 * new:.1f} ms vs baseline {1e3 * old:.1f} ms median wall ({old / new:.1f}x faster; CPU "
            f"{1e3 * new_cpu:.1f} vs {1e3 * old_cpu:.1f} ms; target <= 50 ms: {'met' if new <= 0.05 else 'not met'}); "
            f"same numbers: {'/'.join(exact)} bit for bit, the rest at %.6g: {csv}")


def scores(images: int) -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]:
    """Synthetic (ID, OOD) confidences per (detector, set)."""
    rng = np.random.default_rng(0)
    return {(d, s): (np.round(rng.normal(1.0, 1.0, images), 3), np.round(rng.normal(rng.uniform(-0.5, 0.8), 1.0,
                                                                                    images), 3))
            for d in range(DETECTORS) for s in range(SETS)}


def evaluate(cells: dict, method: str, resamples: int) -> float:
    """Seconds for every cell's row and the leaderboard under ``method``."""
    from advopenood_plugins.evaluators.ood.plugin import leaderboard, metric_row

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


def evaluator(args: argparse.Namespace) -> None:
    """The ood evaluator's metric work under each ``ci`` method."""
    cells = scores(args.images)
    times = {m: evaluate(cells, m, args.resamples) for m in ("none", "delong", "bootstrap")}
    print(f"ood evaluator: {DETECTORS} detectors x {SETS} sets x {args.images} images per side, {args.resamples} "
          "resamples")
    print(f"{'method':<10} {'seconds':>9} {'/ none':>8}")
    for method, seconds in times.items():
        print(f"{method:<10} {seconds:9.2f} {seconds / times['none']:8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scores", choices=("synthetic", "msp"), default="synthetic")
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--evaluator", action="store_true", help="also time the ood evaluator under each method")
    args = parser.parse_args()
    summary = kernel(args)
    if args.evaluator:
        evaluator(args)
    print(summary)


if __name__ == "__main__":
    main()
