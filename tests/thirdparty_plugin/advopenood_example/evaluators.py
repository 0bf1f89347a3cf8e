"""An evaluator with its own table, figure and report section: each detector's mean confidence per set."""
from __future__ import annotations

import numpy as np
import pandas as pd

from advopenood.plugin import Bullets, Figure, Paragraph, Results, RunContext, Section, Table, save_figure

TITLE = "Mean confidence per set (example plugin)"


def mean_confidence(scores: dict[str, dict[str, np.ndarray]]) -> pd.DataFrame:
    """One row per detector and set: the mean confidence and the number of samples."""
    rows = [{"detector": det, "set": name, "mean_conf": float(np.mean(conf)), "n": len(conf)}
            for det, by_set in scores.items() for name, conf in by_set.items()]
    return pd.DataFrame(rows, columns=["detector", "set", "mean_conf", "n"])


def readings(table: pd.DataFrame, attacks: list[str]) -> list[str]:
    """Per detector and attack: whether the attack raises or lowers the mean confidence against clean ID."""
    out = []
    for det, part in table.groupby("detector", sort=False):
        conf = dict(zip(part["set"], part["mean_conf"]))
        for attack in attacks:
            if attack in conf and "id" in conf:
                verb = "raises" if conf[attack] > conf["id"] else "lowers"
                out.append(f"{attack} {verb} {det}'s mean confidence from {conf['id']:.3f} to {conf[attack]:.3f}.")
    return out


class MeanConfidence:
    """Mean detector confidence on clean ID, natural OOD and adversarial sets (example third-party evaluator)."""

    def __call__(self, ctx: RunContext) -> Results:
        table = mean_confidence(ctx.scores)
        wide = table.pivot(index="detector", columns="set", values="mean_conf")
        from matplotlib.figure import Figure as MplFigure

        fig = MplFigure(figsize=(5, 3))
        wide.T.plot.bar(ax=fig.subplots())
        path = ctx.plot_dir / "meanconf.png"
        save_figure(fig, path)
        section = Section(TITLE, [
            Paragraph(f"Mean confidence of {len(wide)} detectors on {wide.shape[1]} sets (higher = more ID)."),
            Table(wide, "mean confidence"), Bullets(readings(table, list(ctx.adv_sets))), Figure(path)])
        return Results(tables={"meanconf.csv": table}, figures=[path], sections=[section])
