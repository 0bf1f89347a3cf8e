"""Claims as data: every sentence of the report and of the end-of-run summary that states a number or a comparison
is rendered from a :class:`Claim`, a record of the table cells it reads, the numbers it quotes and the test it rests
on. Plugins put claims among a section's bullets (:class:`advopenood.outputs.Bullets` takes them beside plain
strings); the core renders each (:attr:`Claim.text`) and writes them all to ``claims.json`` in the run folder, and
``advopenood verify`` re-reads every one from its table (:func:`advopenood.evaluation.verify.verify_claims`; a
``first`` claim by :func:`advopenood.evaluation.verify_first.check_first`): the quoted numbers must be the table's
cells (the difference and interval of the order stated), the test must hold, and the sentence in ``report.md``
must be the claim's rendering.

Kinds (:data:`KINDS`):

* ``difference``: "On S, A's AUROC is higher than B's by d points (A - B: 95 % paired interval [lo, hi], m)": stated
  only when the paired interval of A - B excludes 0 and lies above it (``lo > 0``; the writer states the pair in the
  order whose difference is positive).
* ``no_difference``: "A vs B on S: A - B = d points (95 % paired interval [lo, hi], m); no difference shown": the
  interval contains 0, or there is none (a tie: neither is stated higher).
* ``value``: one table cell with its own interval, as the table holds it ("what: v % (95 % interval lo to hi, m,
  table)").
* ``first``: who can be first on one set given the paired comparisons of ``paired.csv`` (the headline's ranks):
  ``names`` the detectors that no paired interval shows lower than another, ``value`` the number of detectors
  ranked, ``hi`` the worst rank of a lone first (1: it is shown higher than every other; NaN for a group). "On S:
  X is first; ...", "On S: only X can be first; ...", "On S: k detectors can be first, ...".

For ``difference`` and ``no_difference``, :attr:`Claim.columns` names the table's ``(detector_a, detector_b,
delta, delta_lo, delta_hi)`` columns; for ``value``, ``(value, lo, hi)``. This module is part of the foundation: it
imports no stage, so that both the report (:mod:`advopenood.outputs`) and its checker
(:mod:`advopenood.evaluation.verify`) read the one definition.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

CLAIMS_FILE = "claims.json"
#: what marks a report sentence as a stated comparison, ranking or quoted cell (a paired interval, "no difference
#: shown", a value's "(95 % interval lo to hi, m, table.csv)", "is first", "can be first", or a superlative such as
#: "the best", "is the strongest"): each such sentence of ``report.md`` must be a claim's rendering, word for word
STATED = re.compile(r"95 % paired interval|no difference shown: |\(95 % interval [-\d.]+ to [-\d.]+, [^)]*\.csv\)|"
                    r"\(no interval, [^)]*\.csv\)|\bcan be first\b|\bis first\b|"
                    r"\bthe (best|strongest|weakest|highest) |\bis the (best|worst|strongest|weakest)\b")
FORMAT_VERSION = 1
KINDS = ("difference", "no_difference", "value", "first")
#: the test each kind rests on, as claims.json states it
TESTS = {"difference": "the paired 95 % interval of the stated difference excludes 0 (lo > 0)",
         "no_difference": "the paired 95 % interval contains 0, or there is none",
         "value": "none: the cell and its own 95 % interval, as the table holds them",
         "first": "no detector named is shown lower than any other on the set (paired interval excludes 0), every "
                  "detector not named is; a lone first also shown higher than every other when its worst rank is 1"}


def name(text: Any) -> str:
    """Display name of a detector or attack: short names upper-cased (``msp`` -> ``MSP``), others as given."""
    s = str(text)
    return s.upper() if s.isalnum() and len(s) <= 8 else s


def signed(value: float) -> str:
    """``+1.2``: one decimal, more (up to four) where one would show a bound that is not 0 as ``+0.0``, so that
    an interval stated to exclude 0 reads so."""
    for places in range(1, 5):
        text = f"{value:+.{places}f}"
        if value == 0 or float(text) != 0:
            return text
    return text


def _num(value: Any) -> float:
    return math.nan if value is None else float(value)


@dataclass(frozen=True)
class Claim:
    """One stated number or comparison (module docstring). ``row``: the key columns and their values (as the CSV
    writes them) that pick the one row of ``table`` it reads; ``names``: the plugins in the order the sentence
    states them; ``where``: the set (and budget) or, for a value, what it is; ``value``, ``lo``, ``hi``: the number
    quoted and its interval (of the stated order), NaN when there is none; ``method``: the table's interval label."""

    kind: str
    table: str
    row: tuple[tuple[str, str], ...]
    columns: tuple[str, ...]
    where: str
    value: float
    lo: float = math.nan
    hi: float = math.nan
    method: str = ""
    names: tuple[str, ...] = ()
    quantity: str = "AUROC"
    note: str = field(default="")

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown claim kind {self.kind!r}; valid choices: {', '.join(KINDS)}")
        if self.kind == "difference" and not self.lo > 0:
            raise ValueError(f"a difference is stated only when its interval excludes 0 above it: {self}")

    @property
    def test(self) -> str:
        """What the claim rests on (:data:`TESTS`)."""
        return TESTS[self.kind]

    @property
    def text(self) -> str:
        """The sentence the report and the summary show."""
        interval = not (math.isnan(self.lo) or math.isnan(self.hi))
        if self.kind == "first":
            return self._first_text()
        if self.kind == "value":
            span = f"95 % interval {self.lo:.1f} to {self.hi:.1f}, {self.method}, " if interval else "no interval, "
            return f"{self.where}: {self.value:.1f} % ({span}{self.table}){self.note}"
        a, b = (name(n) for n in self.names)
        span = (f"95 % paired interval [{signed(self.lo)}, {signed(self.hi)}], {self.method}" if interval else
                "no interval")
        if self.kind == "difference":
            return (f"On {self.where}, {a}'s {self.quantity} is higher than {b}'s by {self.value:.1f} points "
                    f"({a} - {b}: {span}){self.note}.")
        reason = "the interval contains 0" if interval else "there is no interval"
        return (f"{a} vs {b} on {self.where}: {a} - {b} = {self.value:+.1f} {self.quantity} points ({span}); "
                f"no difference shown: {reason}{self.note}.")

    def _first_text(self) -> str:
        """The sentence of a ``first`` claim."""
        shown = [name(n) for n in self.names]
        if len(shown) == 1 and self.hi == 1:
            return (f"On {self.where}: {shown[0]} is first; the paired intervals show it higher than every other "
                    f"detector (paired.csv).")
        if len(shown) == 1:
            return (f"On {self.where}: only {shown[0]} can be first; every other detector is shown lower than at "
                    "least one (paired.csv).")
        listed = ", ".join(shown[:-1]) + " and " + shown[-1]
        return (f"On {self.where}: {len(shown)} of {int(self.value)} detectors can be first, no paired difference "
                f"shown among them: {listed} (paired.csv).")

    def as_dict(self) -> dict[str, Any]:
        """The claim as claims.json holds it: its fields, the test and the sentence (NaN as null)."""
        data = asdict(self)
        data.update(row=dict(self.row), columns=list(self.columns), names=list(self.names), test=self.test,
                    text=self.text)
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in data.items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Claim:
        """The inverse of :meth:`as_dict` (``test`` and ``text`` are derived, not read)."""
        return cls(kind=str(data["kind"]), table=str(data["table"]),
                   row=tuple((str(k), str(v)) for k, v in dict(data["row"]).items()),
                   columns=tuple(data["columns"]), where=str(data["where"]), value=_num(data["value"]),
                   lo=_num(data.get("lo")), hi=_num(data.get("hi")), method=str(data.get("method", "")),
                   names=tuple(data.get("names") or ()), quantity=str(data.get("quantity", "AUROC")),
                   note=str(data.get("note", "")))


def pair_claim(row: dict[str, Any], table: str, keys: tuple[str, ...], columns: tuple[str, str, str, str, str],
               where: str, quantity: str = "AUROC", note: str = "") -> Claim:
    """The claim of one row of a paired table: a ``difference`` in the order whose difference is positive when the
    interval excludes 0 (A - B with its own interval: a swapped pair negates and swaps the bounds), else a
    ``no_difference`` in the table's order. ``keys``: the columns that pick the row."""
    col_a, col_b, col_d, col_lo, col_hi = columns
    delta, lo, hi = (_num(row[c]) for c in (col_d, col_lo, col_hi))
    names = (str(row[col_a]), str(row[col_b]))
    picked = tuple((k, _cell(row[k])) for k in keys)
    method = str(row.get("ci", ""))
    if lo > 0 or hi < 0:
        if hi < 0:
            names, delta, lo, hi = names[::-1], -delta, -hi, -lo
        return Claim("difference", table, picked, columns, where, delta, lo, hi, method, names, quantity, note)
    return Claim("no_difference", table, picked, columns, where, delta, lo, hi, method, names, quantity, note)


def _cell(value: Any) -> str:
    """A key cell as the CSV reads back as text (``""`` for NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def write_claims(out: Path, claims: list[Claim], summary: list[Claim] = ()) -> Path:
    """``<out>/claims.json`` (atomically): every claim of the report (``claims``) and of the end-of-run summary
    (``summary``), each with its test and sentence."""
    from advopenood.io import write_text

    path = Path(out) / CLAIMS_FILE
    write_text(path, json.dumps({"format": FORMAT_VERSION, "claims": [c.as_dict() for c in claims],
                                 "summary": [c.as_dict() for c in summary]}, indent=1))
    return path


def read_claims(out: Path) -> dict[str, list[dict[str, Any]]]:
    """``{"claims": [...], "summary": [...]}`` of ``<out>/claims.json`` as written (dicts, ``text`` included); empty
    lists when there is none."""
    path = Path(out) / CLAIMS_FILE
    data = json.loads(path.read_text()) if path.is_file() else {}
    return {part: list(data.get(part, [])) for part in ("claims", "summary")}
