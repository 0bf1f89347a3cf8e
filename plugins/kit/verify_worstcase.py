"""Re-derivation helpers of the worst-case tables (``mead.csv``, ``multiattack.csv``) from a run's files: the sets
and their groups re-read from ``run.json`` and the attack classes, the per-sample worst case as a pandas group
maximum, a row's interval as ``ood.csv``'s cells are re-derived. A checker shared by the ``mead`` and ``multiattack``
verify hooks, written apart from the writers (:mod:`advopenood_plugins.kit.worstcase`); its numbers come from the
independent checker :mod:`advopenood.evaluation.oracle`.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from advopenood.plugin import RunFiles, as_csv_float, oracle, registry

def worst_case(conf: list[np.ndarray], hit: list[np.ndarray], by: list[np.ndarray] | None = None
               ) -> tuple[np.ndarray, float]:
    """Per clean sample with at least one hit, the confidence of the hit whose choice confidence ``by`` is the
    largest (the first set in order on a tie; NaN if a hit's confidence or choice is NaN), in sample order, and the
    mean number of hits per sample. ``by`` defaults to ``conf`` (the largest confidence); for a randomised detector
    it is the saved ``<set>.select`` (:func:`choices`)."""
    n = len(conf[0])
    by = conf if by is None else by
    long = pd.DataFrame({"row": np.tile(np.arange(n), len(conf)), "set": np.repeat(np.arange(len(conf)), n),
                         "conf": np.concatenate(conf), "by": np.concatenate(by),
                         "hit": np.concatenate(hit).astype(bool)})
    hits = long[long["hit"]]
    ranked = hits.assign(key=hits["by"].fillna(np.inf)).sort_values(["row", "key", "set"],
                                                                     ascending=[True, False, True])
    worst = ranked.groupby("row")["conf"].first().sort_index()
    broken = hits.loc[hits["conf"].isna() | hits["by"].isna(), "row"]
    worst[worst.index.isin(broken)] = np.nan
    return worst.to_numpy(dtype=np.float64), len(hits) / n if n else math.nan


def choices(arrays: dict[str, np.ndarray], names: list[str]) -> list[np.ndarray]:
    """The confidences each set is chosen on in a worst case: ``<set>.select`` where the run saved it (a
    randomised detector's attack-stream confidences), else the set's confidences."""
    return [arrays.get(f"{n}.select", arrays[n]) for n in names]


def run_sets(run: RunFiles) -> list[dict[str, Any]]:
    """The run's ID->ID adversarial sets in run order: ``name``, ``label`` (the attack entry, the set name before
    ``@``), ``group`` (the norm the set ran with, or the class's declared threat, e.g. ``patch``), ``eps`` (None
    for an unbounded attack) and ``objective`` (the class's, ``ce`` for a bounded attack that declares none). Sets of
    an attack class that declares :class:`~advopenood.capabilities.IdNegatives` (ID images pushed to look OOD, e.g.
    the robust AUROC's ``robust_id_<det>``) stay ID negatives and are left out. The run's order is the order of the
    sets in the saved scores (``run.json`` lists them by name)."""
    from advopenood.plugin import IdNegatives

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
