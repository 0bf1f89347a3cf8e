"""Does ROSS's robustness claim hold? ROSS (Hekal et al. 2026) and its base detectors under the attack it was
published with and under attacks on the defence itself, on the pack's models, every AUROC with its 95 % interval
(issue 33; docs/ross-audit.md).

    python benchmarks/ross_audit.py --out runs/ross_audit                           # the audit (both ResNet-20s)
    python benchmarks/ross_audit.py --out runs/ross_audit --models cifar10_resnet18 --limit 64
    python benchmarks/ross_audit.py --out runs/ross_audit --tables-only             # tables of finished runs
    python benchmarks/ross_audit.py --draws --out runs/ross_draws --limit 32         # attack strength vs EOT draws
    python benchmarks/ross_audit.py --cost                                           # EOT step cost vs foolbox PGD
    python benchmarks/ross_audit.py --null --runs ensemble --detectors gen,ross_gen --ood tin --limit 64 \
        --models cifar10_resnet20_at --out runs/ross_null                            # the null check (issue 48)

ROSS runs with their Table 2's settings (``sigma: 0.05, lam: 0.01``, n 25; ``--ross`` changes them). Per model, two
``advopenood run`` s (configs written to ``OUT/<model>_<run>.yaml``), each checked with
``advopenood verify``:

* ``published``: protocol ``hekal2026``: ``hekal_min_<det>`` (PGD-Min on ID images) and ``hekal_max_<det>`` (PGD-Max
  on OOD images) as their ``scripts/attack_ood.py`` runs them (40 steps, eps in normalised units, nothing clipped to
  [0, 1], a ROSS detector attacked through its base detector's gradient), eps 2, 4, 8, 16 "/255";
  table ``table_hekal2026.csv`` (their Table 2's form; ``eps_pixel``: the pixel budget that eps amounts to);
* ``adaptive``: protocol ``strong``: the same attacks at pixel-unit eps, clipped, and the robust-AUROC attacks
  (PGD on the detector's own score, 40 steps: ``robust_id_<det>`` pushes ID images to look OOD, ``robust_ood_<det>``
  OOD images to look ID): for ROSS end to end without EOT (one noise draw held fixed) and with EOT (``--eot`` fresh
  draws per step, the worst of ROSS's score, its median and its log-gate per image); both sides attacked at once
  (robust AUROC). Eps ``--pixel-eps`` (default 2/255 and 8/255: the first about the pixel budget of their "8/255").

The audit table: one row per model, detector, OOD set and pixel budget; AUROC (%) ``value [lo, hi]`` clean, under
each attack (ID side = PGD-Min's, OOD side = PGD-Max's) and robust; then the wall time per stage and per attack
family, and the spread of ROSS's clean AUROC over ``--eval-seeds`` evaluation-noise seeds. The last line is
``SUMMARY``: per model and ROSS detector, the published protocol's AUROC at their 8/255 against the robust AUROC
under the EOT attacks at the same pixel budget, with intervals.

``--draws`` measures the attack strength against the number of EOT draws (the robust AUROC of ``ross_gen`` on the
adversarially trained ResNet-20 for each of ``--draw-list``) with the attack stage's wall time; ``--cost`` times one
EOT gradient step of ``ross_gen`` against one foolbox LinfPGD step on ``gen`` (per network forward-backward pass;
target: at most 1.2x).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from _common import DATA, REPO

#: PyTorch's CPU allocator backs large tensors with transparent huge pages (``madvise``): ROSS's batches of 25 noise
#: copies otherwise spend about half their CPU time in page faults (217,000 minor faults a second, 70x fewer with it)
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

MODELS = ["cifar10_resnet20", "cifar10_resnet20_at"]
DETECTORS = ["gen", "msp", "ross_gen", "ross_msp"]
OOD = {"tin": "tin_test.npz", "textures": "texture_test.npz", "mnist": "mnist_test.npz"}
PUBLISHED_EPS = ["2/255", "4/255", "8/255", "16/255"]
FIT_LIMIT = 2000
#: ROSS as their Table 2 ran it: ``scripts/ross/run_experiments.py`` main() copies
#: ``scripts/ross/ross_default_config.yml`` (``noise_magnitude: 0.05``, ``lambda_: 0.01``) over
#: ``configs/postprocessors/ross.yml`` before every table
TABLE2 = {"sigma": 0.05, "lam": 0.01}
STEPS = 40  # their scripts/experiments/run_attack_ood.sh; also our robust attacks' here
ENSEMBLE_ITERS = 100


def fraction(text: str) -> float:
    """``"8/255"`` -> 8 / 255."""
    top, _, bottom = text.partition("/")
    return float(top) / float(bottom or 1)


def hekal_entries(eps: list[str], args: argparse.Namespace) -> list[dict]:
    """PGD-Min on the ID images and PGD-Max on each natural OOD set, per detector, at every eps (one ``hekal_max``
    set attacks one OOD set: one entry per set, labelled ``hekal_max_<det>-<set>``)."""
    entries = [{"name": f"hekal_min_{det}", "eps": list(eps)} for det in args.detectors]
    for det in args.detectors:
        entries += [{"name": f"hekal_max_{det}", "eps": list(eps), "params": {"ood_set": name},
                     "label": f"hekal_max_{det}-{name}"} for name in args.ood]
    return entries


def config(model: str, run: str, args: argparse.Namespace) -> Path:
    """One run's config: the pack's model config with the audit's detectors, OOD sets, attacks and evaluators."""
    cfg = yaml.safe_load((REPO / "configs" / f"{model}.yaml").read_text())
    eot = {"eot": args.eot} if args.eot else {}
    ross = {d: dict(args.ross) for d in args.detectors if d.startswith("ross_")}
    if run == "published":
        cfg.update(protocol="hekal2026", attacks=hekal_entries(PUBLISHED_EPS, args), evaluators=["hekal2026"],
                   attack_params={"hekal_min": {"steps": STEPS}, "hekal_max": {"steps": STEPS}})
    else:
        cfg.update(protocol="strong", attacks=hekal_entries(args.pixel_eps, args),
                   evaluators=["hekal2026", "robust_auroc"],
                   attack_params={"hekal_min": {"steps": STEPS}, "hekal_max": {"steps": STEPS},
                                  "robust_id": {"steps": STEPS}, "robust_ood": {"steps": STEPS}},
                   evaluator_params={"robust_auroc": {"method": "pgd", "randomised_attacks": "both",
                                                      "eps": [fraction(e) for e in args.pixel_eps], **eot}})
    cfg.update(name=f"ross_audit_{model}_{run}", device=args.device, batch_size=args.batch_size,
               shard_size=args.shard_size, detectors=args.detectors, analyses=[], detector_params=ross)
    cfg["data"].update(root=str(args.data_root), fit_limit=FIT_LIMIT,
                       ood=[{"kind": "npz", "path": OOD[name], "name": name} for name in args.ood])
    path = args.out / f"{model}_{run}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def ensemble_config(model: str, args: argparse.Namespace) -> Path:
    """The ``ensemble`` run's config: the robust AUROC with ``ensemble: standard`` (APGD on the score, APGD on the
    second objective, Square on the score; EOT for a randomised detector: ``--ensemble-draws`` draws per step),
    ``--ensemble-iters`` APGD iterations, ``--ensemble-queries`` Square queries, at each ``--pixel-eps``, no other
    attack."""
    cfg = yaml.safe_load(config(model, "adaptive", args).read_text())
    cfg.update(name=f"ross_audit_{model}_ensemble", attacks=[], evaluators=["robust_auroc"],
               attack_params={f: {"n_iter": args.ensemble_iters} for f in
                              ("robust_apgd_id", "robust_apgd_ood", "robust_apgd_aux_id", "robust_apgd_aux_ood")},
               evaluator_params={"robust_auroc": {"ensemble": "standard", "randomised_attacks": "eot",
                                                  "eot": args.ensemble_draws,
                                                  "square_queries": args.ensemble_queries,
                                                  "eps": [fraction(e) for e in args.pixel_eps]}})
    path = args.out / f"{model}_ensemble.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def run(model: str, run_name: str, args: argparse.Namespace) -> float:
    """One run and its ``verify``; wall seconds."""
    start = time.perf_counter()
    cli = [sys.executable, "-m", "advopenood.cli"]
    folder = args.out / f"{model}_{run_name}"
    quiet = [] if args.verbose else ["--quiet"]
    limit = args.limit if run_name == "published" else args.adaptive_limit or args.limit
    path = ensemble_config(model, args) if run_name == "ensemble" else config(model, run_name, args)
    subprocess.run([*cli, "run", "--config", str(path), "--limit", str(limit),
                    "--out", str(folder), *quiet], check=True)
    if not args.no_verify:
        subprocess.run([*cli, "verify", str(folder)], check=True)
    return time.perf_counter() - start


def cell(value: float, lo: float, hi: float) -> str:
    """``value [lo, hi]`` with one decimal; blank for a missing value."""
    if pd.isna(value):
        return ""
    return f"{value:.1f}" if pd.isna(lo) else f"{value:.1f} [{lo:.1f}, {hi:.1f}]"


def _pick(frame: pd.DataFrame, metric: str, **where: object) -> str:
    """The one row of ``frame`` matching ``where`` as ``value [lo, hi]`` of ``metric``; blank when there is none."""
    rows = frame
    for key, value in where.items():
        rows = rows[rows[key].astype(str) == str(value)]
    if rows.empty:
        return ""
    r = rows.iloc[0]
    return cell(r[metric], r[f"{metric}_lo"], r[f"{metric}_hi"])


def audit_table(out: Path, model: str) -> pd.DataFrame:
    """The audit's rows for one model: per detector, OOD set and pixel budget, AUROC under each attack."""
    pub = pd.read_csv(out / f"{model}_published" / "table_hekal2026.csv")
    ada = pd.read_csv(out / f"{model}_adaptive" / "table_hekal2026.csv")
    rob = pd.read_csv(out / f"{model}_adaptive" / "robust_auroc.csv")
    rob = rob[rob.method == "pgd"]  # the audit's columns are PGD's (a run with the ensemble has more methods)
    rows = []
    for (det, ood_set, eps), _ in ada[ada.objective != "No Attack"].groupby(["detector", "ood_set", "eps"]):
        mine = rob[(rob.detector == det) & (rob.ood_set == ood_set) & np.isclose(rob.eps, eps)]
        plain, eot = mine[mine.attack_family == "plain"], mine[mine.attack_family == "eot"]
        near = pub[(pub.detector == det) & (pub.ood_set == ood_set)]
        near = near.assign(_gap=(near.eps_pixel - eps).abs()).sort_values("_gap")  # the published eps closest in pixels
        pub_eps = near[near.objective != "No Attack"].eps.iloc[0] if len(near) else np.nan
        rows.append({
            "model": model, "detector": det, "ood_set": ood_set, "eps_pixel": f"{eps * 255:.0f}/255",
            "clean": _pick(ada, "auroc", detector=det, ood_set=ood_set, objective="No Attack"),
            "published eps (normalised)": "" if pd.isna(pub_eps) else f"{pub_eps * 255:.0f}/255",
            "published PGD-Min": _pick(pub, "auroc", detector=det, ood_set=ood_set, eps=pub_eps, objective="PGD-Min"),
            "published PGD-Max": _pick(pub, "auroc", detector=det, ood_set=ood_set, eps=pub_eps, objective="PGD-Max"),
            "pixel PGD-Min": _pick(ada, "auroc", detector=det, ood_set=ood_set, eps=eps, objective="PGD-Min"),
            "pixel PGD-Max": _pick(ada, "auroc", detector=det, ood_set=ood_set, eps=eps, objective="PGD-Max"),
            "own score, ID side": _pick(plain, "id_attacked_auroc"),
            "own score, OOD side": _pick(plain, "ood_attacked_auroc"),
            "EOT, ID side": _pick(eot, "id_attacked_auroc"),
            "EOT, OOD side": _pick(eot, "ood_attacked_auroc"),
            "robust (both sides)": _pick(eot if len(eot) else plain, "robust_auroc"),
        })
    return pd.DataFrame(rows)


def ensemble_table(out: Path, model: str) -> pd.DataFrame:
    """The ensemble run's rows for one model: per detector, OOD set and pixel budget, the robust AUROC (both sides)
    of each member and of the per-image worst case over all of them, each side of the worst case, the masking flag
    and the attack seconds of each member."""
    folder = out / f"{model}_ensemble"
    rob = pd.read_csv(folder / "robust_auroc.csv")
    attacks = json.loads((folder / "run.json").read_text()).get("attacks") or {}
    rows = []
    for (det, ood_set, eps), part in rob.groupby(["detector", "ood_set", "eps"], sort=False):
        ens = part[part.method == "ensemble"]
        row = {"model": model, "detector": det, "ood_set": ood_set, "eps_pixel": f"{eps * 255:.3g}/255",
               "n": f"{part.n_id.iloc[0]} + {part.n_ood.iloc[0]}", "clean": _pick(part, "clean_auroc")}
        for r in part[part.method != "ensemble"].to_dict("records"):
            label = r["method"] + (" EOT" if r["attack_family"] == "eot" else "")
            row[label] = cell(r["robust_auroc"], r["robust_auroc_lo"], r["robust_auroc_hi"])
            row[f"{label} s"] = sum(float((attacks.get(n) or {}).get("seconds") or 0.0)
                                    for n in (r["id_attack"], r["ood_attack"]))
        row["ensemble (worst case)"] = _pick(ens, "robust_auroc")
        row["ensemble ID side"] = _pick(ens, "id_attacked_auroc")
        row["ensemble OOD side"] = _pick(ens, "ood_attacked_auroc")
        row["old rule (min of evaluation draws)"] = old_rule(folder, ens.iloc[0]) if len(ens) else math.nan
        row["masking_suspected"] = part.masking_suspected.dropna().astype(str).iloc[0] \
            if part.masking_suspected.notna().any() else ""
        rows.append(row)
    return pd.DataFrame(rows)


def old_rule(folder: Path, ens: pd.Series) -> float:
    """The ensemble row's robust AUROC (%) under the rule before issue 48, from the same run's score files: each
    image's lowest (ID) / highest (OOD) *evaluation* confidence over its clean self and its sets, which for a
    randomised detector picks the luckiest of its evaluation draws (for a deterministic one it is the row itself)."""
    from advopenood.evaluation.metrics import auroc

    arrays = np.load(folder / "scores" / f"{ens['detector']}.npz")
    worst_id = np.min([arrays[n] for n in ["id", *str(ens["id_attack"]).split("+")]], axis=0)
    worst_ood = np.max([arrays[n] for n in [ens["ood_set"], *str(ens["ood_attack"]).split("+")]], axis=0)
    return 100.0 * auroc(worst_id, worst_ood)


def paired_table(out: Path, model: str) -> pd.DataFrame:
    """The ensemble rows of ``robust_paired.csv``: detector A minus detector B, both sides at their own per-image worst
    case, with the paired interval and whether it is a shown difference (excludes 0)."""
    paired = pd.read_csv(out / f"{model}_ensemble" / "robust_paired.csv")
    paired = paired[paired.method == "ensemble"]
    return pd.DataFrame([{"model": model, "A - B": f"{r['detector_a']} - {r['detector_b']}", "ood_set": r["ood_set"],
                          "eps_pixel": f"{r['eps'] * 255:.3g}/255",
                          "difference": cell(r["delta_robust_auroc"], r["delta_robust_auroc_lo"],
                                             r["delta_robust_auroc_hi"]),
                          "excludes 0": not r["delta_robust_auroc_lo"] <= 0 <= r["delta_robust_auroc_hi"]}
                         for r in paired.to_dict("records")])


def published_pairs(out: Path, model: str, resamples: int = 4000) -> pd.DataFrame:
    """ROSS minus its base under their protocol, paired: per ``ross_<base>`` and column of ``table_hekal2026.csv``
    (No Attack, PGD-Min / PGD-Max at each eps), the AUROC difference (points) on the same ID and OOD images (each
    detector on the set its own attack made; their protocol attacks ROSS through the base's gradient), with its
    95 % percentile interval and the Bonferroni-level one over the pair's columns (level 1 - 0.05 / columns), from
    the stratified bootstrap of :func:`advopenood.evaluation.intervals.paired_replicates` (seed 0, ``resamples``)."""
    from advopenood.evaluation.intervals import paired_replicates, percentile

    folder = out / f"{model}_published"
    pub = pd.read_csv(folder / "table_hekal2026.csv")
    rows = []
    for det in [d for d in pub.detector.unique() if d.startswith("ross_")]:
        base = det.removeprefix("ross_")
        if base not in set(pub.detector):
            continue
        arrays = {d: np.load(folder / "scores" / f"{d}.npz") for d in (det, base)}
        mine = pub[pub.detector == det]
        level = 1 - 0.05 / len(mine)
        for r in mine.to_dict("records"):
            twin = pub[(pub.detector == base) & (pub.objective == r["objective"]) & (pub.ood_set == r["ood_set"])
                       & ((pub.eps.isna() & pd.isna(r["eps"])) | np.isclose(pub.eps, r["eps"]))].iloc[0]
            cells = []
            for d, attack in ((det, r["attack"]), (base, twin["attack"])):
                a = arrays[d]
                cells.append((a[attack] if r["objective"] == "PGD-Min" else a["id"],
                              a[attack] if r["objective"] == "PGD-Max" else a[r["ood_set"]]))
            reps = paired_replicates(cells, 0, f"ross_audit/{model}/{det}/{r['attack']}", resamples, ("auroc",))
            diff = reps[0]["auroc"] - reps[1]["auroc"]  # replicates in points
            point = float(r["auroc"] - twin["auroc"])
            rows.append({"model": model, "A - B": f"{det} - {base}", "ood_set": r["ood_set"],
                         "objective": r["objective"],
                         "eps (normalised)": "" if pd.isna(r["eps"]) else f"{r['eps'] * 255:.0f}/255",
                         "difference, 95 %": cell(point, *percentile(diff)),
                         f"Bonferroni, {100 * level:.2f} %": cell(point, *percentile(diff, level))})
    return pd.DataFrame(rows)


def timing(out: Path, model: str) -> pd.DataFrame:
    """Wall seconds per stage of each run (``run.json`` ``timings_s``) and per attack family (each set's
    ``seconds``)."""
    rows = []
    for run_name in ("published", "adaptive"):
        info = json.loads((out / f"{model}_{run_name}" / "run.json").read_text())
        rows += [{"run": run_name, "what": f"stage: {k}", "seconds": v} for k, v in info["timings_s"].items()]
        spent: dict[str, float] = {}
        for name, entry in (info.get("attacks") or {}).items():
            family = name.split("_ross_")[0] + ("_ross" if "_ross_" in name else "")
            family = family.rsplit("-", 1)[0].split("@")[0]
            spent[family] = spent.get(family, 0.0) + float(entry.get("seconds") or 0.0)
        rows += [{"run": run_name, "what": f"attacks: {f}", "seconds": s} for f, s in sorted(spent.items())]
    return pd.DataFrame(rows)


def seed_spread(out: Path, model: str, seeds: int, args: argparse.Namespace) -> pd.DataFrame:
    """ROSS's clean AUROC per OOD set over ``seeds`` evaluation-noise seeds (the run's stored clean scores re-scored
    with ``eval_seed`` 0..seeds-1 by ``advopenood run`` with no attacks): mean, SD, min and max."""
    rows = []
    for s in range(seeds):
        cfg = yaml.safe_load((out / f"{model}_adaptive.yaml").read_text())
        cfg.update(name=f"ross_audit_seed{s}", attacks=[], evaluators=["ood"],
                   detectors=[d for d in args.detectors if d.startswith("ross_")],
                   detector_params={d: {**args.ross, "eval_seed": s} for d in args.detectors if d.startswith("ross_")})
        cfg.pop("attack_params", None)
        cfg.pop("evaluator_params", None)
        path = out / f"{model}_seed{s}.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        folder = out / f"{model}_seed{s}"
        subprocess.run([sys.executable, "-m", "advopenood.cli", "run", "--config", str(path), "--limit",
                        str(args.limit), "--out", str(folder), "--quiet"], check=True)
        ood = pd.read_csv(folder / "ood.csv")
        for r in ood[(ood.attack == "none") & ood.ood_set.isin(list(args.ood))].to_dict("records"):
            rows.append({"detector": r["detector"], "ood_set": r["ood_set"], "seed": s, "auroc": r["auroc"]})
    frame = pd.DataFrame(rows)
    return frame.groupby(["detector", "ood_set"])["auroc"].agg(["mean", "std", "min", "max"]).reset_index()


def curve_point(args: argparse.Namespace, tag: str, robust: dict, attack_params: dict | None) -> list[dict]:
    """One point of a strength curve: ``ross_gen`` alone on the adversarially trained ResNet-20 against
    Tiny-ImageNet, robust-AUROC attacks only (``evaluator_params.robust_auroc`` = ``robust``; ``attack_params``
    replaces the adaptive run's, None keeps them), run and read back as rows: the robust AUROC and each side with
    their intervals, and the attack seconds of the row's two sets."""
    cfg = yaml.safe_load(config("cifar10_resnet20_at", "adaptive", args).read_text())
    cfg.update(name=tag, attacks=[], detectors=["ross_gen"], evaluators=["robust_auroc"],
               evaluator_params={"robust_auroc": {"randomised_attacks": "eot", "ood_sets": ["tin"], **robust}})
    if attack_params is not None:
        cfg["attack_params"] = attack_params
    cfg["data"]["ood"] = [{"kind": "npz", "path": OOD["tin"], "name": "tin"}]
    path = args.out / f"{tag}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    folder = args.out / tag
    subprocess.run([sys.executable, "-m", "advopenood.cli", "run", "--config", str(path), "--limit",
                    str(args.limit), "--out", str(folder), "--quiet"], check=True)
    attacks = json.loads((folder / "run.json").read_text())["attacks"]
    return [{"robust AUROC": cell(r["robust_auroc"], r["robust_auroc_lo"], r["robust_auroc_hi"]),
             "ID side": cell(r["id_attacked_auroc"], r["id_attacked_auroc_lo"], r["id_attacked_auroc_hi"]),
             "OOD side": cell(r["ood_attacked_auroc"], r["ood_attacked_auroc_lo"], r["ood_attacked_auroc_hi"]),
             "attack seconds": sum(float(attacks[n].get("seconds") or 0) for n in (r["id_attack"], r["ood_attack"]))}
            for r in pd.read_csv(folder / "robust_auroc.csv").to_dict("records")]


def draws_curve(args: argparse.Namespace) -> None:
    """Robust AUROC (PGD, both sides, EOT) of ``ross_gen`` against the number of EOT draws, with attack seconds."""
    from advopenood.io import markdown_table

    rows = [{"eot draws": draws, **row} for draws in args.draw_list
            for row in curve_point(args, f"draws_{draws}", {"method": "pgd", "eot": draws, "eps": 8 / 255}, None)]
    print(markdown_table(pd.DataFrame(rows), "{:.1f}"))
    print("SUMMARY ross_gen robust AUROC vs EOT draws: " + "; ".join(
        f"{r['eot draws']} draws: {r['robust AUROC']} in {r['attack seconds']:.0f} s" for r in rows))


def strength_curve(args: argparse.Namespace) -> None:
    """Robust AUROC (both sides, EOT) of ``ross_gen`` on the adversarially trained ResNet-20 against the ensemble
    members' cost: APGD on the score for each of ``--curve-iters`` x ``--curve-draws`` and Square on the score for
    each of ``--curve-queries``, at the first ``--pixel-eps``, with the attack stage's wall time; the ensemble run's
    iterations, draws and queries are read off it by the rule in docs/ross-audit.md."""
    from advopenood.io import markdown_table

    rows = []
    settings = [("apgd", {"n_iter": i}, d) for d in args.curve_draws for i in args.curve_iters]
    settings += [("square", {"queries": q}, None) for q in args.curve_queries]
    for method, knobs, draws in settings:
        tag = f"{method}_{'_'.join(f'{k}{v}' for k, v in knobs.items())}" + (f"_eot{draws}" if draws else "")
        robust = {"method": method, "eps": fraction(args.pixel_eps[0]), **({"eot": draws} if draws else {}),
                  **({"square_queries": knobs["queries"]} if method == "square" else {})}
        attack_params = ({f: {"n_iter": knobs["n_iter"]} for f in ("robust_apgd_id", "robust_apgd_ood")}
                         if method == "apgd" else {})
        for row in curve_point(args, f"curve_{tag}", robust, attack_params):
            rows.append({"attack": method, **{k: knobs.get(k, "") for k in ("n_iter", "queries")},
                         "eot draws": draws or "", **row})
            print(markdown_table(pd.DataFrame(rows[-1:]), "{:.1f}"), flush=True)
    print(markdown_table(pd.DataFrame(rows), "{:.1f}"))
    print("SUMMARY ross_gen strength curve: " + "; ".join(
        f"{r['attack']} {r['n_iter'] or r['queries']}{' eot ' + str(r['eot draws']) if r['eot draws'] else ''}: "
        f"{r['robust AUROC']} in {r['attack seconds']:.0f} s" for r in rows))


def cost(args: argparse.Namespace) -> None:
    """Seconds per network forward-backward pass: one EOT gradient step of ``ross_gen`` (``m`` draws in one batched
    pass) divided by ``m``, against one foolbox LinfPGD step on ``gen`` (one forward-backward pass)."""
    import torch

    from advopenood.data.datasets import build_dataset, limit_dataset, make_loader
    from advopenood.detection.scoring import fit_detectors
    from advopenood.models.classifier import build_model
    from advopenood_plugins.kit.attacks import Best
    from advopenood_plugins.attacks.adaptive import DetectorTarget, JointLinfPGD
    from advopenood.attacks.base import foolbox_model

    device = torch.device(args.device)
    torch.manual_seed(0)
    net = build_model("resnet20", 10, args.data_root / "resnet20_cifar10.pt").to(device)
    data = lambda f, name, n: limit_dataset(build_dataset({"kind": "npz", "path": f, "name": name},  # noqa: E731
                                                          args.data_root, 3, 32), n, 0)
    fit = data("cifar10_train_10k.npz", "train", 1200)
    bank = fit_detectors(["gen", "ross_gen"], "pytorch-ood", net, fit, batch_size=args.batch_size, device=device,
                         seed=0, params={"ross_gen": {"val_size": 200}}, progress=False)
    rows = []
    for batch in args.cost_batch:
        x, y = next(iter(make_loader(data("cifar10_test.npz", "cifar10", batch), batch)))
        x, y = x.to(device), y.to(device)
        targets = {"gen": bank.dets["gen"],
                   **{f"ross_gen eot {m}": bank.dets["ross_gen"].for_attack().with_eot(m) for m in args.draw_list}}
        for label, det in targets.items():
            target = DetectorTarget(det, net, 0.0, 1.0, -float("inf"))  # as the robust attacks see a detector

            def objective(z, target=target):
                conf = target.confidence(z)
                return -conf, torch.zeros(len(z), dtype=torch.bool, device=z.device), conf.detach()
            times = []
            for steps in (1, *[args.cost_steps] * 3):  # a warm-up step, then the fastest of three timed attacks
                attack = JointLinfPGD(objective, Best(x), rel_stepsize=0.01 / 0.3, steps=steps, random_start=True)
                start = time.perf_counter()
                attack(foolbox_model(net, device), x, y, epsilons=8 / 255)
                times.append((time.perf_counter() - start) / steps)
            passes = 1 if label == "gen" else int(label.rsplit(" ", 1)[1])
            rows.append({"batch": batch, "attack": label, "passes per step": passes, "s per step": min(times[1:]),
                         "s per pass": min(times[1:]) / passes})
    frame = pd.DataFrame(rows)
    base = frame[frame.attack == "gen"].set_index("batch")["s per pass"]
    frame["ratio per pass"] = frame["s per pass"] / frame["batch"].map(base)
    print(frame.to_string(index=False))
    print("SUMMARY cost per forward-backward pass vs one foolbox LinfPGD step on gen, same images (target <= 1.2x): "
          + "; ".join(f"batch {r['batch']} {r['attack']}: {r['ratio per pass']:.2f}x"
                      for r in frame.to_dict("records") if r["attack"] != "gen"))


def main() -> None:
    from advopenood.io import markdown_table

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=REPO / "runs" / "ross_audit")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--limit", type=int, default=200, help="ID and OOD test images per set (default 200)")
    p.add_argument("--adaptive-limit", type=int, help="images per set of the adaptive run (default: --limit)")
    p.add_argument("--detectors", type=lambda s: s.split(","), default=DETECTORS)
    p.add_argument("--ross", type=lambda s: {k: float(v) for k, v in (kv.split("=") for kv in s.split(","))},
                   default=dict(TABLE2), help="ROSS's parameters (default their Table 2's: sigma=0.05,lam=0.01)")
    p.add_argument("--ood", type=lambda s: s.split(","), default=list(OOD), help=f"of {', '.join(OOD)}")
    p.add_argument("--data-root", type=Path, default=DATA)
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--shard-size", type=int, default=200)
    p.add_argument("--pixel-eps", type=lambda s: s.split(","), default=["2/255", "8/255"])
    p.add_argument("--eot", type=int, default=None, help="EOT draws per step (default: the detector's n, 25)")
    p.add_argument("--eval-seeds", type=int, default=5, help="evaluation-noise seeds for ROSS's clean spread")
    p.add_argument("--tables-only", action="store_true")
    p.add_argument("--no-verify", action="store_true")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--draws", action="store_true", help="attack strength against EOT draws instead")
    p.add_argument("--cost", action="store_true", help="EOT step cost against foolbox PGD instead")
    p.add_argument("--draw-list", type=lambda s: [int(v) for v in s.split(",")], default=[1, 4, 8, 25])
    p.add_argument("--cost-batch", type=lambda s: [int(v) for v in s.split(",")], default=[8, 32])
    p.add_argument("--cost-steps", type=int, default=5)
    p.add_argument("--runs", type=lambda s: s.split(","), default=["published", "adaptive"],
                   help="of published, adaptive, ensemble (default the first two)")
    p.add_argument("--ensemble-iters", type=int, default=ENSEMBLE_ITERS, help="APGD iterations of the ensemble run")
    p.add_argument("--ensemble-draws", type=int, default=None, help="EOT draws of the ensemble run (default n)")
    p.add_argument("--ensemble-queries", type=int, default=None, help="Square queries of the ensemble run")
    p.add_argument("--null", action="store_true",
                   help="the null check instead: the ensemble run at eps 1e-6 (no attack can move an image; every set "
                        "is a fresh evaluation draw), 5 APGD iterations, 2 EOT draws, 10 Square queries unless given")
    p.add_argument("--curve", action="store_true", help="ensemble members' strength against their cost instead")
    p.add_argument("--curve-iters", type=lambda s: [int(v) for v in s.split(",")], default=[25, 50, 100])
    p.add_argument("--curve-draws", type=lambda s: [int(v) for v in s.split(",")], default=[4])
    p.add_argument("--curve-queries", type=lambda s: [int(v) for v in s.split(",")], default=[100, 300])
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.cost:
        return cost(args)
    if args.draws:
        return draws_curve(args)
    if args.curve:
        return strength_curve(args)
    if args.null:
        args.runs, args.pixel_eps = ["ensemble"], ["1e-6"]
        args.ensemble_iters = 5 if args.ensemble_iters == ENSEMBLE_ITERS else args.ensemble_iters
        args.ensemble_draws, args.ensemble_queries = args.ensemble_draws or 2, args.ensemble_queries or 10
    models = args.models.split(",")
    spent = {}
    if not args.tables_only:
        for model in models:
            spent[model] = {r: run(model, r, args) for r in args.runs}
    lines = []
    for model in models:
        if (args.out / f"{model}_ensemble" / "robust_auroc.csv").exists():
            ens = ensemble_table(args.out, model)
            print(f"\n## {model}: the ensemble\n\n" + markdown_table(ens, "{:.1f}"))
            pairs = paired_table(args.out, model)
            if len(pairs):
                print("\npaired, both sides at each detector's own worst case:\n\n" + markdown_table(pairs, "{}"))
            lines += [f"{model} {r['detector']} {r['ood_set']} eps {r['eps_pixel']} pixel ({r['n']}): clean "
                      f"{r['clean']}, ensemble robust AUROC {r['ensemble (worst case)']} (old rule "
                      f"{r['old rule (min of evaluation draws)']:.1f}), masking {r['masking_suspected'] or 'n/a'}"
                      for r in ens.to_dict("records")]
            lines += [f"{model} {r['A - B']} {r['ood_set']} eps {r['eps_pixel']}: {r['difference']} paired"
                      for r in pairs.to_dict("records")]
            info = json.loads((args.out / f"{model}_ensemble" / "run.json").read_text())
            print("\n" + markdown_table(pd.DataFrame([{"stage": k, "seconds": v}
                                                      for k, v in info["timings_s"].items()]), "{:.0f}"))
        if (args.out / f"{model}_published" / "table_hekal2026.csv").exists():
            pairs = published_pairs(args.out, model)
            if len(pairs):
                print(f"\n## {model}: their protocol, ROSS minus its base, paired\n\n" + markdown_table(pairs, "{}"))
                lines += [f"{model} {r['A - B']} {r['objective']} {r['eps (normalised)'] or 'clean'}: "
                          f"{r['difference, 95 %']} paired" for r in pairs.to_dict("records")
                          if r["eps (normalised)"] in ("", "8/255")]
        if not (args.out / f"{model}_published").exists() or not (args.out / f"{model}_adaptive").exists():
            continue
        table = audit_table(args.out, model)
        print(f"\n## {model}\n\n" + markdown_table(table, "{:.1f}"))
        print("\n" + markdown_table(timing(args.out, model), "{:.0f}"))
        if args.eval_seeds and not args.tables_only:
            print("\nROSS clean AUROC over evaluation seeds:\n" +
                  markdown_table(seed_spread(args.out, model, args.eval_seeds, args), "{:.2f}"))
        for det in [d for d in args.detectors if d.startswith("ross_")]:
            mine = table[(table.detector == det) & (table.ood_set == "tin")]
            for r in mine.to_dict("records"):
                lines.append(f"{model} {det} tin eps {r['eps_pixel']} pixel: published PGD-Min "
                             f"{r['published PGD-Min'] or 'n/a'} / PGD-Max {r['published PGD-Max'] or 'n/a'} at "
                             f"{r['published eps (normalised)']} normalised; robust AUROC (EOT, both sides) "
                             f"{r['robust (both sides)'] or 'n/a'}")
    if spent:
        print("wall seconds per run: " + json.dumps({m: {k: round(v) for k, v in s.items()} for m, s in spent.items()}))
    print("SUMMARY " + "; ".join(lines))


if __name__ == "__main__":
    main()
