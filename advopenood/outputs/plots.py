"""Plot helpers for plugins (headless: figures are built without pyplot's GUI state); plots go under a run's
``plots/`` folder (:data:`PLOT_DIR`, ``ctx.plot_dir``).

* :func:`plot_auroc_heatmap`: detector x set AUROC heatmap of an OOD-metrics table (natural OOD sets, then
  attacks; red below chance, green above; cells whose interval contains 50 hatched and marked ``~``,
  :func:`chance_mask`).
* :func:`plot_roc`: ROC curves of one detector, one curve per natural OOD set and attack, from per-sample
  confidences (:func:`roc_sets` splits a saved score mapping; the adversarial positives are the protocol's,
  ``<attack>.positive``).

:func:`pick_examples` chooses the rows of an example grid (clean image next to its adversarial version): only
images the model classifies correctly when clean, so that every row shows an attack that changed a right answer.

Conventions follow :mod:`advopenood.evaluation.metrics` (OpenOOD): OOD/adversarial is the positive class, the decision
score is ``-conf``; the ROC's x axis is the share of ID samples flagged as OOD, the y axis the share of OOD
samples detected.
"""
from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Iterable, Mapping

import numpy as np
import pandas as pd

from advopenood.claims import name as display

if TYPE_CHECKING:  # matplotlib and scikit-learn load on first plot: seconds that every command would pay
    from matplotlib.figure import Figure

PLOT_DIR = "plots"


def safe_name(text: str) -> str:
    """``text`` as a file name part: other characters become ``_`` (``pgd@0.03`` stays, ``a/b`` -> ``a_b``)."""
    return re.sub(r"[^A-Za-z0-9._@-]+", "_", text)


def set_label(row: Mapping) -> str:
    """Column label of an ``ood.csv`` row: the natural OOD set's name, or the attack's (set) name."""
    return str(row["ood_set"]) if str(row["attack"]) == "none" else str(row["attack"])


def ood_matrix(ood: pd.DataFrame, metric: str = "auroc") -> pd.DataFrame:
    """``metric`` as a detector x set table (natural OOD sets first, then attacks, in file order; the number
    of natural-set columns is in ``table.attrs["n_natural"]``).

    Rows are detectors (``detector (backend)`` when one detector appears with several backends); when the
    file holds several datasets or architectures, columns are prefixed ``dataset/arch``.
    """
    if ood.empty:
        return pd.DataFrame()
    df = ood.copy()
    df["attack"] = df["attack"].fillna("none").astype(str)
    df["set"] = [set_label(r) for r in df.to_dict("records")]
    groups = df[["dataset", "arch"]].drop_duplicates()
    if len(groups) > 1:
        df["set"] = df["dataset"].astype(str) + "/" + df["arch"].astype(str) + " " + df["set"]
    multi = df.groupby("detector")["backend"].nunique(dropna=False) > 1
    df["row"] = [f"{d} ({b})" if multi.get(d, False) else str(d) for d, b in zip(df["detector"], df["backend"])]
    natural = list(dict.fromkeys(df.loc[df["attack"] == "none", "set"]))
    attacks = list(dict.fromkeys(df.loc[df["attack"] != "none", "set"]))
    table = df.pivot_table(index="row", columns="set", values=metric, aggfunc="mean", dropna=False, sort=False)
    table = table.reindex(index=list(dict.fromkeys(df["row"])), columns=natural + attacks)
    table.index.name, table.columns.name = "detector", None
    table.attrs["n_natural"] = len(natural)
    return table


def pick_examples(df: pd.DataFrame, k: int) -> pd.DataFrame:
    """Up to ``k`` rows of ``df`` (columns ``y``, ``clean_pred``, ``success``, ``l2``) for an example grid.

    Only clean-correct rows (``clean_pred == y``) qualify: a misclassified clean image "succeeds" under any
    attack without showing one. Among them the successful attacks, else all, spread over the ``l2`` range from
    largest to smallest. Empty when no row is clean-correct or ``k`` is 0.
    """
    pool = df[df["clean_pred"].to_numpy() == df["y"].to_numpy()]
    success = pool["success"].to_numpy(bool)
    if success.any():
        pool = pool[success]
    if k <= 0 or pool.empty:
        return pool.iloc[:0]
    pool = pool.sort_values("l2", ascending=False, kind="stable")
    picks = np.unique(np.linspace(0, len(pool) - 1, num=min(k, len(pool))).round().astype(int))
    return pool.iloc[picks]


def chance_mask(ood: pd.DataFrame) -> np.ndarray:
    """Which cells of :func:`ood_matrix` ``(ood, "auroc")`` have a 95 % interval (``auroc_lo``, ``auroc_hi``) that
    contains 50 (chance): a boolean detector x set array; False where a cell has no interval."""
    table = ood_matrix(ood, "auroc")
    if table.empty or "auroc_lo" not in ood or "auroc_hi" not in ood:
        return np.zeros(table.shape, dtype=bool)
    lo, hi = ood_matrix(ood, "auroc_lo").to_numpy(float), ood_matrix(ood, "auroc_hi").to_numpy(float)
    with np.errstate(invalid="ignore"):
        return (lo <= 50.0) & (50.0 <= hi)


def plot_auroc_heatmap(ood: pd.DataFrame, chance: np.ndarray | None = None) -> Figure:
    """Heatmap of AUROC (%) per detector and set; 50 (chance) is white, below red, above green. ``chance``: a boolean
    array of the table's shape (:func:`chance_mask`), its cells hatched and marked ``~`` (interval contains 50).

    Sized to its content: every cell gets the same size (0.9 x 0.34 in) whatever the number of detectors and sets,
    so labels keep their size (8 pt); with more sets than detectors the sets are the rows, so the figure grows down
    the page rather than across it."""
    table = ood_matrix(ood, "auroc")
    marked = np.zeros(table.shape, dtype=bool) if chance is None else np.asarray(chance, dtype=bool)
    sets_as_rows = table.shape[1] > table.shape[0]
    values = table.to_numpy(dtype=float)
    rows, cols = [display(r) for r in table.index], [display(c) for c in table.columns]  # one spelling
    if sets_as_rows:
        values, marked, rows, cols = values.T, marked.T, cols, rows
    n_rows, n_cols = values.shape
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.figure import Figure

    label_in = 0.075 * max(len(c) for c in cols) if cols else 1.0
    fig = Figure(figsize=(max(4.5, 0.9 * n_cols + 2.6), max(2.5, 0.34 * n_rows + 1.2 + label_in * 0.6)))
    ax = fig.subplots()
    im = ax.imshow(np.ma.masked_invalid(values), cmap="RdYlGn", norm=TwoSlopeNorm(vmin=0, vcenter=50, vmax=100),
                   aspect="auto")
    ax.set_facecolor("0.85")
    _heatmap_cells(ax, values, marked)
    ax.set_xticks(range(n_cols), cols, rotation=30 if max(map(len, cols), default=0) > 6 else 0, ha="right"
                  if max(map(len, cols), default=0) > 6 else "center", fontsize=8)
    ax.set_yticks(range(n_rows), rows, fontsize=8)
    _heatmap_groups(ax, table.attrs["n_natural"], len(table.columns), sets_as_rows)
    if sets_as_rows:  # the group labels take the right side
        fig.colorbar(im, ax=ax, label="AUROC (%)", orientation="horizontal", fraction=0.5 / (0.34 * n_rows + 2),
                     pad=0.6 / (0.34 * n_rows + 2) + 0.04)
    else:
        fig.colorbar(im, ax=ax, label="AUROC (%)", fraction=0.6 / (0.9 * n_cols + 2.6), pad=0.02)
    what = "sets (rows) and detectors (columns)" if sets_as_rows else "detectors (rows) and sets (columns)"
    ax.set_title(f"AUROC (%) per {what}; 50 = chance", fontsize=9, pad=18 if not sets_as_rows else 8)
    fig.tight_layout()
    return fig


def _heatmap_cells(ax, values: np.ndarray, marked: np.ndarray) -> None:
    """Each cell's value (``~`` and hatched where ``marked``, ``n/a`` where missing)."""
    from matplotlib.patches import Rectangle

    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            v = values[i, j]
            text = "n/a" if math.isnan(v) else f"~{v:.1f}" if marked[i, j] else f"{v:.1f}"
            ax.text(j, i, text, ha="center", va="center", fontsize=8,
                    color="black" if math.isnan(v) or 20 < v < 85 else "white")
            if marked[i, j]:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="//", edgecolor="0.4", lw=0))


def _heatmap_groups(ax, n_natural: int, n_sets: int, sets_as_rows: bool) -> None:
    """The line between natural OOD and adversarial sets, each side labelled."""
    if not 0 < n_natural < n_sets:
        return
    if sets_as_rows:
        ax.axhline(n_natural - 0.5, color="k", lw=1.5)
        ax.text(1.0, (n_natural - 1) / 2, " natural OOD", transform=ax.get_yaxis_transform(), va="center", fontsize=8)
        ax.text(1.0, (n_natural + n_sets - 1) / 2, " adversarial", transform=ax.get_yaxis_transform(), va="center",
                fontsize=8)
        return
    ax.axvline(n_natural - 0.5, color="k", lw=1.5)
    ax.text((n_natural - 1) / 2, -0.6, "natural OOD", ha="center", va="bottom", fontsize=8)
    ax.text((n_natural + n_sets - 1) / 2, -0.6, "adversarial", ha="center", va="bottom", fontsize=8)


def plot_roc(conf_id: np.ndarray, conf_ood: Mapping[str, np.ndarray], detector: str,
             adversarial: Iterable[str] = ()) -> Figure:
    """ROC curves of one detector: ID confidences ``conf_id`` against each set in ``conf_ood``.

    OOD is the positive class and ``-conf`` the score (OpenOOD); sets named in ``adversarial`` are drawn
    solid, natural OOD sets dashed. The legend, beside the axes (never over the curves; two columns past 24
    entries), gives each curve's AUROC in percent.
    """
    adversarial = set(adversarial)
    from matplotlib.figure import Figure
    from sklearn.metrics import auc, roc_curve

    n_curves = len(conf_ood) + 1
    columns = 1 if n_curves <= 24 else 2
    width, height = 5.0 + 2.4 * columns, max(4.8, 0.2 * math.ceil(n_curves / columns) + 1.0)
    fig = Figure(figsize=(width, height))
    ax = fig.add_axes((0.8 / width, 0.6 / height, 4.0 / width, 3.9 / height))  # 4 x 3.9 in, legend to its right
    conf_id = np.asarray(conf_id, dtype=float)
    for name, conf in conf_ood.items():
        conf = np.asarray(conf, dtype=float)
        if len(conf) == 0 or len(conf_id) == 0 or np.isnan(conf).any() or np.isnan(conf_id).any():
            continue
        scores = np.nan_to_num(-np.concatenate([conf_id, conf]), posinf=np.finfo(float).max / 2,
                               neginf=-np.finfo(float).max / 2)
        labels = np.r_[np.zeros(len(conf_id)), np.ones(len(conf))]
        fpr, tpr, _ = roc_curve(labels, scores)
        style = "-" if name in adversarial else "--"
        ax.plot(fpr, tpr, style, lw=1.5, label=f"{display(name)} (AUROC {100 * auc(fpr, tpr):.1f})")
    ax.plot([0, 1], [0, 1], color="0.6", lw=0.8, ls=":", label="chance")
    ax.axhline(0.95, color="0.4", lw=0.6, ls="-.")
    ax.text(0.99, 0.945, "TPR 95 %", ha="right", va="top", fontsize=7, color="0.3")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.01)
    ax.set_xlabel("FPR (ID samples flagged as OOD)")
    ax.set_ylabel("TPR (OOD / adversarial samples detected)")
    ax.set_title(f"ROC of {display(detector)}: natural OOD (dashed) and attacks (solid)", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.03, 1.0), frameon=False, ncol=columns)
    return fig


def roc_sets(scores: Mapping[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray], list[str]]:
    """Split a ``scores/<detector>.npz`` mapping into ID confidences, per-set OOD confidences (adversarial
    sets restricted to their OOD positives, ``<set>.positive``) and the adversarial set names."""
    masks = {k[: -len(".positive")]: np.asarray(v, dtype=bool) for k, v in scores.items() if k.endswith(".positive")}
    sets: dict[str, np.ndarray] = {}
    for name, conf in scores.items():
        if name == "id" or name.endswith((".success", ".positive")):
            continue
        conf = np.asarray(conf, dtype=float)
        mask = masks.get(name)
        sets[name] = conf[mask] if mask is not None and len(mask) == len(conf) else conf
    natural = [n for n in sets if n not in masks]
    order = natural + [n for n in sets if n in masks]
    return np.asarray(scores["id"], dtype=float), {n: sets[n] for n in order}, list(masks)
