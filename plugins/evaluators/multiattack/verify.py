"""``verify`` hook of the ``multiattack`` evaluator: ``multiattack_curves.csv`` and ``multiattack.csv`` re-derived.

Inputs: ``scores/<det>.npz`` (clean confidences, each adversarial set's confidences and its ``<set>.positive`` mask,
the protocol's OOD positives) and ``run.json`` (sets, protocol, backend, the evaluator's parameters). Separate from
:mod:`advopenood_plugins.evaluators.multiattack.plugin` and :mod:`advopenood_plugins.evaluators.mead.plugin` (nothing imported from either): metrics
come from the independent checker :mod:`advopenood.evaluation.oracle`, worst cases from
:func:`advopenood_plugins.kit.verify_worstcase.worst_case`, and the competitiveness ratios (MultiRobustBench
Definition 3.5, Eqs. 2-3) and stability constants (Definition 3.7, Eq. 4) are written again as loops over
dictionaries. Intervals are re-derived as ``mead.csv``'s
(:func:`advopenood_plugins.kit.verify_worstcase.row_bounds`: a loop over each cell's seeded resamples; a set's key
is its ``ood.csv`` cell's, a union's ``union|<det>|<group>|<eps>`` or ``union|<det>|all``).
"""
from __future__ import annotations

import math
from typing import Any

import pandas as pd

from advopenood.plugin import RunFiles, compare, oracle
from advopenood_plugins.kit.verify_worstcase import (BOUNDS, backend_of, chosen_detectors, csv_eps, eps_groups,
                                                     eps_text, row_bounds, run_params, run_sets, worst_case,
                                                     choices)

#: MultiRobustBench's alpha = 3 % (Sec. 4.1), the evaluator's default, and the slack on ``|ds| <= alpha``.
PAPER_ALPHA, SLACK = 0.03, 1e-12


def positives_rule(run: RunFiles) -> str:
    """The protocol's rule for OOD positives (``successful`` or ``all``), from ``run.json``."""
    return str((run.info.get("protocol") or {}).get("ood_positives", "successful"))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def expected_curves(run: RunFiles) -> pd.DataFrame:
    """``multiattack_curves.csv``: per detector and set, clean vs the set's positive rows; per (group, eps) with
    sets of more than one attack, their per-sample union."""
    params = run_params(run, "multiattack")
    rule = positives_rule(run)
    rows = []
    for det in chosen_detectors(run, params):
        arrays = run.scores(det)
        neg = arrays["id"]
        for (group, eps), members in eps_groups(run_sets(run)).items():
            members = [m for m in members if m["name"] in arrays]
            base = {"detector": det, "backend": backend_of(run, det), "norm": group, "eps": csv_eps(eps),
                    "positives": rule, "protocol": run.protocol}
            for m in members:
                mask = arrays[f"{m['name']}.positive"].astype(bool)
                auroc, fpr95 = oracle.auroc(neg, arrays[m["name"]][mask]), oracle.fpr95(neg, arrays[m["name"]][mask])
                rows.append({**base, "attack": m["label"], "set": m["name"], "auroc": auroc, "fpr95": fpr95,
                             "n_pos": int(mask.sum()), "n_neg": len(neg),
                             **row_bounds(neg, arrays[m["name"]][mask], run, f"ood|{det}|{m['name']}")})
            if len({m["label"] for m in members}) > 1:
                worst, _ = worst_case([arrays[m["name"]] for m in members],
                                      [arrays[f"{m['name']}.positive"] for m in members],
                                      choices(arrays, [m["name"] for m in members]))
                auroc, fpr95 = oracle.auroc(neg, worst), oracle.fpr95(neg, worst)
                rows.append({**base, "attack": "union", "set": "+".join(m["name"] for m in members), "auroc": auroc,
                             "fpr95": fpr95, "n_pos": len(worst), "n_neg": len(neg),
                             **row_bounds(neg, worst, run, f"union|{det}|{group}|{eps_text(eps)}")})
    return pd.DataFrame(rows, columns=["detector", "backend", "attack", "norm", "eps", "set", "auroc", "fpr95", "n_pos",
                                       "n_neg", "positives", "protocol", *BOUNDS])


def _accuracy(value: float, metric: str) -> float:
    """``a(h, P)``: AUROC / 100, or (100 - FPR95) / 100."""
    return value / 100.0 if metric == "auroc" else (100.0 - value) / 100.0


def _above_chance(value: float, metric: str) -> float:
    """``max(0, (AUROC - 50) / 50)`` or ``max(0, (95 - FPR95) / 95)``; NaN stays NaN."""
    if math.isnan(value):
        return math.nan
    return max(0.0, (value - 50.0) / 50.0 if metric == "auroc" else (95.0 - value) / 95.0)


def _ratios(own: dict[str, float], ref: dict[str, float]) -> tuple[float, float, int]:
    """``(100 mean, 100 min, count)`` of ``own[P] / ref[P]`` over the sets with ``ref[P] > 0`` and ``own[P]``
    defined."""
    r = [own[p] / ref[p] for p in own if not math.isnan(own[p]) and ref.get(p, math.nan) > 0]
    return (100.0 * _mean(r), 100.0 * min(r), len(r)) if r else (math.nan, math.nan, 0)


def _sc(own: dict[str, float], strength: dict[str, float], alpha: float) -> float:
    """Eq. 4: the largest ``|a1 - a2| / |s1 - s2|`` over pairs with ``0 < |s1 - s2| <= alpha``."""
    best = math.nan
    names = [p for p in own if not math.isnan(own[p]) and not math.isnan(strength.get(p, math.nan))]
    for i, p in enumerate(names):
        for q in names[i + 1:]:
            ds = abs(strength[p] - strength[q])
            if 0 < ds <= alpha + SLACK:
                slope = abs(own[p] - own[q]) / ds
                best = slope if math.isnan(best) else max(best, slope)
    return best


def _sweep(own: dict[str, float], sets: list[dict[str, Any]]) -> float:
    """Along each attack's eps sweep, ``s = eps / eps_max``: the largest slope between neighbouring eps."""
    best = math.nan
    for label in dict.fromkeys(s["label"] for s in sets):
        points = sorted((s["eps"], own[s["name"]]) for s in sets
                        if s["label"] == label and s["eps"] is not None and s["name"] in own)
        if len(points) < 2 or points[-1][0] <= 0:
            continue
        for (e1, a1), (e2, a2) in zip(points, points[1:]):
            ds = (e2 - e1) / points[-1][0]
            if ds > 0 and not math.isnan(a1) and not math.isnan(a2):
                slope = abs(a2 - a1) / ds
                best = slope if math.isnan(best) else max(best, slope)
    return best


def expected_table(run: RunFiles, curves: pd.DataFrame) -> pd.DataFrame:
    """``multiattack.csv`` from the re-derived curves and the saved scores (union over all sets)."""
    params = run_params(run, "multiattack")
    reference = str(params.get("reference", "best")).lower()
    alpha = float(params.get("alpha", PAPER_ALPHA))
    sets = [s for s in run_sets(run) if s["name"] in set(curves["set"])]
    per_set = curves[curves["attack"] != "union"]
    detectors = list(dict.fromkeys(per_set["detector"]))
    rows = []
    for metric in ("auroc", "fpr95"):
        raw = {d: {s["name"]: math.nan for s in sets} for d in detectors}
        for r in per_set.to_dict("records"):
            raw[r["detector"]][r["set"]] = float(r[metric])
        acc = {d: {p: _accuracy(v, metric) for p, v in raw[d].items()} for d in detectors}
        cc = {d: {p: _above_chance(v, metric) for p, v in raw[d].items()} for d in detectors}

        def best(table: dict[str, dict[str, float]]) -> dict[str, float]:
            out = {}
            for s in sets:
                vals = [table[d][s["name"]] for d in detectors if not math.isnan(table[d][s["name"]])]
                out[s["name"]] = max(vals) if vals else math.nan
            return out

        top, top_cc = best(acc), best(cc)
        ref, ref_cc = (top, top_cc) if reference == "best" else (acc[reference], cc[reference])
        strength = {p: 1.0 - v for p, v in top.items()}
        for d in detectors:
            arrays = run.scores(d)
            here = [s for s in run_sets(run) if s["name"] in arrays]
            worst_union, _ = worst_case([arrays[s["name"]] for s in here],
                                        [arrays[f"{s['name']}.positive"] for s in here],
                                        choices(arrays, [s["name"] for s in here]))
            union = oracle.ood_metrics(arrays["id"], worst_union, (metric,))[metric]
            union_bounds = row_bounds(arrays["id"], worst_union, run, f"union|{d}|all")
            values = [(p, v) for p, v in raw[d].items() if not math.isnan(v)]
            worst_set, worst, key = "", math.nan, math.nan
            for p, v in values:  # chosen on the attack-stream confidences where the run saved them (randomised)
                by = v if f"{p}.select" not in arrays else oracle.ood_metrics(
                    arrays["id.select"], arrays[f"{p}.select"][arrays[f"{p}.positive"].astype(bool)], (metric,))[metric]
                if worst_set == "" or (by < key if metric == "auroc" else by > key):
                    worst_set, worst, key = p, v, by
            at = per_set[(per_set["detector"] == d) & (per_set["set"] == worst_set)]
            cr_avg, cr_worst, n_cr = _ratios(acc[d], ref)
            cc_avg, cc_worst, n_cc = _ratios(cc[d], ref_cc)
            rows.append({"detector": d, "metric": metric, "avg": _mean([v for _, v in values]), "worst": worst,
                         "worst_set": worst_set, "union": union, "cr_ind_avg": cr_avg, "cr_ind_worst": cr_worst,
                         "worst_lo": at[f"{metric}_lo"].iloc[0] if len(at) else math.nan,
                         "worst_hi": at[f"{metric}_hi"].iloc[0] if len(at) else math.nan,
                         "union_lo": union_bounds[f"{metric}_lo"], "union_hi": union_bounds[f"{metric}_hi"],
                         "ci": union_bounds["ci"],
                         "n_sets_cr": n_cr, "cr_cc_ind_avg": cc_avg, "cr_cc_ind_worst": cc_worst, "n_sets_cr_cc": n_cc,
                         "stability": _sc(acc[d], strength, alpha), "alpha": alpha,
                         "stability_eps": _sweep(acc[d], sets), "reference": reference, "n_sets": len(values),
                         "backend": backend_of(run, d), "positives": positives_rule(run), "protocol": run.protocol})
    return pd.DataFrame(rows)


def verify_multiattack(run: RunFiles) -> list[str]:
    """Differences between ``multiattack_curves.csv`` / ``multiattack.csv`` as written and as re-derived from the
    run's scores, positive masks and ``run.json``; every ``multiattack.csv`` row must name its ``deviations``."""
    names = ("multiattack_curves.csv", "multiattack.csv")
    lines = [f"{name} was not written" for name in names if not run.has(name)]
    if lines:
        return lines
    curves, written = expected_curves(run), run.table("multiattack.csv")
    reference = str(run_params(run, "multiattack").get("reference", "best")).lower()
    lines = compare(curves, run.table("multiattack_curves.csv"), ["detector", "set"],
                    ["backend", "attack", "norm", "eps", "auroc", "fpr95", *BOUNDS, "n_pos", "n_neg", "positives",
                     "protocol"], atol=1e-6, table="multiattack_curves.csv")
    if reference != "best" and reference not in set(curves["detector"]):
        lines.append(f"multiattack.csv: reference detector {reference!r} has no scores in the run")
    elif len(curves[curves["attack"] != "union"]):
        lines += compare(expected_table(run, curves), written, ["detector", "metric"],
                         ["backend", "avg", "worst", "worst_lo", "worst_hi", "worst_set", "union", "union_lo",
                          "union_hi", "cr_ind_avg", "cr_ind_worst", "n_sets_cr", "cr_cc_ind_avg", "cr_cc_ind_worst",
                          "n_sets_cr_cc", "stability", "alpha", "stability_eps", "reference", "n_sets", "positives",
                          "protocol", "ci"], atol=1e-6, table="multiattack.csv")
    elif len(written):
        lines.append("multiattack.csv: rows written but no set was scored")
    if "deviations" not in written.columns or (len(written) and written["deviations"].isna().any()):
        lines.append("multiattack.csv: a row does not name its deviations from MultiRobustBench")
    return lines
