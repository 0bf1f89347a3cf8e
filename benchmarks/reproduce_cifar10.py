"""Reproduce the CIFAR-10 column of Lorenz et al. (Tables 3 and 4) under protocol ``lorenz2024``, and compare.

For each model it runs

    advopenood run --config cifar10_<model> --protocol lorenz2024 --data-root ../shared/data --limit N
        --shard-size 200 --out OUT/<model>

(4 attacks, 16 detectors, natural OOD sets), then compares every cell with the paper's values in
``benchmarks/lorenz2024_cifar10.csv`` (extracted from the paper's text; see benchmarks/README.md). The shard
size 200 makes each shard one of the reference code's loader batches (``--batch-size 200``), so the reference
masked PGD draws one patch position per 200 consecutive images as the paper's code does.

Writes ``OUT/compare.csv`` (one row per model x cell: ``ours``, ``paper``, ``diff`` = ours - paper, and for
AUROC ``same_side_50``: both >= 50 or both < 50) and ``OUT/compare.md``, and ends with a ``SUMMARY`` line.
``resnet18`` is the pack's ResNet-18 (OpenOOD ResNet18_32x32, the paper's CIFAR-10 architecture; 84.4 %
clean accuracy on the reproduction's 1,000 JPEG test images vs the paper's 95.32 %), ``resnet20`` the pack's
ResNet-20 (87.2 %).

Run: ``python benchmarks/reproduce_cifar10.py --limit 1000 --models resnet20,resnet18``.
"""
from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from _common import DATA, REPO
from advopenood import io as aio
from advopenood.io import markdown_table

PAPER = REPO / "benchmarks" / "lorenz2024_cifar10.csv"
MODELS = ("resnet20", "resnet18")
#: the reference code's loader batch (``scripts/attack_ood.py --batch-size``, default 200)
REFERENCE_BATCH = 200


def command(model: str, limit: int, out: Path, device: str) -> list[str]:
    """The ``advopenood run`` command line of one model."""
    return ["advopenood", "run", "--config", f"cifar10_{model}", "--protocol", "lorenz2024", "--data-root", str(DATA),
            "--limit", str(limit), "--shard-size", str(REFERENCE_BATCH), "--out", str(out), "--device", device,
            "--overwrite"]


def paper_cells() -> pd.DataFrame:
    """The paper's CIFAR-10 cells: ``table, detector, attack, metric, paper``."""
    paper = pd.read_csv(PAPER, keep_default_na=False)
    return paper.assign(paper=paper.value.astype(float))[["table", "detector", "attack", "metric", "paper"]]


def our_cells(out: Path) -> pd.DataFrame:
    """Our cells from a run folder, in the paper's layout (Table 3: clean accuracy and ``asr_all``)."""
    asr = pd.read_csv(out / "asr.csv")
    rows = [{"table": 3, "detector": "", "attack": "none", "metric": "clean_acc", "ours": asr.clean_acc.iloc[0],
             "n": asr.n.iloc[0]}]
    rows += [{"table": 3, "detector": "", "attack": r.attack, "metric": "asr_all", "ours": r.asr_all, "n": r.n}
             for r in asr.itertuples()]
    ood = pd.read_csv(out / "ood.csv")
    for r in ood[ood.attack != "none"].itertuples():
        rows += [{"table": 4, "detector": r.detector, "attack": r.attack, "metric": m, "ours": getattr(r, m),
                  "n": r.n_ood} for m in ("fpr95", "auroc")]
    return pd.DataFrame(rows)


def compare(model: str, out: Path) -> pd.DataFrame:
    """One row per cell the paper reports: ours, paper, difference, and for AUROC whether both sit on the
    same side of 50."""
    df = paper_cells().merge(our_cells(out), on=["table", "detector", "attack", "metric"], how="left")
    df.insert(0, "model", model)
    df["diff"] = df.ours - df.paper
    auroc = df.metric == "auroc"
    df["same_side_50"] = pd.Series(pd.NA, index=df.index, dtype="boolean")
    df.loc[auroc, "same_side_50"] = (df.ours[auroc] >= 50) == (df.paper[auroc] >= 50)
    return df[["model", "table", "detector", "attack", "metric", "ours", "paper", "diff", "same_side_50", "n"]]


def summary(df: pd.DataFrame) -> str:
    """One clause per model: clean accuracy, ASR differences, AUROC side agreement and the cells that disagree."""
    parts = []
    for model, d in df.groupby("model", sort=False):
        t3 = d[d.table == 3].set_index("attack")
        asr = ", ".join(f"{a} {t3.ours[a]:.1f} vs {t3.paper[a]:.2f}" for a in ("pgd", "fgsm", "df", "mpgd"))
        au = d[d.metric == "auroc"]
        other = au[~au.same_side_50.astype(bool)]
        parts.append(f"{model} (n={int(t3.n['none'])}, clean {t3.ours['none']:.1f} vs 95.32): ASR {asr}; "
                     f"AUROC same side of 50 in {int(au.same_side_50.sum())}/{len(au)} cells, "
                     f"mean |diff| {au['diff'].abs().mean():.1f}; other side: "
                     + (", ".join(f"{r.detector}/{r.attack}" for r in other.itertuples()) or "none"))
    return "SUMMARY lorenz2024 vs paper: " + " | ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--models", default="resnet20,resnet18", help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--out", default="runs/reproduce_cifar10")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--compare-only", action="store_true", help="compare existing runs under --out")
    args = parser.parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in models if m not in MODELS]
    if bad:
        parser.error(f"unknown model {bad[0]!r}; valid choices: {', '.join(MODELS)}")
    out = Path(args.out)
    tables = []
    for model in models:
        run_out = out / model
        if not args.compare_only:
            cmd = command(model, args.limit, run_out, args.device)
            print("$", shlex.join(cmd), flush=True)
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "advopenood.cli.main", *cmd[1:]], check=True)
            print(f"{model}: {time.perf_counter() - start:.0f} s", flush=True)
        tables.append(compare(model, run_out))
    df = pd.concat(tables, ignore_index=True)
    aio.write_csv(out / "compare.csv", df)
    text = markdown_table(df.drop(columns=["table"]))
    aio.write_text(out / "compare.md", text + "\n")
    print(text)
    print(summary(df))


if __name__ == "__main__":
    main()
