"""Benchmark: binarization test time per sample, CIFAR-10 ResNet-20, N_inner 999, PGD-100 (the paper's setting).

Prints the end-to-end time per tested sample of :func:`run_bintest` and a per-phase breakdown of one sample
(sampling, batched feature extraction of the N_inner + 2 points, readout fit, attack, random baseline)::

    python benchmarks/bench_bintest.py [--data DIR] [--n 16] [--n-inner 999] [--steps 100] [--device cpu]
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import torch

from advopenood.data.datasets import build_dataset, stack
from advopenood.models.classifier import build_model
from advopenood_plugins.analyses.bintest import binarization as bt
from advopenood_plugins.attacks.standard import PGD

DEFAULT_DATA = Path(os.environ.get("ADVOPENOOD_TEST_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def phases(model: torch.nn.Module, x_c: torch.Tensor, attack: PGD, *, n_inner: int, eps: float,
           batch_size: int) -> dict[str, float]:
    """Seconds spent in each step of the test for one sample."""
    rng = np.random.default_rng(0)
    t = {"start": time.perf_counter()}
    pts = torch.cat([x_c[None], bt.sample_inner_points(x_c, n_inner, eps, "linf", 0.05, rng),
                     bt.sample_boundary_points(x_c, 1, eps, "linf", rng)])
    t["sample points"] = time.perf_counter()
    logits, feats = bt.batched_logits_features(model, pts, batch_size)
    t["features (batched)"] = time.perf_counter()
    f = feats.double().cpu().numpy()
    labels = np.r_[np.zeros(len(f) - 1, dtype=np.int64), 1]
    w, b, _ = bt.train_readout(f, labels)
    readout = bt.shift_and_rescale(w, b, f, len(f) - 1, 0.999, float(logits.min()), float(logits.max()))
    binary = bt.BinaryClassifier(model, readout.to(x_c.device))
    t["readout fit"] = time.perf_counter()
    attack(binary, x_c[None], torch.zeros(1, dtype=torch.long, device=x_c.device), seed=0)
    t["attack"] = time.perf_counter()
    bt.random_attack(binary, x_c, eps=eps, norm="linf", n_random=400, rng=rng, batch_size=batch_size)
    t["random baseline"] = time.perf_counter()
    keys = list(t)
    return {k: t[k] - t[prev] for prev, k in zip(keys, keys[1:])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA,
                    help="folder with cifar10_test.npz and resnet20_cifar10.pt")
    ap.add_argument("--n", type=int, default=16, help="test samples (first N of the CIFAR-10 test set)")
    ap.add_argument("--n-inner", type=int, default=999)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch-size", type=int, default=500)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    model = build_model("resnet20", 10, args.data / "resnet20_cifar10.pt", device=device)
    ds = build_dataset({"kind": "npz", "path": "cifar10_test.npz", "name": "cifar10"}, args.data, 3, 32)
    x, y = stack(ds, list(range(args.n)))
    attack = PGD(steps=args.steps)
    eps = float(attack.params["eps"])

    phases(model, x[0].to(device), attack, n_inner=args.n_inner, eps=eps, batch_size=args.batch_size)  # warm-up
    breakdown = phases(model, x[0].to(device), attack, n_inner=args.n_inner, eps=eps, batch_size=args.batch_size)

    start = time.perf_counter()
    summary, _ = bt.run_bintest(model, x, y, attack, n_inner=args.n_inner, seed=0, device=device,
                                batch_size=args.batch_size, progress=True, attack_name=f"pgd-{args.steps}")
    elapsed = time.perf_counter() - start
    tested = summary["n"] + summary["n_skipped"]

    print(f"device {device}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"ResNet-20 / CIFAR-10, N_inner {args.n_inner}, PGD-{args.steps}, eps {eps:.4f}, {tested} samples tested "
          f"({summary['n_misclassified']} misclassified skipped)")
    print(f"time per tested sample: {elapsed / max(1, tested):.2f} s   (ASR {summary['asr']:.2f}, "
          f"R-ASR {summary['random_asr']:.2f}, passed {summary['passed']})")
    print("one sample, by phase:")
    for name, sec in breakdown.items():
        print(f"  {name:<20} {sec:6.2f} s")


if __name__ == "__main__":
    main()
