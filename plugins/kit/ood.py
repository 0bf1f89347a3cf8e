"""What the ``ood`` evaluator shares with others: one cell's metrics with their interval (:func:`metric_row`; the
``smoothed`` evaluator's rows are ``ood.csv``'s cells) and the group of every natural set (:func:`set_groups`, the
product :data:`SET_GROUPS`, read by ``ood`` and ``levels``)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from advopenood.data.benchmarks import natural_group
from advopenood.data.datasets import dataset_name
from advopenood.evaluation.context import RunContext
from advopenood.evaluation.intervals import IntervalPolicy
from advopenood.evaluation.metrics import ood_metrics
from advopenood.evaluation.products import Product

#: the four metrics of a cell (OpenOOD's), in percent
METRICS = ("fpr95", "auroc", "aupr_in", "aupr_out")
NAN_METRICS = {m: math.nan for m in METRICS}
#: bootstrap replicates per cell key (:func:`advopenood.evaluation.intervals.cell_key`), for the group means
Replicates = dict[str, dict[str, np.ndarray]]


def metric_row(conf_id: np.ndarray, conf_ood: np.ndarray, ctx: RunContext | None = None, key: str = "",
               replicates: Replicates | None = None) -> dict[str, Any]:
    """Metrics in percent, each with its 95 % interval (``<m>_lo``, ``<m>_hi``: the run's ``ci`` plan, seeded by
    the run seed and ``key``; none without ``ctx``), ``ci``, ``n_id``, ``n_ood`` and ``error`` (NaN metrics and the
    reason when undefined; empty bounds and the reason when a side has fewer than 2 images). The cell's bootstrap
    replicates go into ``replicates[key]`` when given."""
    policy = ctx.intervals if ctx is not None else IntervalPolicy()
    base = {"n_id": len(conf_id), "n_ood": len(conf_ood), "error": "", "ci": policy.label}
    try:
        values = ood_metrics(conf_id, conf_ood)
    except ValueError as exc:  # NaN scores or an empty side: reported in the row, never averaged away
        values, base["error"] = NAN_METRICS, str(exc)
    bounds, reps, reason = policy.cell(key, conf_id, conf_ood)
    if replicates is not None:
        replicates[key] = reps
    base["error"] = base["error"] or reason
    return {**values, **bounds, **base}


def set_groups(ctx: RunContext) -> dict[str, str]:
    """Group of every natural set of the run: the data entry's ``group``, else OpenOOD v1.5's for
    ``data.dataset`` (:func:`advopenood.data.benchmarks.natural_group`)."""
    data = ctx.plan.data
    declared = {dataset_name(spec): spec.group for spec in data.ood}
    return {name: declared.get(name) or natural_group(data.dataset or ctx.dataset, name) for name in ctx.ood_sets}


def saved_set_groups(run: Any) -> dict[str, str]:
    """:func:`set_groups` from a run folder (:class:`advopenood.evaluation.runfiles.RunFiles`): the natural sets
    ``run.json`` names, grouped by the saved config's data entries, else OpenOOD v1.5's group for its dataset."""
    data = run.config.get("data") or {}
    dataset = data.get("dataset") or ((run.info.get("data") or {}).get("id") or {}).get("name")
    declared = {}
    for entry in data.get("ood") or []:
        try:
            declared[dataset_name(entry)] = entry.get("group") if isinstance(entry, dict) else None
        except (ValueError, TypeError, KeyError):  # an entry this version cannot read: its set takes OpenOOD's group
            continue
    return {str(name): declared.get(name) or natural_group(dataset, str(name))
            for name in (run.info.get("data") or {}).get("ood") or {}}


#: the product: :func:`set_groups` of the run, computed once for every evaluator that declares it
SET_GROUPS: Product[dict[str, str]] = Product("set_groups", set_groups, "the group of every natural set")
