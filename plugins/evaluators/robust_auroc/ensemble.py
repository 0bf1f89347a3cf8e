"""The ``robust_auroc`` evaluator's part of the attack ensemble (:mod:`advopenood_plugins.kit.ensemble`: the
ensemble rows and ``robust_ensemble.csv``, computed once per run): the figure of ``robust_ensemble.csv`` (its
report section: :func:`~advopenood_plugins.evaluators.robust_auroc.report.ensemble_section`) and the
gradient-masking flag (``masking_suspected``).

**Masking** (Carlini et al. 2019, "On Evaluating Adversarial Robustness": a gradient-free attack that beats
the gradient attacks says the gradients are unreliable): per detector, OOD set and eps, ``masking_suspected`` is
True when the run has a Square row and at least one row of an attack on the score's gradient
(:data:`SCORE_GRADIENT_METHODS`: ``pgd``, ``apgd``, plain or EOT; ``apgd_aux`` follows another objective's gradient
and is left out, so that it cannot hide a masked score) and, for EVERY such row ``g``, the 95 % interval of
``robust_auroc_g - robust_auroc_square`` lies above 0 (paired: bootstrap draws of ``robust_masking|<det>|<OOD
set>|<eps>`` applied to both rows' attacked arrays; DeLong's correlated difference under ``delong``); False when the
run has both kinds and the rule does not hold; empty (NA) without a Square row, without a score-gradient row, or
without an interval (``ci: none``, fewer than 2 images a side).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from advopenood.plugin import RunContext, too_few
from advopenood_plugins.kit.ensemble import Ensemble

#: the attacks that follow the detector's score's gradient: the masking flag's comparison
SCORE_GRADIENT_METHODS = ("pgd", "apgd")


def ensemble_report(ctx: RunContext, ensemble: Ensemble) -> tuple[dict[str, pd.DataFrame], list[Path]]:
    """``robust_ensemble.csv`` and its figure (nothing without an ensemble row)."""
    from advopenood_plugins.evaluators.robust_auroc.report import plot_ensemble

    if ensemble.steps is None:
        return {}, []
    figure = plot_ensemble(ensemble.steps, ctx.plot_dir)
    return {"robust_ensemble.csv": ensemble.steps}, [figure] if figure else []


def masking_flags(ctx: RunContext, table: pd.DataFrame) -> dict[tuple[str, str, float], Any]:
    """``(detector, OOD set, eps) -> True / False / pd.NA`` by the rule of the module docstring."""
    policy = ctx.intervals
    flags: dict[tuple[str, str, float], Any] = {}
    for (det, ood_set, eps), part in table.groupby(["detector", "ood_set", "eps"], sort=False):
        square = part[part["method"] == "square"]
        gradient = part[part["method"].isin(SCORE_GRADIENT_METHODS)]
        flags[det, ood_set, eps] = pd.NA
        if not len(square) or not len(gradient) or policy.method == "none":
            continue
        cell = lambda r: (np.asarray(ctx.scores[det][r["id_attack"]], float),
                          np.asarray(ctx.scores[det][r["ood_attack"]], float))
        sq, grads = cell(square.iloc[0]), [cell(r) for r in gradient.to_dict("records")]
        same = [g for g in grads if (len(g[0]), len(g[1])) == (len(sq[0]), len(sq[1]))]
        reps: list[Any] = [None] * (len(same) + 1)
        if policy.bootstrap and not too_few(len(sq[0]), len(sq[1])):  # the square row and the rows paired with it
            key = f"robust_masking|{det}|{ood_set}|{float(eps):.6g}"
            reps = [r["auroc"] for r in policy.paired(key, [sq, *same], ("auroc",))]
        verdicts = []
        for g in grads:
            lo, _, error = policy.difference(g, sq, next((r for s, r in zip(same, reps[1:]) if s is g), None), reps[0])
            verdicts.append(pd.NA if error or math.isnan(lo) else bool(lo > 0))
        flags[det, ood_set, eps] = pd.NA if any(v is pd.NA for v in verdicts) else all(verdicts)
    return flags


def with_masking(ctx: RunContext, table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with ``masking_suspected`` set on every row of its detector, OOD set and eps."""
    flags = masking_flags(ctx, table[table["method"] != "ensemble"])
    column = [flags.get((r["detector"], r["ood_set"], r["eps"]), pd.NA) for r in table.to_dict("records")]
    return table.assign(masking_suspected=pd.array(column, dtype="boolean"))
