"""Is any detector robust? Every detector on the pack's standard and adversarially trained ResNet-20, with 95 %
intervals: clean, PGD, each detector's adaptive attack, robust AUROC with both sides attacked (PGD and APGD, EOT
attacks for the randomised detectors), smoothed detectors under the plain and the EOT attack (issues 23 and 31).

    python benchmarks/robust_study.py --limit 200 --out runs/robust_study                 # both models, then tables
    OMP_NUM_THREADS=1 python benchmarks/robust_study.py --limit 200 --out runs/robust_study --top 5 \
        --detectors msp,odin,mds,rmds,gram,ebo,klm,mls,react,vim,knn,dice,ash,gen,nnguide,scale,smoothed_msp,\
smoothed_knn --eot 4 --steps 25 --methods pgd --jobs 2                                 # what a 2-core CPU ran
    python benchmarks/robust_study.py --limit 500 --device cuda --batch-size 500 --shard-size 500 --eot 4 \
        --groups 6 --jobs 12                                                              # a GPU with 16 cores
    python benchmarks/robust_study.py --out runs/robust_study --tables-only               # tables of finished runs
    python benchmarks/robust_study.py --curve --limit 64 --out runs/strength_curve        # strength vs cost

Each model runs as one ``advopenood run`` (config written to ``OUT/study_<model>.yaml``); the tables are read from the
runs' ``ood.csv``, ``robust_auroc.csv``, ``robust_paired.csv``, ``levels.csv``, ``table_smoothed.csv`` and
``run.json`` and printed as Markdown, every AUROC as ``value [lo, hi]`` (its 95 % interval), with the wall time of
each stage and of each attack family; every run is checked with ``advopenood verify``. The last line is ``SUMMARY``:
per model, how many detectors' robust AUROC interval lies below 50, contains 50 or lies above it, and the highest
robust AUROC with its interval and the number of detectors its paired interval separates it from.

``--detectors`` chooses the detectors (default: all 16 and four smoothed ones); ``--top K`` keeps, per model, the K
non-randomised ones with the highest clean AUROC on the study's images (a clean run first) and every randomised
one; ``--steps`` sets the robust PGD attacks' steps and ``--methods`` the robust AUROC's methods. ``--data-root``
points at a copy of the pack, or at subsets made by ``--make-subsets`` (the rows ``--limit`` would draw from the full files, with their
``source_index``, so that a machine without the pack evaluates the same images).

``--curve`` measures the attack strength against its cost instead: the robust AUROC (both sides, PGD) of
``msp`` and ``smoothed_msp`` on the adversarially trained ResNet-20 for each number of steps in ``--curve-steps`` and, for the
smoothed one, each number of EOT draws in ``--curve-eot``, with the attack stage's wall time; the study's steps and
draws are read off that curve (benchmarks/README.md).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from _common import DATA, REPO

#: PyTorch's CPU allocator backs large tensors with transparent huge pages (``madvise``): ROSS's batches of 25 noise
#: copies otherwise spend about half their CPU time in page faults (217,000 minor faults a second, 70x fewer with it)
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

MODELS = {"standard": "cifar10_resnet20", "adversarially trained": "cifar10_resnet20_at"}
DETECTORS = ["msp", "odin", "mds", "rmds", "gram", "ebo", "klm", "mls", "react", "vim", "knn", "dice", "ash", "gen",
             "nnguide", "scale"]
SMOOTHED = ["smoothed_msp", "smoothed_ebo", "smoothed_mds", "smoothed_knn"]
#: the pack's files a study run reads, and the rows of each it draws (``limit`` for the test sets, the fit limit)
FILES = {"cifar10_test.npz": "limit", "tin_test.npz": "limit", "cifar10_train_10k.npz": "fit"}
FIT_LIMIT = 2000
#: attack families whose sets' generation time is summed per row of the timing table (name prefix -> family)
FAMILIES = [("robust_apgd_", "robust APGD"), ("robust_", "robust PGD"), ("adaptive_eot_", "adaptive EOT"),
            ("adaptive_", "adaptive"), ("pgd", "PGD")]


def config(model: str, out: Path, data_root: Path, detectors: list[str], device: str, batch_size: int,
           subsets: bool, shard_size: int = 256, eot: int | None = None, tag: str = "",
           methods: tuple[str, ...] = ("pgd", "apgd"), steps: int | None = None) -> Path:
    """The study's config for one packaged model config: Tiny-ImageNet as the OOD set, the chosen detectors, PGD,
    the adaptive and EOT families, and the robust AUROC with ``methods`` (EOT attacks for randomised detectors,
    ``eot`` noise draws per gradient, default the detector's own number; ``steps`` iterations of the robust PGD
    attacks and their EOT twins, default the attacks' 100)."""
    from advopenood import registry
    from advopenood.capabilities import is_randomised

    cfg = yaml.safe_load((REPO / "configs" / f"{model}.yaml").read_text())
    draws = {} if eot is None else {"eot": eot}
    randomised = any(is_randomised(registry.get("detectors", d)) for d in detectors)
    cfg.update(name=f"study_{model}", device=device, batch_size=batch_size, shard_size=shard_size,
               attacks=["pgd", "adaptive", *(["adaptive_eot"] if randomised else [])], detectors=detectors,
               evaluators=["ood", "robust_auroc", "levels", "smoothed"], analyses=[],
               attack_params={**({"adaptive_eot": draws} if draws else {}),
                              **({"robust_id": {"steps": steps}, "robust_ood": {"steps": steps}} if steps else {})},
               evaluator_params={"robust_auroc": {"method": list(methods), "ood_sets": ["tin"], **draws}})
    cfg["data"].update(root=str(data_root), ood=[{"kind": "npz", "path": "tin_test.npz", "name": "tin"}],
                       fit_limit=None if subsets else FIT_LIMIT)
    path = out / f"study_{model}{tag}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def make_subsets(limit: int, dest: Path, seed: int = 0) -> None:
    """Write, under ``dest``, the rows of each study file that ``--limit`` (or the fit limit) draws from the pack
    (:func:`advopenood.data.datasets.seeded_prefix`, sorted), with ``source_index``; the models beside them."""
    import shutil

    from advopenood.data.datasets import seeded_prefix

    dest.mkdir(parents=True, exist_ok=True)
    for name, which in FILES.items():
        with np.load(DATA / name) as full:
            k = limit if which == "limit" else FIT_LIMIT
            rows = seeded_prefix(len(full["y"]), k, seed, sort=True)
            source = full["source_index"][rows] if "source_index" in full.files else rows
            np.savez(dest / name, x=full["x"][rows], y=full["y"][rows], source_index=source)
    for name in ("resnet20_cifar10.pt", "resnet20_cifar10_at.pt"):
        shutil.copy2(DATA / name, dest / name)


def run(model: str, out: Path, args: argparse.Namespace, detectors: list[str] | None = None, part: int = -1
        ) -> float:
    """One model's run (``part`` >= 0: one group's, into ``OUT/parts``, with ``detectors``) and, for the whole run,
    its ``verify``; wall seconds."""
    start = time.perf_counter()
    cli = [sys.executable, "-m", "advopenood.cli"]
    tag = "" if part < 0 else f"_g{part}"
    cfg = config(model, out, args.data_root, detectors or args.chosen.get(model, args.detectors), args.device,
                 args.batch_size, args.subsets, args.shard_size, args.eot, tag, args.methods, args.steps)
    limit = [] if args.subsets else ["--limit", str(args.limit)]
    quiet = [] if args.verbose else ["--quiet"]
    folder = out / model if part < 0 else out / "parts" / f"{model}{tag}"
    subprocess.run([*cli, "run", "--config", str(cfg), *limit, "--out", str(folder), *quiet], check=True)
    if part < 0 and not args.no_verify:
        subprocess.run([*cli, "verify", str(folder)], check=True)
    return time.perf_counter() - start


def run_variant(cfg: dict, args: argparse.Namespace) -> Path:
    """Write ``cfg`` (a study config changed for one purpose) as ``OUT/<name>.yaml``, run it into ``OUT/<name>``
    and return that folder."""
    path = args.out / f"{cfg['name']}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    folder = args.out / cfg["name"]
    limit = [] if args.subsets else ["--limit", str(args.limit)]
    subprocess.run([sys.executable, "-m", "advopenood.cli", "run", "--config", str(path), *limit, "--out",
                    str(folder), "--quiet"], check=True)
    return folder


def select(model: str, args: argparse.Namespace) -> list[str]:
    """``--top K``: the K non-randomised detectors of ``--detectors`` with the highest clean AUROC against
    Tiny-ImageNet on this model (one clean run of all of them on the study's images, ``OUT/clean_<model>``; ties
    by name), then every randomised one of ``--detectors`` and the base each is made from (its twin in the paired
    comparisons): the rule the study states in benchmarks/README.md."""
    from advopenood import registry
    from advopenood.capabilities import is_randomised, twin_of

    randomised = [d for d in args.detectors if is_randomised(registry.get("detectors", d))]
    bases = [b for b in dict.fromkeys(twin_of(registry.get("detectors", d)) for d in randomised) if b]
    plain = [d for d in args.detectors if d not in randomised]
    cfg = yaml.safe_load(config(model, args.out, args.data_root, plain, args.device, args.batch_size, args.subsets,
                                args.shard_size, tag="_clean").read_text())
    cfg.update(name=f"clean_{model}", attacks=[], evaluators=["ood"], attack_params={}, evaluator_params={})
    ood = pd.read_csv(run_variant(cfg, args) / "ood.csv")
    clean = ood[(ood.attack == "none") & (ood.ood_set == "tin")].sort_values(["auroc", "detector"],
                                                                              ascending=[False, True])
    chosen = list(clean.detector.head(args.top))
    twins = [b for b in bases if b not in chosen]
    print(f"{model}: the {args.top} highest clean AUROCs: " + ", ".join(
        f"{r.detector} {r.auroc:.1f}" for r in clean.head(args.top).itertuples()) + "; with " +
        ", ".join(randomised + twins))
    return chosen + twins + randomised


def groups(detectors: list[str], k: int) -> list[list[str]]:
    """``k`` groups of detectors for parallel runs, the expensive randomised ones spread first (round robin)."""
    from advopenood import registry
    from advopenood.capabilities import is_randomised

    ordered = sorted(detectors, key=lambda d: not is_randomised(registry.get("detectors", d)))
    return [g for g in (ordered[i::k] for i in range(k)) if g]


def run_all(models: list[str], args: argparse.Namespace) -> dict[str, float]:
    """Every model's run; with ``--groups K``, first K runs per model on detector groups, ``--jobs`` at once, whose
    attack sets and scores land in the shared store, then each model's whole run, which reads them back."""
    spent: dict[str, float] = {m: 0.0 for m in models}
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        if args.groups > 1:
            work = [(m, g, i) for m in models for i, g in enumerate(groups(args.chosen.get(m, args.detectors),
                                                                              args.groups))]
            start = time.perf_counter()
            list(pool.map(lambda w: run(w[0], args.out, args, w[1], w[2]), work))
            print(f"groups: {len(work)} runs in {time.perf_counter() - start:.0f} s")
        for model, seconds in zip(models, pool.map(lambda m: run(m, args.out, args), models)):
            spent[model] += seconds
    return spent


def cell(value: float, lo: float, hi: float) -> str:
    """``value [lo, hi]`` with one decimal; blank for a missing value."""
    if pd.isna(value):
        return ""
    return f"{value:.1f}" if pd.isna(lo) else f"{value:.1f} [{lo:.1f}, {hi:.1f}]"


def table(out: Path, model: str, detectors: list[str]) -> pd.DataFrame:
    """One row per detector: AUROC (%) with its 95 % interval on clean Tiny-ImageNet, under PGD, under its adaptive
    attack (and, for a smoothed detector, its EOT attack), robust (both sides; PGD and APGD, the EOT attacks for a
    randomised detector), and the highest level it reaches with the criteria it rests on."""
    folder = out / model
    ood = pd.read_csv(folder / "ood.csv")
    robust = pd.read_csv(folder / "robust_auroc.csv")
    robust = robust.assign(_eot=robust["attack_family"].eq("eot")).sort_values("_eot", ascending=False)
    robust = robust.drop_duplicates(["detector", "method"])  # a randomised detector's EOT row
    levels = pd.read_csv(folder / "levels.csv")
    rows = []
    for det in [*detectors, "gram_legacy"]:
        mine = ood[ood.detector == det].set_index("attack")
        if mine.empty:
            continue
        rob = robust[robust.detector == det].set_index("method")
        at = lambda a: cell(*mine.loc[a, ["auroc", "auroc_lo", "auroc_hi"]]) if a in mine.index else ""  # noqa: E731
        rb = lambda m: cell(*rob.loc[m, ["robust_auroc", "robust_auroc_lo", "robust_auroc_hi"]]) \
            if m in rob.index else ""  # noqa: E731
        reached = levels.loc[levels.detector == det, "reached"]
        rows.append({"detector": det, "clean": at("none"), "pgd": at("pgd"), "adaptive": at(f"adaptive_{det}"),
                     "adaptive_eot": at(f"adaptive_eot_{det}"), "robust_pgd": rb("pgd"), "robust_apgd": rb("apgd"),
                     "robust_family": rob["attack_family"].iloc[0] if len(rob) else "",
                     "level": "" if not len(reached) or pd.isna(reached.iloc[0]) else int(reached.iloc[0]),
                     "_robust": rob.loc["pgd", "robust_auroc"] if "pgd" in rob.index else np.nan,
                     "_lo": rob.loc["pgd", "robust_auroc_lo"] if "pgd" in rob.index else np.nan,
                     "_hi": rob.loc["pgd", "robust_auroc_hi"] if "pgd" in rob.index else np.nan})
    return pd.DataFrame(rows)


def timing(out: Path, model: str) -> pd.DataFrame:
    """Wall seconds per stage (``run.json`` ``timings_s``, each group run's first when ``--groups`` ran them) and
    per attack family (each set's ``seconds``, summed over the runs that generated it)."""
    folders = [*sorted((out / "parts").glob(f"{model}_g*")), out / model]
    rows, spent = [], {}
    for folder in folders:
        info = json.loads((folder / "run.json").read_text())
        where = "" if folder == out / model else f" ({folder.name})"
        rows += [{"what": f"stage: {k}{where}", "seconds": v} for k, v in info["timings_s"].items()]
        for name, entry in (info.get("attacks") or {}).items():
            family = next((f for prefix, f in FAMILIES if name.startswith(prefix)), "other")
            spent[family] = spent.get(family, 0.0) + float(entry.get("seconds") or 0.0)
    rows += [{"what": f"attacks: {f}", "seconds": s} for f, s in spent.items()]
    return pd.DataFrame(rows)


def summary(out: Path, model: str, t: pd.DataFrame) -> str:
    """The conclusions the robust-AUROC (PGD, both sides) intervals support, for one model."""
    below, above = int((t["_hi"] < 50).sum()), int((t["_lo"] > 50).sum())
    rated = int(t["_robust"].notna().sum())
    best = t.loc[t["_robust"].idxmax()]
    paired = pd.read_csv(out / model / "robust_paired.csv")
    paired = paired[(paired.method == "pgd") & ((paired.detector_a == best.detector) | (paired.detector_b == best.detector))]
    sig = paired[paired["significant"].astype(str).eq("True")]
    return (f"{model}: robust AUROC (PGD, both sides) interval below 50 for {below}/{rated} detectors, above 50 for "
            f"{above}, containing 50 for {rated - below - above}; highest {best._robust:.1f} [{best._lo:.1f}, "
            f"{best._hi:.1f}] ({best.detector}), separated from {len(sig)}/{len(paired)} others by its paired interval")


def curve(args: argparse.Namespace) -> None:
    """Robust AUROC (PGD, both sides) against steps and EOT draws, with the attack stage's seconds."""
    from advopenood.io import markdown_table

    model = "cifar10_resnet20_at"  # the standard model's robust AUROC is 0 at any strength tried (README)
    rows = []
    for steps in args.curve_steps:
        for eot in [None, *args.curve_eot]:
            tag = f"s{steps}" + (f"_e{eot}" if eot else "")
            detectors = ["smoothed_msp"] if eot else ["msp", "smoothed_msp"]
            params = {"method": "pgd", "ood_sets": ["tin"], "randomised_attacks": "eot" if eot else "plain",
                      **({"eot": eot} if eot else {})}
            cfg = yaml.safe_load(config(model, args.out, args.data_root, detectors, args.device, args.batch_size,
                                        args.subsets, args.shard_size, tag=f"_{tag}").read_text())
            cfg.update(name=f"curve_{tag}", attacks=[], evaluators=["robust_auroc"],
                       evaluator_params={"robust_auroc": params},
                       attack_params={"robust_id": {"steps": steps}, "robust_ood": {"steps": steps}})
            folder = run_variant(cfg, args)
            info = json.loads((folder / "run.json").read_text())
            for r in pd.read_csv(folder / "robust_auroc.csv").to_dict("records"):
                rows.append({"detector": r["detector"], "steps": steps, "eot draws": eot or "plain",
                             "robust AUROC": cell(r["robust_auroc"], r["robust_auroc_lo"], r["robust_auroc_hi"]),
                             "attack seconds": sum(float(info["attacks"][n].get("seconds") or 0)
                                                   for n in (r["id_attack"], r["ood_attack"]))})
    print(markdown_table(pd.DataFrame(rows), "{:.1f}"))
    print("SUMMARY strength curve: " + "; ".join(f"{r['detector']} steps {r['steps']} eot {r['eot draws']}: "
                                                 f"{r['robust AUROC']} in {r['attack seconds']:.0f} s" for r in rows))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--limit", type=int, default=200, help="ID and OOD test images per model (default 200)")
    p.add_argument("--out", type=Path, default=REPO / "runs" / "robust_study")
    p.add_argument("--data-root", type=Path, default=DATA)
    p.add_argument("--subsets", action="store_true", help="--data-root holds --make-subsets files: use every row")
    p.add_argument("--make-subsets", type=Path, help="write the subsets for --limit under this folder and stop")
    p.add_argument("--detectors", default=",".join(DETECTORS + SMOOTHED))
    p.add_argument("--models", default=",".join(MODELS.values()))
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--shard-size", type=int, default=256, help="images an attack processes at once (store shard)")
    p.add_argument("--jobs", type=int, default=1, help="runs at once")
    p.add_argument("--groups", type=int, default=1, help="detector groups per model run in parallel first")
    p.add_argument("--eot", type=int, default=None,
                   help="EOT draws per gradient (default: the detector's own n; 4 by the strength curve)")
    p.add_argument("--top", type=int, default=None,
                   help="study the TOP non-randomised detectors by clean AUROC per model, and every randomised one")
    p.add_argument("--methods", type=lambda s: tuple(s.split(",")), default=("pgd", "apgd"),
                   help="robust-AUROC methods (default pgd,apgd)")
    p.add_argument("--steps", type=int, default=None,
                   help="robust PGD steps (default the attacks' 100; 25 by the strength curve)")
    p.add_argument("--tables-only", action="store_true")
    p.add_argument("--no-verify", action="store_true", help="leave `advopenood verify RUN` to another machine")
    p.add_argument("--verbose", action="store_true", help="the runs' progress bars")
    p.add_argument("--curve", action="store_true")
    p.add_argument("--curve-steps", type=lambda s: [int(v) for v in s.split(",")], default=[10, 25, 50, 100, 200])
    p.add_argument("--curve-eot", type=lambda s: [int(v) for v in s.split(",")], default=[1, 2, 4, 8, 16])
    args = p.parse_args()
    if args.make_subsets:
        make_subsets(args.limit, args.make_subsets)
        return
    args.detectors = args.detectors.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.curve:
        curve(args)
        return
    from advopenood.io import markdown_table

    models = args.models.split(",")
    args.chosen = {}
    if args.top and not args.tables_only:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            args.chosen = dict(zip(models, pool.map(lambda m: select(m, args), models)))
    seconds = {} if args.tables_only else run_all(models, args)
    lines = []
    for label, model in MODELS.items():
        if model not in models:
            continue
        info = json.loads((args.out / model / "run.json").read_text())
        t = table(args.out, model, info["config"]["detectors"] if "config" in info else args.detectors)
        sample = info.get("sample") or {}
        print(f"\n### {label} ({model}): {sample.get('n_id', '?')} ID and {sample.get('n_ood', '?')} OOD images\n")
        print(markdown_table(t.drop(columns=["_robust", "_lo", "_hi"]), "{:.1f}"))
        smoothed = args.out / model / "table_smoothed.csv"
        if smoothed.is_file():
            s = pd.read_csv(smoothed)
            s = pd.DataFrame({"detector": s.detector, "direction": s.direction,
                              **{c: [cell(v, lo, hi) for v, lo, hi in zip(s[c], s[f"{c}_lo"], s[f"{c}_hi"])]
                                 for c in ("auroc_baseline", "auroc_plain", "auroc_eot") if c in s}})
            print("\n" + markdown_table(s, "{:.1f}"))
        print("\n" + markdown_table(timing(args.out, model), "{:.0f}"))
        lines.append(summary(args.out, model, t) + (f", {seconds[model]:.0f} s" if model in seconds else ""))
    print("\nSUMMARY " + "; ".join(lines))


if __name__ == "__main__":
    main()
