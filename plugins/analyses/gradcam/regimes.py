"""The ``gradcam`` analysis's definitions, shared by its tables and its report: the regimes of Lorenz et al.'s
Figure 1, the subsets of images, the explained class of a map, and where the thresholds come from."""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

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


def classify_regime(l2: Any, ssim: Any, l2_threshold: float, ssim_threshold: float) -> np.ndarray:
    """Regime name per sample: L2 ``>= l2_threshold`` is high, SSIM ``>= ssim_threshold`` is high (see REGIMES)."""
    high_l2 = np.asarray(l2, dtype=float) >= l2_threshold
    high_ssim = np.asarray(ssim, dtype=float) >= ssim_threshold
    return np.where(high_l2, np.where(high_ssim, "moved", "changed"),
                    np.where(high_ssim, "unchanged", "low_l2_low_ssim")).astype(object)


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
