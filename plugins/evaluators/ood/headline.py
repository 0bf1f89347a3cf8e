"""The report's headline, the first thing a reader sees: AUROC per detector and set with its 95 % interval and the
detector's rank on the set, and what the intervals support.

**Ranks from simultaneous paired tests** (:func:`rank_ranges`). On one set with ``n`` ranked detectors, a
detector's rank is the range of places it can take given the paired comparisons of ``paired.csv``, tested together:
a pair is shown different when its Holm-adjusted p-value over every pair on the set is below 0.05 (``p_holm``,
:mod:`advopenood_plugins.kit.paired`), so that the chance of any false difference behind the set's ranks, a
"first" or a "can be first" is at most 5 % (with 17 detectors a set has 136 pairs: 95 % intervals taken one at a
time would show about 7 false differences among equal detectors). A rank runs from 1 + the number of detectors
shown better to ``n`` - the number shown worse. A pair not compared (no p-value, or not in ``paired.csv``) counts as
undecided, so a rank range is never narrower than the tests allow; two detectors whose ranges overlap are tied.
Overlapping per-cell intervals are not used as a test. A set without a single paired test is ranked by the point
estimates (competition ranking: 1, 1, 3), marked untested.

**Too few images** (:func:`too_few_to_rank`): on a set with fewer than
:data:`~advopenood.evaluation.metrics.MIN_CONCLUSIVE` images on a side, no rank and no "first" is stated; the
reading gives the set's AUROC range and its sample size instead.

**Transfer.** A set attacked to break detector Y (a detector-aware attack, e.g. ``adaptive_msp``) is a transfer
result in every other detector's row (:func:`advopenood_plugins.kit.ood.transfer_rows`): those cells are left out of
the headline's table and ranks (the set's column holds Y's own cell, unranked) and shown in their own table
(:func:`transfer_section`).
"""
from __future__ import annotations

import math
from typing import Any

import pandas as pd

from advopenood.plugin import (CHANCE, LEVEL, MIN_CONCLUSIVE, Bullets, Claim, Paragraph, Section, Table, join,
                               name as label, ood_matrix)
from advopenood_plugins.kit.ood import transfer_rows
from advopenood_plugins.kit.paired import PAIRED_CLAIM_COLUMNS

#: the title of the evaluator's headline section (its declared :class:`~advopenood.capabilities.Headline`)
HEADLINE = "AUROC per detector and set"
#: a rank of a set without a paired test carries this mark
UNTESTED = "?"
#: a pair is shown different when its Holm-adjusted p-value is below this
ALPHA = 1 - LEVEL
#: the ``method`` of a ``first`` claim: the simultaneous test it rests on
FIRST_METHOD = "holm"


def _tested(paired: pd.DataFrame, ood_set: str) -> pd.DataFrame:
    """The rows of ``paired`` on ``ood_set`` with a simultaneous test (a ``p_holm``), ``shown`` True where it is below
    0.05 (a table without ``p_holm``, written before it, has none)."""
    if paired is None or paired.empty or "p_holm" not in paired:
        return pd.DataFrame(columns=["detector_a", "detector_b", "delta_auroc", "shown"])
    part = paired[(paired["ood_set"].astype(str) == ood_set) & paired["p_holm"].notna()]
    return pd.DataFrame({"detector_a": part["detector_a"], "detector_b": part["detector_b"],
                         "delta_auroc": part["delta_auroc"], "shown": part["p_holm"].astype(float) < ALPHA})


def too_few_to_rank(ood: pd.DataFrame, ood_set: str) -> tuple[int, int] | None:
    """``(n_id, n_ood)`` of ``ood_set`` when its fewest images on a side are below
    :data:`~advopenood.evaluation.metrics.MIN_CONCLUSIVE` (no rank, no first there), else None (also without
    ``n_id`` / ``n_ood`` columns)."""
    if not {"n_id", "n_ood"} <= set(ood.columns):
        return None
    part = ood[ood["ood_set"].astype(str) == ood_set][["n_id", "n_ood"]].dropna()
    if part.empty:
        return None
    sizes = int(part["n_id"].min()), int(part["n_ood"].min())
    return sizes if min(sizes) < MIN_CONCLUSIVE else None


def rank_ranges(aurocs: pd.Series, paired: pd.DataFrame | None, ood_set: str) -> dict[str, tuple[int, int, bool]]:
    """Each detector's ``(best, worst, tested)`` rank on ``ood_set`` (module docstring): from the paired tests when
    the set has any, else competition ranks of the point estimates (``best == worst``, ``tested`` False). NaN AUROCs
    get no rank."""
    values = aurocs.dropna().astype(float)
    n = len(values)
    tests = _tested(paired, ood_set)
    if tests.empty:
        return {d: (1 + int((values > v).sum()),) * 2 + (False,) for d, v in values.items()}
    better = {d: 0 for d in values.index}
    worse = dict(better)
    shown = tests[tests["shown"].astype(bool)]
    for a, b, delta in zip(shown["detector_a"].astype(str), shown["detector_b"].astype(str),
                           shown["delta_auroc"].astype(float)):
        if a not in better or b not in better:
            continue
        high, low = (a, b) if delta > 0 else (b, a)
        better[low] += 1
        worse[high] += 1
    return {d: (1 + better[d], n - worse[d], True) for d in values.index}


def rank_text(rank: tuple[int, int, bool]) -> str:
    """``#1``, ``#1-4`` (a tie), ``#2?`` (untested)."""
    best, worst, tested = rank
    return f"#{best}" + (f"-{worst}" if worst != best else "") + ("" if tested else UNTESTED)


def headline_table(ood: pd.DataFrame, paired: pd.DataFrame | None) -> pd.DataFrame:
    """Detector x set: ``AUROC [lo, hi] #rank`` (one decimal; the value alone without an interval)."""
    aimed = _aimed_sets(ood)
    ood = ood[~transfer_rows(ood)]
    table = ood_matrix(ood, "auroc")
    if table.empty:
        return table
    has_ci = "auroc_lo" in ood
    lo = ood_matrix(ood, "auroc_lo") if has_ci else table * math.nan
    hi = ood_matrix(ood, "auroc_hi") if has_ci else table * math.nan
    columns = {}
    for col in table.columns:
        ranks = rank_ranges(table[col], paired, str(col))
        unranked = too_few_to_rank(ood, str(col)) is not None
        cells = []
        for det in table.index:
            v, low, high = table.at[det, col], lo.at[det, col], hi.at[det, col]
            if math.isnan(v):
                cells.append("transfer" if str(col) in aimed else "n/a")
                continue
            interval = "" if math.isnan(low) or math.isnan(high) else f" [{low:.1f}, {high:.1f}]"
            ranked = not unranked and str(col) not in aimed
            cells.append(f"{v:.1f}{interval}" + (f" {rank_text(ranks[det])}" if ranked else ""))
        columns[str(col)] = cells
    out = pd.DataFrame(columns, index=pd.Index([label(d) for d in table.index], name="detector"))
    return out


def _aimed_sets(ood: pd.DataFrame) -> set[str]:
    """The adversarial sets of ``ood`` attacked to break one detector (``aimed_at`` not empty)."""
    if "aimed_at" not in ood:
        return set()
    return {str(s) for s, a in zip(ood["ood_set"], ood["aimed_at"]) if not pd.isna(a) and str(a)}


def first_claim(ranks: dict[str, tuple[int, int, bool]], ood_set: str) -> Claim:
    """Who can be first on ``ood_set`` as a ``first`` claim (:mod:`advopenood.claims`): the detectors of rank 1,
    the number ranked, the worst rank of a lone first (NaN for a group)."""
    first = sorted(d for d, (best, _, _) in ranks.items() if best == 1)
    worst = float(ranks[first[0]][1]) if len(first) == 1 else math.nan
    return Claim("first", "paired.csv", (("ood_set", ood_set),), PAIRED_CLAIM_COLUMNS, label(ood_set),
                 float(len(ranks)), 1.0, worst, FIRST_METHOD, tuple(first))


def read_headline(ood: pd.DataFrame, paired: pd.DataFrame | None) -> list[str | Claim]:
    """What the intervals support: per set, who can be first (a ``first`` claim, :func:`first_claim`); the cells
    not shown to differ from chance; how many paired comparisons show a difference."""
    aimed = _aimed_sets(ood)
    ood = ood[~transfer_rows(ood)]
    table = ood_matrix(ood, "auroc")
    if table.empty:
        return []
    out: list[str | Claim] = []
    for col in [c for c in table.columns if str(c) not in aimed]:
        ranks = rank_ranges(table[col], paired, str(col))
        if not ranks:
            continue
        small = too_few_to_rank(ood, str(col))
        if small is not None:
            out.append(_unranked(table[col].dropna(), str(col), small))
        elif not any(t for _, _, t in ranks.values()):
            out.append(f"On {label(col)}: no paired test; ranks follow the point estimates only.")
        elif len(ranks) > 1:
            out.append(first_claim(ranks, str(col)))
    out += _chance_lines(ood)
    tested = paired[paired["significant"].notna()] if paired is not None and len(paired) else pd.DataFrame()
    if len(tested):
        shown = int(tested["significant"].astype(bool).sum())
        holm_shown = int((tested["p_holm"].astype(float) < ALPHA).sum()) if "p_holm" in tested else 0
        out.append(f"{shown} of {len(tested)} paired comparisons show a difference taken one at a time (paired "
                   f"interval excludes 0; paired.csv), {holm_shown} when every pair on a set is tested together "
                   "(Holm-adjusted p_holm < 0.05): the ranks read the latter.")
    return out


def _unranked(values: pd.Series, ood_set: str, sizes: tuple[int, int]) -> str:
    """The reading of a set too small to rank (:func:`too_few_to_rank`): its range and sample size."""
    lo, hi = values.idxmin(), values.idxmax()
    return (f"On {label(ood_set)}: {sizes[0]} ID and {sizes[1]} OOD images, fewer than {MIN_CONCLUSIVE} per side: "
            f"no rank is stated; AUROC ranges from {values[lo]:.1f} ({label(lo)}) to {values[hi]:.1f} ({label(hi)}).")


def _chance_lines(ood: pd.DataFrame) -> list[str]:
    """The cells whose interval contains 50 and those wholly below it."""
    if "auroc_lo" not in ood:
        return []
    rows = ood.dropna(subset=["auroc_lo", "auroc_hi"])
    cells = [f"{label(r['detector'])} on {label(r['ood_set'])}" for r in rows.to_dict("records")]
    near = [c for c, lo, hi in zip(cells, rows["auroc_lo"], rows["auroc_hi"]) if lo <= CHANCE <= hi]
    below = [c for c, hi in zip(cells, rows["auroc_hi"]) if hi < CHANCE]
    out = []
    if near:
        shown = join(near[:8] + ([f"{len(near) - 8} more"] if len(near) > 8 else []))
        out.append(f"Not shown to differ from chance (interval contains 50): {shown}.")
    if below:
        out.append(f"{len(below)} of {len(rows)} cells lie below chance (whole interval under 50): adversarial "
                   "examples there look more in-distribution than clean images.")
    return out


def headline_section(ood: pd.DataFrame, paired: pd.DataFrame | None) -> Section:
    """``AUROC per detector and set``: the headline table, its rule and what the intervals support (the report's
    first screen)."""
    method = str(ood["ci"].dropna().iloc[0]) if "ci" in ood and ood["ci"].notna().any() else "none"
    items: list[Any] = [
        Paragraph(f"AUROC (%) of each detector (rows) on each natural OOD and adversarial set (columns), its 95 % "
                  f"interval ({method}) in brackets, then its rank on the set. Ranks come from the paired "
                  "comparisons (paired.csv) tested together: a pair is shown different when its Holm-adjusted "
                  "p-value over every pair on the set is below 0.05 (p_holm); a rank runs from 1 + the number of "
                  "detectors shown better to n - the number shown worse, and a range such as #1-4 is a tie. "
                  f"Overlapping intervals are not a test. A rank marked {UNTESTED} follows the point estimates (no "
                  f"paired test on the set). A set with fewer than {MIN_CONCLUSIVE} images on a side has no rank. "
                  "A set attacked to break one detector shows that detector's own cell, unranked; the other "
                  "detectors' cells on it (marked transfer) are in the transfer table."),
        Table(headline_table(ood, paired), "AUROC (%) [95 % interval] #rank"),
        Bullets(read_headline(ood, paired), "What the intervals support")]
    return Section(HEADLINE, items, headline=True)


def transfer_section(ood: pd.DataFrame) -> list[Section]:
    """``Transfer: sets attacked to break another detector``: per detector (rows) and set aimed at another detector
    (columns), the AUROC with its interval, not ranked; none when the run has no such cell."""
    rows = ood[transfer_rows(ood)]
    if not len(rows):
        return []
    has_ci = "auroc_lo" in rows
    cells: dict[str, dict[str, str]] = {}
    for r in rows.to_dict("records"):
        interval = "" if not has_ci or pd.isna(r["auroc_lo"]) or pd.isna(r["auroc_hi"]) else \
            f" [{r['auroc_lo']:.1f}, {r['auroc_hi']:.1f}]"
        value = "n/a" if pd.isna(r["auroc"]) else f"{r['auroc']:.1f}{interval}"
        cells.setdefault(f"{r['ood_set']} (aimed at {label(r['aimed_at'])})", {})[label(r["detector"])] = value
    table = pd.DataFrame(cells).fillna("own")
    table.index.name = "detector"
    return [Section("Transfer: sets attacked to break another detector", [
        Paragraph("AUROC (%) [95 % interval] of each detector (rows) on each set attacked to break another detector "
                  "(columns, each naming the detector it was aimed at): the attack never saw these detectors, so a "
                  "cell is a transfer result, not their robustness. These cells are kept out of the headline's "
                  "ranks and out of each detector's adversarial means (leaderboard.csv); own: the set was aimed at "
                  "that detector (its cell is in the headline)."),
        Table(table, "Transfer AUROC (%) [95 % interval], not ranked")])]
