"""The worst case per image over a detector's robust-AUROC attacks (``method`` ``ensemble``) and the robust AUROC
after each attack added (``robust_ensemble.csv``), a product (:data:`ENSEMBLE`) that the ``robust_auroc`` evaluator
writes and the ``ood`` evaluator's leaderboard reads (its robust fields: :func:`robust_rows`, the one rule that
``advopenood verify`` applies too).

**Ensemble** (AutoAttack's rule, Croce & Hein, ICML 2020, applied to a detector's score): per detector, natural OOD
set and eps, each ID test image takes the lowest confidence over its clean self and every ID-side robust set of that
detector in the run (every method and attack family: PGD, APGD, APGD on the second objective, Square, plain and
EOT), each OOD image the highest over its clean self and every OOD-side set on that OOD set. For a randomised
detector (``smoothed_<det>``, ``ross_<det>``) the image's worst set is *chosen* on its attack-stream confidences
(``scores/<det>.npz``'s ``<set>.select``: the noise every attack on it draws) and *scored* once with the evaluation
stream's confidence of the chosen image, independent of every draw that chose it (Athalye, Carlini & Wagner 2018,
Sec. 4.3; Tramer et al. 2020: a randomised defence is evaluated on fresh randomness). Taking the minimum of the
evaluation confidences themselves would pick, per image, the luckiest of its K + 1 independent evaluation draws:
with no attack at all, four draws of ``ross_gen`` on the adversarially trained ResNet-20 lost 8.9 AUROC points that
way (issue 48); a deterministic detector's choice is its score, and its rows are as before. The row's metrics are
:func:`~advopenood_plugins.kit.robust.robust_metrics` of (clean ID, clean OOD, worst ID, worst
OOD) with the paired interval of every other row, cell key ``robust|<det>|ensemble|<OOD set>|<eps as %.6g>``
(:func:`ensemble_key`), except ``clean_auroc``, which is ``ood.csv``'s cell and carries its interval (key
``ood|<det>|<OOD set>``), as every single-attack row's does; ``id_attack`` / ``ood_attack`` list the sets joined by
``+`` in :data:`ORDER`.

**Steps** (``robust_ensemble.csv``, as AutoAttack prints robust accuracy after each attack): step 0 is the clean
AUROC, then one step per attack in the fixed order :data:`ORDER` (``apgd``, ``apgd_aux``, ``pgd``, each plain before
its EOT twin, ``square`` last), each adding its ID-side and OOD-side set; after each step the robust AUROC of the
worst case so far with its interval (bootstrap draws of the ensemble row's key, the same for every step) and how
many ID and OOD images that attack set the worst case of (strictly lower, resp. higher, than before). The last step
is the ensemble row, with its interval; step 0 is the clean cell, with ``ood.csv``'s interval: one number, one
interval in every file.

**Nothing to combine**: a detector, OOD set and eps with at most one attack per side, or none on one side, gets no
ensemble row; every such cell is named, with why, in ``Results.skipped["ensemble"]`` (``run.json``'s
``nothing_computed`` as ``evaluator:robust_auroc:ensemble``, the report, stderr).

**The leaderboard's robust fields** (:func:`robust_rows`, ``leaderboard_openood.json``): per detector, its rows at
its largest eps; its ensemble rows where it has any, else the rows of the first of :data:`ROBUST_METHODS` it has
(its EOT rows where it has any). The writer applies it to the run's rows, ``advopenood verify`` to its
re-derivation of ``robust_auroc.csv``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from advopenood.plugin import Product, RunContext, cell_key
from advopenood_plugins.kit.robust import COLUMNS, attack_family, robust_attack, robust_intervals, robust_metrics

#: the order attacks join the ensemble: ``(method, attack family)``
ORDER = [("apgd", "plain"), ("apgd", "eot"), ("apgd_aux", "plain"), ("apgd_aux", "eot"), ("pgd", "plain"),
         ("pgd", "eot"), ("square", "plain")]
STEP_COLUMNS = ["detector", "ood_set", "eps", "step", "attack", "id_attack", "ood_attack", "robust_auroc",
                "robust_auroc_lo", "robust_auroc_hi", "ci", "id_images_set", "ood_images_set", "n_id", "n_ood",
                "error", "protocol"]


@dataclass(frozen=True)
class Ensemble:
    """The ensemble of a run (:data:`ENSEMBLE`, computed once and read by the ``robust_auroc`` evaluator and the
    ``ood`` evaluator's leaderboard): the ensemble rows of ``robust_auroc.csv`` (the columns of
    :data:`~advopenood_plugins.kit.robust.COLUMNS`; none: an empty frame), ``robust_ensemble.csv`` (None without a
    row), the skipped cells with their reasons and each cell's worst-case arrays."""

    rows: pd.DataFrame
    steps: pd.DataFrame | None = None
    skipped: dict[str, str] = field(default_factory=dict)
    #: per (detector, OOD set, eps): the per-image worst case (ID side, OOD side), for ``robust_paired.csv``
    worst: dict[tuple[str, str, float], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


#: one step of an ensemble: (attack label, its ID-side sets, its OOD-side sets)
Step = tuple[str, list[str], list[str]]


def attack_label(method: str, family: str) -> str:
    """A step's ``attack``: the method, ``_eot`` added for an EOT twin (``apgd_eot``)."""
    return method + ("_eot" if family == "eot" else "")


def _robust_sets(ctx: RunContext) -> list[tuple[str, str, str, float, str, str]]:
    """``(detector, side, source, eps, attack label, set)`` of every robust set of a detector the run scored."""
    out = []
    for name, adv in ctx.adv_sets.items():
        cls = robust_attack(adv.attack)
        if cls is not None and cls.detector in ctx.scores:
            out.append((cls.detector, cls.side, adv.source, float(adv.eps),
                        attack_label(cls.method, attack_family(cls)), name))
    return out


def ensemble_cells(ctx: RunContext) -> dict[tuple[str, str, float], list[Step]]:
    """``(detector, OOD set, eps) -> steps`` in :data:`ORDER`: per detector, each eps of its robust sets and each
    natural OOD set it has an OOD-side set on (every natural OOD set when it has none)."""
    sets = _robust_sets(ctx)
    cells: dict[tuple[str, str, float], list[Step]] = {}
    for det in dict.fromkeys(s[0] for s in sets):
        mine = [s for s in sets if s[0] == det]
        budgets: list[float] = []
        for s in mine:
            budgets += [] if any(math.isclose(s[3], b, rel_tol=1e-6) for b in budgets) else [s[3]]
        oods = list(dict.fromkeys(s[2] for s in mine if s[1] == "ood")) or list(ctx.ood_sets)
        for ood_set in oods:
            for eps in budgets:
                at = [s for s in mine if math.isclose(s[3], eps, rel_tol=1e-6)]
                cells[det, ood_set, eps] = [
                    (label, [s[5] for s in at if s[1] == "id" and s[4] == label],
                     [s[5] for s in at if s[1] == "ood" and s[4] == label and s[2] == ood_set])
                    for label in (attack_label(*m) for m in ORDER)]
                cells[det, ood_set, eps] = [st for st in cells[det, ood_set, eps] if st[1] or st[2]]
    return cells


def nothing_to_combine(steps: list[Step]) -> str:
    """Why a cell has no ensemble: no attack on one side, or one attack set per side; "" when it has one."""
    n_id, n_ood = sum(len(s[1]) for s in steps), sum(len(s[2]) for s in steps)
    if not n_id or not n_ood:
        return f"no {'ID' if not n_id else 'OOD'}-side robust attack"
    return "one attack per side" if n_id == 1 and n_ood == 1 else ""


def skipped_reason(cells: dict[str, list[str]]) -> str:
    """One line for every cell with nothing to combine, grouped by why (``cells``: why -> ``det (set, eps)``)."""
    said = "; ".join(f"{why} for {', '.join(where)}" for why, where in cells.items())
    return (f"no robust ensemble: {said}; an ensemble needs two or more attacks on a side and one on each (e.g. "
            "evaluator_params.robust_auroc.ensemble: standard)")


#: a per-image worst case so far: (the confidence it scores, the confidence it was chosen on)
Worst = tuple[np.ndarray, np.ndarray]


def worst_case(start: Worst, scores: dict[str, np.ndarray], choice: dict[str, np.ndarray], sets: list[str],
               lower: bool) -> Worst:
    """The per-image worst case over ``start`` and ``sets``: each image moves to a set whose *choice* confidence is
    strictly lower (``lower``, the ID side) or higher than its choice so far, and takes that set's *score*; a NaN
    score anywhere makes the image's worst case NaN. ``choice`` is :meth:`RunContext.choice_scores`: for a
    randomised detector its attack-stream confidences, so the evaluation draw of the chosen image is independent
    of every draw that chose it; for a deterministic one ``scores`` itself, and this is the plain minimum
    (maximum) of the scores."""
    value, chosen = np.array(start[0], float), np.array(start[1], float)
    for name in sets:
        by, score = np.asarray(choice[name], float), np.asarray(scores[name], float)
        take = ((by < chosen) if lower else (by > chosen)) | np.isnan(by)
        value = np.where(take | np.isnan(score), score, value)
        chosen = np.where(take, by, chosen)
    return value, chosen


def ensemble_key(det: str, ood_set: str, eps: float) -> str:
    """The cell key of a detector's ensemble row, whose draws every step of its ``robust_ensemble.csv`` shares."""
    return f"robust|{det}|ensemble|{ood_set}|{float(eps):.6g}"


def ensemble_cell(ctx: RunContext, det: str, ood_set: str, eps: float, steps: list[Step]
                  ) -> tuple[dict[str, Any], list[dict[str, Any]], tuple[np.ndarray, np.ndarray]]:
    """The ensemble row of one cell, its rows of ``robust_ensemble.csv`` (module docstring) and its worst case
    (ID side, OOD side)."""
    policy, scores, choice = ctx.intervals, ctx.scores[det], ctx.choice_scores(det)
    clean_id, clean_ood = np.asarray(scores["id"], float), np.asarray(scores[ood_set], float)
    id_sets, ood_sets = [n for s in steps for n in s[1]], [n for s in steps for n in s[2]]
    sizes = {len(scores[n]) for n in id_sets} | {len(clean_id)}, {len(scores[n]) for n in ood_sets} | {len(clean_ood)}
    if len(sizes[0]) > 1 or len(sizes[1]) > 1:
        raise ValueError(f"robust_auroc ensemble of {det}: its attacked sets are not the clean sets' size")
    common = {"detector": det, "ood_set": ood_set, "eps": eps, "ci": policy.label,
              "n_id": len(clean_id), "n_ood": len(clean_ood), "protocol": ctx.protocol}
    key, own = ensemble_key(det, ood_set, eps), {"clean_auroc": cell_key("ood", det, ood_set)}
    rows = []
    at_id, at_ood = (clean_id, np.asarray(choice["id"], float)), (clean_ood, np.asarray(choice[ood_set], float))
    for step, (label, ids, oods) in enumerate([("none", [], []), *steps]):
        new_id, new_ood = worst_case(at_id, scores, choice, ids, True), worst_case(at_ood, scores, choice, oods, False)
        set_id, set_ood = int((new_id[1] < at_id[1]).sum()), int((new_ood[1] > at_ood[1]).sum())
        at_id, at_ood = new_id, new_ood
        w_id, w_ood = at_id[0], at_ood[0]
        bounds, reason = robust_intervals(clean_id, clean_ood, w_id, w_ood, policy, key, own_keys=own)
        shown = "clean_auroc" if step == 0 else "robust_auroc"  # step 0 is the clean cell: ood.csv's interval
        rows.append({**common, "ci": bounds["ci"], "step": step, "attack": label, "id_attack": "+".join(ids),
                     "ood_attack": "+".join(oods),
                     "robust_auroc": robust_metrics(clean_id, clean_ood, w_id, w_ood)["robust_auroc"],
                     "robust_auroc_lo": bounds[f"{shown}_lo"], "robust_auroc_hi": bounds[f"{shown}_hi"],
                     "id_images_set": set_id, "ood_images_set": set_ood, "error": reason})
    row = {**common, "method": "ensemble", "attack_family": "all", **robust_metrics(clean_id, clean_ood, w_id, w_ood),
           **bounds, "id_attack": "+".join(id_sets), "ood_attack": "+".join(ood_sets), "error": reason}
    return row, rows, (w_id, w_ood)


def ensemble_of(ctx: RunContext) -> Ensemble:
    """The ensemble rows, ``robust_ensemble.csv`` and (as the part ``ensemble``) the cells with nothing to combine
    with why (the product :data:`ENSEMBLE`)."""
    rows, steps, worst, empty = [], [], {}, {}
    for (det, ood_set, eps), cell in ensemble_cells(ctx).items():
        reason = nothing_to_combine(cell)
        if reason:
            empty.setdefault(reason, []).append(f"{det} ({ood_set}, eps {float(eps):.6g})")
            continue
        row, cell_steps, worst[det, ood_set, eps] = ensemble_cell(ctx, det, ood_set, eps, cell)
        rows.append(row)
        steps += cell_steps
    skipped = {"ensemble": skipped_reason(empty)} if empty else {}
    if not rows:  # concatenating an empty frame would turn every column into objects: the reader checks len
        return Ensemble(pd.DataFrame(columns=COLUMNS), None, skipped, worst)
    return Ensemble(pd.DataFrame(rows).reindex(columns=COLUMNS), pd.DataFrame(steps, columns=STEP_COLUMNS), skipped,
                    worst)


#: the run's ensemble, computed once for the evaluators that read it
ENSEMBLE: Product[Ensemble] = Product("robust_ensemble", ensemble_of,
                                      "robust_auroc.csv's ensemble rows and robust_ensemble.csv")


#: the single-attack rows the leaderboard's robust fields read where a detector has no ensemble row, first found first
ROBUST_METHODS = ("pgd", "apgd", "apgd_aux", "square")


def robust_rows(robust: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The one rule of the leaderboard's robust fields (module docstring), shared by the writer and ``advopenood
    verify``: per detector of ``robust`` (``robust_auroc.csv``'s rows, the ensemble rows included), the rows its
    fields are the means of."""
    out = {}
    for det, part in robust.groupby("detector", sort=False):
        eps = part["eps"].astype(float)
        part = part[np.isclose(eps, eps.max())]
        methods = set(part["method"])
        method = "ensemble" if "ensemble" in methods else next((m for m in ROBUST_METHODS if m in methods),
                                                               sorted(methods)[0])
        part = part[part["method"] == method]
        if (part["attack_family"] == "eot").any():
            part = part[part["attack_family"] == "eot"]
        out[str(det)] = part
    return out
