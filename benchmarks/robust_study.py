"""Is any detector robust? All 16 detectors (and gram_legacy) on the pack's standard and adversarially trained
ResNet-20: clean, PGD, the detector-adaptive attack, robust AUROC with both sides attacked (PGD and APGD), and
smoothed detectors under the plain and the EOT attack (issue 23, item 6).

    python benchmarks/robust_study.py --limit 16 --out runs/robust_study          # run both models, then the tables
    python benchmarks/robust_study.py --out runs/robust_study --tables-only        # tables of finished runs

Each model runs as one ``advopenood run`` (configs written to ``OUT/study_<model>.yaml``); the tables are read from
the runs' ``ood.csv``, ``robust_auroc.csv``, ``levels.csv`` and ``table_smoothed.csv`` and printed as Markdown,
ending in a ``SUMMARY`` line. Every run is also checked with ``advopenood verify``.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import yaml

from _common import DATA, REPO

from advopenood.io import markdown_table

MODELS = {"standard": "cifar10_resnet20", "adversarially trained": "cifar10_resnet20_at"}
DETECTORS = ["msp", "odin", "mds", "rmds", "gram", "ebo", "klm", "mls", "react", "vim", "knn", "dice", "ash", "gen",
             "nnguide", "scale"]
SMOOTHED = ["smoothed_msp", "smoothed_ebo", "smoothed_mds", "smoothed_knn"]


def config(model: str, out: Path) -> Path:
    """The study's config for one packaged model config: Tiny-ImageNet as the OOD set, every detector plus four
    smoothed ones, PGD, the adaptive and EOT families, and the robust AUROC with PGD and APGD."""
    cfg = yaml.safe_load((REPO / "configs" / f"{model}.yaml").read_text())
    cfg.update(name=f"study_{model}", attacks=["pgd", "adaptive", "adaptive_eot"], detectors=DETECTORS + SMOOTHED,
               evaluators=["ood", "robust_auroc", "levels", "smoothed"], analyses=[],
               evaluator_params={"robust_auroc": {"method": ["pgd", "apgd"], "ood_sets": ["tin"]}})
    cfg["data"].update(root=str(DATA), ood=[{"kind": "npz", "path": "tin_test.npz", "name": "tin"}], fit_limit=2000)
    path = out / f"study_{model}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def run(model: str, out: Path, limit: int) -> float:
    start = time.perf_counter()
    cli = [sys.executable, "-m", "advopenood.cli"]
    subprocess.run([*cli, "run", "--config", str(config(model, out)), "--limit", str(limit), "--out",
                    str(out / model), "--quiet"], check=True)
    subprocess.run([*cli, "verify", str(out / model)], check=True)
    return time.perf_counter() - start


def table(out: Path, model: str) -> pd.DataFrame:
    """One row per detector: AUROC (%) on clean Tiny-ImageNet, under PGD, under its adaptive attack (and, for a
    smoothed detector, its EOT attack), robust (both sides, PGD and APGD), and the level it reaches."""
    folder = out / model
    ood = pd.read_csv(folder / "ood.csv")
    robust = pd.read_csv(folder / "robust_auroc.csv")
    levels = pd.read_csv(folder / "levels.csv").drop_duplicates("detector").set_index("detector")  # a row a criterion
    rows = []
    for det in [*DETECTORS, "gram_legacy", *SMOOTHED]:
        mine = ood[ood.detector == det].set_index("attack")
        if mine.empty:
            continue
        rob = robust[robust.detector == det].set_index("method")
        cell = lambda attack: mine.loc[attack, "auroc"] if attack in mine.index else None  # noqa: E731
        rows.append({"detector": det, "clean": cell("none"), "pgd": cell("pgd"), "adaptive": cell(f"adaptive_{det}"),
                     "adaptive_eot": cell(f"adaptive_eot_{det}"),
                     "robust_pgd": rob.loc["pgd", "robust_auroc"] if "pgd" in rob.index else None,
                     "robust_apgd": rob.loc["apgd", "robust_auroc"] if "apgd" in rob.index else None,
                     "level": levels.loc[det, "reached"] if det in levels.index else None})
    return pd.DataFrame(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--limit", type=int, default=16)
    p.add_argument("--out", type=Path, default=REPO / "runs" / "robust_study")
    p.add_argument("--tables-only", action="store_true")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    seconds = {m: run(m, args.out, args.limit) for m in MODELS.values()} if not args.tables_only else {}
    summary = []
    for label, model in MODELS.items():
        t = table(args.out, model)
        print(f"\n### {label} ({model})\n")
        print(markdown_table(t, "{:.1f}"))
        smoothed = args.out / model / "table_smoothed.csv"
        if smoothed.is_file():
            cols = ["detector", "direction", "auroc_baseline", "auroc_plain", "auroc_eot"]
            print("\n" + markdown_table(pd.read_csv(smoothed)[cols], "{:.1f}"))
        best = t.loc[t["robust_pgd"].idxmax()]
        below = int((t["robust_pgd"] < 50).sum())
        summary.append(f"{model}: robust AUROC (PGD, both sides) below 50 for {below}/{t['robust_pgd'].notna().sum()}"
                       f" detectors, highest {best['robust_pgd']:.1f} ({best['detector']})"
                       + (f", {seconds[model]:.0f} s" if model in seconds else ""))
    print("\nSUMMARY " + "; ".join(summary))


if __name__ == "__main__":
    main()
