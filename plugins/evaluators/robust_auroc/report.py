"""The ``robust_auroc`` evaluator's report section: ``robust_auroc.csv``'s AUROCs per detector and set with their
intervals, one reading per detector, method and eps, and the paired differences' readings."""
from __future__ import annotations

import pandas as pd

from advopenood.outputs.report import eps_label, join
from advopenood.outputs.report import name as label
from advopenood.outputs.results import Bullets, Paragraph, Section, Table
from advopenood_plugins.evaluators.robust_auroc.paired import read_robust_paired


def read_robust(table: pd.DataFrame) -> list[str]:
    """Per detector, method and eps: the clean AUROC against the robust one, averaged over the natural OOD sets,
    with both one-sided AUROCs."""
    out = []
    for (det, method, family, eps), part in table.groupby(["detector", "method", "attack_family", "eps"], sort=False):
        mean = part[["clean_auroc", "id_attacked_auroc", "ood_attacked_auroc", "robust_auroc"]].mean()
        verb = "falls to" if mean.robust_auroc < mean.clean_auroc else "stays at"
        how = method.upper() + (" with EOT gradients" if family == "eot" else "")
        out.append(f"{label(det)} ({how}, eps {eps_label(eps)}, mean over {len(part)} OOD set"
                   f"{'s' if len(part) > 1 else ''}): AUROC {verb} {mean.robust_auroc:.1f} from {mean.clean_auroc:.1f} "
                   f"when both sides are attacked (ID side alone {mean.id_attacked_auroc:.1f}, OOD side alone "
                   f"{mean.ood_attacked_auroc:.1f}).")
    below = sorted({label(d) for d in table.loc[table["robust_auroc"] < 50, "detector"]})
    if below:
        out.append(f"{join(below)} {'falls' if len(below) == 1 else 'fall'} below chance (robust AUROC < 50) on at "
                   "least one set: attacked OOD images look more in-distribution than attacked ID images.")
    return out


def robust_section(table: pd.DataFrame, paired: pd.DataFrame | None = None) -> Section:
    """``Robust AUROC``: the table's AUROCs per detector and set, and their readings, with the paired differences'
    (``robust_paired.csv``) when given."""
    bounds = [c for c in table.columns if c.endswith(("_lo", "_hi"))]
    shown = table.drop(columns=["id_attack", "ood_attack", "n_id", "n_ood", "protocol", "error", *bounds],
                       errors="ignore").copy()
    shown["eps"] = [eps_label(e) for e in shown["eps"]]
    if {"robust_auroc_lo", "robust_auroc_hi"} <= set(table.columns):
        shown.insert(shown.columns.get_loc("robust_auroc") + 1, "robust 95 % interval",
                     ["" if pd.isna(lo) else f"[{lo:.1f}, {hi:.1f}]"
                      for lo, hi in zip(table["robust_auroc_lo"], table["robust_auroc_hi"])])
    return Section("Robust AUROC (ID and OOD attacked)", [
        Paragraph("AUROC (%) with ID images attacked to look OOD and OOD images attacked to look in-distribution "
                  "inside the same Linf ball (ATD's and AROS's robust AUROC): clean, one side attacked, both sides "
                  "attacked (robust). Every image of both sets counts. A randomised detector (e.g. a smoothed one) "
                  "is attacked with EOT gradients (attack family eot) unless the evaluator is told otherwise, and "
                  "scored with evaluation noise independent of every noise draw its attacks saw."),
        Table(shown), Bullets(read_robust(table) + ([] if paired is None else read_robust_paired(paired)))])
