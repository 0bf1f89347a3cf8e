"""The ``smoothed`` evaluator's report section: ``table_smoothed`` and one reading per row."""
from __future__ import annotations

import pandas as pd

from advopenood.outputs.results import Bullets, Paragraph, Section, Table
from advopenood.outputs.report import eps_label
from advopenood_plugins.attacks.eot import eot_name

def read_smoothed(table: pd.DataFrame) -> list[str]:
    """One reading per row: the plain and the EOT attack's AUROC, which is lower, and what to report."""
    out = []
    for r in table.to_dict("records"):
        head = (f"{r['detector']} (n={r['n']}, sigma={r['sigma']:g}, {r['statistic']}) at eps "
                f"{eps_label(r['eps']) or r['eps']} ({r['direction']})")
        base = "" if pd.isna(r["auroc_baseline"]) else \
            f"; the classifier-only baseline ({r['baseline']}) gives {r['auroc_baseline']:.1f}"
        plain, eot = r["auroc_plain"], r["auroc_eot"]
        if pd.isna(eot) and pd.isna(plain):
            continue
        if pd.isna(eot):
            out.append(f"{head}: AUROC {plain:.1f} under the plain attack{base}. No EOT attack in this run: the "
                       f"plain attack differentiates the noise-free detector, so this AUROC is only an upper bound on "
                       f"the smoothed detector's robustness; run {eot_name(r['plain_attack'])} too.")
            continue
        if pd.isna(plain):
            out.append(f"{head}: AUROC {eot:.1f} under the EOT attack ({r['eot_samples']} draws){base}; no plain "
                       "attack in this run to compare with.")
            continue
        delta = f"{abs(eot - plain):.1f}"
        if delta == "0.0":
            verdict = "the two attacks are equally strong"
        elif eot < plain:
            verdict = (f"the EOT attack is stronger by {delta} points: an evaluation with the plain attack alone "
                       "overstates the smoothed detector's robustness")
        else:
            verdict = (f"here the plain attack is the stronger by {delta} points (the EOT estimate may need more "
                       "draws or steps); report the lower AUROC")
        out.append(f"{head}: AUROC {plain:.1f} under the plain attack (noise-free gradient) and {eot:.1f} under EOT "
                   f"({r['eot_samples']} draws){base}; {verdict}.")
    return out


def smoothed_section(table: pd.DataFrame) -> Section:
    """``Smoothed detectors: plain vs EOT attacks``: the table and its readings."""
    return Section("Smoothed detectors: plain vs EOT attacks", [
        Paragraph("Each smoothed detector scores the median (or mean) of its base detector's confidence over n "
                  "seeded Gaussian-noise copies (sigma) of the image. Both adaptive attacks see its true confidence; "
                  "the plain one takes the base detector's gradient at the noise-free image, the EOT one averages "
                  "the gradient over the detector's noise draws. AUROC/FPR95 in percent, lower AUROC = stronger "
                  "attack; the robust figure is the lower of the two."),
        Table(table.drop(columns=[c for c in table.columns if c.endswith(("_lo", "_hi"))])),
        Bullets(read_smoothed(table))])
