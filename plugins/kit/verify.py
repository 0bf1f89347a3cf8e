"""What several built-in verify hooks share: the run's interval plan, a cell's re-derived interval and the pairs of
detectors a set compares, all from the independent checker :mod:`advopenood.evaluation.oracle` (never from the code
that wrote the tables). A checker module, as its name says: ``tests/test_oracle.py`` checks that it imports no writer.
"""
from __future__ import annotations

import math
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd

from advopenood.plugin import UsageError, is_detector_aware, oracle, registry, twin_of

METRICS = ("fpr95", "auroc", "aupr_in", "aupr_out")
BOUNDS = [f"{m}_{end}" for m in METRICS for end in ("lo", "hi")]
#: a cell's re-derived bootstrap replicates per metric, by cell key (``ood|<detector>|<set>``)
Draws = dict[str, dict[str, np.ndarray]]


def ci_plan(run: Any) -> oracle.IntervalPlan:
    """The run's intervals as the checker re-derives them (:class:`advopenood.evaluation.oracle.IntervalPlan` of
    ``run.json``; ``none`` for a run written before)."""
    return oracle.IntervalPlan.of(run.config)


def rederive_bounds(conf_id: np.ndarray, conf_ood: np.ndarray, run: Any, key: str,
                    draws: Draws | None = None) -> dict[str, Any]:
    """A cell's ``<m>_lo`` / ``<m>_hi`` and ``ci`` by the run's ``ci`` plan; the bootstrap replicates go into
    ``draws[key]``. NaN bounds when a side has fewer than 2 images or holds NaN; at a bound, the checker's rule
    (:func:`advopenood.evaluation.oracle.bounded`), named in ``ci``."""
    plan = ci_plan(run)
    out: dict[str, Any] = {c: math.nan for c in BOUNDS}
    out["ci"] = plan.label
    conf_id, conf_ood = np.asarray(conf_id, float).ravel(), np.asarray(conf_ood, float).ravel()
    n, m = len(conf_id), len(conf_ood)
    if plan.method == "none" or n < 2 or m < 2 or np.isnan(conf_id).any() or np.isnan(conf_ood).any():
        return out
    bounds, reps = plan.cell(key, conf_id, conf_ood)
    values, methods = oracle.ood_metrics(conf_id, conf_ood), {}
    for metric in METRICS:
        lo, hi = bounds.get(metric, (math.nan, math.nan))
        out[f"{metric}_lo"], out[f"{metric}_hi"], methods[metric] = oracle.bounded(metric, values[metric], lo, hi, n, m)
    out["ci"] = oracle.bound_label(plan.label, methods)
    if draws is not None and reps:
        draws[key] = reps
    return out


def twin(det: str) -> str:
    """The registered detector ``det`` derives from, "" when it declares none or is unknown."""
    try:
        return twin_of(registry.get("detectors", det))
    except UsageError:
        return ""


def pairs_of(aurocs: dict[str, float]) -> list[tuple[str, str, bool]]:
    """The pairs of one set: all (sorted names) up to 20 detectors, else each against the best; twins always."""
    names = sorted(aurocs)
    twins = {(d, twin(d)) for d in names if twin(d) in names}
    if len(names) <= 20:
        plain = set(combinations(names, 2))
    else:
        finite = [d for d in names if not math.isnan(aurocs[d])]
        best = sorted(finite, key=lambda d: (-aurocs[d], d))[0] if finite else names[0]
        plain = {(best, d) for d in names if d != best}
    plain = {p for p in plain if p not in twins and p[::-1] not in twins}
    return [(a, b, False) for a, b in plain] + [(a, b, True) for a, b in twins]


def aimed(attack: str) -> str:
    """The detector attack ``attack`` (a registered name, as run.json's ``attacks`` give it) is aimed at, re-stated
    apart from the writer's rule: a detector-aware attack class's ``detector``, else ``""``."""
    if not registry.resolves("attacks", attack):
        return ""
    cls = registry.get("attacks", attack)
    return str(cls.detector) if is_detector_aware(cls) else ""


def transfer(rows: Any) -> Any:
    """Which (re-derived) ``ood.csv`` rows are a transfer result: detector X on a set aimed at another detector."""
    target = rows["aimed_at"].map(lambda v: "" if pd.isna(v) else str(v))
    return (target != "") & (target != rows["detector"].astype(str))


def shared_sources(run: Any, arrays: Any, masks: dict[str, np.ndarray | None]
                   ) -> dict[str, tuple[str, int, np.ndarray]]:
    """The checker's ``(pool, pool size, rows)`` of each set of a mean (masks: its positive rows, None: all): an
    attacked set's rows are those of its source in ``run.json`` (``attacks.<set>.source``: ``id`` or the natural set
    it attacked), a natural set's its own; a set with more rows than its source holds is its own pool."""
    attacks = run.info.get("attacks") or {}
    out = {}
    for name, mask in masks.items():
        n = len(arrays[name])
        pool = str((attacks.get(name) or {}).get("source") or name)
        rows = np.arange(n) if mask is None else np.flatnonzero(mask)
        size = len(arrays[pool]) if pool in arrays else None
        out[name] = (pool, size, rows) if size is not None and n <= size else (name, len(rows), np.arange(len(rows)))
    return out
