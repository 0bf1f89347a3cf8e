"""``verify`` hook of the ``mead`` evaluator: ``mead.csv`` and ``mead_summary.csv`` re-derived from a run's files.

Inputs: ``scores/<det>.npz`` (clean confidences ``id``, each adversarial set's confidences and its ``<set>.success``
mask, the success of the images the detectors scored) and ``run.json`` (each set's attack and parameters, its
source, the protocol, the detector backend, the evaluator's parameters). The code path is separate from
:mod:`advopenood_plugins.evaluators.mead.plugin` and imports nothing from it: the groups and objectives are read from the attack
classes again, the worst case is a pandas group maximum over a long table of successful (sample, attack) pairs,
AUROC and FPR95 come from the independent checker :mod:`advopenood.evaluation.oracle`; averages are plain loops. A
row's interval is re-derived as ``ood.csv``'s cells are (:func:`advopenood_plugins.kit.verify.rederive_bounds`: a
loop over the row's seeded resamples, key :func:`row_key`, of the clean scores against the worst-case scores). Rows
are compared with :func:`advopenood.evaluation.verify.compare` (numbers as the CSV holds them). The helpers here
serve :mod:`advopenood_plugins.evaluators.multiattack.verify` too.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from advopenood import registry
from advopenood.evaluation import oracle
from advopenood.evaluation.verify import RunFiles, as_csv_float, compare

#: MEAD's settings (Sec. 5.1: all attacks, and one per objective) and advopenood's ``adaptive``, stated again.
MEAD_SETTINGS = ["mead", "ce", "kl", "gini", "fr", "adaptive"]


def worst_case(conf: list[np.ndarray], hit: list[np.ndarray]) -> tuple[np.ndarray, float]:
    """Per clean sample with at least one hit, the largest confidence among its hits (NaN if one is NaN), in
    sample order, and the mean number of hits per sample."""
    n = len(conf[0])
    long = pd.DataFrame({"row": np.tile(np.arange(n), len(conf)), "conf": np.concatenate(conf),
                         "hit": np.concatenate(hit).astype(bool)})
    hits = long[long["hit"]]
    worst = hits.groupby("row")["conf"].max().sort_index()
    worst[worst.index.isin(hits.loc[hits["conf"].isna(), "row"])] = np.nan
    return worst.to_numpy(dtype=np.float64), len(hits) / n if n else math.nan


def run_sets(run: RunFiles) -> list[dict[str, Any]]:
    """The run's ID->ID adversarial sets in run order: ``name``, ``label`` (the attack entry, the set name before
    ``@``), ``group`` (the norm the set ran with, or the class's declared threat, e.g. ``patch``), ``eps`` (None
    for an unbounded attack) and ``objective`` (the class's, ``ce`` for a bounded attack that declares none). Sets of
    an attack class that declares :class:`~advopenood.capabilities.IdNegatives` (ID images pushed to look OOD, e.g.
    the robust AUROC's ``robust_id_<det>``) stay ID negatives and are left out. The run's order is the order of the
    sets in the saved scores (``run.json`` lists them by name)."""
    from advopenood.capabilities import IdNegatives

    attacks = run.info.get("attacks") or {}
    saved = list(run.scores(run.detectors[0])) if run.detectors else []
    order = [n for n in saved if n in attacks] + [n for n in attacks if n not in saved]
    out = []
    for name, entry in ((n, attacks[n]) for n in order):
        if entry.get("source", "id") != "id":
            continue
        cls = registry.get("attacks", entry["attack"])
        if issubclass(cls, IdNegatives):
            continue
        params = entry.get("params") or {}
        bounded = bool(getattr(cls, "bounded", True))
        objective = getattr(cls, "objective", None) or ("ce" if bounded else None)
        eps = params.get("eps")
        group = str(params.get("norm") or getattr(cls, "threat", cls.norm))
        out.append({"name": name, "label": name.rsplit("@", 1)[0], "group": group,
                    "eps": float(eps) if bounded and eps is not None else None, "objective": objective})
    return out


def eps_groups(sets: list[dict[str, Any]]) -> dict[tuple[str, float | None], list[dict[str, Any]]]:
    """Sets by (group, eps) in first-seen order."""
    groups: dict[tuple[str, float | None], list[dict[str, Any]]] = {}
    for s in sets:
        groups.setdefault((s["group"], None if s["eps"] is None else round(s["eps"], 9)), []).append(s)
    return groups


def run_params(run: RunFiles, evaluator: str) -> dict[str, Any]:
    """The evaluator's parameters from the run's config (empty: defaults)."""
    return dict(((run.info.get("config") or {}).get("evaluator_params") or {}).get(evaluator) or {})


def chosen_detectors(run: RunFiles, params: dict[str, Any]) -> list[str]:
    """The saved detectors the evaluator read (its ``detectors`` parameter, lower case, or all)."""
    wanted = params.get("detectors")
    keep = None if wanted is None else {str(d).lower() for d in wanted}
    return [d for d in run.detectors if keep is None or d in keep]


def backend_of(run: RunFiles, det: str) -> str:
    """The ``backend`` a detector's rows carry: ``run.json``'s ``detector_backends``, else ``detector_backend``."""
    return str((run.info.get("detector_backends") or {}).get(det, run.info.get("detector_backend", "")))


def eps_text(eps: float | None) -> str:
    """An eps in a seed key (the shared contract with the writer): 6 significant digits, ``none`` when unbounded."""
    return "none" if eps is None else f"{eps:.6g}"


def row_key(prefix: str, det: str, group: str, eps: float | None, setting: str) -> str:
    """The seed key of a ``mead.csv`` row's resamples."""
    return "|".join([prefix, det, group, eps_text(eps), setting])


def row_bounds(neg: np.ndarray, pos: np.ndarray, run: RunFiles, key: str) -> dict[str, Any]:
    """``auroc_lo`` / ``auroc_hi`` / ``fpr95_lo`` / ``fpr95_hi`` and ``ci`` of clean ``neg`` against ``pos`` by the
    run's ``ci`` plan."""
    from advopenood_plugins.kit.verify import rederive_bounds

    got = rederive_bounds(neg, pos, run, key)
    return {k: got[k] for k in ("auroc_lo", "auroc_hi", "fpr95_lo", "fpr95_hi", "ci")}


#: a mead.csv row's interval columns
BOUNDS = ["auroc_lo", "auroc_hi", "fpr95_lo", "fpr95_hi", "ci"]


def csv_eps(eps: float | None) -> float:
    """An eps key as the CSV holds it (6 significant digits; NaN for none), for :func:`advopenood.evaluation.verify.compare`."""
    return math.nan if eps is None else as_csv_float(eps)


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
                                              [arrays[f"{m['name']}.success"] for m in use])
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
