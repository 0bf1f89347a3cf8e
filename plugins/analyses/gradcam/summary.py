"""``gradcam_summary.csv``: per attack and subset of ``gradcam.csv``'s rows, n, the mean and median L2 and SSIM and
the regime shares, each with its 95 % interval, named in the ``ci`` column (:data:`CI_LABEL`):

* a regime share (``pct_<regime>``): Wilson's score interval on ``k`` of ``n`` images
  (:func:`advopenood.evaluation.intervals.wilson`), as ``asr.csv`` has it;
* a mean (``<col>_mean``): the normal interval ``mean +- z s / sqrt(n)`` with the sample standard deviation ``s``
  (``n - 1`` in the denominator); none for fewer than 2 images;
* a median (``<col>_median``): the distribution-free order-statistic interval ``[x_(l), x_(n+1-l)]`` of the sorted
  values, ``l`` the smallest rank with ``P(Bin(n, 1/2) <= l) >= 0.025`` (coverage at least 95 %; Conover 1999,
  Sec. 3.2); none for fewer than 6 images, where no such rank leaves 95 %.

The intervals are over the images of the cell; they need no seed. ``advopenood verify`` re-derives the summary from
``gradcam.csv`` on its own path (:mod:`.verify`).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import binom

from advopenood.plugin import Z95, wilson
from advopenood_plugins.analyses.gradcam.regimes import REGIMES, SUBSETS, subset_masks

#: the ``ci`` column of gradcam_summary.csv: the interval of each kind of column
CI_LABEL = "wilson (pct), normal (mean), order-statistic (median)"
#: The columns saying how a row was made, repeated in the summary.
PROVENANCE = ("target_rule", "l2_threshold", "ssim_threshold", "threshold_origin", "protocol")


def mean_interval(values: np.ndarray) -> tuple[float, float]:
    """``mean +- z s / sqrt(n)`` (module docstring); NaN for fewer than 2 values."""
    n = len(values)
    if n < 2:
        return float("nan"), float("nan")
    half = Z95 * float(np.std(values, ddof=1)) / np.sqrt(n)
    mean = float(np.mean(values))
    return mean - half, mean + half


def median_interval(values: np.ndarray) -> tuple[float, float]:
    """The order-statistic interval of the median (module docstring); NaN where ``n`` is too small."""
    n = len(values)
    rank = int(binom.ppf(0.025, n, 0.5)) if n else 0
    if rank < 1:
        return float("nan"), float("nan")
    ordered = np.sort(values)
    return float(ordered[rank - 1]), float(ordered[n - rank])


def _cell(sub: pd.DataFrame) -> dict[str, Any]:
    """n, means, medians and regime shares of one cell's rows, each with its interval."""
    n = len(sub)
    row: dict[str, Any] = {"n": n}
    for col in ("l2", "ssim"):
        values = sub[col].to_numpy(float)
        row[f"{col}_mean"] = float(values.mean()) if n else float("nan")
        row[f"{col}_mean_lo"], row[f"{col}_mean_hi"] = mean_interval(values)
        row[f"{col}_median"] = float(np.median(values)) if n else float("nan")
        row[f"{col}_median_lo"], row[f"{col}_median_hi"] = median_interval(values)
    for regime in REGIMES:
        hits = int(np.count_nonzero(sub["regime"].to_numpy() == regime))
        row[f"pct_{regime}"] = 100.0 * hits / n if n else float("nan")
        row[f"pct_{regime}_lo"], row[f"pct_{regime}_hi"] = wilson(hits, n)
    return row


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Per attack and subset (all / successful / unsuccessful attacks on clean-correct images / clean-misclassified
    images, :func:`subset_masks`): :func:`_cell`'s numbers and intervals, the ``ci`` label and how the rows were made
    (target rule, thresholds and their origin, protocol)."""
    rows = []
    for attack, part in df.groupby("attack", sort=False):
        masks = subset_masks(part)
        for subset in SUBSETS:
            row: dict[str, Any] = {"attack": attack, "eps": part["eps"].iloc[0], "subset": subset}
            row.update(_cell(part[masks[subset]]))
            row["ci"] = CI_LABEL
            row.update({k: part[k].iloc[0] for k in PROVENANCE})
            rows.append(row)
    return pd.DataFrame(rows)
