"""Grad-CAM attention shift between clean images and their adversarial counterparts (paper section 4.2).

Lorenz et al., "Deciphering the Definition of Adversarial Robustness for Post-Hoc OOD Detectors", Sec. 4.2:
"we investigate the Grad-CAM output of benign and attacked images ... we consider two well-known metrics: the
mean square error distance (L2), and the structural similar index method (SSIM)". For every clean image and its
adversarial counterpart we compute a Grad-CAM map (pytorch-grad-cam, ``GradCAM`` on the classifier's last
convolutional block, or a transformer's declared token layer with pytorch-grad-cam's reshape transform). The explained class (``target``):

* ``prediction`` (default, the paper's): each map explains its own image's top prediction, the clean map the
  clean prediction and the adversarial map the adversarial prediction, as pytorch-grad-cam does with
  ``targets=None`` (OpenOOD's ``openood/evaluation_api/attackdataset.py`` calls it with ``targets = None``);
* ``clean`` (advopenood's variant): both maps explain the clean prediction, so a difference is a change in where
  the network looks for that one class, not a change of the explained class.

``gradcam.csv`` names the rule (``target_rule``) and each map's class (``clean_target``, ``adv_target``).
Maps are ReLU'd, upsampled bilinearly to the input size and min-max scaled to [0, 1] per image (by
pytorch-grad-cam), then compared with :func:`cam_distance`: L2 is the **mean squared** difference (the
paper's "L2" is a mean-square distance, not a Euclidean norm) and SSIM is scikit-image's
``structural_similarity`` with ``data_range=1``.

Each sample falls into one of the paper's regimes (:data:`REGIMES`: high/low L2 crossed with high/low SSIM).
The paper names the regimes but gives no numeric cut between high and low: the thresholds (default L2 0.02,
SSIM 0.5) are advopenood's choice, not the paper's, and every output says so (``threshold_origin``).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from advopenood.evaluation.context import RunContext
from advopenood.data.datasets import seeded_prefix, stack
from advopenood.errors import UsageError
from advopenood.io import save_figure
from advopenood.models.classifier import Classifier
from advopenood.outputs.results import Bullets, Figure as FigureItem, Paragraph, Results, Section, Table, as_written, guarded
from advopenood.outputs.plots import pick_examples, safe_name
from advopenood.registry import register
from advopenood.outputs.report import eps_label, fmt, pct
from advopenood.outputs.report import name as label

if TYPE_CHECKING:  # matplotlib loads on the first figure
    from matplotlib.figure import Figure

#: The paper's three regimes plus the corner it argues cannot occur (reported so shares sum to 100 %).
REGIMES = ("changed", "moved", "unchanged", "low_l2_low_ssim")
REGIME_MEANING = {
    "changed": "high L2, low SSIM: attention changed",
    "moved": "high L2, high SSIM: attention moved but kept its structure",
    "unchanged": "low L2, high SSIM: attention unchanged",
    "low_l2_low_ssim": "low L2, low SSIM: small but unstructured change",
}
#: ``successful`` / ``unsuccessful``: clean-correct images the attack did / did not flip; ``clean_misclassified``:
#: images the classifier already got wrong, which count as ``success`` (``adv_pred != y``) without any attack
SUBSETS = ("all", "successful", "unsuccessful", "clean_misclassified")
#: The explained class of each map: ``prediction`` (each image's own top prediction, the paper's) or ``clean``.
TARGET_RULES = ("prediction", "clean")
TARGET_MEANING = {"prediction": "each map explains its own image's prediction",
                  "clean": "both maps explain the clean prediction"}
#: The regime thresholds are advopenood's, not Lorenz et al.'s (the paper gives no numeric cut).
DEFAULT_THRESHOLDS = (0.02, 0.5)
CSV_COLUMNS = ["index", "attack", "eps", "y", "clean_pred", "adv_pred", "success", "target_rule", "clean_target",
               "adv_target", "l2", "ssim", "regime", "l2_threshold", "ssim_threshold", "threshold_origin", "protocol"]
#: The columns saying how a row was made, repeated in the summary.
PROVENANCE = ("target_rule", "l2_threshold", "ssim_threshold", "threshold_origin", "protocol")
SSIM_MIN_SIDE = 7


def upsample(maps: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Bilinearly resize maps ``(H, W)`` or ``(N, H, W)`` to ``size`` (e.g. an 8x8 CAM to the 32x32 input)."""
    arr = np.asarray(maps, dtype=np.float32)
    t = torch.from_numpy(arr.reshape(-1, 1, *arr.shape[-2:]))
    out = F.interpolate(t, size=tuple(size), mode="bilinear", align_corners=False)
    return out.reshape(*arr.shape[:-2], *size).numpy()


def cam_distance(map_a: np.ndarray, map_b: np.ndarray) -> tuple[float, float]:
    """``(l2, ssim)`` between two CAMs of equal shape with values in [0, 1].

    ``l2 = mean((a - b) ** 2)`` over all pixels (mean squared error, 0 for identical maps, at most 1);
    ``ssim = structural_similarity(a, b, data_range=1)`` (scikit-image, 7x7 uniform window, 1 for identical
    maps). Maps must be at least 7 pixels a side: :func:`upsample` small CAMs to the input size first.
    """
    a, b = np.asarray(map_a, dtype=np.float64), np.asarray(map_b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"cam_distance needs two 2-d maps of one shape, got {a.shape} and {b.shape}")
    if min(a.shape) < SSIM_MIN_SIDE:
        raise ValueError(f"maps of {a.shape[0]}x{a.shape[1]} are too small for SSIM's 7x7 window; "
                         "upsample them to the input size first")
    from skimage.metrics import structural_similarity

    l2 = float(np.mean((a - b) ** 2))
    ssim = float(structural_similarity(a, b, data_range=1.0))
    return l2, ssim


def classify_regime(l2: Any, ssim: Any, l2_threshold: float, ssim_threshold: float) -> np.ndarray:
    """Regime name per sample: L2 ``>= l2_threshold`` is high, SSIM ``>= ssim_threshold`` is high (see REGIMES)."""
    high_l2 = np.asarray(l2, dtype=float) >= l2_threshold
    high_ssim = np.asarray(ssim, dtype=float) >= ssim_threshold
    return np.where(high_l2, np.where(high_ssim, "moved", "changed"),
                    np.where(high_ssim, "unchanged", "low_l2_low_ssim")).astype(object)


class CamExtractor:
    """Grad-CAM on a :class:`Classifier`'s declared target layer (``cam_layer``); use as a context manager.

    The target layer and pytorch-grad-cam's ``reshape_transform`` come from the backbone: the last conv block
    for CNNs; for Swin-T the final LayerNorm (``B x 7 x 7 x C`` tokens, permuted to NCHW); for ViT-B/16 the last
    block's ``ln_1`` (class token dropped, patch tokens on the 14 x 14 grid); for timm models the last stage, or
    the last block's ``norm1`` for token models (:mod:`advopenood.models`).

    Grad-CAM needs only d(score)/d(A) for the block's output A. On entry a forward hook turns A into a
    leaf that requires grad, so the maps work when attacks froze the parameters (``requires_grad=False``),
    and backpropagation stops at A (no weight gradients, no pass through the earlier layers). The model is
    put in eval mode; on exit the hooks are removed and the training flag restored. Parameters are not touched.
    """

    def __init__(self, model: Classifier, device: torch.device):
        self.model, self.device = model, device
        self._cam = None
        self._leaf_hook = None
        self._training = False

    @staticmethod
    def _as_leaf(module: torch.nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
        return output.detach().requires_grad_(True)

    def __enter__(self) -> "CamExtractor":
        from pytorch_grad_cam import GradCAM

        self._training = self.model.training
        # registered before GradCAM's own hooks, so those see (and record gradients of) the leaf
        layer = self.model.cam_layer
        self._leaf_hook = layer.register_forward_hook(self._as_leaf)
        self._cam = GradCAM(model=self.model, target_layers=[layer], reshape_transform=self.model.cam_reshape)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._cam.activations_and_grads.release()
        self._leaf_hook.remove()
        self._cam = self._leaf_hook = None
        self.model.train(self._training)

    def __call__(self, x: torch.Tensor, targets: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Maps ``(N, H, W)`` in [0, 1] at ``x``'s spatial size, and the predictions of that forward pass.

        ``targets`` are the explained classes; ``None`` explains each image's own prediction.
        """
        from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

        if self._cam is None:
            raise RuntimeError("CamExtractor must be used inside a `with` block")
        cam_targets = None if targets is None else [ClassifierOutputTarget(int(t)) for t in targets]
        with torch.enable_grad():
            maps = self._cam(input_tensor=x.to(self.device), targets=cam_targets)
        preds = self._cam.outputs.argmax(1).detach().cpu().numpy()
        return np.clip(np.asarray(maps, dtype=np.float32), 0.0, 1.0), preds


def _distances(maps_a: np.ndarray, maps_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    pairs = [cam_distance(a, b) for a, b in zip(maps_a, maps_b)]
    return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])


def _select_rows(n: int, max_samples: int | None, seed: int) -> np.ndarray:
    """All rows, or a sorted seeded sample of ``max_samples`` of them."""
    if max_samples is None or max_samples >= n:
        return np.arange(n)
    return seeded_prefix(n, max_samples, seed)


def threshold_origin(l2_threshold: float, ssim_threshold: float) -> str:
    """Where the regime thresholds come from: advopenood's defaults or the run's config; never the paper."""
    if (l2_threshold, ssim_threshold) == DEFAULT_THRESHOLDS:
        return "advopenood default (not from the paper)"
    return "config (not from the paper)"


def subset_masks(df: pd.DataFrame) -> dict[str, np.ndarray]:
    """The rows of each of :data:`SUBSETS`: an attack succeeds on an image only if the clean image was classified
    correctly and the adversarial one is not (``clean_pred == y`` and ``success``)."""
    correct = df["clean_pred"].to_numpy() == df["y"].to_numpy()
    success = df["success"].to_numpy(bool)
    return {"all": np.ones(len(df), bool), "successful": correct & success, "unsuccessful": correct & ~success,
            "clean_misclassified": ~correct}


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Per attack and subset (all / successful / unsuccessful attacks on clean-correct images / clean-misclassified
    images, :func:`subset_masks`): n, means, medians, regime shares in %, and how the rows were made (target rule,
    thresholds and their origin, protocol)."""
    rows = []
    for attack, part in df.groupby("attack", sort=False):
        masks = subset_masks(part)
        for subset in SUBSETS:
            sub = part[masks[subset]]
            row: dict[str, Any] = {"attack": attack, "eps": part["eps"].iloc[0], "subset": subset, "n": len(sub)}
            for col in ("l2", "ssim"):
                row[f"{col}_mean"] = float(sub[col].mean()) if len(sub) else float("nan")
                row[f"{col}_median"] = float(sub[col].median()) if len(sub) else float("nan")
            for regime in REGIMES:
                row[f"pct_{regime}"] = float(100.0 * np.mean(sub["regime"] == regime)) if len(sub) else float("nan")
            row.update({k: part[k].iloc[0] for k in PROVENANCE})
            rows.append(row)
    return pd.DataFrame(rows)


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
        ax.imshow(cam, cmap="jet", alpha=0.5, vmin=0, vmax=1, interpolation="bilinear")
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
    full = summary[summary["subset"] == "all"].dropna(subset=["pct_unchanged"])
    if len(full) > 1:
        keep = full.loc[full["pct_unchanged"].idxmax()]
        shift = full.loc[full["pct_changed"].idxmax()]
        out.append(f"{label(keep['attack'])} preserves attention most ({pct(keep['pct_unchanged'])} unchanged); "
                   f"{label(shift['attack'])} changes it most ({pct(shift['pct_changed'])} changed).")
    return out



def gradcam_section(summary: pd.DataFrame, figures: list[Path]) -> Section:
    """``Grad-CAM attention shift``: regime shares per attack and subset, readings, then ``figures``."""
    table = summary.copy()
    if "eps" in table:
        table["eps"] = [eps_label(e) for e in table["eps"]]
    keep = [c for c in ("attack", "eps", "subset", "n", "l2_mean", "l2_median", "ssim_mean", "ssim_median",
                        "pct_changed", "pct_moved", "pct_unchanged", "pct_low_l2_low_ssim") if c in table]
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
                  "SSIM, unchanged = low L2 and high SSIM; shares in percent." + thresholds + protocol),
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


@register("analyses", "gradcam")
class GradCamAnalysis:
    """Grad-CAM attention shift (L2 / SSIM) between clean and adversarial images, with regimes and plots.

    Parameters: ``target`` (explained class, :data:`TARGET_RULES`: ``prediction``, the paper's, or ``clean``),
    ``l2_threshold`` (mean-squared-difference cut between low and high L2), ``ssim_threshold`` (cut between
    low and high SSIM; both thresholds are advopenood's, not the paper's), ``max_samples`` (seeded subset of the
    ID rows, ``None`` = all), ``n_examples`` (rows of the example grid, 0 = none), ``batch_size`` (default: the
    run's), ``progress`` (progress bar; also off when the run is ``--quiet``).
    """

    def __init__(self, target: str = "prediction", l2_threshold: float = DEFAULT_THRESHOLDS[0],
                 ssim_threshold: float = DEFAULT_THRESHOLDS[1], max_samples: int | None = None, n_examples: int = 6,
                 batch_size: int | None = None, progress: bool = True):
        if target not in TARGET_RULES:
            raise UsageError(f"gradcam target {target!r} is unknown; valid choices: {', '.join(TARGET_RULES)}")
        if not 0.0 < float(l2_threshold) <= 1.0:
            raise UsageError(f"gradcam l2_threshold {l2_threshold!r} is out of range; valid choices: "
                             "0 < l2_threshold <= 1 (mean squared difference of maps in [0, 1])")
        if not -1.0 <= float(ssim_threshold) <= 1.0:
            raise UsageError(f"gradcam ssim_threshold {ssim_threshold!r} is out of range; valid choices: "
                             "-1 <= ssim_threshold <= 1")
        if max_samples is not None and int(max_samples) < 1:
            raise UsageError(f"gradcam max_samples {max_samples!r} is out of range; valid choices: "
                             "a positive integer or null (all)")
        if int(n_examples) < 0:
            raise UsageError(f"gradcam n_examples {n_examples!r} is out of range; valid choices: 0 or more")
        if batch_size is not None and int(batch_size) < 1:
            raise UsageError(f"gradcam batch_size {batch_size!r} is out of range; valid choices: "
                             "a positive integer or null")
        self.target = target
        self.l2_threshold, self.ssim_threshold = float(l2_threshold), float(ssim_threshold)
        self.max_samples = None if max_samples is None else int(max_samples)
        self.n_examples = int(n_examples)
        self.batch_size = None if batch_size is None else int(batch_size)
        self.progress = bool(progress)

    def __call__(self, ctx: RunContext) -> Results:
        n = len(ctx.id_set)
        for name, adv in ctx.id_adv_sets.items():
            if len(adv) != n:
                raise ValueError(f"adversarial set {name!r} has {len(adv)} rows but the ID set has {n}")
        rows = _select_rows(n, self.max_samples, ctx.seed)
        bs = self.batch_size or ctx.batch_size
        parts: dict[str, list[dict[str, np.ndarray]]] = {name: [] for name in ctx.id_adv_sets}
        with CamExtractor(ctx.model, ctx.device) as cam:
            batches = [rows[i:i + bs] for i in range(0, len(rows), bs)] if ctx.id_adv_sets else []
            show = self.progress and ctx.progress
            for batch in tqdm(batches, desc="gradcam", unit="batch", leave=False, disable=not show):
                x, _ = stack(ctx.id_set, batch)
                clean_maps, clean_pred = cam(x)
                for name, adv in ctx.id_adv_sets.items():
                    x_adv = adv.load(batch)
                    if self.target == "prediction":
                        adv_maps, adv_target = cam(x_adv)
                    else:
                        adv_maps, _ = cam(x_adv, clean_pred)
                        adv_target = clean_pred
                    part = {"row": batch, "clean_target": clean_pred, "adv_target": adv_target}
                    part["l2"], part["ssim"] = _distances(clean_maps, adv_maps)
                    parts[name].append(part)
            frames = [self._frame(ctx, name, adv, parts[name]) for name, adv in ctx.id_adv_sets.items()]
            examples = {name: self._plot_examples(ctx, cam, name, frame) if self.n_examples else None
                        for name, frame in zip(ctx.id_adv_sets, frames)}
        df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=CSV_COLUMNS)
        figures: list[Path] = []
        for name, frame in zip(ctx.id_adv_sets, frames):
            path = ctx.plot_dir / f"gradcam_{safe_name(name)}.png"
            save_figure(plot_shift(frame, name, self.l2_threshold, self.ssim_threshold, self.target), path)
            figures += [path] + ([examples[name]] if examples[name] is not None else [])
        summary = summarize(df) if len(df) else pd.DataFrame()
        sections = (guarded("Grad-CAM attention shift", lambda: [gradcam_section(as_written(summary, ctx.protocol), figures)])
                    if len(summary) else [])
        return Results(tables={"gradcam.csv": df.drop(columns=["row"], errors="ignore"), "gradcam_summary.csv": summary},
                       figures=figures, sections=sections)

    def _frame(self, ctx: RunContext, name: str, adv, parts: list[dict[str, np.ndarray]]) -> pd.DataFrame:
        cols = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        rec = adv.records.iloc[cols["row"]].reset_index(drop=True)
        df = pd.DataFrame({"row": cols["row"], "index": rec["index"].to_numpy(), "attack": name,
                           "eps": np.nan if adv.eps is None else float(adv.eps), "y": rec["y"].to_numpy(),
                           "clean_pred": rec["clean_pred"].to_numpy(), "adv_pred": rec["adv_pred"].to_numpy(),
                           "success": rec["success"].to_numpy(bool), "target_rule": self.target,
                           "clean_target": cols["clean_target"], "adv_target": cols["adv_target"],
                           "l2": cols["l2"], "ssim": cols["ssim"]})
        df["regime"] = classify_regime(df["l2"], df["ssim"], self.l2_threshold, self.ssim_threshold)
        df["l2_threshold"], df["ssim_threshold"] = self.l2_threshold, self.ssim_threshold
        df["threshold_origin"] = threshold_origin(self.l2_threshold, self.ssim_threshold)
        df["protocol"] = ctx.protocol
        return df

    def _plot_examples(self, ctx: RunContext, cam: CamExtractor, name: str, frame: pd.DataFrame) -> Path | None:
        """The example grid of one attack (``plots/gradcam_examples_<attack>.png``); None when no row qualifies."""
        picks = pick_examples(frame, self.n_examples)
        if picks.empty:
            return None
        rows = picks["row"].to_numpy()
        x, _ = stack(ctx.id_set, rows)
        x_adv = ctx.id_adv_sets[name].load(rows)
        maps, _ = cam(x, picks["clean_target"].to_numpy())
        maps_adv, _ = cam(x_adv, picks["adv_target"].to_numpy())
        fig = plot_examples(x.numpy(), x_adv.numpy(), maps, maps_adv, picks, name, self.target)
        path = ctx.plot_dir / f"gradcam_examples_{safe_name(name)}.png"
        save_figure(fig, path)
        return path
