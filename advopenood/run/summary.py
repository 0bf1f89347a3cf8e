"""What a finished run prints on stdout: where its report is and up to three headline numbers, each a claim
(:class:`advopenood.claims.Claim`, kind ``value``) read from a table the run wrote, with that table's own 95 %
interval and its method named: the clean accuracy and the highest attack success rate (``asr.csv``, Wilson), and
the largest worst-case AUROC of a detector over the adversarial sets (``ood.csv``, the run's interval). The last two
are point estimates, stated as such: no ranking is claimed without a paired test. The claims go to
``claims.json`` (``summary``) so that ``advopenood verify`` checks them against the tables."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from advopenood.claims import Claim, where_clean_acc, where_highest_asr, where_largest_worst
from advopenood.evaluation.context import RunContext


def _table(out: Path, fname: str) -> pd.DataFrame | None:
    path = Path(out) / fname
    return pd.read_csv(path) if path.is_file() else None


def _value(table: str, row: pd.Series, keys: tuple[str, ...], column: str, where: str, about: str) -> Claim:
    """A ``value`` claim about ``about`` (:data:`advopenood.claims.SUBJECTS`) of ``row[column]`` with the row's
    ``<column>_lo`` / ``_hi`` and its ``ci`` label."""
    picked = tuple((k, "" if pd.isna(row[k]) else str(row[k])) for k in keys)
    lo, hi = (float(row.get(f"{column}_{end}", math.nan)) for end in ("lo", "hi"))
    return Claim("value", table, picked, (column, f"{column}_lo", f"{column}_hi"), where, float(row[column]), lo, hi,
                 str(row.get("ci", "")), about=about)


def asr_claims(asr: pd.DataFrame) -> list[Claim]:
    """The clean accuracy, and the highest ASR among the bounded ID->ID sets (among all when none is bounded; every
    set that ties for it named)."""
    out = []
    if "clean_acc_lo" in asr and len(asr):
        row = asr.iloc[0]
        out.append(_value("asr.csv", row, ("attack",), "clean_acc", where_clean_acc(row["n"]), "clean_acc"))
    sets = asr[(asr["source"] == "id") & asr["asr"].notna()]
    bounded = sets[sets["eps"].notna()]
    sets = bounded if len(bounded) else sets
    if len(sets):
        top = sets[sets["asr"] == sets["asr"].max()]
        out.append(_value("asr.csv", top.iloc[0], ("attack",), "asr",
                          where_highest_asr([str(a) for a in top["attack"]], list(top["eps"])), "highest_asr"))
    return out


def worst_row(part: pd.DataFrame) -> pd.Series:
    """A detector's worst set among ``part`` (its rows): the lowest AUROC, ties (to 1e-9) to the first set name in
    sorted order, the tie rule of the ``levels`` evaluator's ``worst_set``, so that stdout and ``levels.csv`` name
    the same set."""
    order = part.assign(_rounded=part["auroc"].astype(float).round(9), _set=part["ood_set"].astype(str))
    return order.sort_values(["_rounded", "_set"], kind="stable").iloc[0].drop(["_rounded", "_set"])


def robust_claim(ood: pd.DataFrame) -> Claim | None:
    """The detector whose lowest AUROC over the adversarial sets (the natural OOD sets when the run has none) is
    largest, as ``ood.csv`` holds it; None without such a row."""
    rows = ood[ood["auroc"].notna()]
    if "aimed_at" in rows:  # a set attacked to break another detector is a transfer result, not this one's worst
        aimed = rows["aimed_at"].map(lambda v: "" if pd.isna(v) else str(v))
        rows = rows[(aimed == "") | (aimed == rows["detector"].astype(str))]
    adversarial = rows[rows["positives"] != "natural"]
    rows = adversarial if len(adversarial) else rows
    if not len(rows):
        return None
    worst = pd.DataFrame([worst_row(part) for _, part in rows.groupby("detector", sort=False)])
    best = worst.sort_values(["auroc", "detector"], ascending=[False, True]).iloc[0]
    side = "adversarial" if len(adversarial) else "natural OOD"
    return _value("ood.csv", best, ("detector", "ood_set"), "auroc",
                  where_largest_worst(best["detector"], best["ood_set"], side), "largest_worst_auroc")


def summary_claims(out: Path) -> list[Claim]:
    """The summary's claims, from the tables under ``out`` (the staging folder of the report stage)."""
    asr, ood = _table(out, "asr.csv"), _table(out, "ood.csv")
    claims = asr_claims(asr) if asr is not None else []
    robust = robust_claim(ood) if ood is not None and "positives" in ood else None
    return claims + ([robust] if robust is not None else [])


def summary(ctx: RunContext) -> list[str]:
    """The run's closing lines: the report's path and the summary's claims (:func:`summary_claims`, rendered by the
    report stage: ``ctx.outcome.summary``)."""
    report = ctx.out / "report.html"
    lines = [f"report: {report}" if report.is_file() else f"outputs: {ctx.out}"]
    return lines + list(ctx.outcome.summary)
