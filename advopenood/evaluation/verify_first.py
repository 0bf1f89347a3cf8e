"""``advopenood verify``'s check of a ``first`` claim (:mod:`advopenood.claims`: who can be first on a set, the
headline's reading), re-derived from ``paired.csv`` and ``ood.csv`` on a path of its own, apart from the code that
ranks the headline (``plugins/evaluators/ood/headline.py``)."""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import pandas as pd

from advopenood.claims import Claim


class First(NamedTuple):
    """Who can be first on a set as the tables give it: the detectors no paired row shows lower (sorted), the number
    ranked and a lone first's worst rank (NaN for a group or none)."""

    names: list[str]
    ranked: int
    worst: float


def _text(value: Any) -> str:
    """A key cell as text (``""`` for a missing one)."""
    return "" if pd.isna(value) else str(value)


def derive_first(ood_set: str, paired: pd.DataFrame, ood: pd.DataFrame) -> First:
    """A row of ``paired`` whose Holm-adjusted p-value (``p_holm``, over every pair on the set) is below 0.05 shows
    the detector with the higher AUROC higher (``delta_auroc`` > 0: ``detector_a``); among the detectors with an
    AUROC on ``ood_set`` in ``ood``, those that no row shows lower are the ones that can be first, and a lone one's
    worst rank is ``n`` - the number it is shown higher than. A table without ``p_holm`` shows none."""
    ranked = set(ood.loc[(ood["ood_set"].map(_text) == ood_set) & ood["auroc"].notna(), "detector"].map(str))
    rows = paired[paired["ood_set"].map(_text) == ood_set]
    lower = {d: 0 for d in ranked}
    higher = dict(lower)
    p_holm = rows["p_holm"] if "p_holm" in rows else pd.Series(math.nan, index=rows.index)
    for a, b, delta, p in zip(rows["detector_a"].map(str), rows["detector_b"].map(str), rows["delta_auroc"], p_holm):
        if a in ranked and b in ranked and float(p) < 0.05:
            win, lose = (a, b) if float(delta) > 0 else (b, a)
            higher[win] += 1
            lower[lose] += 1
    first = sorted(d for d, k in lower.items() if k == 0)
    worst = float(len(ranked) - higher[first[0]]) if len(first) == 1 else math.nan
    return First(first, len(ranked), worst)


def check_first(claim: Claim, paired: pd.DataFrame, ood: pd.DataFrame, min_conclusive: int | None = None
                ) -> list[str]:
    """What is wrong with a ``first`` claim against :func:`derive_first` of its set: one line per problem; a first
    on a set with fewer than the run's ``min_conclusive`` images on a side (``run.json``'s ``sample``) is one."""
    ood_set = dict(claim.row).get("ood_set", "")
    first, ranked, worst = derive_first(ood_set, paired, ood)
    lines = []
    sizes = ood.loc[ood["ood_set"].map(_text) == ood_set, ["n_id", "n_ood"]].dropna() if {"n_id", "n_ood"} <= \
        set(ood.columns) else pd.DataFrame()
    if min_conclusive is not None and len(sizes) and min(sizes.min()) < min_conclusive:
        lines.append(f"it ranks {ood_set} on {int(sizes['n_id'].min())} ID and {int(sizes['n_ood'].min())} OOD "
                     f"images, fewer than the run's min_conclusive ({min_conclusive}) per side")
    if list(claim.names) != first:
        lines.append(f"it names {', '.join(claim.names) or 'none'} as able to be first, the paired rows "
                     f"{', '.join(first) or 'none'}")
    if claim.value != ranked:
        lines.append(f"it ranks {claim.value:g} detectors, ood.csv {ranked} on {ood_set}")
    if not (claim.hi == worst or (math.isnan(claim.hi) and math.isnan(worst))):
        lines.append(f"its lone first's worst rank {claim.hi!r} is not the paired rows' {worst!r}")
    if claim.lo != 1:
        lines.append(f"its best rank {claim.lo!r} is not 1")
    return lines
