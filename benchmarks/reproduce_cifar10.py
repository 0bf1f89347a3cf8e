"""Reproduce the CIFAR-10 column of Lorenz et al. (Tables 3 and 4) under protocol ``lorenz2024``, and compare.

For each model it writes ``OUT/<model>.yaml``, the packaged ``cifar10_<model>`` config with

* ``detectors``: the paper's 16 and ``gram_legacy`` (OpenOOD's GRAM before bdf6a55, the one the paper ran);
* ``attacks``: FGSM, PGD, DeepFool and one masked-PGD set per position seed, ``{name: mpgd, params:
  {position_seed: s}, label: mpgd_p<s>}`` for ``s`` in ``--position-seeds`` (default 0-4): the same images,
  the patches elsewhere,

and runs

    advopenood run --config OUT/<model>.yaml --protocol lorenz2024 --data-root ../shared/data --limit N
        --shard-size 200 --out OUT/<model>

then compares every cell with the paper's values in ``benchmarks/lorenz2024_cifar10.csv`` (extracted from the
paper's text; see benchmarks/README.md). The shard size 200 makes each shard one of the reference code's loader
batches (``--batch-size 200``), so the reference masked PGD draws one patch position per 200 consecutive images
as the paper's code does; with ``--limit 200`` each mPGD set has one position, and the seeds give the spread.

Writes ``OUT/compare.csv`` (one row per model x cell: ``ours``, ``paper``, ``diff`` = ours - paper, for AUROC
``same_side_50``: both >= 50 or both < 50; for mPGD ``ours`` is the mean over the position seeds, ``ours_min`` /
``ours_max`` their range, ``seeds`` their number and ``seeds_paper_side`` how many of them sit on the paper's side
of 50), ``OUT/compare.md``, ``OUT/tables.md`` (the tables of benchmarks/README.md), and ends with a ``SUMMARY`` line. The paper's GRAM cells are compared with
``gram_legacy`` (counted) and with our fixed ``gram`` (listed beside, not counted). ``resnet18`` is the pack's
ResNet-18 (OpenOOD ResNet18_32x32, the paper's CIFAR-10 architecture; 84.4 % clean accuracy on 1,000 JPEG test
images vs the paper's 95.32 %), ``resnet20`` the pack's ResNet-20 (87.2 %).

Run: ``python benchmarks/reproduce_cifar10.py --limit 200 --models resnet20,resnet18``.
"""
from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

import pandas as pd
import yaml

from _common import DATA, REPO
from advopenood import io as aio
from advopenood.io import markdown_table

PAPER = REPO / "benchmarks" / "lorenz2024_cifar10.csv"
MODELS = ("resnet20", "resnet18")
#: the reference code's loader batch (``scripts/attack_ood.py --batch-size``, default 200)
REFERENCE_BATCH = 200
#: the GRAM the paper ran (OpenOOD's before bdf6a55) and ours; the paper's GRAM cells are compared with both
LEGACY, FIXED = "gram_legacy", "gram"
MPGD_SET = re.compile(r"^mpgd_p(\d+)$")


def paper_cells() -> pd.DataFrame:
    """The paper's CIFAR-10 cells: ``table, detector, attack, metric, paper``; its GRAM cells also as
    ``gram_legacy``'s."""
    paper = pd.read_csv(PAPER, keep_default_na=False)
    paper = paper.assign(paper=paper.value.astype(float))[["table", "detector", "attack", "metric", "paper"]]
    legacy = paper[paper.detector == FIXED].assign(detector=LEGACY)
    after = paper.index[paper.detector == FIXED][-1] + 1  # gram_legacy's rows right after gram's
    return pd.concat([paper.loc[:after - 1], legacy, paper.loc[after:]], ignore_index=True)


def run_config(model: str, seeds: list[int]) -> dict:
    """The packaged ``cifar10_<model>`` config with the paper's detectors plus ``gram_legacy`` and one mPGD set
    per position seed."""
    raw = yaml.safe_load((resources.files("advopenood.configs") / f"cifar10_{model}.yaml").read_text())
    detectors = sorted({d for d in paper_cells().detector if d})
    raw["data"]["root"] = str(DATA)
    raw["detectors"] = detectors
    raw["attacks"] = ["fgsm", "pgd", "df"] + [{"name": "mpgd", "params": {"position_seed": s}, "label": f"mpgd_p{s}"}
                                              for s in seeds]
    return raw


def command(config: Path, limit: int, out: Path, device: str) -> list[str]:
    """The ``advopenood run`` command line of one model's config."""
    return ["advopenood", "run", "--config", str(config), "--protocol", "lorenz2024", "--data-root", str(DATA),
            "--limit", str(limit), "--shard-size", str(REFERENCE_BATCH), "--out", str(out), "--device", device,
            "--overwrite"]


def our_cells(out: Path) -> pd.DataFrame:
    """Our cells from a run folder, in the paper's layout (Table 3: clean accuracy and ``asr_all``); an mPGD set
    ``mpgd_p<s>`` is attack ``mpgd`` with ``position_seed`` ``s`` (-1 for every other set)."""
    asr = pd.read_csv(out / "asr.csv")
    rows = [{"table": 3, "detector": "", "attack": "none", "metric": "clean_acc", "ours": asr.clean_acc.iloc[0],
             "n": asr.n.iloc[0]}]
    rows += [{"table": 3, "detector": "", "attack": r.attack, "metric": "asr_all", "ours": r.asr_all, "n": r.n}
             for r in asr.itertuples()]
    ood = pd.read_csv(out / "ood.csv")
    for r in ood[ood.attack != "none"].itertuples():
        rows += [{"table": 4, "detector": r.detector, "attack": r.attack, "metric": m, "ours": getattr(r, m),
                  "n": r.n_ood} for m in ("fpr95", "auroc")]
    df = pd.DataFrame(rows)
    seed = df.attack.str.extract(MPGD_SET, expand=False)
    return df.assign(position_seed=pd.to_numeric(seed).fillna(-1).astype(int), attack=df.attack.where(seed.isna(), "mpgd"))


def spread(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per cell: ``ours`` (mean over position seeds; the value itself for the other attacks),
    ``ours_min``, ``ours_max``, ``seeds`` (how many) and ``n`` (images per set)."""
    keys = ["table", "detector", "attack", "metric"]
    return cells.groupby(keys, as_index=False, sort=False).agg(
        ours=("ours", "mean"), ours_min=("ours", "min"), ours_max=("ours", "max"), seeds=("ours", "size"),
        n=("n", "first"), per_seed=("ours", list))


def compare(model: str, out: Path) -> pd.DataFrame:
    """One row per cell the paper reports: ours (mPGD: mean, min, max over the position seeds), paper,
    difference, and for AUROC whether ours (the mean) sits on the paper's side of 50 and for how many seeds."""
    df = paper_cells().merge(spread(our_cells(out)), on=["table", "detector", "attack", "metric"], how="left")
    df.insert(0, "model", model)
    df["diff"] = df.ours - df.paper
    auroc = df.metric == "auroc"
    side = lambda v, p: (v >= 50) == (p >= 50)
    df["same_side_50"] = pd.Series(pd.NA, index=df.index, dtype="boolean")
    df.loc[auroc, "same_side_50"] = side(df.ours[auroc], df.paper[auroc])
    df["seeds_paper_side"] = pd.Series(pd.NA, index=df.index, dtype="Int64")
    df.loc[auroc, "seeds_paper_side"] = [sum(side(v, r.paper) for v in r.per_seed) if isinstance(r.per_seed, list)
                                         else pd.NA for r in df[auroc].itertuples()]
    return df[["model", "table", "detector", "attack", "metric", "ours", "ours_min", "ours_max", "seeds", "paper",
               "diff", "same_side_50", "seeds_paper_side", "n"]]


def tables(df: pd.DataFrame) -> str:
    """Per model, Table 3 and the AUROC grid as benchmarks/README.md shows them: ``ours / paper`` per cell, mPGD
    as ``mean [min, max] / paper (k/n)`` with ``k`` of the ``n`` position seeds on the paper's side of 50; **x**:
    ours (the mean) on the other side."""
    out = []
    for model, d in df.groupby("model", sort=False):
        t3 = d[d.table == 3]
        rows = [f"| {r.metric if r.attack == 'none' else r.attack + ' ASR'} | "
                + (f"{r.ours:.1f} [{r.ours_min:.1f}, {r.ours_max:.1f}]" if r.seeds > 1 else f"{r.ours:.1f}")
                + f" | {r.paper:g} |" for r in t3.itertuples()]
        out += [f"### {model}", "", "| Table 3 | ours | paper |", "|---|---|---|", *rows, ""]
        au = d[d.metric == "auroc"]
        attacks = list(dict.fromkeys(au.attack))
        out += ["| detector | " + " | ".join(a if a != "mpgd" else "mPGD (seeds on the paper's side)" for a in attacks)
                + " |", "|---" * (len(attacks) + 1) + "|"]
        for det, cells in au.groupby("detector", sort=False):
            cell = cells.set_index("attack")
            text = []
            for a in attacks:
                r = cell.loc[a]
                ours = (f"{r.ours:.1f} [{r.ours_min:.1f}, {r.ours_max:.1f}]" if r.seeds > 1 else f"{r.ours:.1f}")
                seeds = f" ({r.seeds_paper_side}/{r.seeds})" if r.seeds > 1 else ""
                text.append(f"{ours} / {r.paper:.2f}{seeds}" + ("" if r.same_side_50 else " **x**"))
            out.append(f"| {det} | " + " | ".join(text) + " |")
        out.append("")
    return "\n".join(out)


def patch_corners(out: Path) -> dict[int, list[tuple[int, int]]]:
    """Per mPGD position seed, the top-left corner (row, column) of each patch of the run's stored set: where the
    stored images differ from the run's clean test images, per group of ``REFERENCE_BATCH`` rows."""
    import numpy as np
    import torch

    from advopenood.data import build_dataset, limit_dataset, stack

    info = json.loads((out / "run.json").read_text())
    test = limit_dataset(build_dataset({"kind": "npz", "path": "cifar10_test.npz", "name": "cifar10"}, DATA, 3, 32),
                         info["config"]["limit"], int(info["seed"]))  # the run's rows: ``index`` counts them
    corners = {}
    for name, attack in info["attacks"].items():
        match = MPGD_SET.match(name)
        if not match:
            continue
        shards = [np.load(f) for f in sorted(Path(attack["path"]).glob("shard_*.npz"))]
        x_adv = torch.from_numpy(np.concatenate([z["x_adv"] for z in shards]))
        x, _ = stack(test, np.concatenate([z["index"] for z in shards]))
        groups = ((x_adv[g:g + REFERENCE_BATCH] - x[g:g + REFERENCE_BATCH]).abs().amax((0, 1)) > 0
                  for g in range(0, len(x), REFERENCE_BATCH))
        corners[int(match.group(1))] = [tuple(changed.nonzero().min(0).values.tolist()) for changed in groups]
    return corners


def position_table(out: Path, detectors: tuple[str, ...] = ("msp", "mds", LEGACY, FIXED)) -> str:
    """One row per mPGD position seed of a run: the patch corners, ASR (``asr_all``) and a few detectors' AUROC."""
    cells = our_cells(out)
    seeded = cells[cells.position_seed >= 0]
    asr = seeded[seeded.metric == "asr_all"].set_index("position_seed").ours
    au = seeded[seeded.metric == "auroc"].pivot(index="position_seed", columns="detector", values="ours")
    corners = patch_corners(out)
    rows = [f"| {s} | {', '.join(map(str, corners[s]))} | {asr[s]:.1f} | "
            + " | ".join(f"{au.loc[s, d]:.1f}" for d in detectors) + " |" for s in asr.index]
    return "\n".join(["| position seed | patch corner (row, col) | mPGD ASR | "
                      + " | ".join(f"{d} AUROC" for d in detectors) + " |", "|---" * (len(detectors) + 3) + "|",
                      *rows, ""])


def summary(df: pd.DataFrame) -> str:
    """One clause per model: clean accuracy, ASR (mPGD: mean and range over position seeds), AUROC side
    agreement with the paper's GRAM as ``gram_legacy`` (the fixed ``gram`` listed apart) and the cells that
    disagree."""
    parts = []
    for model, d in df.groupby("model", sort=False):
        t3 = d[d.table == 3].set_index("attack")
        asr = ", ".join(f"{a} {t3.ours[a]:.1f} vs {t3.paper[a]:.2f}" for a in ("pgd", "fgsm", "df"))
        m = t3.loc["mpgd"]
        asr += f", mpgd {m.ours:.1f} [{m.ours_min:.1f}, {m.ours_max:.1f}] over {int(m.seeds)} seeds vs {m.paper:.2f}"
        au = d[(d.metric == "auroc") & (d.detector != FIXED)]
        other = au[~au.same_side_50.astype(bool)]
        fixed = d[(d.metric == "auroc") & (d.detector == FIXED)].set_index("attack")
        legacy = d[(d.metric == "auroc") & (d.detector == LEGACY)].set_index("attack")
        gram = ", ".join(f"{a} {legacy.ours[a]:.1f} / {fixed.ours[a]:.1f} vs {legacy.paper[a]:.2f}"
                         for a in ("pgd", "fgsm", "df", "mpgd"))
        parts.append(f"{model} (n={int(t3.n['none'])}, clean {t3.ours['none']:.1f} vs 95.32): ASR {asr}; "
                     f"AUROC same side of 50 in {int(au.same_side_50.sum())}/{len(au)} cells (GRAM = gram_legacy), "
                     f"mean |diff| {au['diff'].abs().mean():.1f}; GRAM legacy / fixed vs paper: {gram}; other side: "
                     + (", ".join(f"{r.detector}/{r.attack}" for r in other.itertuples()) or "none"))
    return "SUMMARY lorenz2024 vs paper: " + " | ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--models", default="resnet20,resnet18", help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--position-seeds", default="0,1,2,3,4",
                        help="mPGD position seeds, comma-separated (at least 5 for a spread)")
    parser.add_argument("--out", default="runs/reproduce_cifar10")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--compare-only", action="store_true", help="compare existing runs under --out")
    args = parser.parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in models if m not in MODELS]
    if bad:
        parser.error(f"unknown model {bad[0]!r}; valid choices: {', '.join(MODELS)}")
    seeds = [int(s) for s in args.position_seeds.split(",") if s.strip()]
    out = Path(args.out)
    per_model = []
    for model in models:
        run_out = out / model
        if not args.compare_only:
            config = out / f"{model}.yaml"
            aio.write_text(config, yaml.safe_dump(run_config(model, seeds), sort_keys=False))
            cmd = command(config, args.limit, run_out, args.device)
            print("$", shlex.join(cmd), flush=True)
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "advopenood.cli", *cmd[1:]], check=True)
            print(f"{model}: {time.perf_counter() - start:.0f} s", flush=True)
        per_model.append(compare(model, run_out))
    df = pd.concat(per_model, ignore_index=True)
    aio.write_csv(out / "compare.csv", df)
    text = markdown_table(df.drop(columns=["table"]))
    aio.write_text(out / "compare.md", text + "\n")
    aio.write_text(out / "tables.md", tables(df) + "\n".join(f"\n### {m}: mPGD per position seed\n\n"
                                                             + position_table(out / m) for m in models))
    print(text)
    print(summary(df))


if __name__ == "__main__":
    main()
