"""Re-derivation of ``table_hekal2026.csv`` from ``scores/*.npz``, ``run.json`` and the stored sets (shards and
``spec.json`` under each set's ``path``), written apart from ``plugins/evaluators/hekal2026/plugin.py`` and
:mod:`advopenood.evaluation.metrics`: every AUROC, FPR95 and interval from the independent checker
:mod:`advopenood.evaluation.oracle` (through :func:`advopenood_plugins.kit.verify.rederive_bounds`), which sets a row
uses from ``run.json`` (each set's attack, parameters and source) and the registered attack classes, ``eps_pixel``
from the network's normalisation std the set's ``spec.json`` records, ``left_range`` from the stored images.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from advopenood.plugin import oracle

TABLE = "table_hekal2026.csv"
KEYS = ["detector", "ood_set", "attack"]
CHECKED = ["eps", "eps_units", "eps_pixel", "objective", "through", "clip", "left_range", "n_id", "n_ood", "auroc",
           "auroc_lo", "auroc_hi", "fpr95", "fpr95_lo", "fpr95_hi", "ci"]


def _class(kind: str, name: str) -> Any:
    from advopenood.plugin import registry

    return registry.get(kind, name)


def _stored(path: str) -> tuple[float, float]:
    """``(share of images with a pixel outside [0, 1], largest normalisation std)`` of a stored set."""
    folder = Path(path)
    out = total = 0
    for shard in sorted(folder.glob("shard_*.npz")):
        with np.load(shard) as d:
            x = d["x_adv"]
        bad = (x < 0) | (x > 1)
        out += int(bad.reshape(len(x), -1).any(axis=1).sum())
        total += len(x)
    spec = json.loads((folder / "spec.json").read_text())
    std = max((spec.get("context") or {}).get("pixel_std") or [1.0])
    return (out / total if total else math.nan), float(std)


def hekal_sets(run: Any) -> list[dict[str, Any]]:
    """Every hekal set of the run (attack class with ``objective == "hekal"``): name, detector, side, source,
    parameters and what its stored images give."""
    out = []
    for name, entry in (run.info.get("attacks") or {}).items():
        cls = _class("attacks", entry["attack"])
        if getattr(cls, "objective", "") != "hekal":
            continue
        left, std = _stored(entry["path"])
        out.append({"set": name, "detector": cls.detector, "side": cls.side, "source": entry.get("source", "id"),
                    "params": entry["params"], "left_range": left, "std": std})
    return out


def _through(detector: str, params: dict[str, Any]) -> str:
    """``base`` for a detector built on a base detector (:class:`~advopenood.capabilities.Composite`, ``ross_<det>``)
    attacked through it."""
    from advopenood.plugin import is_composite

    return "base" if params["through"] == "base" and is_composite(_class("detectors", detector)) else "self"


def rederive_hekal(run: Any) -> pd.DataFrame:
    """table_hekal2026.csv re-computed: per detector with scores and hekal sets, per natural OOD set, the clean row,
    one PGD-Min row per ``hekal_min`` set and one PGD-Max row per ``hekal_max`` set of that OOD set."""
    from advopenood_plugins.kit.verify import rederive_bounds

    sets = hekal_sets(run)
    natural = list(((run.info.get("data") or {}).get("ood") or {}).keys())
    rows = []
    for det in sorted({s["detector"] for s in sets} & set(run.detectors)):
        arrays = run.scores(det)
        for ood_set in (o for o in natural if o in arrays):
            cells = [("No Attack", None, arrays["id"], arrays[ood_set], f"ood|{det}|{ood_set}")]
            for s in (s for s in sets if s["detector"] == det and s["set"] in arrays):
                if s["side"] == "min":
                    key = f"hekal2026|{det}|{s['set']}|{ood_set}"
                    cells.append(("PGD-Min", s, arrays[s["set"]], arrays[ood_set], key))
                elif s["source"] == ood_set:
                    cells.append(("PGD-Max", s, arrays["id"], arrays[s["set"]], f"ood|{det}|{s['set']}"))
            for objective, s, conf_id, conf_ood, key in cells:
                bounds = rederive_bounds(conf_id, conf_ood, run, key)
                row = {"detector": det, "ood_set": ood_set, "objective": objective, "attack": "none", "eps": math.nan,
                       "eps_units": math.nan, "eps_pixel": math.nan, "through": math.nan, "clip": math.nan,
                       "left_range": math.nan, "n_id": len(conf_id), "n_ood": len(conf_ood),
                       "auroc": oracle.auroc(conf_id, conf_ood), "fpr95": oracle.fpr95(conf_id, conf_ood),
                       **{c: bounds[c] for c in ("auroc_lo", "auroc_hi", "fpr95_lo", "fpr95_hi", "ci")}}
                if s is not None:
                    p, eps = s["params"], float(s["params"]["eps"])
                    row.update(attack=s["set"], eps=eps, eps_units=p["units"], clip=bool(p["clip"]),
                               eps_pixel=eps * s["std"] if p["units"] == "normalised" else eps,
                               through=_through(det, p), left_range=s["left_range"])
                rows.append(row)
    return pd.DataFrame(rows, columns=KEYS + CHECKED)


def verify_hekal(run: Any) -> list[str]:
    """Differences between ``table_hekal2026.csv`` and its re-derivation (``advopenood verify``)."""
    from advopenood.plugin import compare

    if not run.has(TABLE):  # none written when there was nothing to compute (run.json's nothing_computed)
        expected = len(rederive_hekal(run))
        return [f"{TABLE}: the evaluator ran but the table is missing ({expected} rows expected)"] if expected else []
    return compare(rederive_hekal(run), run.table(TABLE), KEYS, CHECKED, atol=1e-6, table=TABLE)
