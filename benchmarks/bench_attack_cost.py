"""Attack cost per network forward+backward pass: each detector-aware attack family vs foolbox PGD, side by side.

Same model (CIFAR ResNet-20), same CIFAR-10 test images, eps 8/255, ``--steps`` gradient steps, one lambda (1.0):
per detector and family, the classifier-only ``pgd`` (foolbox ``LinfPGD``) and the family's attack, timed back to back
in every repeat (interleaved, so that the load of a shared machine hits both; the median ratio over the repeats):

* ``adaptive``: ``adaptive_<det>`` (foolbox PGD on the joint objective, ``plugins/adaptive.py``);
* ``robust_id`` / ``robust_ood``: ``robust_id_<det>`` / ``robust_ood_<det>`` (``plugins/robust_attacks.py``);
* ``apgd``: ``adaptive_apgd_<det>`` (pyautoattack APGD, ``n_iter = steps``: ``steps + 1`` gradients);
* ``eot``: ``adaptive_eot_smoothed_<det>`` with ``smoothed_<det>``'s ``n = --draws`` (its gradient is the mean over
  ``n`` noisy F+B passes): cost per draw.

The cost of a pass is the attack's wall time divided by the gradients it nominally takes (steps x lambdas, x draws
for EOT); the ratio divides it by PGD's (``steps`` gradients). A forward hook on the network's first layer counts
the forward passes (F) and the backward passes that reach the input (B) per nominal gradient, so an extra pass
shows up beside its cost: a detector whose score needs one forward pass should cost one F and one B per gradient,
GRAM too (its tapped maps are recorded in the shared pass; its cost is in the Gram statistics of every conv/ReLU
map and their backward), ODIN two F and three B (its input preprocessing gradient is a backward through the shared pass, its perturbed input
a forward and a backward of its own), and an EOT draw of a smoothed detector one F+B plus its share of the smoothed
value's ``n`` noisy forwards and of the clean pass the classifier term needs. The ``--threads`` default (1) suits a
shared 2-core machine.
Run: ``python benchmarks/bench_attack_cost.py [--n 16 --steps 10 --repeats 3 --draws 2]`` or ``--quick``.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import torch
from _common import DATA, cifar

from advopenood import registry
from advopenood.attacks.base import build_attack
from advopenood.capabilities import bind_attack
from advopenood.data.datasets import build_dataset, limit_dataset

#: detectors whose score needs one network forward pass (the 1.2x goal applies to them)
ONE_PASS = ("msp", "mls", "ebo", "mds", "knn")
FAMILIES = ("adaptive", "robust_id", "robust_ood", "apgd", "eot")


class PassCounter:
    """Counts forward passes through a module and backward passes that reach it, in images / batch size."""

    def __init__(self, module: torch.nn.Module, batch: int):
        self.batch, self.forward, self.backward = batch, 0.0, 0.0
        module.register_forward_hook(self._hook)

    def _hook(self, module: torch.nn.Module, inputs: Any, output: torch.Tensor) -> None:
        rows = len(output) / self.batch
        self.forward += rows
        if output.requires_grad:
            output.register_hook(lambda grad: self._backward(rows))

    def _backward(self, rows: float) -> None:
        self.backward += rows

    def measure(self, fn: Callable[[], object]) -> tuple[float, float, float]:
        """``(seconds, forward passes, backward passes)`` of one call."""
        self.forward = self.backward = 0.0
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t, self.forward, self.backward


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=16, help="CIFAR-10 test images attacked (one batch)")
    parser.add_argument("--fit", type=int, default=500, help="fit-set images (CIFAR-10 train subset)")
    parser.add_argument("--steps", type=int, default=10, help="gradient steps of every attack")
    parser.add_argument("--draws", type=int, default=2, help="noise draws of smoothed_<det> (the EOT family)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--detectors", default="msp,mls,ebo,mds,knn,odin,gram")
    parser.add_argument("--quick", action="store_true", help="smoke test: 8 images, 2 steps, msp and odin, 1 repeat")
    args = parser.parse_args()
    if args.quick:
        args.n, args.fit, args.steps, args.draws, args.repeats, args.detectors = 8, 256, 2, 2, 1, "msp,odin"
    torch.set_num_threads(args.threads)
    names = registry.parse_names("detectors", args.detectors)
    model, x, y = cifar(args.n)
    fit = limit_dataset(build_dataset({"kind": "npz", "path": "cifar10_train_10k.npz", "name": "cifar10_train"},
                                      DATA, 3, 32), args.fit, 0)
    counter = PassCounter(model.backbone.conv1, args.n)
    steps, lam = args.steps, [1.0]
    pgd = build_attack("pgd", {"steps": steps}, input_size=32, protocol=None)
    plans = {"adaptive": ("adaptive_{}", {"steps": steps, "lam": lam}, steps),
             "robust_id": ("robust_id_{}", {"steps": steps}, steps),
             "robust_ood": ("robust_ood_{}", {"steps": steps}, steps),
             "apgd": ("adaptive_apgd_{}", {"n_iter": steps, "lam": lam}, steps + 1),
             "eot": ("adaptive_eot_smoothed_{}", {"steps": steps, "lam": lam}, steps * args.draws)}
    attacks: dict[tuple[str, str], tuple[Any, int]] = {}
    for name in names:
        for family, (pattern, params, grads) in plans.items():
            attack = build_attack(pattern.format(name), params, input_size=32, protocol=None)
            bind_attack(attack, model, fit, seed=0, batch_size=128, device="cpu",
                        detector_params={f"smoothed_{name}": {"n": args.draws}})
            attack.target  # fit outside the timing, as the PGD model needs no fit
            attacks[name, family] = attack, grads
    pgd(model, x, y, seed=0)  # warm-up
    print(f"{args.n} images, eps 8/255, {steps} steps, lambda 1, smoothed n = EOT draws = {args.draws}, "
          f"{args.threads} thread(s), {args.repeats} repeats interleaved; cost per F+B pass relative to PGD's, and "
          "network passes (F forward, B backward) per gradient")
    ratios: dict[tuple[str, str], list[float]] = {}
    passes: dict[tuple[str, str], tuple[float, float]] = {}
    pgd_pass = []
    for _ in range(args.repeats):
        for name in names:
            for family in FAMILIES:
                t_pgd, f, b = counter.measure(lambda: pgd(model, x, y, seed=0))
                passes[name, "pgd"] = f / steps, b / steps
                pgd_pass.append(t_pgd / steps)
                attack, grads = attacks[name, family]
                t, f, b = counter.measure(lambda: attack(model, x, y, seed=0))
                ratios.setdefault((name, family), []).append((t / grads) / (t_pgd / steps))
                passes[name, family] = f / grads, b / grads
    print(f"PGD: {1000 * statistics.median(pgd_pass):.0f} ms per F+B pass of {args.n} images, "
          f"F {passes[names[0], 'pgd'][0]:.2f} B {passes[names[0], 'pgd'][1]:.2f} per gradient")
    print(f"{'detector':9s}" + "".join(f" {family:>18s}" for family in FAMILIES))
    for name in names:
        cells = [f"{statistics.median(ratios[name, fam]):5.2f}x F{passes[name, fam][0]:4.1f} "
                 f"B{passes[name, fam][1]:4.1f}" for fam in FAMILIES]
        print(f"{name:9s}" + "".join(f" {cell:>18s}" for cell in cells))
    median = {k: statistics.median(v) for k, v in ratios.items()}
    one_pass = {k: v for k, v in median.items() if k[0] in ONE_PASS and k[1] != "eot"}
    summary = "SUMMARY attack cost per F+B pass / PGD's:"
    if one_pass:
        worst = max(one_pass, key=one_pass.get)
        summary += (f" one-pass detectors (adaptive, robust, APGD) max {one_pass[worst]:.2f}x ({worst[1]} {worst[0]}), "
                    f"{sum(v > 1.2 for v in one_pass.values())} of {len(one_pass)} above 1.2x;")
    eot = [v for k, v in median.items() if k[0] in ONE_PASS and k[1] == "eot"]
    if eot:
        summary += f" EOT per draw (smoothed, n = {args.draws}) median {statistics.median(eot):.2f}x;"
    for name in [n for n in names if n not in ONE_PASS]:
        summary += f" {name} {min(v for k, v in median.items() if k[0] == name and k[1] != 'eot'):.2f}-" \
                   f"{max(v for k, v in median.items() if k[0] == name and k[1] != 'eot'):.2f}x, EOT " \
                   f"{median[name, 'eot']:.2f}x;"
    print(summary.rstrip(";"))


if __name__ == "__main__":
    main()
