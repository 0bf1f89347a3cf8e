"""MEAD Linf group on CIFAR-10: time of the 12 attacks (FGSM, BIM, PGD x CE, KL, Gini, FR at 8/255) on N images,
of scoring (detector fit + clean and adversarial scoring), and of the ``mead`` evaluator; share of each.
The fit and clean-scoring part is timed by a separate ``score_all`` call on the clean set alone (after an untimed
warm-up call on a 512-image fit subset).

Paper defaults: PGD 40 steps of 2.5*eps/40 from a random start, BIM 10 steps of 0.2*eps, FGSM one step (KL and FR
from a random start). Sets are generated into a fresh temporary store (no cache reuse). Scoring uses
:func:`advopenood.detectors.score_all` with the same detectors as a run (one shared network pass per batch).

Run: ``python benchmarks/bench_mead.py [--n 500] [--detectors all] [--threads 2]``.

Measured (2 shared AMD EPYC cores, 500 images, 16 detectors on the pytorch-ood backend, other jobs running, so
wall times vary by up to 3x between identical attacks; mead evaluator 0.4-0.7 s, about 0.1 %, in every run):

=========================  =======  ==============  ==========================================  =====
run                        total    attacks         scoring (fit + clean / 12 adversarial sets)  load
=========================  =======  ==============  ==========================================  =====
1 thread                   541 s    432 s (79.8 %)  109 s (20.1 %: 71 s / 37 s)                  8.8
2 threads                  483 s    450 s (93.1 %)   33 s ( 6.8 %: 16 s / 17 s)                  3.6
2 threads, quietest        361 s    228 s (63.0 %)  133 s (36.9 %: 17 s / 116 s)                 0.4
=========================  =======  ==============  ==========================================  =====

PGD-40 on 500 images took 17-25 s per objective when the machine was quiet (BIM-10 about a quarter of that);
GRAM and ODIN (own network passes) are nearly all of the scoring time. Success rates at 8/255: CE 93/100/100 %
(FGSM/BIM/PGD), KL 53/62/62 %, FR 54/71/73 %, Gini 85/67/71 %; 8.9 successful attacks of 12 per image.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from _common import DATA
from advopenood import registry
from advopenood.config.loading import validate
from advopenood.evaluation.context import CleanRecord, RunContext
from advopenood.data.datasets import build_dataset, limit_dataset, make_loader
from advopenood.detection.scoring import score_all
from advopenood.models.classifier import build_model, weights_hash
from advopenood.attacks.store import AdvStore
from advopenood_plugins.attacks.mead import OBJECTIVES, attack_name


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=500, help="CIFAR-10 test images (seeded subset)")
    parser.add_argument("--detectors", default="all", help="comma-separated detectors, or all")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    model = build_model("resnet20", 10, DATA / "resnet20_cifar10.pt")
    id_set = limit_dataset(build_dataset({"kind": "npz", "path": "cifar10_test.npz", "name": "cifar10"}, DATA, 3, 32),
                           args.n, seed=0)
    fit_set = build_dataset({"kind": "npz", "path": "cifar10_train_10k.npz", "name": "cifar10_train"}, DATA, 3, 32)
    detectors = registry.parse_names("detectors", args.detectors)
    load = os.getloadavg()[0]

    attack_seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        store = AdvStore(Path(tmp) / "adv", shard_size=256)
        model_hash = weights_hash(model)
        adv_sets = {}
        for method in ("fgsm", "bim", "pgd"):
            for objective in OBJECTIVES:
                name = attack_name(method, objective, "linf")
                t = time.perf_counter()
                adv_sets[name] = store.generate(id_set, model, registry.get("attacks", name)(eps=8 / 255),
                                                model_hash=model_hash, seed=0, device=device, progress=False)
                attack_seconds[name] = time.perf_counter() - t
                print(f"attack {name:<22} {attack_seconds[name]:7.1f} s  "
                      f"success {100 * adv_sets[name].records.success.mean():5.1f} %", flush=True)
        t_attacks = sum(attack_seconds.values())

        clean = {"id": lambda: make_loader(id_set, args.batch)}
        score_all(detectors, args.backend, model, limit_dataset(fit_set, 512, seed=0), clean,  # warm-up, untimed
                  batch_size=args.batch, device=device, seed=0, progress=False)
        t = time.perf_counter()
        score_all(detectors, args.backend, model, fit_set, clean, batch_size=args.batch, device=device, seed=0,
                  progress=False)
        t_fit = time.perf_counter() - t
        sets = {**clean, **{name: (lambda adv=adv: adv.iter_batches(args.batch)) for name, adv in adv_sets.items()}}
        t = time.perf_counter()
        result = score_all(detectors, args.backend, model, fit_set, sets, batch_size=args.batch, device=device,
                           seed=0, progress=False)
        t_scoring = time.perf_counter() - t
        for det, reason in result.errors.items():
            print(f"detector {det} skipped: {reason}")

        r = next(iter(adv_sets.values())).records
        plan = validate({"model": {"arch": "resnet20"}, "data": {"dataset": "cifar10", "id": {"kind": "demo"}},
                         "attacks": [], "detectors": "", "evaluators": ["mead"], "device": str(device),
                         "batch_size": args.batch})  # the context's settings (seed, device, ...) are its plan's
        ctx = RunContext(plan=plan, out=Path(tmp) / "out", model=model, id_set=id_set, fit_set=fit_set, ood_sets={},
                         adv_sets=adv_sets, clean=CleanRecord(r.y.to_numpy(), r.clean_pred.to_numpy()),
                         backend=result.backend, scores=result.scores)
        t = time.perf_counter()
        table = registry.get("evaluators", "mead")()(ctx)["mead.csv"]
        t_eval = time.perf_counter() - t

    total = t_attacks + t_scoring + t_eval
    by_method = {m: sum(s for n, s in attack_seconds.items() if n.startswith(f"mead_{m}_"))
                 for m in ("fgsm", "bim", "pgd")}
    print(f"\n{args.n} images, {len(result.scores)} detectors ({result.backend}), {args.threads} torch threads, "
          f"load average {load:.1f} at start")
    print("attacks by method: " + ", ".join(f"{m} {s:.1f} s" for m, s in by_method.items()))
    print("per-detector seconds (fit + score): "
          + ", ".join(f"{k} {v:.1f}" for k, v in sorted(result.seconds.items())))
    mead = table[(table.setting == "mead")].set_index("detector")[["auroc", "fpr95", "n_pos", "mean_successes"]]
    print(mead.round(2).to_string())
    print(f"SUMMARY MEAD Linf group (12 attacks) on {args.n} CIFAR images: total {total:.1f} s = "
          f"attacks {t_attacks:.1f} s ({100 * t_attacks / total:.1f} %) + scoring {t_scoring:.1f} s "
          f"({100 * t_scoring / total:.1f} %: detector fit and clean scoring {t_fit:.1f} s, "
          f"the 12 adversarial sets {t_scoring - t_fit:.1f} s) "
          f"+ mead evaluator {t_eval:.2f} s ({100 * t_eval / total:.1f} %)")


if __name__ == "__main__":
    main()
