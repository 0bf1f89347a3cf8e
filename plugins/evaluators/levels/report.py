"""The ``levels`` evaluator's report section: the criteria, the worst AUROC per level, one reading per detector,
the figure; rendered from ``levels.csv`` and its one-row-per-detector view alone."""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pandas as pd

from advopenood.plugin import MIN_CONCLUSIVE, Bullets, Figure, Paragraph, Section, Table, io as aio, join, name as label

#: a detector whose clean AUROC is below ``min_auroc`` plus this many points passes a level's bar without much to
#: lose (on the adversarially trained ResNet-20, MDS is 52.0 clean and 52.7 under PGD): the report says so
NEAR_BAR = 5.0


def levels_of(wide: pd.DataFrame) -> list[int]:
    """The levels a :func:`~.plugin.worst_levels` table has columns for (``level<k>_auroc``), in order."""
    return sorted(int(m.group(1)) for c in wide.columns if (m := re.fullmatch(r"level(\d+)_auroc", str(c))))


def read_levels(table: pd.DataFrame, clean: dict[str, float] | None = None) -> list[str]:
    """One sentence per row of :func:`~.plugin.worst_levels`: the level it reaches, where it falls short, which levels the run
    lacks; with
    ``clean`` (:func:`clean_aurocs`), a detector that reaches a level while its clean AUROC is within
    :data:`NEAR_BAR` points of ``min_auroc`` is said to detect little even unattacked (the bar is a floor)."""
    out = []
    clean = clean or {}
    levels = levels_of(table)
    for r in table.to_dict("records"):
        det, line = label(r["detector"]), float(r["min_auroc"])
        worst = {k: float(r[f"level{k}_auroc"]) for k in levels}
        missing = [str(k) for k in levels if math.isnan(worst[k])]
        gap = f" Levels {join(missing)} are not evaluated in this run." if len(missing) > 1 else \
            f" Level {missing[0]} is not evaluated in this run." if missing else ""
        if pd.isna(r["reached"]):
            out.append(f"{det}: no level is evaluated (the run has no strong, adaptive or OOD->ID set for it).")
            continue
        reached = int(r["reached"])
        failing = next((k for k in levels if k > reached and not math.isnan(worst[k])), None)
        head = (f"{det} reaches level {reached} (worst AUROC there {worst[reached]:.1f}{_span(r, reached)}, at least "
                f"{line:.0f})" if reached else f"{det} reaches no level")
        tail = (f"; at level {failing} its worst AUROC is {worst[failing]:.1f}{_span(r, failing)}, below {line:.0f}"
                if failing else "")
        base = clean.get(r["detector"], math.nan)
        weak = (f" Its clean AUROC is only {base:.1f}: it passes the bar of {line:.0f} without detecting much even "
                "unattacked." if reached and base < line + NEAR_BAR else "")
        out.append(f"{head}{tail}.{weak}{gap}")
    return out


def _span(row: dict[str, Any], level: int) -> str:
    """``, 95 % interval lo to hi`` of a level's worst AUROC as levels.csv holds it; ``""`` without one."""
    lo, hi = row.get(f"level{level}_lo", math.nan), row.get(f"level{level}_hi", math.nan)
    return "" if pd.isna(lo) or pd.isna(hi) else f", 95 % interval {float(lo):.1f} to {float(hi):.1f}"


def read_conclusive(table: pd.DataFrame) -> list[str]:
    """One sentence per ``levels.csv`` row that is not conclusive (``conclusive`` 0): its interval contains the bar,
    or the sample is too small to conclude (fewer than ``min_conclusive`` images a side): its pass or fail is not
    supported at 95 %."""
    out = []
    for r in table.to_dict("records"):
        if r.get("conclusive") == 0:
            verdict = "passes" if r["passed"] == 1 else "falls short of"
            why = ("the interval contains the bar" if r["auroc_lo"] <= r["min_auroc"] <= r["auroc_hi"] else
                   f"the sample has fewer than {MIN_CONCLUSIVE} images on a side")
            out.append(f"{label(r['detector'])} {verdict} the bar of {float(r['min_auroc']):.0f} at level {r['level']} "
                       f"({r['criterion']}: worst AUROC {r['auroc']:.1f}, 95 % interval {r['auroc_lo']:.1f} to "
                       f"{r['auroc_hi']:.1f} on {r['worst_set']}), but {why}: not conclusive.")
    return out


def plot_levels(table: pd.DataFrame, path: Path, min_auroc: float) -> Path:
    """Grouped bars: the worst AUROC per level and detector (rows of :func:`~.plugin.worst_levels`) with its 95 % interval as
    an error bar, chance and the ``min_auroc`` line; unevaluated levels are marked ``n/a``."""
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dets, levels = list(table["detector"]), levels_of(table)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.4 * len(dets) + 1.5), 3.2))
    width = 0.8 / len(levels)
    for i, k in enumerate(levels):
        xs = np.arange(len(dets)) + (i - 1.5) * width
        values = table[f"level{k}_auroc"].to_numpy(float)
        lo, hi = table[f"level{k}_lo"].to_numpy(float), table[f"level{k}_hi"].to_numpy(float)
        err = np.nan_to_num(np.stack([values - lo, hi - values]))  # no bar where a cell has no interval
        ax.bar(xs, np.nan_to_num(values), width, yerr=err, error_kw={"elinewidth": 0.6, "capsize": 1.5},
               label=f"level {k}")
        for x, v in zip(xs, values):
            ax.text(x, 1 if math.isnan(v) else v + 1, "n/a" if math.isnan(v) else f"{v:.0f}", ha="center",
                    va="bottom", fontsize=6, rotation=90)
    ax.axhline(50, color="grey", lw=0.8, ls=":", label="chance")
    if min_auroc != 50:
        ax.axhline(min_auroc, color="black", lw=0.8, ls="--", label=f"min_auroc {min_auroc:g}")
    ax.set_xticks(np.arange(len(dets)), [label(d) for d in dets])
    ax.set_ylim(0, 100)
    ax.set_ylabel("worst AUROC (%)")
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.15), frameon=False)
    aio.save_figure(fig, path)
    return path


def levels_section(table: pd.DataFrame, wide: pd.DataFrame, criteria: pd.DataFrame, figure: Path,
                   clean: dict[str, float] | None = None) -> Section:
    """``Levels of adversarial robustness``: the ``criteria`` and whose they are, the worst AUROC per level
    (``wide``, :func:`~.plugin.worst_levels` of ``levels.csv``'s ``table``), one reading per detector, the
    figure."""
    return Section("Levels of adversarial robustness", [
        Paragraph("Lorenz et al.'s four levels (Sec. 4): 1 strong attacks, 2 other models and data than the "
                  "ResNet-18 trained on CIFAR-10, 3 attacks adapted to the detector through BPDA, 4 adaptive attacks "
                  "and OOD->ID examples. Each criterion below is the paper's unless marked ours; the bar a level must "
                  "clear, a worst AUROC of at least min_auroc, is ours: Sec. 4 gives no number."),
        Table(criteria),
        Paragraph("Each cell is the worst AUROC (%) of the level's criteria (their sets are in levels.csv); empty "
                  "where the run has none."),
        Table(wide), Bullets(read_levels(wide, clean) + read_conclusive(table)),
        Figure(figure, "Worst AUROC (%) of each detector at each level (bars; n/a where the run has no set of the "
                       "level), with chance (dotted) and min_auroc (dashed)")])
