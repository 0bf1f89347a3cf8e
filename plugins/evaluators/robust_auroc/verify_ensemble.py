"""Re-derivation of the ensemble rows of ``robust_auroc.csv``, of ``robust_ensemble.csv`` and of the
``masking_suspected`` column (``advopenood verify``), written apart from ``ensemble.py``.

The sets come from ``run.json`` through :func:`~advopenood_plugins.kit.verify_robust.robust_sets`; the
per-image worst case is a plain loop over images; every AUROC and bootstrap replicate comes from the independent
checker :mod:`advopenood.evaluation.oracle` (Mann-Whitney AUROC, the cell's seeded resamples as a loop).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from advopenood.plugin import oracle
from advopenood_plugins.kit.verify_robust import ROBUST_BOUNDS, ROBUST_METRICS, robust_bounds, robust_sets

#: the order attacks join the ensemble, as the writer documents it (``<method>`` or ``<method>_eot``)
JOIN_ORDER = ["apgd", "apgd_eot", "apgd_aux", "apgd_aux_eot", "pgd", "pgd_eot", "square"]
STEP_KEYS = ["detector", "ood_set", "eps", "step"]
STEP_VALUES = ["attack", "id_attack", "ood_attack", "robust_auroc", "robust_auroc_lo", "robust_auroc_hi", "ci",
               "id_images_set", "ood_images_set", "n_id", "n_ood"]


def _label(entry: dict[str, Any]) -> str:
    return entry["method"] + ("_eot" if entry["family"] == "eot" else "")


def cells(run: Any) -> list[tuple[str, str, float, list[tuple[str, list[str], list[str]]]]]:
    """``(detector, OOD set, eps, steps)`` of every cell with something to combine: at least one set on each side
    and more than one set on a side."""
    sets = [s for s in robust_sets(run) if s["detector"] in run.detectors]
    out = []
    for det in dict.fromkeys(s["detector"] for s in sets):
        mine = [s for s in sets if s["detector"] == det]
        budgets: list[float] = []
        for s in mine:
            if not any(math.isclose(s["eps"], b, rel_tol=1e-6) for b in budgets):
                budgets.append(s["eps"])
        for ood_set in dict.fromkeys(s["source"] for s in mine if s["side"] == "ood"):
            for eps in budgets:
                at = [s for s in mine if math.isclose(s["eps"], eps, rel_tol=1e-6)]
                steps = [(lab, [s["set"] for s in at if s["side"] == "id" and _label(s) == lab],
                          [s["set"] for s in at if s["side"] == "ood" and _label(s) == lab and s["source"] == ood_set])
                         for lab in JOIN_ORDER]
                steps = [st for st in steps if st[1] or st[2]]
                n_id, n_ood = sum(len(st[1]) for st in steps), sum(len(st[2]) for st in steps)
                if n_id and n_ood and n_id + n_ood > 2:
                    out.append((det, ood_set, eps, steps))
    return out


def _worst(start: tuple[np.ndarray, np.ndarray], others: list[tuple[np.ndarray, np.ndarray]], lowest: bool
           ) -> tuple[np.ndarray, np.ndarray]:
    """Image by image, ``(value, chosen on)`` of the set whose choice confidence is the lowest (``lowest``) or highest,
    the first in order on a tie, NaN where any of the image's values or choices is NaN. A set is
    ``(confidences, choice confidences)``: for a randomised detector the choice is the saved attack-stream
    ``<set>.select`` (the writer's rule: choose on attack noise, score on evaluation noise), else the confidences."""
    value, chosen = np.array(start[0], dtype=float), np.array(start[1], dtype=float)
    for i in range(len(value)):
        for conf, by in others:
            if math.isnan(by[i]) or ((by[i] < chosen[i]) if lowest else (by[i] > chosen[i])):
                value[i], chosen[i] = conf[i], by[i]
            if math.isnan(conf[i]):
                value[i] = math.nan
    return value, chosen


def choice(arrays: dict[str, np.ndarray], name: str) -> tuple[np.ndarray, np.ndarray]:
    """Set ``name``'s confidences and the confidences a worst case chooses it on (``<name>.select`` where saved)."""
    conf = arrays[name].astype(float)
    return conf, arrays[f"{name}.select"].astype(float) if f"{name}.select" in arrays else conf


#: per (detector, OOD set, eps as %.6g): the re-derived per-image worst case (ID side, OOD side)
Worst = dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]]


def rederive_ensemble(run: Any) -> tuple[pd.DataFrame, pd.DataFrame, Worst]:
    """The ensemble rows of ``robust_auroc.csv`` and ``robust_ensemble.csv``, re-computed, and each cell's worst
    case (for ``robust_paired.csv``)."""
    rows, steps, worst = [], [], {}
    for det, ood_set, eps, members in cells(run):
        arrays = run.scores(det)
        clean_id, clean_ood = arrays["id"].astype(float), arrays[ood_set].astype(float)
        at_id, at_ood = choice(arrays, "id"), choice(arrays, ood_set)
        # one number, one interval: the steps share the ensemble row's draws; the clean cell is ood.csv's
        key, own = f"robust|{det}|ensemble|{ood_set}|{eps:.6g}", {"clean_auroc": f"ood|{det}|{ood_set}"}
        for k, (lab, ids, oods) in enumerate([("none", [], []), *members]):
            chosen_id = _worst(at_id, [choice(arrays, n) for n in ids], True)
            chosen_ood = _worst(at_ood, [choice(arrays, n) for n in oods], False)
            (new_id, moved_id), (new_ood, moved_ood) = chosen_id, chosen_ood
            got = robust_bounds((clean_id, clean_ood, new_id, new_ood), run, key, own)
            shown = "clean_auroc" if k == 0 else "robust_auroc"
            steps.append({"detector": det, "ood_set": ood_set, "eps": f"{eps:.6g}", "step": k, "attack": lab,
                          "id_attack": "+".join(ids), "ood_attack": "+".join(oods),
                          "robust_auroc": oracle.auroc(new_id, new_ood), "robust_auroc_lo": got[f"{shown}_lo"],
                          "robust_auroc_hi": got[f"{shown}_hi"], "ci": got["ci"],
                          "id_images_set": int(np.sum(moved_id != at_id[1])),
                          "ood_images_set": int(np.sum(moved_ood != at_ood[1])), "n_id": len(new_id),
                          "n_ood": len(new_ood)})
            at_id, at_ood = chosen_id, chosen_ood
        worst_id, worst_ood = at_id[0], at_ood[0]
        worst[det, ood_set, f"{eps:.6g}"] = (worst_id, worst_ood)
        rows.append({"detector": det, "id_attack": "+".join(n for m in members for n in m[1]),
                     "ood_attack": "+".join(n for m in members for n in m[2]), "ood_set": ood_set, "eps": eps,
                     "method": "ensemble", "attack_family": "all", "clean_auroc": oracle.auroc(clean_id, clean_ood),
                     "id_attacked_auroc": oracle.auroc(worst_id, clean_ood),
                     "ood_attacked_auroc": oracle.auroc(clean_id, worst_ood),
                     "robust_auroc": oracle.auroc(worst_id, worst_ood),
                     "robust_fpr95": oracle.fpr95(worst_id, worst_ood),
                     "n_id": len(worst_id), "n_ood": len(worst_ood), **got})  # the last step's: the same cell
    return pd.DataFrame(rows), pd.DataFrame(steps, columns=STEP_KEYS + STEP_VALUES), worst


def masking(run: Any, single: pd.DataFrame) -> dict[tuple[str, str, str], Any]:
    """``(detector, OOD set, eps as %.6g) -> True / False / NaN``: Square below every gradient row beyond the paired
    interval (``ensemble.py``'s rule), from the re-derived single-attack rows ``single``."""
    from advopenood_plugins.kit.verify import ci_plan

    plan = ci_plan(run)
    out: dict[tuple[str, str, str], Any] = {}
    for (det, ood_set, eps), part in single.groupby(["detector", "ood_set", "eps"], sort=False):
        key = (det, ood_set, f"{float(eps):.6g}")
        out[key] = math.nan
        square = part[part["method"] == "square"].to_dict("records")
        gradient = part[part["method"].isin(["pgd", "apgd"])].to_dict("records")
        if not square or not gradient or plan.method == "none":
            continue
        cell = lambda r: (run.scores(det)[r["id_attack"]].astype(float), run.scores(det)[r["ood_attack"]].astype(float))
        sq = cell(square[0])
        n, m = len(sq[0]), len(sq[1])
        if min(n, m) < 2:
            continue
        grads = [cell(g) for g in gradient]
        reps = [r["auroc"] for r in plan.paired(f"robust_masking|{det}|{ood_set}|{float(eps):.6g}", [sq, *grads],
                                                ("auroc",))] if plan.bootstrap else [None] * (len(grads) + 1)
        lows = [plan.difference(g, sq, r, reps[0])[0] for g, r in zip(grads, reps[1:])]
        out[key] = math.nan if any(math.isnan(lo) for lo in lows) else all(lo > 0 for lo in lows)
    return out


def verify_ensemble(run: Any, single: pd.DataFrame, rows: pd.DataFrame, steps: pd.DataFrame) -> list[str]:
    """Differences between the written ensemble rows, ``robust_ensemble.csv`` and ``masking_suspected`` and their
    re-derivation from the scores (``single``: the re-derived single-attack rows; ``rows``, ``steps``: the first two
    of :func:`rederive_ensemble`)."""
    from advopenood.plugin import compare

    written = run.table("robust_auroc.csv")
    mine = written[written["method"] == "ensemble"] if "method" in written.columns else written.iloc[:0]
    lines = compare(rows.reindex(columns=["detector", "id_attack", "ood_attack", "ood_set", "eps", *ROBUST_METRICS,
                                          *ROBUST_BOUNDS, "ci", "n_id", "n_ood"]), mine,
                    ["detector", "id_attack", "ood_attack"], ["ood_set", "eps", *ROBUST_METRICS, *ROBUST_BOUNDS, "ci",
                                                            "n_id", "n_ood"], atol=1e-6, table="robust_auroc.csv")
    if len(steps) or run.has("robust_ensemble.csv"):
        table = run.table("robust_ensemble.csv") if run.has("robust_ensemble.csv") else steps.iloc[:0]
        table = table.assign(eps=[f"{float(e):.6g}" for e in table["eps"]]).fillna({"id_attack": "", "ood_attack": ""})
        lines += compare(steps, table, STEP_KEYS, STEP_VALUES, atol=1e-6, table="robust_ensemble.csv")
    if "masking_suspected" in written.columns or (single["method"] == "square").any():
        flags = masking(run, single)
        for i, r in enumerate(written.to_dict("records")):
            want = flags.get((r["detector"], r["ood_set"], f"{float(r['eps']):.6g}"), math.nan)
            have = r.get("masking_suspected", math.nan)
            if (pd.isna(want) != pd.isna(have)) or (not pd.isna(want) and bool(want) != _truth(have)):
                lines.append(f"robust_auroc.csv: row {i} ({r['detector']}, {r['method']}) masking_suspected: written "
                             f"{have!r}, re-derived {want!r}")
    return lines


def _truth(value: Any) -> bool:
    """A CSV cell read back as a boolean (``True`` / ``False``, as pandas writes them)."""
    return str(value).strip().lower() in ("true", "1", "1.0")
