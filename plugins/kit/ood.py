"""What the ``ood`` evaluator shares with others: one cell's metrics with their interval (:func:`metric_row`; the
``smoothed`` evaluator's rows are ``ood.csv``'s cells) and the group of every natural set (:func:`set_groups`, the
product :data:`SET_GROUPS`, read by ``ood`` and ``levels``: defined in the core, :mod:`advopenood.evaluation.shared`,
public through :mod:`advopenood.plugin`, re-exported here), and which sets are a transfer result for a detector
(:func:`transfer_rows`), and where the sets of a mean take their images from (:func:`mean_sources`)."""
from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np
import pandas as pd

from advopenood.plugin import (  # noqa: F401
    SET_GROUPS, ImageSource, IntervalPolicy, RunContext, dataset_name, image_sources, is_detector_aware, natural_group,
    ood_metrics, registry, set_groups)

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


def aimed_at(attack: str) -> str:
    """The detector an attack is aimed at: a detector-aware attack's ``detector`` (e.g. ``adaptive_msp``'s ``msp``),
    ``""`` for any other attack, a natural set (``none``) or a name the registry does not resolve."""
    if not registry.resolves("attacks", str(attack)):
        return ""
    cls = registry.get("attacks", str(attack))
    return str(cls.detector) if is_detector_aware(cls) else ""


def transfer_rows(ood: pd.DataFrame) -> pd.Series:
    """Which rows of ``ood.csv`` are a transfer result: detector X on a set attacked to break another detector Y
    (its ``aimed_at`` column, :func:`aimed_at`; none in a table without it). They are kept out of X's headline
    ranking and adversarial means and shown in a table of their own."""
    if "aimed_at" not in ood:
        return pd.Series(False, index=ood.index)
    target = ood["aimed_at"].map(lambda v: "" if pd.isna(v) else str(v))
    return (target != "") & (target != ood["detector"].astype(str))


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


def mean_sources(ctx: RunContext, scores: dict[str, np.ndarray], sets: Iterable[str],
                 masks: dict[str, np.ndarray | None]) -> dict[str, ImageSource]:
    """Where each set of a mean takes its OOD-side images from (:func:`~advopenood.evaluation.intervals.image_sources`):
    an attacked set's rows are its source's (the ID test images, or the natural OOD set it attacked: ``AdvSet.source``),
    its positives only where ``masks`` selects them; a natural set is its own."""
    sets = list(sets)
    sizes = {"id": len(scores["id"]), **{n: len(scores[n]) for n in ctx.ood_sets if n in scores}}
    source_of = {s: ctx.adv_sets[s].source for s in sets if s in ctx.adv_sets}
    return image_sources(sets, source_of, sizes, masks, {s: len(scores[s]) for s in sets})
