"""``verify`` hook of the ``mead`` evaluator: ``mead.csv`` and ``mead_summary.csv`` re-derived from a run's files.

Inputs: ``scores/<det>.npz`` (clean confidences ``id``, each adversarial set's confidences and its ``<set>.success``
mask, the success of the images the detectors scored) and ``run.json`` (each set's attack and parameters, its
source, the protocol, the detector backend, the evaluator's parameters). The code path is separate from
:mod:`advopenood_plugins.evaluators.mead.plugin` and imports nothing from it: the groups and objectives are read from the attack
classes again, the worst case is a pandas group maximum over a long table of successful (sample, attack) pairs,
AUROC and FPR95 come from the independent checker :mod:`advopenood.evaluation.oracle`; averages are plain loops. A
row's interval is re-derived as ``ood.csv``'s cells are (:func:`advopenood_plugins.kit.verify.rederive_bounds`: a
loop over the row's seeded resamples, key :func:`row_key`, of the clean scores against the worst-case scores). Rows
are compared with :func:`advopenood.evaluation.verify.compare` (numbers as the CSV holds them). The helpers it
shares with :mod:`advopenood_plugins.evaluators.multiattack.verify` are in
:mod:`advopenood_plugins.kit.verify_worstcase`.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from advopenood.plugin import RunFiles, compare, oracle
from advopenood_plugins.kit.verify_worstcase import (BOUNDS, backend_of, chosen_detectors, csv_eps,  # noqa: F401
                                                     eps_groups, eps_text, row_bounds, row_key, run_params, run_sets,
                                                     choices, worst_case)

#: MEAD's settings (Sec. 5.1: all attacks, and one per objective) and advopenood's ``adaptive``, stated again.
MEAD_SETTINGS = ["mead", "ce", "kl", "gini", "fr", "adaptive"]


def expected_mead(run: RunFiles) -> pd.DataFrame:
    """``mead.csv`` from the saved scores and success masks (MEAD Sec. 4, Eqs. 7-10: a clean sample is a positive
    when an attack of the setting succeeded on it, scored by its least OOD-looking successful attack)."""
    params = run_params(run, "mead")
    settings = list(params.get("settings") or MEAD_SETTINGS)
    sets = run_sets(run)
    present = {s["objective"] for s in sets}
    single = set(MEAD_SETTINGS) - {"mead"}
    rows = []
    for det in chosen_detectors(run, params):
        arrays = run.scores(det)
        neg = arrays["id"]
        for (group, eps), members in eps_groups(sets).items():
            if any(m["name"] not in arrays for m in members):
                continue
            for setting in settings:
                if setting == "mead":
                    use = members
                elif setting not in present:
                    continue
                else:
                    own = [m for m in members if m["objective"] == setting]
                    shared = [m for m in members if m["objective"] not in single]
                    use = own + shared if own else (members if len(shared) == len(members) else [])
                if not use:
                    continue
                worst, mean_hits = worst_case([arrays[m["name"]] for m in use],
                                              [arrays[f"{m['name']}.success"] for m in use],
                                              choices(arrays, [m["name"] for m in use]))
                auroc, fpr95 = oracle.auroc(neg, worst), oracle.fpr95(neg, worst)
                rows.append({"detector": det, "backend": backend_of(run, det), "norm": group, "eps": csv_eps(eps),
                             "setting": setting, "auroc": auroc, "fpr95": fpr95, "n_pos": len(worst),
                             "n_neg": len(neg), "mean_successes": mean_hits, "protocol": run.protocol,
                             **row_bounds(neg, worst, run, row_key("mead", det, group, eps, setting))})
    return pd.DataFrame(rows, columns=["detector", "backend", "norm", "eps", "setting", "auroc", "fpr95", "n_pos",
                                       "n_neg", "mean_successes", "protocol", *BOUNDS])


def expected_summary(mead: pd.DataFrame) -> pd.DataFrame:
    """``mead_summary.csv`` from ``mead.csv`` rows (MEAD Tables 1-3): per group the mean over all its rows (no-eps
    ones included; NaN rows skipped, all counted in ``n_groups``), ``all`` the mean over the groups."""
    per: dict[tuple, dict[str, list[float]]] = {}
    for r in mead.to_dict("records"):
        acc = per.setdefault((r["detector"], r["backend"], r["setting"], r["protocol"], r["norm"]),
                             {"auroc": [], "fpr95": []})
        acc["auroc"].append(r["auroc"])
        acc["fpr95"].append(r["fpr95"])

    def mean(values: list[float]) -> float:
        kept = [v for v in values if not math.isnan(v)]
        return sum(kept) / len(kept) if kept else math.nan

    rows, overall = [], {}
    for (det, backend, setting, protocol, norm), acc in per.items():
        row = {"detector": det, "backend": backend, "norm": norm, "setting": setting, "auroc": mean(acc["auroc"]),
               "fpr95": mean(acc["fpr95"]), "n_groups": len(acc["auroc"]), "protocol": protocol}
        rows.append(row)
        total = overall.setdefault((det, backend, setting, protocol), {"auroc": [], "fpr95": [], "n": 0})
        total["auroc"].append(row["auroc"])
        total["fpr95"].append(row["fpr95"])
        total["n"] += row["n_groups"]
    for (det, backend, setting, protocol), total in overall.items():
        rows.append({"detector": det, "backend": backend, "norm": "all", "setting": setting,
                     "auroc": mean(total["auroc"]), "fpr95": mean(total["fpr95"]), "n_groups": total["n"],
                     "protocol": protocol})
    return pd.DataFrame(rows, columns=["detector", "backend", "norm", "setting", "auroc", "fpr95", "n_groups",
                                       "protocol"])


def verify_mead(run: RunFiles) -> list[str]:
    """Differences between ``mead.csv`` / ``mead_summary.csv`` as written and as re-derived from the run's
    scores, masks and ``run.json`` (empty: both re-derived)."""
    lines = [f"{name} was not written" for name in ("mead.csv", "mead_summary.csv") if not run.has(name)]
    if lines:
        return lines
    mead = expected_mead(run)
    return (compare(mead, run.table("mead.csv"), ["detector", "norm", "eps", "setting"],
                    ["backend", "auroc", "fpr95", *BOUNDS, "n_pos", "n_neg", "mean_successes", "protocol"],
                    atol=1e-6, table="mead.csv")
            + compare(expected_summary(mead), run.table("mead_summary.csv"), ["detector", "norm", "setting"],
                      ["backend", "auroc", "fpr95", "n_groups", "protocol"], table="mead_summary.csv"))
