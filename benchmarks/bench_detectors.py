"""All 16 detectors: the shared pass (``score_all``) vs one network pass per detector, side by side.

Same model (CIFAR ResNet-20), same fit rows (the CIFAR-10 train subset, in ``score_all``'s seeded order), same
scored sets (CIFAR-10 test as ID; Tiny-ImageNet, MNIST, Fashion-MNIST, Texture as OOD), same batches.
"Per detector" is OpenOOD's way: each detector's ``setup`` runs its own pass over the fit set and its
``inference`` its own pass over every set. Both include fitting. Reports the speed ratio (all 16, and the
15 besides ODIN, whose input gradient costs one backward and one forward on the perturbed input per batch
either way; GRAM reads the shared pass's tapped maps) and the largest score difference (absolute,
relative to the score scale ``max(1, max |score|)``). A small untimed run of both ways first pays the one-time
process costs (imports, first-call set-up), which would otherwise fall on whichever column runs first. The two
ways then alternate ``--repeat`` times and the medians are compared: a run of the shared pass takes seconds, and
a burst of load on a shared machine moved a single run by up to 50 %.
Target: >= 4x for all 16, differences <= 1e-5. Run: ``python benchmarks/bench_detectors.py [--n 1000 --fit 10000]``.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from _common import DATA
from torch.utils.data import DataLoader

from advopenood import registry
from advopenood.data.datasets import build_dataset, limit_dataset, make_loader
from advopenood.detection.bank import create_detector, fit_subset
from advopenood.detection.openood_backend import resolve_backend
from advopenood.detection.scoring import score_all
from advopenood.models.classifier import build_model

OOD = {"tin": "tin_test.npz", "mnist": "mnist_test.npz", "fashionmnist": "fashionmnist_test.npz",
       "texture": "texture_test.npz"}


def dict_loader(ds, batch_size: int) -> DataLoader:
    """Unshuffled loader yielding OpenOOD's ``{'data', 'label'}`` batches (with ``.dataset`` and ``.batch_size``)."""
    collate = lambda items: {"data": torch.stack([x for x, _ in items]),
                             "label": torch.tensor([y for _, y in items])}
    return DataLoader(ds, batch_size=batch_size, shuffle=False, collate_fn=collate)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1000, help="images per scored set")
    parser.add_argument("--fit", type=int, default=10000, help="fit-set images (CIFAR-10 train subset)")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--backend", default="auto", choices=["auto", "openood", "pytorch-ood"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3, help="alternating runs of each way; medians reported")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cpu = torch.device("cpu")

    def npz(name: str, path: str, n: int):
        return limit_dataset(build_dataset({"kind": "npz", "path": path, "name": name}, DATA, 3, 32), n, 0)

    model = build_model("resnet20", 10, DATA / "resnet20_cifar10.pt")
    fit_set = npz("cifar10_train", "cifar10_train_10k.npz", args.fit)
    data = {"id": npz("cifar10", "cifar10_test.npz", args.n), **{k: npz(k, v, args.n) for k, v in OOD.items()}}
    names = [n for n in registry.names("detectors") if getattr(registry.get("detectors", n), "openood_name", None)]
    n_images = sum(len(ds) for ds in data.values())
    print(f"{len(names)} detectors, fit {len(fit_set)} images, score {n_images} images in {len(data)} sets, "
          f"batch {args.batch}, {args.threads} threads")

    # one-time process costs (imports behind the store keys and pytorch-ood, first-call kernel set-up) are paid
    # by whichever column runs first; a small untimed run of both ways pays them before either is timed
    warm = {"id": lambda: make_loader(limit_dataset(data["id"], 32, 0), args.batch)}
    score_all(names, args.backend, model, limit_dataset(fit_set, 200, 0), warm, batch_size=args.batch, device=cpu,
              seed=0, progress=False)
    for name in ("msp", "odin"):
        det = create_detector(name, resolve_backend(args.backend), seed=0, batch_size=args.batch)
        det.setup(model, {"train": dict_loader(limit_dataset(fit_set, 32, 0), args.batch)}, {})
        det.inference(model, dict_loader(limit_dataset(data["id"], 32, 0), args.batch), progress=False)

    fit_loader = dict_loader(fit_subset(fit_set, seed=0), args.batch)
    t_shared_runs: list[float] = []
    det_shared_runs: list[dict[str, float]] = []
    t_per_runs: list[dict[str, float]] = []
    rel: dict[str, float] = {}
    for _ in range(args.repeat):  # the two ways alternate, so a burst of load on the machine hits both
        t = time.perf_counter()
        shared = score_all(names, args.backend, model, fit_set,
                           {k: (lambda ds=ds: make_loader(ds, args.batch)) for k, ds in data.items()},
                           batch_size=args.batch, device=cpu, seed=0, progress=False)
        t_shared_runs.append(time.perf_counter() - t)
        det_shared_runs.append(dict(shared.seconds))
        if shared.errors:
            print("errors:", shared.errors)
        t_per: dict[str, float] = {}
        for name in shared.scores:
            t = time.perf_counter()
            det = create_detector(name, shared.backend, seed=0, batch_size=args.batch)
            det.setup(model, {"train": fit_loader, "val": fit_loader}, {})
            per = {k: det.inference(model, dict_loader(ds, args.batch), progress=False)[1] for k, ds in data.items()}
            t_per[name] = time.perf_counter() - t
            diff = max(float(np.abs(per[k] - shared.scores[name][k]).max()) for k in data)
            scale = max(1.0, max(float(np.abs(shared.scores[name][k]).max()) for k in data))
            rel[name] = max(rel.get(name, 0.0), diff / scale)
        t_per_runs.append(t_per)

    med = lambda values: float(np.median(values))
    t_shared = med(t_shared_runs)
    t_per = {n: med([run[n] for run in t_per_runs]) for n in shared.scores}
    s_det = {n: med([run.get(n, 0.0) for run in det_shared_runs]) for n in shared.scores}
    print(f"\nbackend {shared.backend}; medians of {args.repeat} alternating runs of each way")
    print(f"{'detector':<9} {'per-detector s':>14} {'shared s':>9} {'rel diff':>9}")
    for name in shared.scores:
        print(f"{name:<9} {t_per[name]:14.2f} {s_det[name]:9.2f} {rel[name]:9.2g}")
    print("shared pass, each run (s): " + ", ".join(f"{t:.1f}" for t in t_shared_runs)
          + "; one pass per detector: " + ", ".join(f"{sum(run.values()):.1f}" for run in t_per_runs))
    own = [n for n in ("odin",) if n in shared.scores]
    t_own_shared = sum(s_det[n] for n in own)
    t_per_total = med([sum(run.values()) for run in t_per_runs])
    t_per_sharing = med([sum(v for n, v in run.items() if n not in own) for run in t_per_runs])
    worst_rel = max(rel.values())
    print(f"\nshared pass, all {len(shared.scores)}: {t_shared:.1f} s; one pass per detector: {t_per_total:.1f} s")
    print(f"the {len(shared.scores) - len(own)} pass-sharing detectors: {t_shared - t_own_shared:.1f} s vs "
          f"{t_per_sharing:.1f} s; ODIN (its backward + extra forward either way): {t_own_shared:.1f} s vs "
          f"{sum(t_per[n] for n in own):.1f} s")
    print(f"SUMMARY detectors: shared pass {t_per_total / t_shared:.2f}x faster for all {len(shared.scores)} "
          f"({t_per_sharing / (t_shared - t_own_shared):.2f}x for the {len(shared.scores) - len(own)} that share it); "
          f"max score difference {worst_rel:.2g} relative to the score scale (target >= 4x, <= 1e-5)")


if __name__ == "__main__":
    main()
