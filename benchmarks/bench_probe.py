"""The attack stage's estimate on a fresh store against the time it takes (issue 50, item 8).

A robust run (the pack's ResNet-20, ``--evaluator robust_auroc`` with ``ensemble: standard``, PGD, APGD, APGD on the
second objective and Square on each side of every detector and OOD set) on an empty cache: before any attack the
stage probes each attack family on one batch of 8 images (``advopenood.run.attack.probe_costs``) and prints, per
set, its estimate in seconds per image; the run then records each set's seconds in ``run.json``
(``attacks.<set>.seconds``).
Per set and per run: the estimate (per-image cost x images), the measured seconds and their ratio;
``--runs`` runs, each on a fresh store. Goal: the estimate within 30 % of the measured time (|ratio - 1| <= 0.3) in
every run.

Each run is a fresh process with ``--threads`` torch threads (``OMP_NUM_THREADS``, default 1: the probe and the
attacks then see the same one core); the SUMMARY states it and the load average before the first and after the last
run, since on shared cores the probe's seconds and the attacks' minutes may see different loads.

Run: ``python benchmarks/bench_probe.py [--limit 16 --runs 3 --iters 10 --queries 50 --detectors msp --threads 1]``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from _common import DATA, REPO, pack_config

#: a plan line of a set with a probed estimate: its images to generate and the cost per image
PROBED = re.compile(r"plan: attack (\S+) on \d+ images of \S+: (\d+) to generate, about .* \(([0-9.e+-]+) s per "
                    r"image, probed on a batch")


def one_run(folder: Path, args: argparse.Namespace) -> dict[str, tuple[float, float]]:
    """Per attack set of one robust run on a fresh store under ``folder``, ``(estimate, measured)`` seconds."""
    cfg = pack_config(args.fit)
    cfg["data"]["ood"] = cfg["data"]["ood"][:1]
    cfg["attack_params"] = {f"robust_{m}_{s}": {"n_iter": args.iters} for m in ("apgd", "apgd_aux")
                            for s in ("id", "ood")}
    cfg["attack_params"].update({f"robust_{s}": {"steps": args.iters} for s in ("id", "ood")})
    cfg["evaluator_params"] = {"robust_auroc": {"ensemble": "standard", "method": ["pgd"],
                                                "square_queries": args.queries}}
    config = folder / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    out = folder / "out"
    code = "import sys; from advopenood.cli.main import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-c", code, "run", "--config", str(config), "--out", str(out),
                           "--cache-dir", str(folder / "cache"), "--data-root", str(DATA), "--limit", str(args.limit),
                           "--attack", "", "--detectors", args.detectors, "--evaluator", "robust_auroc",
                           "--ci-resamples", "100"], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": str(args.threads),
                               "MKL_NUM_THREADS": str(args.threads)})
    if done.returncode:
        sys.exit(f"the run failed ({done.returncode}): {done.stderr[-2000:]}")
    attacks = json.loads((out / "run.json").read_text())["attacks"]
    return {name: (int(n) * float(cost), float(attacks[name]["seconds"]))
            for name, n, cost in PROBED.findall(done.stderr)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=16, help="ID images (and images of the OOD set)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10, help="PGD steps and APGD iterations of every attack")
    parser.add_argument("--queries", type=int, default=50, help="Square's queries")
    parser.add_argument("--fit", type=int, default=500, help="fit-set images")
    parser.add_argument("--detectors", default="msp")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each run (OMP_NUM_THREADS)")
    args = parser.parse_args()
    ratios, load = [], [os.getloadavg()[0]]
    for k in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            sets = one_run(Path(tmp), args)
        for name, (estimate, measured) in sets.items():
            print(f"  run {k + 1} {name:34} estimate {estimate:7.1f} s, measured {measured:7.1f} s, "
                  f"ratio {estimate / measured:.2f}", flush=True)
        estimate, measured = (sum(v[i] for v in sets.values()) for i in (0, 1))
        ratios.append(estimate / measured)
        print(f"run {k + 1}: estimate {estimate:.1f} s, measured {measured:.1f} s, ratio {ratios[-1]:.2f} "
              f"({len(sets)} sets)", flush=True)
    within = sum(abs(r - 1) <= 0.3 for r in ratios)
    load.append(os.getloadavg()[0])
    print(f"SUMMARY probe estimate / measured attack time, {args.limit} images, detectors {args.detectors}, "
          f"{args.iters} iterations, {args.queries} queries: ratios {', '.join(f'{r:.2f}' for r in ratios)}; "
          f"{within} of {len(ratios)} runs within 30 %; {args.threads} torch thread(s); load average "
          f"{load[0]:.2f} before, {load[1]:.2f} after, on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
