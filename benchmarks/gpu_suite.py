"""One prepared command for a lent GPU (issue 42, item 5): the ROSS audit and the robust study with the attack
ensemble, every run folder and table under one output folder.

    python benchmarks/gpu_suite.py --out runs/gpu_suite              # one H100: 1,000 + 1,000 images per set
    python benchmarks/gpu_suite.py --smoke --out /tmp/gpu_suite      # the same code path on the CPU, tiny sizes

What it runs (the configs are built by ``benchmarks/ross_audit.py`` and ``benchmarks/robust_study.py``, whose
``config`` functions this script calls; it only adds the ensemble and the sizes):

* ``OUT/ross_audit/``: the ROSS audit (published protocol and adaptive run) on both pack ResNet-20s, ``gen``,
  ``msp``, ``ross_gen``, ``ross_msp``, Tiny-ImageNet and Textures, with ``evaluator_params.robust_auroc.ensemble:
  standard`` (APGD on the score, APGD on the second objective, their EOT twins, Square on the score) beside the
  audit's PGD;
* ``OUT/robust_study/``: the robust study (all 16 detectors, ``smoothed_msp``, ``smoothed_knn``, ``ross_msp``, both
  ResNet-20s, Tiny-ImageNet) with the same ensemble;
* ``OUT/benchmark/`` (``--only benchmark``, issue 52): the standard benchmark ``cifar10-linf-8-full`` (every image
  of the pack's CIFAR-10 sets, the standard ensemble at AutoAttack's budgets: APGD 100 iterations, Square 5,000
  queries; ``configs/benchmarks/``) for ``msp`` on the adversarially trained ResNet-20, its entries, and the
  leaderboard built from them (``OUT/benchmark/leaderboard/``); sized as one model and one detector, since the full
  benchmark's Square alone is 5,000 forward passes of 41,200 images per detector and side (an estimate, not yet
  measured on an H100: the 16 detectors and the second model do not fit 12 minutes, and are not run);
* ``OUT/tables.md``: the audit's and the study's tables, and per run the ensemble's robust AUROC per detector with
  its interval, the lowest single-attack row and ``masking_suspected``;
* ``OUT/suite.json``: what finished, with each run's wall seconds and ``advopenood verify``'s verdict.

Sizes (:data:`SIZES`): ``gpu``: 1,000 ID + 1,000 OOD images per set, robust PGD 40 steps (the audit's) and APGD 100
iterations, EOT 4 draws, Square 1,000 queries (AutoAttack's 5,000 would alone take most of the 12 minutes over the
study's 76 Square sets; ``--square-queries`` changes it), bootstrap intervals of 2,000 resamples, batches of 500;
planned to fit 12 minutes on one H100 (not yet measured on one: the session that wrote it had no device).
``advopenood verify`` runs after each run (a single-threaded re-derivation, minutes at this size): ``--no-verify``
leaves it to another machine (``suite.json`` then says ``"verified": null``). ``smoke``: 8 + 8 images, ``ross_msp``
(4 noise copies, EOT attacks only) in the audit and ``msp`` in the study, the standard ResNet-20, one budget
(8/255), 2 steps and 4 queries, 200 bootstrap resamples, every run in this process: about a minute on a free 2-core
CPU (``tests/test_gpu_suite.py`` runs it).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

import robust_study  # noqa: E402
import ross_audit  # noqa: E402
from _common import DATA, REPO  # noqa: E402

SIZES = {
    "gpu": {"limit": 1000, "device": "cuda", "batch": 500, "shard": 1000, "fit": 2000, "steps": 40, "n_iter": 100,
            "eot": 4, "queries": 1000, "models": ross_audit.MODELS, "ood": ["tin", "textures"],
            "ross_detectors": ross_audit.DETECTORS, "pixel_eps": ["2/255", "8/255"], "published_eps": None,
            "randomised": "both", "resamples": 2000,
            "study_detectors": [*robust_study.DETECTORS, "smoothed_msp", "smoothed_knn", "ross_msp"], "ross": {},
            "benchmark": "cifar10-linf-8-full", "benchmark_models": ["cifar10_resnet20_at"],
            "benchmark_detectors": ["msp"]},
    "smoke": {"limit": 8, "device": "cpu", "batch": 8, "shard": 8, "fit": 96, "steps": 2, "n_iter": 2, "eot": 1,
              "queries": 4, "models": ["cifar10_resnet20"], "ood": ["tin"], "ross_detectors": ["ross_msp"],
              "pixel_eps": ["8/255"], "published_eps": ["8/255"], "randomised": "eot", "study_detectors": ["msp"],
              "ross": {"n": 4, "val_size": 32}, "resamples": 200, "benchmark": "smoke",
              "benchmark_models": ["cifar10_resnet20"], "benchmark_detectors": ["msp"]},
}
#: every iterative attack family the two scripts' configs name, and its iteration parameter
ITERATIONS = {"pgd": "steps", "adaptive": "steps", "adaptive_eot": "steps", "hekal_min": "steps",
              "hekal_max": "steps", "robust_id": "steps", "robust_ood": "steps", "robust_apgd_id": "n_iter",
              "robust_apgd_ood": "n_iter", "robust_apgd_aux_id": "n_iter", "robust_apgd_aux_ood": "n_iter"}


def with_ensemble(path: Path, size: dict, queries: int) -> Path:
    """Rewrite the config at ``path`` for the suite: the ensemble on, the sizes' fit rows, iterations and (ROSS)
    noise copies; returns ``path``."""
    cfg = yaml.safe_load(path.read_text())
    params = cfg.setdefault("attack_params", {}) or {}
    for family, key in ITERATIONS.items():
        params.setdefault(family, {})[key] = size[key]
    cfg["attack_params"] = params
    robust = cfg.setdefault("evaluator_params", {}).setdefault("robust_auroc", {})
    robust.update(ensemble="standard", square_queries=queries, eot=size["eot"])
    if "randomised_attacks" in robust:
        robust["randomised_attacks"] = size["randomised"]
    cfg["data"]["fit_limit"] = size["fit"]
    cfg["ci"] = {**(cfg.get("ci") or {}), "method": "bootstrap", "resamples": size["resamples"]}
    for entry in cfg.get("attacks") or []:  # the published protocol's budgets, fewer in the smoke test
        if isinstance(entry, dict) and size["published_eps"] and str(entry["name"]).startswith("hekal_"):
            entry["eps"] = list(size["published_eps"])
        # an entry naming a family's member (hekal_min_ross_msp) takes no attack_params.<family>
        # (config.plan.expand_attacks): the sizes' iterations go into its own params
        key = next((k for f, k in ITERATIONS.items() if isinstance(entry, dict) and
                    str(entry["name"]).startswith(f"{f}_")), None)
        if key:
            entry.setdefault("params", {})[key] = size[key]
    for det in cfg.get("detectors") or []:
        if det.startswith("ross_") and size["ross"]:
            cfg.setdefault("detector_params", {}).setdefault(det, {}).update(size["ross"])
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def run_config(path: Path, folder: Path, limit: int, verify: bool = True) -> dict:
    """``advopenood run`` of ``path`` into ``folder``, then ``advopenood verify``, in this process (one import of
    torch for the whole suite); wall seconds and the verdict. A run that fails stops the suite."""
    from advopenood.cli.main import main as cli

    start = time.perf_counter()
    rc = cli(["run", "--config", str(path), "--limit", str(limit), "--out", str(folder), "--quiet"])
    if rc != 0:
        raise SystemExit(f"gpu_suite: advopenood run {path} exited with code {rc}")
    seconds = time.perf_counter() - start
    verified = cli(["verify", str(folder)]) == 0 if verify else None
    return {"folder": str(folder), "seconds": round(seconds, 1), "verified": verified}


def ross_runs(out: Path, size: dict, queries: int, verify: bool) -> dict[str, dict]:
    """The ROSS audit's two runs per model, through ``ross_audit.config``, the adaptive one with the ensemble."""
    args = SimpleNamespace(out=out, eot=size["eot"], ross=dict(ross_audit.TABLE2), detectors=size["ross_detectors"],
                           pixel_eps=size["pixel_eps"], device=size["device"], batch_size=size["batch"],
                           shard_size=size["shard"], data_root=DATA, ood=size["ood"])
    out.mkdir(parents=True, exist_ok=True)
    done = {}
    for model in size["models"]:
        for run in ("published", "adaptive"):
            path = with_ensemble(ross_audit.config(model, run, args), size, queries)
            if run == "published":  # the published protocol has no robust AUROC: only the sizes apply
                cfg = yaml.safe_load(path.read_text())
                cfg.pop("evaluator_params", None)
                path.write_text(yaml.safe_dump(cfg, sort_keys=False))
            done[f"ross_audit/{model}_{run}"] = run_config(path, out / f"{model}_{run}", size["limit"], verify)
    return done


def study_runs(out: Path, size: dict, queries: int, verify: bool) -> dict[str, dict]:
    """The robust study's run per model, through ``robust_study.config``, with PGD and the ensemble."""
    out.mkdir(parents=True, exist_ok=True)
    done = {}
    for model in size["models"]:
        path = robust_study.config(model, out, DATA, size["study_detectors"], size["device"], size["batch"], False,
                                   size["shard"], size["eot"], "", ("pgd",), size["steps"])
        done[f"robust_study/{model}"] = run_config(with_ensemble(path, size, queries), out / model, size["limit"],
                                                   verify)
    return done


def benchmark_runs(out: Path, size: dict, verify: bool) -> dict[str, dict]:
    """The standard benchmark's run per model (``advopenood run --benchmark``: it fixes images, budgets and the
    ensemble; the sizes give only the device, detectors and batch), then ``advopenood leaderboard`` of its entries
    (with ``--verify`` unless ``verify`` is False) into ``OUT/leaderboard``."""
    from advopenood.cli.main import main as cli

    out.mkdir(parents=True, exist_ok=True)
    done = {}
    for model in size["benchmark_models"]:
        cfg = yaml.safe_load((REPO / "configs" / f"{model}.yaml").read_text())
        cfg.update(device=size["device"], batch_size=size["batch"], shard_size=size["shard"])
        cfg["data"]["root"] = str(DATA)
        path = out / f"{model}.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        start = time.perf_counter()
        folder = out / f"{size['benchmark']}_{model}"
        rc = cli(["run", "--benchmark", size["benchmark"], "--config", str(path), "--detectors",
                  ",".join(size["benchmark_detectors"]), "--out", str(folder), "--quiet"])
        if rc != 0:
            raise SystemExit(f"gpu_suite: advopenood run --benchmark {size['benchmark']} exited with code {rc}")
        seconds = time.perf_counter() - start
        verified = cli(["leaderboard", str(folder), "--verify"]) == 0 if verify else None
        done[f"benchmark/{size['benchmark']}_{model}"] = {"folder": str(folder), "seconds": round(seconds, 1),
                                                          "verified": verified}
    cli(["leaderboard", *(r["folder"] for r in done.values()), "--out", str(out / "leaderboard")])
    return done


def ensemble_table(folder: Path) -> pd.DataFrame:
    """Per detector, OOD set and eps of a run: the ensemble's robust AUROC with its interval, the lowest
    single-attack row's, which attack that is, and ``masking_suspected``."""
    rob = pd.read_csv(folder / "robust_auroc.csv")
    rows = []
    for (det, ood_set, eps), part in rob.groupby(["detector", "ood_set", "eps"], sort=False):
        ens, single = part[part["method"] == "ensemble"], part[part["method"] != "ensemble"]
        low = single.sort_values("robust_auroc").iloc[0]
        rows.append({"detector": det, "ood_set": ood_set, "eps": f"{eps * 255:.0f}/255",
                     "ensemble": "" if not len(ens) else robust_study.cell(*ens.iloc[0][
                         ["robust_auroc", "robust_auroc_lo", "robust_auroc_hi"]]),
                     "lowest single": robust_study.cell(*low[["robust_auroc", "robust_auroc_lo", "robust_auroc_hi"]]),
                     "lowest by": f"{low['method']} ({low['attack_family']})",
                     "masking_suspected": part["masking_suspected"].iloc[0]})
    return pd.DataFrame(rows)


def tables(out: Path, size: dict, done: dict[str, dict]) -> str:
    """The Markdown of every finished run's tables."""
    from advopenood.io import markdown_table

    parts = []
    for model in size["models"]:
        if f"ross_audit/{model}_adaptive" in done:
            audit = ross_audit.audit_table(out / "ross_audit", model)
            parts.append(f"## ROSS audit, {model}\n\n" + markdown_table(audit, "{:.1f}"))
            parts.append("Ensemble:\n\n" + markdown_table(ensemble_table(out / "ross_audit" / f"{model}_adaptive"),
                                                          "{:.1f}"))
        if f"robust_study/{model}" in done:
            t = robust_study.table(out / "robust_study", model, size["study_detectors"])
            parts.append(f"## Robust study, {model}\n\n" + markdown_table(t.drop(columns=["_robust", "_lo", "_hi"]),
                                                                         "{:.1f}"))
            parts.append("Ensemble:\n\n" + markdown_table(ensemble_table(out / "robust_study" / model), "{:.1f}"))
    return "\n\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (under a minute)")
    p.add_argument("--square-queries", type=int, default=None, help="Square's queries (default: the sizes')")
    p.add_argument("--only", choices=["ross", "study", "benchmark"], default=None,
                   help="run one of the audit and the study, or the standard benchmark alone (not run by default)")
    p.add_argument("--no-verify", action="store_true",
                   help="leave `advopenood verify RUN` to another machine (a single-threaded re-derivation)")
    args = p.parse_args(argv)
    size = SIZES["smoke" if args.smoke else "gpu"]
    queries = args.square_queries or size["queries"]
    if queries < 1:
        p.error(f"--square-queries {queries}; valid choices: an integer >= 1")
    args.out.mkdir(parents=True, exist_ok=True)
    start, done = time.perf_counter(), {}
    if args.only in (None, "ross"):
        done.update(ross_runs(args.out / "ross_audit", size, queries, not args.no_verify))
    if args.only in (None, "study"):
        done.update(study_runs(args.out / "robust_study", size, queries, not args.no_verify))
    if args.only == "benchmark":
        done.update(benchmark_runs(args.out / "benchmark", size, not args.no_verify))
    (args.out / "tables.md").write_text(tables(args.out, size, done))
    total = round(time.perf_counter() - start, 1)
    (args.out / "suite.json").write_text(json.dumps({"sizes": "smoke" if args.smoke else "gpu", "queries": queries,
                                                     "runs": done, "seconds": total}, indent=1))
    for name, r in done.items():
        verdict = {True: "ok", False: "FAILED", None: "not run"}[r["verified"]]
        print(f"finished {name}: {r['seconds']:.0f} s, verify {verdict}")
    print(f"tables: {args.out / 'tables.md'}; {len(done)} runs in {total:.0f} s")
    return 1 if any(r["verified"] is False for r in done.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
