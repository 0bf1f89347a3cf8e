"""Two installs of advopenood side by side: the same runs, the same seeds, the same numbers?

Runs, with each install's ``advopenood`` (``--old`` and ``--new``: the console script of a venv holding one checkout
each), in fresh stores of their own and with one torch thread:

* the embedded demo (``advopenood demo``);
* a ``robust_auroc,levels`` run on the pack's ResNet-20 (``--limit 64 --attack pgd --detectors msp,mds --evaluator
  ood,robust_auroc,levels``, the command of docs/evaluators.md, "Robust AUROC");
* ``ensemble``: the same model and detectors (both deterministic) under ``ensemble: standard`` at a reduced budget
  (32 + 32 images, APGD 10 iterations, Square 20 queries; the config is written to ``OUT/<tag>/ensemble.yaml``): the
  check of issue 48 that choosing a randomised detector's worst set on attack noise left every deterministic cell as
  it was;

then ``advopenood verify`` of each folder by the install that wrote it, and compares every CSV and every score file
(``scores/*.npz``) of the two installs byte for byte. Store keys, versions and timings (``run.json``,
``manifest.json``, the reports' provenance) may differ and are not compared. Prints the wall times of each run and
each verify, and a SUMMARY line.

    python benchmarks/compare_versions.py --old ../before/.venv/bin/advopenood --new .venv/bin/advopenood \\
        --out runs/compare_versions
"""
from __future__ import annotations

import argparse
import filecmp
import os
import subprocess
import time
from pathlib import Path

import yaml

from _common import DATA

RUNS = {
    "demo": ["demo"],
    "robust": ["run", "--config", "cifar10_resnet20", "--data-root", str(DATA), "--limit", "64", "--attack", "pgd",
               "--detectors", "msp,mds", "--evaluator", "ood,robust_auroc,levels"],
    "ensemble": ["run", "--config", "{root}/ensemble.yaml", "--data-root", str(DATA), "--limit", "32"],
}
#: the ``ensemble`` run's config: the pack's ResNet-20 as the packaged ``cifar10_resnet20`` has it, two deterministic
#: detectors, the standard ensemble at a budget a CPU runs in minutes
ENSEMBLE = {
    "name": "compare_ensemble", "seed": 0, "device": "cpu", "batch_size": 32,
    "model": {"arch": "resnet20", "checkpoint": "resnet20_cifar10.pt", "num_classes": 10, "in_channels": 3,
              "input_size": 32, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]},
    "data": {"root": str(DATA), "dataset": "cifar10",
             "id": {"kind": "npz", "path": "cifar10_test.npz", "name": "cifar10"},
             "fit": {"kind": "npz", "path": "cifar10_train_10k.npz", "name": "cifar10_train"},
             "ood": [{"kind": "npz", "path": "tin_test.npz", "name": "tin"}], "fit_limit": 2000},
    "attacks": [], "detectors": ["msp", "mds"], "evaluators": ["ood", "robust_auroc"], "analyses": [],
    "attack_params": {name: {"n_iter": 10} for name in
                      ("robust_apgd_id", "robust_apgd_ood", "robust_apgd_aux_id", "robust_apgd_aux_ood")},
    "evaluator_params": {"robust_auroc": {"ensemble": "standard", "square_queries": 20, "eps": [8 / 255]}},
}


def timed(cmd: list[str], env: dict[str, str], log: Path, check: bool = True) -> float:
    """Wall seconds of ``cmd`` (its output in ``log``); with ``check``, a failure stops the comparison (a run's; a
    verify that finds differences is reported, not fatal)."""
    start = time.perf_counter()
    with log.open("w") as fh:
        subprocess.run(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, check=check)
    return time.perf_counter() - start


def compared(old: Path, new: Path) -> tuple[int, list[str]]:
    """How many CSV and score files the two folders hold, and those that differ or that one of them lacks."""
    files = {p.relative_to(root) for root in (old, new) for p in root.rglob("*")
             if p.suffix == ".csv" or (p.suffix == ".npz" and p.parent.name == "scores")}
    differ = [str(f) for f in sorted(files)
              if not ((old / f).exists() and (new / f).exists() and filecmp.cmp(old / f, new / f, shallow=False))]
    return len(files), differ


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", type=Path, required=True, help="the earlier install's advopenood console script")
    p.add_argument("--new", type=Path, required=True, help="the later install's advopenood console script")
    p.add_argument("--out", type=Path, default=Path("runs") / "compare_versions")
    p.add_argument("--runs", type=lambda v: v.split(","), default=list(RUNS), help=f"of {', '.join(RUNS)}")
    p.add_argument("--keep", action="store_true",
                   help="keep a run folder an earlier invocation finished (its run.json present): not run again")
    args = p.parse_args()
    rows, summary = [], []
    for tag, cli in (("old", args.old), ("new", args.new)):
        root = args.out / tag
        root.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "ADVOPENOOD_CACHE": str(root / "cache"), "OMP_NUM_THREADS": "1"}
        (root / "ensemble.yaml").write_text(yaml.safe_dump(ENSEMBLE, sort_keys=False))
        for name in args.runs:
            cmd = [part.format(root=root) for part in RUNS[name]]
            if args.keep and (root / name / "run.json").is_file():
                run_s = float("nan")  # finished by an earlier invocation
            else:
                run_s = timed([str(cli), *cmd, "--out", str(root / name), "--quiet", "--overwrite"], env,
                              root / f"{name}.log")
            verify_s = timed([str(cli), "verify", str(root / name)], env, root / f"{name}_verify.log", check=False)
            last = (root / f"{name}_verify.log").read_text().strip().splitlines()[-1]
            rows.append((tag, name, run_s, verify_s, last))
    for tag, name, run_s, verify_s, last in rows:
        print(f"{tag:4} {name:7} run {run_s:7.1f} s  verify {verify_s:6.1f} s  {last}")
    for name in args.runs:
        count, differ = compared(args.out / "old" / name, args.out / "new" / name)
        named = f": {', '.join(differ)}" if differ else ""
        print(f"{name}: {count} CSV and score files, {len(differ)} differ{named}")
        summary.append(f"{name} {count - len(differ)}/{count} files identical")
    clean = all(" 0 difference(s), 0 file finding(s)" in r[4] for r in rows)
    print("SUMMARY old vs new, same seeds: " + "; ".join(summary) + f"; verify clean on both: {clean}; verify s "
          + ", ".join(f"{tag} {name} {verify_s:.1f}" for tag, name, _, verify_s, _ in rows))


if __name__ == "__main__":
    main()
