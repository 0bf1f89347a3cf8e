"""The attack stage's estimate on a fresh store against the time it takes (issue 50, item 8).

A robust run (the pack's ResNet-20, ``--evaluator robust_auroc`` with ``ensemble: standard``, PGD, APGD, APGD on the
second objective and Square on each side of every detector and OOD set) on an empty cache: before any attack the
stage probes each attack family on a batch of 2 and one of 8 images (``advopenood.run.attack.probe_costs``) and
prints, per set, its estimate in seconds per image and per shard (every set here is one shard); the run then
records each set's seconds in ``run.json`` (``attacks.<set>.seconds``).
Per run: the estimate over every set (per-image cost x images), the measured seconds of every set and their ratio;
``--runs`` runs, each on a fresh store. Goal: the estimate within 30 % of the measured time (|ratio - 1| <= 0.3) in
every run.

Run: ``python benchmarks/bench_probe.py [--limit 16 --runs 3 --iters 10 --queries 50 --detectors msp]``.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from _common import DATA, REPO, pack_config

#: a plan line of a set with a probed estimate: its images to generate and the cost per image
PROBED = re.compile(r"plan: attack (\S+) on \d+ images of \S+: (\d+) to generate, about .* \(([0-9.e+-]+) s per "
                    r"image and ([0-9.e+-]+) s per shard, probed on batches")


def one_run(folder: Path, args: argparse.Namespace) -> tuple[float, float]:
    """``(estimate, measured)`` seconds of the attack sets of one robust run on a fresh store under ``folder``."""
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
                           "--ci-resamples", "100"], cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"the run failed ({done.returncode}): {done.stderr[-2000:]}")
    estimate = sum(int(n) * float(cost) + float(shard) for _, n, cost, shard in PROBED.findall(done.stderr))
    attacks = json.loads((out / "run.json").read_text())["attacks"]
    return estimate, sum(float(a["seconds"]) for a in attacks.values())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=16, help="ID images (and images of the OOD set)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10, help="PGD steps and APGD iterations of every attack")
    parser.add_argument("--queries", type=int, default=50, help="Square's queries")
    parser.add_argument("--fit", type=int, default=500, help="fit-set images")
    parser.add_argument("--detectors", default="msp")
    args = parser.parse_args()
    ratios = []
    for k in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            estimate, measured = one_run(Path(tmp), args)
        ratios.append(estimate / measured)
        print(f"run {k + 1}: estimate {estimate:.1f} s, measured {measured:.1f} s, ratio {ratios[-1]:.2f}", flush=True)
    within = sum(abs(r - 1) <= 0.3 for r in ratios)
    print(f"SUMMARY probe estimate / measured attack time, {args.limit} images, detectors {args.detectors}, "
          f"{args.iters} iterations, {args.queries} queries: ratios {', '.join(f'{r:.2f}' for r in ratios)}; "
          f"{within} of {len(ratios)} runs within 30 %")


if __name__ == "__main__":
    main()
