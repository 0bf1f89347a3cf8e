"""``advopenood verify``'s check of ``claims.json`` (:mod:`advopenood.claims`): every claim is read back as data
and re-rendered from its table's row, so that no part of its sentence rests on the claim's own word.

For each claim: the one row its key cells pick; the numbers it quotes must be that row's cells (the difference and
interval in the order stated), its method the row's ``ci``, its test must hold (:data:`advopenood.claims.TESTS`),
its ``where`` must be what the row's cells give (:func:`advopenood.claims.place`; for a value the template of its
subject filled from the table, and for a selection, the highest success rate or the largest worst-case AUROC, the
row the table's own numbers select, re-derived here), and the sentence the row renders must be the one
``claims.json`` holds. A ``first`` claim is re-derived from ``paired.csv`` and ``ood.csv``
(:mod:`advopenood.evaluation.verify_first`). A claims.json that is not the file a run writes is one finding.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from advopenood.claims import (CLAIMS_FILE, SUBJECTS, Claim, ClaimError, parse_claims, place, quantity_of,
                               where_asr, where_clean_acc, where_highest_asr, where_largest_worst)
from advopenood.evaluation.runfiles import RunFiles, Unreadable, key_matches, key_text, same_cell
from advopenood.evaluation.verify_first import check_first, derive_first

def _table(run: RunFiles, name: str, tables: dict[str, Any]) -> pd.DataFrame | str:
    """The run's table ``name`` (read once), or why it cannot be read."""
    if name not in tables:
        try:
            tables[name] = run.table(name)
        except Unreadable as exc:
            tables[name] = str(exc)
    return tables[name]


def _numbers(claim: Claim, cells: tuple[float, float, float], table: str) -> list[str]:
    """The claim's number and bounds that are not the cells (as the CSV writes them)."""
    return [f"its {what} {have!r} is not {table}'s {cell!r}" for what, have, cell in
            zip(("number", "interval's lower end", "interval's upper end"), (claim.value, claim.lo, claim.hi), cells)
            if not same_cell(have, cell, 1e-9)]


def _pair(claim: Claim, row: pd.Series) -> tuple[list[str], Claim | None]:
    """What is wrong with a difference or a tie against its row, and the claim the row makes (in the stated order,
    or in the other where the row's interval lies below 0)."""
    col_a, col_b, col_d, col_lo, col_hi = claim.columns
    d, lo, hi = (float(row[c]) for c in (col_d, col_lo, col_hi))
    pair = (str(row[col_a]), str(row[col_b]))
    if tuple(claim.names) == pair[::-1]:
        d, lo, hi = -d, -hi, -lo
    elif tuple(claim.names) != pair:
        return [f"it names {', '.join(claim.names)}, the row {', '.join(pair)}"], None
    method = key_text(row["ci"]) if "ci" in row else ""
    lines = _numbers(claim, (d, lo, hi), claim.table)
    if claim.method != method:
        lines.append(f"its method {claim.method!r} is not {claim.table}'s {method!r}")
    if claim.kind == "difference" and not lo > 0:
        lines.append("it states a direction that the paired interval of the stated difference does not support")
    if claim.kind == "no_difference" and (lo > 0 or hi < 0):
        lines.append("it says no difference is shown where the paired interval excludes 0")
    names = tuple(claim.names)
    if hi < 0:
        names, d, lo, hi = names[::-1], -d, -hi, -lo
    cells = {k: key_text(row[k]) for k, _ in claim.row}
    made = Claim("difference" if lo > 0 else "no_difference", claim.table, claim.row, claim.columns,
                 place(cells, claim.columns[:2]), d, lo, hi, method, names, quantity_of(col_d))
    return lines, made


def _highest_asr(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of the highest success rate among the bounded ID->ID sets (among all ID->ID sets when none is
    bounded), in table order."""
    sets = table[(table["source"].map(key_text) == "id") & table["asr"].notna()]
    bounded = sets[sets["eps"].notna()]
    sets = bounded if len(bounded) else sets
    return sets[sets["asr"] == sets["asr"].max()]


def _largest_worst(table: pd.DataFrame) -> tuple[dict[str, Any] | None, str]:
    """The row of the detector whose lowest AUROC over the adversarial sets (the natural OOD sets without any; a set
    aimed at another detector, ``aimed_at``, left out) is largest (ties: the first detector by name; a detector's
    worst: the first set name in sorted order among its rows of that AUROC to 1e-9), and the side."""
    rows = table[table["auroc"].notna()]
    if "aimed_at" in rows:
        aimed = rows["aimed_at"].map(key_text)
        rows = rows[(aimed == "") | (aimed == rows["detector"].map(key_text))]
    adversarial = rows[rows["positives"].map(key_text) != "natural"]
    side = "adversarial" if len(adversarial) else "natural OOD"
    worst: dict[str, dict[str, Any]] = {}
    for r in (adversarial if len(adversarial) else rows).to_dict("records"):
        det = str(r["detector"])
        mine = (round(float(r["auroc"]), 9), str(r["ood_set"]))
        if det not in worst or mine < (round(float(worst[det]["auroc"]), 9), str(worst[det]["ood_set"])):
            worst[det] = r
    ranked = sorted(worst.items(), key=lambda item: (-float(item[1]["auroc"]), item[0]))
    return (ranked[0][1] if ranked else None), side


def _picks(claim: Claim, row: dict[str, Any]) -> bool:
    """Whether the table row ``row`` is the one the claim's key cells name."""
    return all(key_text(row.get(k)) == v for k, v in claim.row)


def _value(claim: Claim, row: pd.Series, table: pd.DataFrame) -> tuple[list[str], Claim | None]:
    """What is wrong with a value against its row and table, and the claim they make: its cells, its method and
    its subject's description filled from them (a selection re-derived from the whole table)."""
    subject = SUBJECTS[claim.about]
    value, lo, hi = (float(row[c]) if c in row else math.nan for c in subject.columns)
    method = key_text(row["ci"]) if "ci" in row else ""
    lines = _numbers(claim, (value, lo, hi), claim.table)
    if claim.method != method:
        lines.append(f"its method {claim.method!r} is not {claim.table}'s {method!r}")
    if claim.about == "asr":
        where = where_asr(row["attack"], row.get("eps"))
    elif claim.about == "clean_acc":
        where = where_clean_acc(row["n"])
    elif claim.about == "highest_asr":
        top = _highest_asr(table)
        if not len(top) or not _picks(claim, top.iloc[0].to_dict()):
            lines.append(f"its row {dict(claim.row)} is not {claim.table}'s highest success rate (the row of "
                         f"{key_text(top['attack'].iloc[0]) if len(top) else 'none'})")
        where = where_highest_asr([str(a) for a in top["attack"]], list(top["eps"])) if len(top) else ""
    else:
        best, side = _largest_worst(table)
        if best is None or not _picks(claim, best):
            lines.append(f"its row {dict(claim.row)} is not {claim.table}'s largest worst-case AUROC (the row of "
                         f"{best and (best['detector'], best['ood_set'])})")
        where = where_largest_worst(best["detector"], best["ood_set"], side) if best is not None else ""
    if claim.where != where:
        lines.append(f"its where {claim.where!r} is not {claim.table}'s {where!r}")
    made = Claim("value", claim.table, claim.row, claim.columns, where, value, lo, hi, method, about=claim.about)
    return lines, made


def _first(run: RunFiles, claim: Claim, paired: pd.DataFrame, tables: dict[str, Any]) -> tuple[list[str],
                                                                                               Claim | None]:
    """What is wrong with a ``first`` claim, and the claim ``paired.csv`` and ``ood.csv`` make of its set."""
    ood = _table(run, "ood.csv", tables)
    if isinstance(ood, str):
        return [ood], None
    minimum = (run.info.get("sample") or {}).get("min_conclusive")
    lines = check_first(claim, paired, ood, None if minimum is None else int(minimum))
    names, ranked, worst = derive_first(dict(claim.row).get("ood_set", ""), paired, ood)
    try:
        made = Claim("first", claim.table, claim.row, claim.columns, place(dict(claim.row), claim.columns[:2]),
                     float(ranked), 1.0, worst, "holm", tuple(names))
    except ClaimError:  # no detector can be first there: the lines above say so
        made = None
    return lines, made


def check_claim(run: RunFiles, claim: Claim, tables: dict[str, Any]) -> list[str]:
    """What is wrong with one claim against its table (module docstring): one line per problem, the last the
    sentence its row renders where that is not the claim's."""
    table = _table(run, claim.table, tables)
    if isinstance(table, str):
        return [f"its table {claim.table} is missing" if "missing" in table else table]
    try:
        if claim.kind == "first":
            lines, made = _first(run, claim, table, tables)
        else:
            mask = np.ones(len(table), dtype=bool)
            for column, value in claim.row:
                mask &= key_matches(table[column], value) if column in table else False
            if mask.sum() != 1:
                return [f"{int(mask.sum())} rows of {claim.table} match {dict(claim.row)}"]
            row = table[mask].iloc[0]
            lines, made = _pair(claim, row) if claim.kind != "value" else _value(claim, row, table)
    except (KeyError, ValueError, TypeError) as exc:  # a cell that is not a number, a column that is gone
        return [f"{claim.table}'s rows cannot be read as the claim's numbers ({type(exc).__name__}: {exc})"]
    if made is not None and made.text != claim.text:
        lines.append(f"its sentence is not {claim.table}'s row rendered ({made.text!r})")
    return lines


def verify_claims(run: RunFiles) -> list[str]:
    """Every claim of ``claims.json`` read back (:meth:`Claim.from_dict`: a field of another type, a note, a
    ``where`` that is not its row's place, or fields no claim of its kind has are an invalid claim), checked
    against its table (:func:`check_claim`), and its stored sentence the rendering of its fields. A claims.json
    that is not the file a run writes (not JSON, not an object, no list of objects) is one line. One line per
    problem, naming the sentence."""
    if run.problem(CLAIMS_FILE) == "missing":
        return []
    try:
        data = parse_claims(run.text(CLAIMS_FILE))
    except Unreadable as exc:
        return [f"{exc}; no claim can be checked"]
    except ValueError as exc:
        return [f"{CLAIMS_FILE}: {exc}; no claim can be checked"]
    tables: dict[str, Any] = {}
    lines = []
    for part, records in data.items():
        for i, raw in enumerate(records):
            text = raw.get("text")
            label = repr(text) if isinstance(text, str) else f"{part}[{i}]"
            try:
                claim = Claim.from_dict(raw)
            except ValueError as exc:
                lines.append(f"{CLAIMS_FILE}: {label}: not a valid claim ({getattr(exc, 'problem', exc)})")
                continue
            problems = check_claim(run, claim, tables)
            if claim.text != text:
                problems.append(f"its sentence is not the rendering of its fields ({claim.text!r})")
            lines += [f"{CLAIMS_FILE}: {label}: {p}" for p in problems]
    return lines
