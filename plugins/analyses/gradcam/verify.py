"""Re-derivation of ``gradcam_summary.csv`` from the per-image ``gradcam.csv``, written apart from
:mod:`.summary`: the subsets from the columns ``y``, ``clean_pred`` and ``success`` (an attack succeeds on an image
only if the clean one was classified correctly), the shares' Wilson intervals by the independent checker
:func:`advopenood.evaluation.oracle.wilson`, the means' normal intervals from the sum of squares, and the medians'
order-statistic ranks from the binomial sum ``sum_{i < l} C(n, i) / 2^n`` in exact integers (no scipy).
"""
from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd

from advopenood.plugin import compare, oracle

KEYS = ["attack", "subset"]
STATS = [f"{c}_{s}{b}" for c in ("l2", "ssim") for s in ("mean", "median") for b in ("", "_lo", "_hi")]
REGIMES = ("changed", "moved", "unchanged", "low_l2_low_ssim")


def _subset(df: pd.DataFrame, subset: str) -> pd.DataFrame:
    """The rows of one subset, by its definition."""
    right = df["clean_pred"].astype(int) == df["y"].astype(int)
    won = df["success"].astype(str).str.lower().isin(("true", "1", "1.0"))
    picks = {"all": right | ~right, "successful": right & won, "unsuccessful": right & ~won,
             "clean_misclassified": ~right}
    return df[picks[subset]]


def _median_rank(n: int) -> int:
    """The largest ``l`` with ``P(Bin(n, 1/2) <= l - 1) < 0.025``, by exact fractions; 0 where there is none."""
    total, rank = Fraction(0), 0
    while rank < n and total + Fraction(math.comb(n, rank), 2 ** n) < Fraction(1, 40):
        total += Fraction(math.comb(n, rank), 2 ** n)
        rank += 1
    return rank


def _stats(values: list[float], name: str) -> dict[str, float]:
    """Mean and median of ``values`` with their intervals (the module docstring's formulas)."""
    n, nan = len(values), math.nan
    out = {f"{name}_{s}{b}": nan for s in ("mean", "median") for b in ("", "_lo", "_hi")}
    if not n:
        return out
    mean = math.fsum(values) / n
    ordered = sorted(values)
    out[f"{name}_mean"] = mean
    out[f"{name}_median"] = (ordered[(n - 1) // 2] + ordered[n // 2]) / 2
    if n > 1:
        half = 1.959963984540054 * math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1) / n)
        out[f"{name}_mean_lo"], out[f"{name}_mean_hi"] = mean - half, mean + half
    rank = _median_rank(n)
    if rank:
        out[f"{name}_median_lo"], out[f"{name}_median_hi"] = ordered[rank - 1], ordered[n - rank]
    return out


def expected(per_image: pd.DataFrame) -> pd.DataFrame:
    """The summary's numbers, re-derived per attack and subset."""
    rows: list[dict[str, Any]] = []
    for attack in dict.fromkeys(per_image["attack"]):
        part = per_image[per_image["attack"] == attack]
        for subset in ("all", "successful", "unsuccessful", "clean_misclassified"):
            sub = _subset(part, subset)
            n = len(sub)
            row: dict[str, Any] = {"attack": attack, "subset": subset, "n": n}
            for col in ("l2", "ssim"):
                row.update(_stats([float(v) for v in sub[col]], col))
            for regime in REGIMES:
                k = int((sub["regime"].astype(str) == regime).sum())
                row[f"pct_{regime}"] = 100.0 * k / n if n else math.nan
                row[f"pct_{regime}_lo"], row[f"pct_{regime}_hi"] = oracle.wilson(k, n)
            rows.append(row)
    return pd.DataFrame(rows)


def verify(run: Any) -> list[str]:
    """``gradcam_summary.csv`` against its re-derivation from ``gradcam.csv`` (every number and bound)."""
    if not run.has("gradcam_summary.csv"):
        return []
    summary = run.table("gradcam_summary.csv")
    per_image = run.table("gradcam.csv", ["attack", "y", "clean_pred", "success", "l2", "ssim", "regime"])
    columns = ["n"] + STATS + [f"pct_{r}{b}" for r in REGIMES for b in ("", "_lo", "_hi")]
    return compare(expected(per_image), summary, KEYS, columns, atol=1e-6, table="gradcam_summary.csv")
