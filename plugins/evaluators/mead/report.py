"""The ``mead`` evaluator's report section: ``mead.csv``'s AUROC per detector and setting, group and eps, with one
reading per group."""
from __future__ import annotations

import pandas as pd

from advopenood.plugin import CHANCE, Bullets, Paragraph, Section, Table, eps_label, join, name as label


def read_mead(mead: pd.DataFrame) -> list[str]:
    """Per (norm, eps) group of MEAD's all-attack worst case: detectors below chance, or that none is. No
    detector is called the best: mead.csv has no paired comparison of detectors."""
    out = []
    worst = mead[mead["setting"] == "mead"] if (mead["setting"] == "mead").any() else mead
    for (norm, eps), part in worst.groupby(["norm", worst["eps"].fillna(-1.0)], sort=False):
        part = part.dropna(subset=["auroc"])
        if part.empty:
            continue
        group = f"{norm}" + (f", eps {eps_label(eps)}" if eps >= 0 else ", unbounded")
        below = [label(d) for d, a in zip(part["detector"], part["auroc"]) if a < CHANCE]
        if below:
            out.append(f"Under MEAD's worst case over all attacks ({group}), {len(below)} of {len(part)} detectors "
                       f"fall below chance ({join(below)}).")
        else:
            out.append(f"Under MEAD's worst case over all attacks ({group}) no detector falls below chance.")
    return out


def mead_section(mead: pd.DataFrame) -> Section:
    """``MEAD worst case``: AUROC per detector (rows) and setting, group and eps (columns), with readings."""
    table = mead.copy()
    table["group"] = [f"{s} {n} {eps_label(e) or 'unbounded'}"
                      for s, n, e in zip(table["setting"], table["norm"], table["eps"])]
    wide = table.pivot_table(index="detector", columns="group", values="auroc", aggfunc="mean", sort=False)
    wide = wide.reindex(index=list(dict.fromkeys(table["detector"])), columns=list(dict.fromkeys(table["group"])))
    wide.columns.name = None
    protocol = f" Protocol: {mead['protocol'].iloc[0]}." if "protocol" in mead and len(mead) else ""
    return Section("MEAD worst case", [
        Paragraph("AUROC (%) per detector when a clean image counts as detected only if every successful attack on "
                  "it is detected (Granese et al.); columns: setting, group (norm l1, l2 or linf; patch for patch "
                  "attacks such as mPGD, kept out of the norm groups), eps. Attacks without one of MEAD's objectives "
                  "(DeepFool, CW) enter every objective setting, as in MEAD's tables." + protocol),
        Table(wide, "MEAD AUROC (%)"), Bullets(read_mead(mead))])
