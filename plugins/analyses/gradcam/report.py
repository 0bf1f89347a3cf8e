"""The ``gradcam`` analysis's figures and report section: the L2-vs-SSIM shift per attack, example maps, and one
reading per attack from ``gradcam_summary.csv``."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from advopenood.plugin import (PLOT_DIR, Bullets, Figure as FigureItem, Paragraph, Section, Table, eps_label, fmt,
                               guarded, name as label, pct, safe_name)
from advopenood_plugins.analyses.gradcam.regimes import REGIME_MEANING, TARGET_MEANING, subset_masks

if TYPE_CHECKING:  # matplotlib loads on the first figure
    from matplotlib.figure import Figure


def _density(x: np.ndarray, y: np.ndarray, bins: int = 60) -> np.ndarray:
    """Relative point density (smoothed 2-d histogram looked up at each point), 1 at the densest point."""
    if len(x) < 3:
        return np.ones(len(x))
    xr = (0.0, max(float(x.max()), 1e-6) * 1.001)
    yr = (min(float(y.min()), 0.0), 1.0001)
    from scipy.ndimage import gaussian_filter

    hist, xe, ye = np.histogram2d(x, y, bins=bins, range=(xr, yr))
    hist = gaussian_filter(hist, sigma=1.5)
    ix = np.clip(np.searchsorted(xe, x, side="right") - 1, 0, bins - 1)
    iy = np.clip(np.searchsorted(ye, y, side="right") - 1, 0, bins - 1)
    d = hist[ix, iy]
    return d / d.max() if d.max() > 0 else np.ones(len(x))


REGIME_COLORS = {"changed": "tab:red", "moved": "tab:orange", "unchanged": "tab:green", "low_l2_low_ssim": "tab:gray"}


def plot_shift(df: pd.DataFrame, attack: str, l2_threshold: float, ssim_threshold: float,
               target_rule: str = "prediction") -> Figure:
    """L2-vs-SSIM scatter coloured by density (red dense, blue sparse, as the paper's Figure 1); the regime
    quadrants are shaded and their shares given in the legend; unsuccessful attacks are grey crosses, images
    misclassified when clean grey circles (:func:`subset_masks`)."""
    from matplotlib.patches import Patch

    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 5.6))
    ax = fig.subplots()
    l2, ssim = df["l2"].to_numpy(float), df["ssim"].to_numpy(float)
    masks = subset_masks(df)
    ok, failed, wrong = masks["successful"], masks["unsuccessful"], masks["clean_misclassified"]
    xmax = max(float(l2.max()) * 1.05 if len(l2) else 0.0, l2_threshold * 2)
    ymin = min(float(ssim.min()) - 0.05 if len(ssim) else 0.0, 0.0)
    quadrants = {"unchanged": ((0, l2_threshold), (ssim_threshold, 1.05)),
                 "moved": ((l2_threshold, xmax), (ssim_threshold, 1.05)),
                 "changed": ((l2_threshold, xmax), (ymin, ssim_threshold)),
                 "low_l2_low_ssim": ((0, l2_threshold), (ymin, ssim_threshold))}
    handles = []
    for regime, ((x0, x1), (y0, y1)) in quadrants.items():
        ax.fill_between([x0, x1], y0, y1, color=REGIME_COLORS[regime], alpha=0.08, lw=0)
        share = 100.0 * np.mean(df["regime"] == regime) if len(df) else float("nan")
        name = "" if regime == "low_l2_low_ssim" else f"{regime} "
        handles.append(Patch(color=REGIME_COLORS[regime], alpha=0.3,
                             label=f"{name}({REGIME_MEANING[regime].split(':')[0]}): {share:.1f} %"))
    dens = _density(l2, ssim)
    order = np.argsort(dens[ok])
    sc = ax.scatter(l2[ok][order], ssim[ok][order], c=dens[ok][order], cmap="jet", vmin=0, vmax=1, s=14,
                    edgecolors="none", label=f"successful attack ({ok.sum()})")
    handles.append(sc)
    if failed.any():
        handles.append(ax.scatter(l2[failed], ssim[failed], marker="x", c="0.35", s=16, linewidths=0.8,
                                  label=f"unsuccessful attack ({failed.sum()})"))
    if wrong.any():
        handles.append(ax.scatter(l2[wrong], ssim[wrong], marker="o", facecolors="none", edgecolors="0.35", s=16,
                                  linewidths=0.8, label=f"misclassified when clean ({wrong.sum()})"))
    fig.colorbar(sc, ax=ax, label="relative density")
    ax.set_xlim(0, xmax)
    ax.set_ylim(ymin, 1.05)
    ax.axvline(l2_threshold, color="k", ls="--", lw=0.8)
    ax.axhline(ssim_threshold, color="k", ls="--", lw=0.8)
    ax.set_xlabel("L2 (mean squared difference of the Grad-CAM maps)")
    ax.set_ylabel("SSIM")
    ax.set_title(f"Grad-CAM shift under {attack} (n={len(df)}; {TARGET_MEANING[target_rule]})\n"
                 f"thresholds L2 {l2_threshold:g}, SSIM {ssim_threshold:g}: advopenood's, not the paper's", fontsize=9)
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, fontsize=8, frameon=False)
    return fig


def _show(ax, img: np.ndarray, cam: np.ndarray | None = None) -> None:
    img = np.transpose(img, (1, 2, 0))
    ax.imshow(img[..., 0] if img.shape[-1] == 1 else img, cmap="gray" if img.shape[-1] == 1 else None,
              vmin=0, vmax=1, interpolation="nearest")
    if cam is not None:
        ax.imshow(cam, cmap="jet", alpha=0.5, vmin=0, vmax=1, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])


def plot_examples(x: np.ndarray, x_adv: np.ndarray, cams: np.ndarray, cams_adv: np.ndarray,
                  rows: pd.DataFrame, attack: str, target_rule: str = "prediction") -> Figure:
    """Grid with one sample per row: clean image, clean CAM, adversarial image, adversarial CAM (overlaid)."""
    n = len(rows)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.2, 1.9 * n + 0.4))
    axes = fig.subplots(n, 4, squeeze=False)
    for i, (_, r) in enumerate(rows.iterrows()):
        _show(axes[i, 0], x[i])
        _show(axes[i, 1], x[i], cams[i])
        _show(axes[i, 2], x_adv[i])
        _show(axes[i, 3], x_adv[i], cams_adv[i])
        axes[i, 0].set_ylabel(f"#{int(r['index'])}", fontsize=8)
        axes[i, 0].set_title(f"clean, label {int(r['y'])}, pred {int(r['clean_pred'])}", fontsize=8)
        axes[i, 1].set_title(f"clean CAM, class {int(r['clean_target'])}", fontsize=8)
        axes[i, 2].set_title(f"{attack}, pred {int(r['adv_pred'])}", fontsize=8)
        axes[i, 3].set_title(f"{attack} CAM, class {int(r['adv_target'])}\nL2 {r['l2']:.3f}, SSIM {r['ssim']:.2f}: "
                             f"{r['regime']}", fontsize=8)
    fig.suptitle(f"Grad-CAM, clean vs {attack} ({TARGET_MEANING[target_rule]})", fontsize=10)
    fig.tight_layout()
    return fig


def read_gradcam(summary: pd.DataFrame) -> list[str]:
    """Per attack: the regime shares of the successful attacks (and how unsuccessful ones compare)."""
    out = []
    for attack, part in summary.groupby("attack", sort=False):
        by = {r["subset"]: r for r in part.to_dict("records")}
        main = by.get("successful") if by.get("successful", {}).get("n", 0) else by.get("all")
        if not main or not main.get("n"):
            continue
        who = "successful attacks" if main is by.get("successful") else "samples"
        text = (f"Under {label(attack)}, Grad-CAM attention changed (high L2, low SSIM) for "
                f"{pct(main['pct_changed'])} of {int(main['n'])} {who}, moved with its structure kept for "
                f"{pct(main['pct_moved'])} and stayed unchanged for {pct(main['pct_unchanged'])} "
                f"(median L2 {fmt(main['l2_median'])}, median SSIM {fmt(main['ssim_median'])})")
        miss = by.get("unsuccessful")
        if miss and miss.get("n"):
            text += (f"; of the {int(miss['n'])} unsuccessful attacks, {pct(miss['pct_unchanged'])} left it "
                     "unchanged")
        out.append(text + ".")
    return out



def _bracketed(value: float, lo: float, hi: float) -> str:
    """``v [lo, hi]`` (3 significant digits), ``v`` without an interval, ``n/a`` without a value."""
    if pd.isna(value):
        return "n/a"
    return fmt(value) if pd.isna(lo) or pd.isna(hi) else f"{fmt(value)} [{fmt(lo)}, {fmt(hi)}]"


def gradcam_section(summary: pd.DataFrame, figures: list[Path]) -> Section:
    """``Grad-CAM attention shift``: regime shares per attack and subset, readings, then ``figures``."""
    table = summary.copy()
    if "eps" in table:
        table["eps"] = [eps_label(e) for e in table["eps"]]
    keep = [c for c in ("attack", "eps", "subset", "n", "l2_mean", "l2_median", "ssim_mean", "ssim_median",
                        "pct_changed", "pct_moved", "pct_unchanged", "pct_low_l2_low_ssim") if c in table]
    for col in keep[4:]:
        if f"{col}_lo" in table and f"{col}_hi" in table:
            table[col] = [_bracketed(v, lo, hi) for v, lo, hi in zip(table[col], table[f"{col}_lo"],
                                                                      table[f"{col}_hi"])]
    rules = {"prediction": "each map explains its own image's top prediction (the clean map the clean prediction, "
                           "the adversarial map the adversarial prediction; the paper's rule)",
             "clean": "both maps explain the clean prediction (advopenood's variant, not the paper's rule)"}
    rule = str(summary["target_rule"].iloc[0]) if "target_rule" in summary and len(summary) else ""
    target = f"; {rules.get(rule, f'target rule {rule}')}" if rule else ""
    thresholds = ""
    if {"l2_threshold", "ssim_threshold"} <= set(summary.columns) and len(summary):
        thresholds = (f" Thresholds: L2 >= {fmt(float(summary['l2_threshold'].iloc[0]))} is high, "
                      f"SSIM >= {fmt(float(summary['ssim_threshold'].iloc[0]))} is high; the paper gives no numeric "
                      "thresholds, these are advopenood's.")
    protocol = f" Protocol: {summary['protocol'].iloc[0]}." if "protocol" in summary and len(summary) else ""
    return Section("Grad-CAM attention shift", [
        Paragraph("Grad-CAM maps of each clean image and its adversarial counterpart on the last convolutional "
                  f"block{target}. L2 is the mean squared difference of the maps (in [0, 1]), SSIM their structural "
                  "similarity. Regimes (paper, section 4.2): changed = high L2 and low SSIM, moved = high L2 and high "
                  "SSIM, unchanged = low L2 and high SSIM; shares in percent. Each number has its 95 % interval in "
                  "brackets (ci column of gradcam_summary.csv: Wilson's for shares, normal for means, "
                  "order-statistic for medians)." + thresholds + protocol + " Per-image values: gradcam.csv."),
        Table(table[keep]), Bullets(read_gradcam(summary)),
        *[FigureItem(p, gradcam_caption(Path(p))) for p in figures]])


def gradcam_caption(path: Path) -> str:
    """What a Grad-CAM figure shows, from its file name (``gradcam_<set>.png``, ``gradcam_examples_<set>.png``)."""
    if path.stem.startswith("gradcam_examples_"):
        return (f"Examples under {path.stem.removeprefix('gradcam_examples_')}, one image per row: the clean image, "
                "its Grad-CAM map, the adversarial image and its map")
    return (f"Grad-CAM shift under {path.stem.removeprefix('gradcam_')}: L2 against SSIM of each image's clean and "
            "adversarial maps, coloured by density; the shaded quadrants are the regimes, with their shares in the "
            "legend")


def gradcam_sections(summary: pd.DataFrame, figures: list[Path]) -> list[Section]:
    """The report's ``Grad-CAM attention shift`` from ``gradcam_summary.csv`` as written and its ``figures`` (none
    without a row); the run builds it from the table it writes, ``advopenood verify`` from the CSV
    (:func:`report_sections`)."""
    return guarded("Grad-CAM attention shift", lambda: [gradcam_section(summary, figures)]) if len(summary) else []


def report_sections(run: Any) -> list[Section]:
    """:func:`gradcam_sections` from a run folder (:class:`advopenood.evaluation.runfiles.RunFiles`):
    ``gradcam_summary.csv`` and, per attack in its order, ``plots/gradcam_<attack>.png`` then
    ``plots/gradcam_examples_<attack>.png`` where the folder holds them (the run's order)."""
    summary = run.table("gradcam_summary.csv")
    attacks = dict.fromkeys(summary["attack"].astype(str)) if "attack" in summary else {}
    plots = [f"{PLOT_DIR}/gradcam_{kind}{safe_name(a)}.png" for a in attacks for kind in ("", "examples_")]
    return gradcam_sections(summary, [run.path / p for p in plots if run.has(p)])
