"""The ``multiattack`` evaluator's figures: AUROC and FPR95 against eps per detector and norm, drawn from
``multiattack_curves.csv`` alone."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from advopenood.plugin import io as aio, safe_name


def plot_sweeps(curves: pd.DataFrame, plot_dir: Path, union: str = "union",
                metrics: tuple[str, str] = ("auroc", "fpr95")) -> list[str]:
    """``eps_sweep_<detector>_<norm>.png``: ``metrics`` (AUROC and FPR95) of ``multiattack_curves.csv`` against
    eps, one line per attack (dashed: the ``union`` row). Only attacks with two or more eps values are drawn;
    returns the file names written."""
    from matplotlib.figure import Figure

    written: list[str] = []
    bounded = curves[curves["eps"].notna()]
    for (detector, norm), part in bounded.groupby(["detector", "norm"], sort=False):
        swept = [a for a, g in part.groupby("attack", sort=False) if g["eps"].nunique() > 1]
        if not swept:
            continue
        fig = Figure(figsize=(9, 3.4))
        axes = fig.subplots(1, 2)
        for attack in swept:
            g = part[part["attack"] == attack].sort_values("eps")
            style = {"linestyle": "--", "color": "black"} if attack == union else {}
            for ax, metric in zip(axes, metrics):
                ax.plot(g["eps"], g[metric], marker="o", markersize=3, label=attack, **style)
        for ax, metric, chance in zip(axes, metrics, (50.0, 95.0)):
            ax.axhline(chance, color="grey", linewidth=0.8, linestyle=":")
            ax.set_xlabel(f"eps ({norm})")
            ax.set_ylabel(f"{metric.upper()} (%)")
            ax.grid(alpha=0.3)
        axes[0].set_title(f"{detector}: AUROC vs eps")
        axes[1].set_title(f"{detector}: FPR95 vs eps")
        axes[1].legend(fontsize=7)
        name = safe_name(f"eps_sweep_{detector}_{norm}.png")
        aio.save_figure(fig, plot_dir / name)
        written.append(name)
    return written
