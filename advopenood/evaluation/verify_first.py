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
    """A row of ``paired`` whose interval lies above 0 shows ``detector_a`` higher, below 0 ``detector_b``; among the
    detectors with an AUROC on ``ood_set`` in ``ood``, those that no row shows lower are the ones that can be first,
    and a lone one's worst rank is ``n`` - the number it is shown higher than."""
    ranked = set(ood.loc[(ood["ood_set"].map(_text) == ood_set) & ood["auroc"].notna(), "detector"].map(str))
    rows = paired[paired["ood_set"].map(_text) == ood_set]
    lower = {d: 0 for d in ranked}
    higher = dict(lower)
    for a, b, lo, hi in zip(rows["detector_a"].map(str), rows["detector_b"].map(str), rows["delta_auroc_lo"],
                            rows["delta_auroc_hi"]):
        if a in ranked and b in ranked and (float(lo) > 0 or float(hi) < 0):
            win, lose = (a, b) if float(lo) > 0 else (b, a)
            higher[win] += 1
            lower[lose] += 1
    first = sorted(d for d, k in lower.items() if k == 0)
    worst = float(len(ranked) - higher[first[0]]) if len(first) == 1 else math.nan
    return First(first, len(ranked), worst)


def check_first(claim: Claim, paired: pd.DataFrame, ood: pd.DataFrame) -> list[str]:
    """What is wrong with a ``first`` claim against :func:`derive_first` of its set: one line per problem."""
    ood_set = dict(claim.row).get("ood_set", "")
    first, ranked, worst = derive_first(ood_set, paired, ood)
    lines = []
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
