"""Attack throughput: advopenood's PGD-10 (foolbox) vs a plain torch PGD loop vs torchattacks, side by side,
and next to them AutoAttack's APGD-CE and the standard AutoAttack ensemble (``pyautoattack``).

Same model (CIFAR ResNet-20), batch, eps 8/255, 10 steps, step 2.5*eps/10, random start, parameters frozen.
APGD-CE and AutoAttack run with ``--aa-iter`` iterations (default 10: the same number of gradients as PGD-10;
100 is the library's standard); AutoAttack's later members only see the images APGD-CE did not fool.
Target: ours >= 0.95x the plain loop. Run: ``python benchmarks/bench_attack_throughput.py [--batch 128]``.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from _common import cifar, median_time
from advopenood import registry
from advopenood.attacks.base import frozen


def plain_pgd(model, x, y, eps: float, steps: int, alpha: float) -> torch.Tensor:
    """Reference PGD-Linf in plain torch (Madry et al. 2018)."""
    x_adv = (x + torch.empty_like(x).uniform_(-eps, eps)).clamp(0, 1)
    for _ in range(steps):
        x_adv.requires_grad_(True)
        loss = F.cross_entropy(model(x_adv), y, reduction="sum")
        (grad,) = torch.autograd.grad(loss, x_adv)
        x_adv = torch.min(torch.max(x_adv.detach() + alpha * grad.sign(), x - eps), x + eps).clamp(0, 1)
    return x_adv


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--aa-iter", type=int, default=10, help="APGD iterations of apgd_ce and autoattack")
    args = parser.parse_args()
    torch.set_num_threads(2)
    model, x, y = cifar(args.batch)
    eps, steps = 8 / 255, 10
    ours = registry.get("attacks", "pgd")(eps=eps, steps=steps)
    candidates = {"advopenood (foolbox)": lambda: ours(model, x, y, seed=0)}
    for name in ("apgd_ce", "autoattack"):
        aa = registry.get("attacks", name)(eps=eps, n_iter=args.aa_iter)
        candidates[f"{name} (pyautoattack)"] = lambda aa=aa: aa(model, x, y, seed=0)
    with frozen(model):
        candidates["plain torch"] = lambda: plain_pgd(model, x, y, eps, steps, 2.5 * eps / steps)
    try:
        import torchattacks

        ta = torchattacks.PGD(model, eps=eps, alpha=2.5 * eps / steps, steps=steps, random_start=True)
        candidates["torchattacks"] = lambda: ta(x, y)
    except ImportError:
        print("torchattacks not installed (pip install -r benchmarks/requirements.txt); skipped")
    times = {}
    for _ in range(args.repeats):
        for name, fn in candidates.items():
            with frozen(model):
                times.setdefault(name, []).append(median_time(fn, 1))
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    for name, t in med.items():
        print(f"{name:<26} {args.batch / t:8.1f} img/s  ({t * 1000:.0f} ms per batch of {args.batch})")
    ratio = med["plain torch"] / med["advopenood (foolbox)"]
    aa = "; ".join(f"{name} / ours PGD = {med['advopenood (foolbox)'] / med[f'{name} (pyautoattack)']:.2f}x"
                   for name in ("apgd_ce", "autoattack"))
    print(f"SUMMARY attack throughput: ours / plain torch = {ratio:.2f}x (target >= 0.95x)"
          + (f"; ours / torchattacks = {med['torchattacks'] / med['advopenood (foolbox)']:.2f}x" if "torchattacks" in med else "")
          + f"; {aa} (APGD {args.aa_iter} iterations)")


if __name__ == "__main__":
    main()
