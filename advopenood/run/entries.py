"""A benchmark run's leaderboard entries: ``entries/<detector>.json``, one per detector, written into the staging
folder with the run's other outputs and committed with them (:func:`advopenood.io.commit_output`), so that an
entry is never newer or older than the files it is read from.

An entry is a function of the run folder's files only (:func:`entry_of`): ``run.json`` (benchmark, model, seed,
versions, detector parameters and backend, wall time), ``asr.csv`` (clean accuracy and its Wilson interval),
``leaderboard.csv`` (clean AUROC / FPR95 per OOD group with intervals), ``ood.csv`` (per set),
``robust_auroc.csv``'s ``ensemble`` rows at the benchmark's eps (robust AUROC both sides, ID side only, OOD side
only, robust FPR95, each with its interval, ``masking_suspected``, sample sizes) and ``robust_ensemble.csv`` (the
members' per-attack curve), plus the digest of the run folder's manifest without the entries
(:func:`manifest_digest`). ``advopenood leaderboard --verify`` calls the same function on the run folder after
``advopenood verify`` passed on it, and compares field by field.
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from advopenood import io as aio

#: where a run folder keeps its entries
ENTRIES = "entries"
#: the entry format's version
FORMAT = 1
#: a CSV's eps (six significant digits) is the benchmark's within this relative tolerance
EPS_RTOL = 1e-5
#: the robust row's metrics an entry holds, each with ``_lo`` / ``_hi``
ROBUST_FIELDS = ("clean_auroc", "id_attacked_auroc", "ood_attacked_auroc", "robust_auroc", "robust_fpr95")


def _num(value: Any) -> float | None:
    """A CSV cell as a JSON number (None for NaN or empty), rounded as the CSV holds it."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def _read(folder: Path, name: str) -> pd.DataFrame:
    path = folder / name
    return pd.read_csv(path) if path.is_file() else pd.DataFrame()


def manifest_digest(files: dict[str, str]) -> str:
    """SHA-256 of the canonical JSON of ``relative path -> SHA-256`` of every file of the run but its entries (the
    entries are listed in the manifest too, and cannot hold their own digest)."""
    kept = {k: v for k, v in sorted(files.items()) if not k.startswith(f"{ENTRIES}/")}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def staged_files(folder: Path) -> dict[str, str]:
    """``relative path -> SHA-256`` of every file under a staging folder (what its manifest will list)."""
    return {rel: hashlib.sha256((folder / rel).read_bytes()).hexdigest() for rel in aio.files_under(folder)}


def _bounds(row: Any, metric: str) -> dict[str, float | None]:
    return {metric: _num(row.get(metric)), f"{metric}_lo": _num(row.get(f"{metric}_lo")),
            f"{metric}_hi": _num(row.get(f"{metric}_hi"))}


def _clean_accuracy(asr: pd.DataFrame, info: dict[str, Any]) -> dict[str, float | None]:
    if len(asr) and "clean_acc_lo" in asr:
        return _bounds(asr.iloc[0].to_dict(), "clean_acc")
    return {"clean_acc": _num(info.get("clean_acc")), "clean_acc_lo": None, "clean_acc_hi": None}


def entry_of(folder: Path, detector: str, files: dict[str, str], name: str | None = None) -> dict[str, Any]:
    """The entry of ``detector`` read from the run folder ``folder`` (module docstring); ``files``: the run's files
    and digests (:func:`staged_files` before the commit, the manifest after); ``name``: the run folder's name
    (default ``folder``'s)."""
    from advopenood.config.benchmarks import by_key

    info = json.loads((folder / "run.json").read_text())
    config = info["config"]
    bench = by_key(str(config.get("benchmark")))
    eps = bench.threat.value if bench is not None else math.nan
    board = _read(folder, "leaderboard.csv")
    mine = board[board["detector"] == detector].iloc[0].to_dict() if len(board) else {}
    ood = _read(folder, "ood.csv")
    groups = dict(zip(ood["ood_set"], ood["group"])) if len(ood) else {}
    robust = _read(folder, "robust_auroc.csv")
    if len(robust):
        robust = robust[(robust["detector"] == detector) & (robust["method"] == "ensemble")
                        & np.isclose(robust["eps"], eps, rtol=EPS_RTOL)]
    steps = _read(folder, "robust_ensemble.csv")
    if len(steps):
        steps = steps[(steps["detector"] == detector) & np.isclose(steps["eps"], eps, rtol=EPS_RTOL)]
    model = config["model"]
    bench_name, _, version = str(config.get("benchmark")).partition("@")
    return {
        "format": FORMAT,
        "benchmark": {"name": bench_name, "version": version,
                      "evaluation": bench.evaluation.version if bench is not None else None,
                      "eps": bench.threat.eps if bench is not None else None},
        "model": {"name": config.get("name"), "arch": info["model"]["arch"],
                  "checkpoint": Path(str(model.get("checkpoint") or "")).name or None,
                  "checkpoint_sha256": info["model"]["weights_sha256"],
                  **_clean_accuracy(_read(folder, "asr.csv"), info),
                  "training": "trained by the run" if model.get("train") else "a checkpoint"},
        "detector": {"name": detector, "params": (config.get("detector_params") or {}).get(detector, {}),
                     "backend": mine.get("backend") or (info.get("detector_backends") or {}).get(detector)},
        "images": {s.name: s.image_digest for s in bench.sets} if bench is not None else {},
        "clean": {group: {**_bounds(mine, f"{group}_auroc"), **_bounds(mine, f"{group}_fpr95")}
                  for group in ("near", "far") if _num(mine.get(f"{group}_auroc")) is not None},
        "robust": {str(r["ood_set"]): {"group": groups.get(r["ood_set"]),
                                       **{k: v for m in ROBUST_FIELDS for k, v in _bounds(r, m).items()},
                                       "masking_suspected": None if pd.isna(r.get("masking_suspected"))
                                       else bool(r.get("masking_suspected") in (True, "True", "true", 1)),
                                       "n_id": int(r["n_id"]), "n_ood": int(r["n_ood"])}
                   for r in (robust.to_dict("records") if len(robust) else [])},
        "curve": [{"ood_set": str(s["ood_set"]), "step": int(s["step"]), "attack": str(s["attack"]),
                   **_bounds(s, "robust_auroc")} for s in (steps.to_dict("records") if len(steps) else [])],
        "seed": info["seed"],
        "device": config.get("device"),
        "precision": info.get("precision") or {},
        "versions": {k: info["versions"].get(k) for k in ("advopenood", "torch", "numpy", "python")
                     if k in info["versions"]},
        "wall_s": _num((info.get("timings_s") or {}).get("total")),
        "run": {"folder": name or folder.name, "manifest_digest": manifest_digest(files)},
    }


def write_entries(stage: Path, final: Path) -> list[str]:
    """``entries/<detector>.json`` for every detector of ``leaderboard.csv`` in the staging folder ``stage`` of a
    benchmark run whose output folder is ``final``; the detectors written."""
    board = _read(stage, "leaderboard.csv")
    detectors = [str(d) for d in board["detector"]] if len(board) else []
    files = staged_files(stage)
    (stage / ENTRIES).mkdir(exist_ok=True)
    for det in detectors:
        aio.write_json(stage / ENTRIES / f"{det}.json", entry_of(stage, det, files, final.name))
    return detectors
