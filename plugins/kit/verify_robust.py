"""Re-derivation of the robust-AUROC rows (``robust_auroc.csv``'s single-attack rows, read by ``levels`` too) from
``scores/*.npz`` and ``run.json``, written apart from the writers (:mod:`advopenood_plugins.kit.robust`) and
:mod:`advopenood.evaluation.metrics`: a checker shared by the ``robust_auroc`` and ``levels`` verify hooks.

Every AUROC, FPR95 and interval comes from the independent checker :mod:`advopenood.evaluation.oracle` (AUROC as the
Mann-Whitney statistic, FPR95 as OpenOOD's, the bootstrap as a plain loop over the cell's seeded resamples). Which
sets a row uses is re-derived from ``run.json`` (each set's attack, parameters and source) and the registered attack
classes.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from advopenood.plugin import oracle

ROBUST_METRICS = ("clean_auroc", "id_attacked_auroc", "ood_attacked_auroc", "robust_auroc", "robust_fpr95")
ROBUST_BOUNDS = [f"{m}_{end}" for m in ROBUST_METRICS for end in ("lo", "hi")]
#: the AUROCs of a robust row: (ID array, OOD array) among (clean ID, clean OOD, attacked ID, attacked OOD)
_PAIRS = {"clean_auroc": (0, 1), "id_attacked_auroc": (2, 1), "ood_attacked_auroc": (0, 3), "robust_auroc": (2, 3)}


def robust_bounds(arrays: tuple[np.ndarray, ...], run: Any, key: str, own_keys: dict[str, str] | None = None
                  ) -> dict[str, Any]:
    """A robust row's ``<m>_lo`` / ``<m>_hi``, ``ci`` and ``error`` re-derived by the run's ``ci`` plan from
    ``arrays`` = (clean ID, clean OOD, attacked ID, attacked OOD): the bootstrap as a loop over the cell's seeded
    resamples (the same ID indices for both ID arrays, the same OOD indices for both OOD arrays), each resample's
    AUROCs and FPR95 from :mod:`advopenood.evaluation.oracle`; DeLong's interval per AUROC as ``ood.csv``'s. A cell
    of ``own_keys`` (the clean and the attacked-OOD AUROC, ``ood.csv``'s cells too) is resampled with its own key, as
    ``ood.csv``'s."""
    from advopenood_plugins.kit.verify import ci_plan

    plan = ci_plan(run)
    out: dict[str, Any] = {c: math.nan for c in ROBUST_BOUNDS}
    out.update(ci=plan.label, error=math.nan)  # empty = NaN
    clean_id, clean_ood, adv_id, adv_ood = (np.asarray(a, float).ravel() for a in arrays)
    n, m = len(adv_id), len(adv_ood)
    if plan.method == "none":
        return out
    if (len(clean_id), len(clean_ood)) != (n, m):
        out["error"] = (f"no interval: the attacked sets ({n} ID, {m} OOD images) are not paired with the clean "
                        f"ones ({len(clean_id)}, {len(clean_ood)})")
        return out
    if min(n, m) < 2:
        out["error"] = f"no interval: {n} ID and {m} OOD images (an interval needs at least 2 per side)"
        return out
    if any(np.isnan(a).any() for a in (clean_id, clean_ood, adv_id, adv_ood)):
        out["error"] = "no interval: NaN scores"
        return out
    sides = (clean_id, clean_ood, adv_id, adv_ood)
    if plan.method == "delong":
        for metric, (i, j) in _PAIRS.items():
            out[f"{metric}_lo"], out[f"{metric}_hi"] = oracle.delong_interval(sides[i], sides[j])
        return _at_bounds(out, sides, plan.label)
    own = own_keys or {}
    shared = [metric for metric in _PAIRS if metric not in own]
    every = plan.paired(key, [(sides[_PAIRS[metric][0]], sides[_PAIRS[metric][1]]) for metric in shared], ("auroc",))
    reps = {metric: r["auroc"] for metric, r in zip(shared, every)}
    for metric, own_key in own.items():  # ood.csv's cells, resampled with ood.csv's keys
        a, b = _PAIRS[metric]
        reps[metric] = plan.paired(own_key, [(sides[a], sides[b])], ("auroc",))[0]["auroc"]
    reps["robust_fpr95"] = plan.paired(key, [(adv_id, adv_ood)], ("fpr95",))[0]["fpr95"]
    for metric, values in reps.items():
        out[f"{metric}_lo"], out[f"{metric}_hi"] = plan.interval(values)
    return _at_bounds(out, sides, plan.label)


def _at_bounds(out: dict[str, Any], sides: tuple[np.ndarray, ...], label: str) -> dict[str, Any]:
    """``out`` after the checker's rule at a bound (:func:`advopenood.evaluation.oracle.bounded`) on each metric,
    ``ci`` naming the methods taken."""
    values = {metric: oracle.auroc(sides[i], sides[j]) for metric, (i, j) in _PAIRS.items()}
    values["robust_fpr95"] = oracle.fpr95(sides[2], sides[3])
    methods = {}
    for metric in ROBUST_METRICS:
        out[f"{metric}_lo"], out[f"{metric}_hi"], methods[metric] = oracle.bounded(
            metric, values[metric], out[f"{metric}_lo"], out[f"{metric}_hi"], len(sides[2]), len(sides[3]))
    out["ci"] = oracle.bound_label(label, methods)
    return out


def attack_class(name: str) -> Any:
    """The registered class of attack ``name``."""
    from advopenood.plugin import registry

    return registry.get("attacks", name)


def robust_sets(run: Any) -> list[dict[str, Any]]:
    """Every robust-AUROC set of the run (attack class with ``objective == "robust"``): name, detector, method, attack
    family (``eot`` for a class that names the plain attack it averages the gradient of, ``plain`` otherwise), side,
    eps and the OOD set it perturbed."""
    out = []
    for name, entry in (run.info.get("attacks") or {}).items():
        cls = attack_class(entry["attack"])
        if getattr(cls, "objective", "") != "robust":
            continue
        side = "id" if entry.get("source", "id") == "id" else "ood"
        family = "plain" if getattr(cls, "plain_attack", entry["attack"]) in ("", entry["attack"]) else "eot"
        out.append({"set": name, "detector": cls.detector, "method": cls.method, "family": family, "side": side,
                    "eps": float(entry["params"]["eps"]), "source": entry.get("source", "id")})
    return out


def rederive_robust(run: Any) -> pd.DataFrame:
    """robust_auroc.csv re-computed: one row per ID-side and OOD-side set of a detector with saved scores, with the
    same method, attack family and eps (relative tolerance 1e-6)."""
    sets = robust_sets(run)
    rows = []
    for a in (s for s in sets if s["side"] == "id"):
        if a["detector"] not in run.detectors:
            continue
        arrays = run.scores(a["detector"])
        for b in sets:
            if b["side"] != "ood" or b["detector"] != a["detector"] or b["method"] != a["method"] \
                    or b["family"] != a["family"] or not math.isclose(a["eps"], b["eps"], rel_tol=1e-6):
                continue
            clean_id, clean_ood = arrays["id"], arrays[b["source"]]
            adv_id, adv_ood = arrays[a["set"]], arrays[b["set"]]
            key = f"robust|{a['detector']}|{a['set']}|{b['set']}"
            own = {"clean_auroc": f"ood|{a['detector']}|{b['source']}",  # ood.csv's cells: their keys
                   "ood_attacked_auroc": f"ood|{a['detector']}|{b['set']}"}
            rows.append({"detector": a["detector"], "id_attack": a["set"], "ood_attack": b["set"],
                         "ood_set": b["source"], "eps": a["eps"], "method": a["method"], "attack_family": a["family"],
                         "clean_auroc": oracle.auroc(clean_id, clean_ood),
                         "id_attacked_auroc": oracle.auroc(adv_id, clean_ood),
                         "ood_attacked_auroc": oracle.auroc(clean_id, adv_ood),
                         "robust_auroc": oracle.auroc(adv_id, adv_ood), "robust_fpr95": oracle.fpr95(adv_id, adv_ood),
                         "n_id": len(adv_id), "n_ood": len(adv_ood),
                         **robust_bounds((clean_id, clean_ood, adv_id, adv_ood), run, key, own)})
    return pd.DataFrame(rows, columns=["detector", "id_attack", "ood_attack", "ood_set", "eps", "method",
                                       "attack_family", *ROBUST_METRICS, *ROBUST_BOUNDS, "ci", "error", "n_id",
                                       "n_ood"])
