"""What the ``ood`` evaluator shares with others: one cell's metrics with their interval (:func:`metric_row`; the
``smoothed`` evaluator's rows are ``ood.csv``'s cells) and the group of every natural set (:func:`set_groups`, the
product :data:`SET_GROUPS`, read by ``ood`` and ``levels``: defined in the core, :mod:`advopenood.evaluation.shared`,
public through :mod:`advopenood.plugin`, re-exported here)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from advopenood.evaluation.context import RunContext
from advopenood.evaluation.intervals import IntervalPolicy
from advopenood.evaluation.metrics import ood_metrics
from advopenood.evaluation.shared import SET_GROUPS, set_groups  # noqa: F401

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
    replicates go into ``replicates[key]`` when given. ``ci`` names the method of any interval at a bound
    (:meth:`~advopenood.evaluation.intervals.IntervalPolicy.labelled_cell`)."""
    policy = ctx.intervals if ctx is not None else IntervalPolicy()
    base = {"n_id": len(conf_id), "n_ood": len(conf_ood), "error": "", "ci": policy.label}
    try:
        values = ood_metrics(conf_id, conf_ood)
    except ValueError as exc:  # NaN scores or an empty side: reported in the row, never averaged away
        values, base["error"] = NAN_METRICS, str(exc)
    bounds, reps, reason, base["ci"] = policy.labelled_cell(key, conf_id, conf_ood)
    if replicates is not None:
        replicates[key] = reps
    base["error"] = base["error"] or reason
    return {**values, **bounds, **base}
