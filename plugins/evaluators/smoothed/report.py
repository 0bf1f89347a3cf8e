"""The ``smoothed`` evaluator's report section: ``table_smoothed`` and one reading per row."""
from __future__ import annotations

import pandas as pd

from advopenood.plugin import Bullets, Paragraph, Section, Table, eps_label
from advopenood_plugins.attacks.eot import eot_name

def read_smoothed(table: pd.DataFrame) -> list[str]:
    """One reading per row: the plain and the EOT attack's AUROC, their difference, and what to report. Neither
    attack is called the stronger: smoothed.csv has no paired interval of the difference."""
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
        verdict = (f"EOT - plain = {eot - plain:+.1f} points, without a paired test on the images, so the two "
                   "attacks are not ranked; report the lower AUROC")
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
