"""Mixed precision: throughput of PGD and of the shared detector pass under autocast vs float32, and the AUROC
difference it causes.

The detection numbers come from the pack's trained ResNet-18 (OpenOOD's ResNet18_32x32, CIFAR-10 test vs
Tiny-ImageNet and vs PGD adversarial examples made in each mode); the 224 px throughput from a ResNet-50 or any
``--arch`` at ``--size`` (random weights: speed does not depend on them). On a CUDA device the mode is the
pipeline's (``set_precision``: bfloat16 autocast and channels-last). On the CPU the pipeline's ``amp`` is a no-op,
so this benchmark forces bfloat16 autocast there to show what the no-op avoids; the output names the device.

Run: ``python benchmarks/bench_amp.py [--device cuda] [--n 512] [--arch resnet50 --size 224 --batch 64]``.
Ends with one ``SUMMARY`` line.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from _common import DATA
from advopenood import registry
from advopenood.data.datasets import Subset, build_dataset, stack
from advopenood.detection.scoring import fit_detectors
from advopenood.evaluation.metrics import ood_metrics
from advopenood.models.classifier import build_model, set_precision

DETECTORS = ["msp", "ebo", "mls", "mds", "knn", "react", "gram"]


def set_mode(model, device: torch.device, amp: bool) -> str:
    """The pipeline's precision on a GPU; on the CPU, bfloat16 autocast forced (the pipeline would not use it)."""
    set_precision(model, device, amp, amp)
    if amp and device.type == "cpu":
        model.autocast_dtype = torch.bfloat16
    return str(model.autocast_dtype or "float32")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device, repeats: int = 3) -> float:
    """Median seconds of ``repeats`` calls after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def batches(x: torch.Tensor, bs: int):
    return lambda: ((x[i:i + bs], torch.zeros(len(x[i:i + bs]), dtype=torch.long)) for i in range(0, len(x), bs))


def detection(device: torch.device, amp: bool, n: int, bs: int, n_fit: int) -> tuple[dict[str, dict[str, float]], float, float]:
    """AUROC per detector (ID vs Tiny-ImageNet, ID vs PGD), PGD images/s and shared-pass images/s, in one mode."""
    model = build_model("resnet18_32x32", 10, DATA / "resnet18_32x32_cifar10.pt", mean=(0, 0, 0), std=(1, 1, 1),
                        device=device)
    set_mode(model, device, amp)
    spec = lambda f, name: build_dataset({"kind": "npz", "path": f, "name": name}, DATA, 3, 32)
    x_id, y_id = stack(spec("cifar10_test.npz", "cifar10"), range(n))
    x_ood, _ = stack(spec("tin_test.npz", "tin"), range(n))
    fit = spec("cifar10_train_10k.npz", "train")
    pgd = registry.get("attacks", "pgd")(eps=8 / 255, steps=10)
    x_id, y_id = x_id.to(device), y_id.to(device)
    attack = lambda: torch.cat([pgd(model, x_id[i:i + bs], y_id[i:i + bs], seed=0) for i in range(0, n, bs)])
    t_pgd = timed(attack, device, repeats=1)
    x_adv = attack()
    bank = fit_detectors(DETECTORS, "pytorch-ood", model, Subset(fit, np.arange(n_fit)), batch_size=bs, device=device,
                         seed=0, progress=False)
    sets = {"id": batches(x_id, bs), "tin": batches(x_ood.to(device), bs), "pgd": batches(x_adv, bs)}
    t_pass = timed(lambda: bank.score({"id": sets["id"]}, progress=False), device)
    scores = bank.score(sets, progress=False)
    aurocs = {d: {s: ood_metrics(sc["id"], sc[s])["auroc"] for s in ("tin", "pgd")} for d, sc in scores.items()}
    return aurocs, n / t_pgd, n / t_pass


def throughput_224(device: torch.device, amp: bool, arch: str, size: int, bs: int) -> tuple[float, float]:
    """Forward (shared pass) and PGD-5 images/s of ``arch`` at ``size`` px, random weights."""
    torch.manual_seed(0)
    model = build_model(arch, 1000, input_size=size, device=device)
    set_mode(model, device, amp)
    x = torch.rand(bs, 3, size, size, device=device)
    y = torch.zeros(bs, dtype=torch.long, device=device)
    with torch.no_grad():
        t_fwd = timed(lambda: model.forward_all(x), device)
    pgd = registry.get("attacks", "pgd")(eps=4 / 255, steps=5)
    t_pgd = timed(lambda: pgd(model, x, y, seed=0), device, repeats=1)
    return bs / t_fwd, bs / t_pgd


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--n", type=int, default=256, help="CIFAR-10 test and Tiny-ImageNet images for the AUROCs")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--fit", type=int, default=2000, help="CIFAR-10 train images the detectors fit on")
    parser.add_argument("--arch", default="resnet50")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch224", type=int, default=16)
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(2)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    print(f"device: {device} = {name}; amp mode: "
          f"{'pipeline set_precision (autocast + channels-last)' if device.type == 'cuda' else 'bfloat16 autocast forced (the pipeline keeps float32 on the CPU)'}")
    results = {}
    for amp in (False, True):
        au, pgd_rate, pass_rate = detection(device, amp, args.n, args.batch, args.fit)
        fwd224, pgd224 = throughput_224(device, amp, args.arch, args.size, args.batch224)
        results[amp] = (au, pgd_rate, pass_rate, fwd224, pgd224)
        print(f"{'amp ' if amp else 'fp32'}: 32 px PGD-10 {pgd_rate:8.1f} img/s, shared pass ({len(au)} detectors) "
              f"{pass_rate:8.1f} img/s; {args.arch} {args.size} px forward {fwd224:7.1f} img/s, PGD-5 {pgd224:6.1f} img/s")
    (a0, p0, s0, f0, g0), (a1, p1, s1, f1, g1) = results[False], results[True]
    print(f"{'detector':8s} {'tin fp32':>9s} {'tin amp':>8s} {'pgd fp32':>9s} {'pgd amp':>8s}")
    diffs = []
    for det in a0:
        if det in a1:
            print(f"{det:8s} {a0[det]['tin']:9.2f} {a1[det]['tin']:8.2f} {a0[det]['pgd']:9.2f} {a1[det]['pgd']:8.2f}")
            diffs += [abs(a1[det][s] - a0[det][s]) for s in ("tin", "pgd")]
    print(f"SUMMARY device={device} ({name}) amp/fp32 throughput: 32px PGD {p1 / p0:.2f}x, 32px shared pass "
          f"{s1 / s0:.2f}x, {args.arch}@{args.size} forward {f1 / f0:.2f}x, PGD {g1 / g0:.2f}x; "
          f"max |dAUROC| {max(diffs):.2f} points, mean {np.mean(diffs):.2f} (n={args.n})")


if __name__ == "__main__":
    main()
