"""Detector-adaptive attacks vs classifier-only PGD, per detector, side by side in one run.

Same model (CIFAR ResNet-20), same ID test images, same eps (8/255), steps and random start; every detector is
fitted once (pytorch-ood backend, the first ``--fit`` rows of the CIFAR-10 train subset in the detectors' seeded
order) and scores the clean images, the PGD examples and its own ``adaptive_<det>`` examples. Prints per
detector the AUROC and FPR95 (%) on the successful examples of each attack, the AUROC drop, and the time ratio
adaptive / PGD, both timed back to back for each detector (the adaptive attack runs once per lambda and
differentiates the detector too).
Run: ``python benchmarks/bench_adaptive.py [--n 64 --steps 20 --lam 0,1,4 --detectors all]``.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from _common import DATA, cifar

from advopenood import registry
from advopenood.attacks.base import build_attack
from advopenood.capabilities import bind_attack
from advopenood.data.datasets import build_dataset, limit_dataset
from advopenood.detection.scoring import fit_detectors
from advopenood.evaluation.metrics import ood_metrics


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=64, help="CIFAR-10 test images attacked")
    parser.add_argument("--fit", type=int, default=2000, help="fit-set images (CIFAR-10 train subset)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lam", default="0,1,4", help="comma-separated lambdas swept per sample")
    parser.add_argument("--detectors", default="all")
    args = parser.parse_args()
    torch.set_num_threads(2)
    names = registry.parse_names("detectors", args.detectors)
    model, x, y = cifar(args.n)
    fit = limit_dataset(build_dataset({"kind": "npz", "path": "cifar10_train_10k.npz", "name": "cifar10_train"},
                                      DATA, 3, 32), args.fit, 0)
    bank = fit_detectors(names, "pytorch-ood", model, fit, batch_size=128, device="cpu", seed=0, progress=False)
    lams = [float(v) for v in args.lam.split(",")]

    pgd = build_attack("pgd", {"steps": args.steps}, input_size=32, protocol=None)
    t = time.perf_counter()
    x_pgd = pgd(model, x, y, seed=0)
    t_pgd = time.perf_counter() - t
    with torch.no_grad():
        hit_pgd = model(x_pgd).argmax(1) != y
    print(f"{args.n} images, eps 8/255, {args.steps} steps, lambdas {lams}; PGD {t_pgd:.1f} s, "
          f"ASR {100 * hit_pgd.float().mean():.1f} %")
    print(f"{'detector':9s} {'AUROC pgd':>9s} {'adaptive':>9s} {'drop':>7s} {'FPR95 pgd':>9s} {'adaptive':>9s} "
          f"{'ASR':>6s} {'time x':>7s}")
    drops, ratios = {}, []
    for name in bank.names:
        attack = build_attack(f"adaptive_{name}", {"steps": args.steps, "lam": lams}, input_size=32, protocol=None)
        bind_attack(attack, model, fit, seed=0, batch_size=128, device="cpu")
        attack.target  # fit outside the timing, as the PGD model needs no fit
        t = time.perf_counter()
        pgd(model, x, y, seed=0)  # timed again right beside the adaptive run: same machine load
        t_pgd = time.perf_counter() - t
        t = time.perf_counter()
        x_ad = attack(model, x, y, seed=0)
        t_ad = time.perf_counter() - t
        with torch.no_grad():
            hit_ad = model(x_ad).argmax(1) != y
        scores = bank.score({"id": lambda: [(x, y)], "pgd": lambda: [(x_pgd, y)], "ad": lambda: [(x_ad, y)]},
                            progress=False)[name]
        base = ood_metrics(scores["id"], scores["pgd"][hit_pgd.numpy()])
        adap = ood_metrics(scores["id"], scores["ad"][hit_ad.numpy()])
        drops[name] = adap["auroc"] - base["auroc"]
        ratios.append(t_ad / t_pgd)
        print(f"{name:9s} {base['auroc']:9.1f} {adap['auroc']:9.1f} {drops[name]:7.1f} "
              f"{base['fpr95']:9.1f} {adap['fpr95']:9.1f} {100 * hit_ad.float().mean():6.1f} {ratios[-1]:7.2f}")
    worst = min(drops, key=drops.get)
    print(f"SUMMARY adaptive AUROC below PGD's for {sum(d < 0 for d in drops.values())} of {len(drops)} detectors; "
          f"largest drop {worst} {drops[worst]:.1f} points; time adaptive/PGD median {np.median(ratios):.2f}x "
          f"(range {min(ratios):.2f}-{max(ratios):.2f}x)")


if __name__ == "__main__":
    main()
