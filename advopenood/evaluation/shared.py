"""The tables several evaluators read, as products (:mod:`advopenood.evaluation.products`), public through
:mod:`advopenood.plugin`: the robust-AUROC table (:data:`ROBUST_TABLE`; ATD, Azizmalayeri et al., NeurIPS 2022;
AROS, Mirzaei et al., ICLR 2025: ``robust_auroc`` writes it, ``ood`` (the leaderboard's robust fields) and
``levels`` (the robust level) read it) and the group of every natural set (:data:`SET_GROUPS`, read by ``ood`` and
``levels``). An evaluator, built-in or a third party's, declares them (``needs = (ROBUST_TABLE,)``) and the run
computes each once. The metrics and their intervals are documented with the ``robust_auroc`` evaluator, in
docs/evaluators.md; a robust-AUROC attack is one whose class declares ``objective = "robust"``
(:func:`robust_attack`), whatever package registers it.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from advopenood import registry
from advopenood.data.benchmarks import natural_group
from advopenood.data.datasets import dataset_name
from advopenood.evaluation.context import RunView
from advopenood.evaluation.intervals import (IntervalPolicy, bound_columns, bound_label, bound_rule, cell_key,
                                            empty_bounds, too_few)
from advopenood.evaluation.metrics import auroc, auroc_interval, fpr_at_tpr95
from advopenood.evaluation.products import Product

ROBUST_METRICS = ("clean_auroc", "id_attacked_auroc", "ood_attacked_auroc", "robust_auroc", "robust_fpr95")


#: each metric followed by its 95 % interval (``<m>_lo``, ``<m>_hi``), then the interval's method; ``error``: why a
#: row's intervals are empty
COLUMNS = ["detector", "ood_set", "eps", "method", "attack_family", *bound_columns(ROBUST_METRICS), "ci", "n_id",
           "n_ood", "id_attack", "ood_attack", "masking_suspected", "protocol", "error"]


def robust_metrics(clean_id: Any, clean_ood: Any, adv_id: Any, adv_ood: Any) -> dict[str, float]:
    """The four AUROCs and the robust FPR95 in percent (OOD positive, score ``-conf``, OpenOOD's
    ``roc_curve`` / ``auc``): clean, ID side attacked, OOD side attacked, both attacked (ATD's three cases)."""
    return {"clean_auroc": 100.0 * auroc(clean_id, clean_ood), "id_attacked_auroc": 100.0 * auroc(adv_id, clean_ood),
            "ood_attacked_auroc": 100.0 * auroc(clean_id, adv_ood), "robust_auroc": 100.0 * auroc(adv_id, adv_ood),
            "robust_fpr95": 100.0 * fpr_at_tpr95(adv_id, adv_ood)}


def robust_intervals(clean_id: Any, clean_ood: Any, adv_id: Any, adv_ood: Any, policy: IntervalPolicy, key: str,
                     own_keys: dict[str, str] | None = None) -> tuple[dict[str, float], str]:
    """``(bounds, reason)``: ``<m>_lo`` / ``<m>_hi`` in percent of the five metrics of :func:`robust_metrics` and why
    they are empty ("" when they are not, or under ``none``).

    By the run's interval ``policy``: ``bootstrap``: paired and stratified: one draw of ID indices and one of OOD
    indices (:meth:`~advopenood.evaluation.intervals.IntervalPolicy.paired` of the cell's ``key``), each applied to
    both arrays of its side, so an attacked image moves with its clean twin (image ``i`` of ``robust_id_<det>`` is
    image ``i`` of the ID test set, likewise on the OOD side); percentile interval of each metric over the same resamples.
    ``own_keys``: the cells that are also another table's cell take that cell's key and draws instead, so that one
    number has one interval in every file: ``clean_auroc`` is ``ood.csv``'s cell of the natural set
    (``ood|<det>|<set>``), ``ood_attacked_auroc`` its cell of the attacked OOD set (``ood|<det>|<OOD set>``).
    ``delong``: each AUROC's analytic interval; FPR95's stays empty. At a bound, the method
    :func:`~advopenood.evaluation.intervals.bound_rule` names, and ``bounds["ci"]`` is the row's ``ci`` column
    (:func:`~advopenood.evaluation.intervals.bound_label`)."""
    arrays = [np.asarray(a, dtype=np.float64).ravel() for a in (clean_id, clean_ood, adv_id, adv_ood)]
    bounds: dict[str, Any] = {**empty_bounds(ROBUST_METRICS), "ci": policy.label}
    if policy.method == "none":
        return bounds, ""
    n_id, n_ood = len(arrays[2]), len(arrays[3])
    if len(arrays[0]) != n_id or len(arrays[1]) != n_ood:
        return bounds, (f"no interval: the attacked sets ({n_id} ID, {n_ood} OOD images) are not paired with the clean "
                        f"ones ({len(arrays[0])}, {len(arrays[1])})")
    reason = too_few(n_id, n_ood)
    if reason or any(np.isnan(a).any() for a in arrays):
        return bounds, reason or "no interval: NaN scores"
    cells = {"clean_auroc": (0, 1), "id_attacked_auroc": (2, 1), "ood_attacked_auroc": (0, 3), "robust_auroc": (2, 3)}
    if policy.method == "delong":
        for m, (i, j) in cells.items():
            lo, hi = auroc_interval(arrays[i], arrays[j])
            bounds.update({f"{m}_lo": 100.0 * lo, f"{m}_hi": 100.0 * hi})
        return at_bounds(bounds, arrays, policy.label), ""
    own = own_keys or {}
    shared = [m for m in cells if m not in own]
    every = dict(zip(shared, policy.paired(key, [cells_of(arrays, cells[m]) for m in shared], ("auroc", "fpr95"))))
    for m, own_key in own.items():  # ood.csv's cells: their own keys and draws, as ood.csv resamples them
        every[m] = policy.paired(own_key, [cells_of(arrays, cells[m])], ("auroc",))[0]
    for m, reps in every.items():
        bounds[f"{m}_lo"], bounds[f"{m}_hi"] = policy.interval(reps["auroc"])
    bounds["robust_fpr95_lo"], bounds["robust_fpr95_hi"] = policy.interval(every["robust_auroc"]["fpr95"])
    return at_bounds(bounds, arrays, policy.label), ""


def at_bounds(bounds: dict[str, Any], arrays: list[np.ndarray], label: str) -> dict[str, Any]:
    """``bounds`` with every interval at a bound replaced by the method
    :func:`~advopenood.evaluation.intervals.bound_rule` names and ``ci`` naming it (the arrays: clean ID, clean
    OOD, attacked ID, attacked OOD)."""
    values, methods = robust_metrics(*arrays), {}
    n_id, n_ood = len(arrays[2]), len(arrays[3])
    for m in ROBUST_METRICS:
        bounds[f"{m}_lo"], bounds[f"{m}_hi"], methods[m] = bound_rule(m, values[m], bounds[f"{m}_lo"],
                                                                      bounds[f"{m}_hi"], n_id, n_ood)
    bounds["ci"] = bound_label(label, methods)
    return bounds


def cells_of(arrays: list[np.ndarray], pair: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """The (ID side, OOD side) arrays of one cell of :func:`robust_intervals`."""
    return arrays[pair[0]], arrays[pair[1]]


def close_eps(a: float | None, b: float | None) -> bool:
    """Whether two budgets are the same (relative tolerance 1e-6; None is no budget and matches nothing)."""
    return a is not None and b is not None and math.isclose(float(a), float(b), rel_tol=1e-6)


def robust_attack(name: str) -> Any:
    """The registered class of attack ``name`` when it is a robust-AUROC attack, None for any other: it declares
    ``objective = "robust"``, its ``side`` (``id`` or ``ood``), ``detector`` and ``method``
    (the built-in robust-AUROC attacks; the verify hook reads the same attributes)."""
    cls = registry.get("attacks", name)
    return cls if isinstance(cls, type) and getattr(cls, "objective", None) == "robust" else None


def attack_family(cls: type) -> str:
    """``"eot"`` for an EOT attack (one that names the plain attack whose gradient it averages, ``plain_attack``),
    ``"plain"`` for the others."""
    return "eot" if getattr(cls, "plain_attack", "") else "plain"


def robust_pairs(ctx: RunView) -> list[tuple[str, str, str, str, str, float]]:
    """``(detector, ID-side set, OOD-side set, method, attack family, eps)`` for every pair of robust-AUROC sets of
    the run on the same detector with the same method, family and eps."""
    sides: dict[str, list[tuple[str, Any, type]]] = {"id": [], "ood": []}
    for name, adv in ctx.adv_sets.items():
        cls = robust_attack(adv.attack)
        if cls is not None:
            sides[cls.side].append((name, adv, cls))
    return [(cls.detector, i_name, o_name, cls.method, attack_family(cls), float(i_adv.eps))
            for i_name, i_adv, cls in sides["id"] for o_name, o_adv, o_cls in sides["ood"]
            if o_cls.detector == cls.detector and o_cls.method == cls.method
            and attack_family(o_cls) == attack_family(cls) and close_eps(i_adv.eps, o_adv.eps)]


def robust_table(ctx: RunView) -> pd.DataFrame:
    """One row per detector with scores and pair of robust sets (:func:`robust_pairs`), each metric with its
    interval by the run's ``ci`` plan (:func:`robust_intervals`, cell key ``robust|<det>|<ID set>|<OOD set>``).

    The ``ood``, ``levels`` and ``robust_auroc`` evaluators all read it: they declare :data:`ROBUST_TABLE` and the
    run computes it once (:class:`advopenood.evaluation.products.Products`)."""
    rows = []
    for det, id_set, ood_set_attack, method, family, eps in robust_pairs(ctx):
        scores = ctx.scores.get(det)
        if scores is None:
            continue
        source = ctx.adv_sets[ood_set_attack].source
        arrays = (scores["id"], scores[source], scores[id_set], scores[ood_set_attack])
        bounds, reason = robust_intervals(*arrays, ctx.intervals, cell_key("robust", det, id_set, ood_set_attack),
                                          own_keys=shared_cells(det, source, ood_set_attack))
        rows.append({"detector": det, "ood_set": source, "eps": eps, "method": method, "attack_family": family,
                     **robust_metrics(*arrays), **bounds,
                     "n_id": len(scores[id_set]), "n_ood": len(scores[ood_set_attack]), "id_attack": id_set,
                     "ood_attack": ood_set_attack, "protocol": ctx.protocol, "error": reason})
    return pd.DataFrame(rows, columns=COLUMNS)


def shared_cells(det: str, ood_set: str, ood_attack: str) -> dict[str, str]:
    """The robust row's cells that are ``ood.csv``'s too, with ``ood.csv``'s cell keys (:func:`robust_intervals`)."""
    return {"clean_auroc": cell_key("ood", det, ood_set), "ood_attacked_auroc": cell_key("ood", det, ood_attack)}


#: the product: :func:`robust_table` of the run, computed once for every evaluator that declares it
ROBUST_TABLE: Product[pd.DataFrame] = Product("robust_table", robust_table, "robust_auroc.csv's single-attack rows")


def set_groups(ctx: RunView) -> dict[str, str]:
    """Group of every natural set of the run: the data entry's ``group``, else OpenOOD v1.5's for
    ``data.dataset`` (:func:`advopenood.data.benchmarks.natural_group`)."""
    data = ctx.plan.data
    declared = {dataset_name(spec): spec.group for spec in data.ood}
    return {name: declared.get(name) or natural_group(data.dataset or ctx.dataset, name) for name in ctx.ood_sets}


#: the product: :func:`set_groups` of the run, computed once for every evaluator that declares it
SET_GROUPS: Product[dict[str, str]] = Product("set_groups", set_groups, "the group of every natural set")
