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
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from advopenood.plugin import (Classifier, ImageCount, Results, RunContext, UsageError, Verifiable, as_written, bounded,
                               pick_examples, register, safe_name, save_figure, seeded_prefix, stack)
from advopenood_plugins.analyses.gradcam.regimes import (DEFAULT_THRESHOLDS, TARGET_RULES, classify_regime,
                                                         threshold_origin)
from advopenood_plugins.analyses.gradcam.summary import summarize
from advopenood_plugins.analyses.gradcam.verify import verify as verify_gradcam
from advopenood_plugins.analyses.gradcam.report import gradcam_sections, plot_examples, plot_shift, report_sections

CSV_COLUMNS = ["index", "attack", "eps", "y", "clean_pred", "adv_pred", "success", "target_rule", "clean_target",
               "adv_target", "l2", "ssim", "regime", "l2_threshold", "ssim_threshold", "threshold_origin", "protocol"]
SSIM_MIN_SIDE = 7
#: the most rows the example figure takes (``n_examples``): each row is four images of the page
MAX_EXAMPLES = 100


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


@register("analyses", "gradcam")
class GradCamAnalysis(Verifiable):
    """Grad-CAM attention shift (L2 / SSIM) between clean and adversarial images, with regimes and plots.

    Parameters: ``target`` (explained class, :data:`TARGET_RULES`: ``prediction``, the paper's, or ``clean``),
    ``l2_threshold`` (mean-squared-difference cut between low and high L2), ``ssim_threshold`` (cut between
    low and high SSIM; both thresholds are advopenood's, not the paper's), ``max_samples`` (seeded subset of the
    ID rows, ``None`` = all), ``n_examples`` (rows of the example grid, 0 = none), ``batch_size`` (default: the
    run's), ``progress`` (progress bar; also off when the run is ``--quiet``). ``gradcam_summary.csv`` holds a 95 %
    interval beside every number (:mod:`.summary`); ``advopenood verify`` re-derives it from ``gradcam.csv``
    (:mod:`.verify`).
    """

    verify = staticmethod(verify_gradcam)
    report_sections = staticmethod(report_sections)  # verify: the section from the CSV and the plots
    #: the bounds of its counts, checked before it is built (docs/analyses.md, "Parameter bounds")
    param_types = {"max_samples": ImageCount | None, "n_examples": bounded(int, 0, MAX_EXAMPLES, "example rows")}

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
            save_figure(plot_shift(frame, name, self.l2_threshold, self.ssim_threshold, self.target), path, colors=64)
            figures += [path] + ([examples[name]] if examples[name] is not None else [])
        summary = summarize(df) if len(df) else pd.DataFrame()
        sections = gradcam_sections(as_written(summary, ctx.protocol), figures)
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
        save_figure(fig, path, colors=64)  # photo-like maps: 64 colours keep the page small
        return path
