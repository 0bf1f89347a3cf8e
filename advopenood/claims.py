"""Claims as data: every sentence of the report and of the end-of-run summary that states a number or a comparison
is rendered from a :class:`Claim`, a record of the table cells it reads, the numbers it quotes and the test it rests
on. Plugins put claims among a section's bullets (:class:`advopenood.outputs.Bullets` takes them beside plain
strings); the core renders each (:attr:`Claim.text`) and writes them all to ``claims.json`` in the run folder, and
``advopenood verify`` re-reads every one from its table (:func:`advopenood.evaluation.verify_claims.verify_claims`;
a ``first`` claim by :func:`advopenood.evaluation.verify_first.check_first`): the quoted numbers must be the table's
cells (the difference and interval of the order stated), the test must hold, and the sentence, re-rendered from
the table's row, must be the one ``claims.json`` and ``report.md`` hold.

Kinds (:data:`KINDS`):

* ``difference``: "On S, A's AUROC is higher than B's by d points (A - B: 95 % paired interval [lo, hi], m)": stated
  only when the paired interval of A - B excludes 0 and lies above it (``lo > 0``; the writer states the pair in the
  order whose difference is positive).
* ``no_difference``: "A vs B on S: A - B = d points (95 % paired interval [lo, hi], m); no difference shown": the
  interval contains 0, or there is none (a tie: neither is stated higher).
* ``value``: one table cell with its own interval, as the table holds it ("what: v % (95 % interval lo to hi, m,
  table)").
* ``first``: who can be first on one set given the paired comparisons of ``paired.csv`` tested together (the
  headline's ranks): ``names`` the detectors that no pair shows lower than another, a pair shown different when
  its Holm-adjusted p-value over every pair on the set is below 0.05 (``p_holm``; ``method`` ``holm``), ``value``
  the number of detectors ranked, ``hi`` the worst rank of a lone first (1: it is shown higher than every other;
  NaN for a group). "On S: X is first; ...", "On S: only X can be first; ...", "On S: k detectors can be first,
  ...". None is made on a set with fewer than ``min_conclusive`` images on a side.

For ``difference`` and ``no_difference``, :attr:`Claim.columns` names the table's ``(detector_a, detector_b,
delta, delta_lo, delta_hi)`` columns; for ``value``, ``(value, lo, hi)``.

A sentence is rendered from the claim's structured fields alone, and its free text is derived from the cells:
:attr:`Claim.about` names its subject (:data:`SUBJECTS`). A difference, a tie or a ``first`` is about a
``place``: its ``where`` is the row's key cells (:func:`place`: the set, then the method and the budget), its
``quantity`` the table's difference column (:func:`quantity_of`), both checked when the claim is made. A value
quotes one of the :class:`Subject` cells, whose description (``where``) is the template of its subject filled from
the table (:func:`where_asr`, :func:`where_clean_acc`, :func:`where_highest_asr`, :func:`where_largest_worst`);
``verify`` fills it again from the table's cells and re-derives the row a selection picks. ``note`` is kept for
claims.json's format only: no subject derives one, and a claim with a note is refused.

This module is part of the foundation: it imports no stage, so that both the report (:mod:`advopenood.outputs`)
and its checker (:mod:`advopenood.evaluation.verify_claims`) read the one definition.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

CLAIMS_FILE = "claims.json"
#: what marks a report sentence as a stated comparison, ranking or quoted cell (a paired interval, "no difference
#: shown", a value's "(95 % interval lo to hi, m, table.csv)", "is first", "can be first", or a superlative such as
#: "the best", "is the strongest"): a plain reading must not look like one (``verify`` names such a line of
#: ``report.md`` that no claim renders as a stated comparison)
STATED = re.compile(r"95 % paired interval|no difference shown: |\(95 % interval [-\d.]+ to [-\d.]+, [^)]*\.csv\)|"
                    r"\(no interval, [^)]*\.csv\)|\bcan be first\b|\bis first\b|"
                    r"\bthe (best|strongest|weakest|highest) |\bis the (best|worst|strongest|weakest)\b")
FORMAT_VERSION = 1
KINDS = ("difference", "no_difference", "value", "first")
#: the kinds that compare two detectors
PAIR_KINDS = ("difference", "no_difference")
#: the test each kind rests on, as claims.json states it
TESTS = {"difference": "the paired 95 % interval of the stated difference excludes 0 (lo > 0)",
         "no_difference": "the paired 95 % interval contains 0, or there is none",
         "value": "none: the cell and its own 95 % interval, as the table holds them",
         "first": "no detector named is shown lower than any other on the set (Holm-adjusted paired p-value over "
                  "every pair on the set below 0.05: p_holm), every detector not named is; a lone first also shown "
                  "higher than every other when its worst rank is 1"}
#: the fields of a claim in claims.json (``test`` and ``text`` are derived: the checker renders them again)
FIELDS = ("kind", "table", "row", "columns", "where", "value", "lo", "hi", "method", "names", "quantity", "note",
          "about", "test", "text")
#: the metrics a difference column names, as a sentence writes them
_METRIC_WORDS = {"auroc": "AUROC", "aupr": "AUPR", "fpr95": "FPR95", "asr": "ASR"}


def name(text: Any) -> str:
    """The one display name of a detector, an attack or a data set, in sentences, report tables, plots and LaTeX
    alike: a registered detector's or attack's short name upper-cased (``msp`` -> ``MSP``, ``pgd`` -> ``PGD``: at
    most 8 letters and digits), any other name as the tables hold it (a data set's declared name, ``texture``,
    ``fashionmnist``; ``ross_gen``; ``robust_ood_msp-tin``). Idempotent: a displayed name displays as itself."""
    s = str(text)
    if not (s.isalnum() and len(s) <= 8):
        return s
    from advopenood import registry  # foundation: the names the plugins registered

    return s.upper() if any(registry.resolves(kind, s) for kind in ("detectors", "attacks")) else s


def eps_label(eps: Any) -> str:
    """``8/255`` for budgets that are a whole number of grey values, ``0.05`` otherwise, ``""`` for none."""
    try:
        value = float(eps)
    except (TypeError, ValueError):
        return ""
    if math.isnan(value):
        return ""
    grey = value * 255
    if abs(grey - round(grey)) < 1e-3 and 0 < round(grey) < 255:
        return f"{int(round(grey))}/255"
    return f"{value:.3g}"


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


# ------------------------------------------------------------------------------------------------- subjects

def place(row: Mapping[str, Any], skip: Sequence[str] = ()) -> str:
    """Where a difference, a tie or a ``first`` holds, from the key cells ``row`` of the row it reads (``skip``: the
    key columns that hold the detectors compared): the set's display name, then the method upper-cased and the
    budget (``textures, PGD, eps 8/255``), then every other key as ``key value``."""
    cells = {k: v for k, v in row.items() if k not in skip}
    parts = [name(cells.pop("ood_set"))] if "ood_set" in cells else []
    if "method" in cells:
        parts.append(str(cells.pop("method")).upper())
    if "eps" in cells:
        eps = cells.pop("eps")
        parts.append(f"eps {eps_label(eps)}" if eps_label(eps) else "without a budget")
    return ", ".join(parts + [f"{k} {v}" for k, v in cells.items()])


def quantity_of(column: str) -> str:
    """The quantity a difference column holds, as a sentence names it: ``delta_auroc`` -> ``AUROC``,
    ``delta_robust_auroc`` -> ``robust AUROC``."""
    words = column.removeprefix("delta_").split("_")
    return " ".join(_METRIC_WORDS.get(w, w) for w in words)


def where_asr(attack: Any, eps: Any) -> str:
    """An attack's success rate on its ``asr.csv`` row (the report's reading of each attack)."""
    budget = eps_label(eps)
    at = f"at eps {budget}" if budget else "without a budget (minimal perturbation)"
    return f"{name(attack)}'s success rate {at}, of the correctly classified images"


def where_clean_acc(n: Any) -> str:
    """The clean accuracy on ``n`` ID images (``asr.csv``'s ``clean_acc``)."""
    return f"clean accuracy on {int(float(n))} ID images"


def where_highest_asr(attacks: Sequence[str], budgets: Sequence[Any]) -> str:
    """The highest success rate among the bounded ID->ID sets (all when none is bounded): every set that ties for
    it (``attacks``, table order) and their budgets."""
    which = ", ".join(attacks[:-1]) + " and " + attacks[-1] if len(attacks) > 1 else attacks[0]
    shown = sorted({f"eps {eps_label(e)}" if eps_label(e) else "no budget" for e in budgets})
    return (f"highest attack success rate (a point estimate, not a tested ranking): {which} ({', '.join(shown)}), "
            "of the correctly classified images")


def where_largest_worst(detector: Any, ood_set: Any, side: str) -> str:
    """The detector whose lowest AUROC over the ``side`` sets (``adversarial`` or ``natural OOD``) is largest."""
    return (f"largest worst-case AUROC over the {side} sets (a point estimate, not a tested ranking: each "
            f"detector's worst set is its own): {name(detector)}, on {name(ood_set)}")


@dataclass(frozen=True)
class Subject:
    """What a ``value`` claim quotes: the table, the key columns that pick its row and the ``(value, lo, hi)``
    columns. Its description (``where``) is filled from the table by its template (the ``where_*`` functions)."""

    table: str
    keys: tuple[str, ...]
    columns: tuple[str, str, str]


#: what a claim can be about: ``place`` (a difference, a tie or a ``first``: :func:`place`) or a value's subject
SUBJECTS: dict[str, Subject | None] = {
    "place": None,
    "asr": Subject("asr.csv", ("attack", "eps"), ("asr", "asr_lo", "asr_hi")),
    "clean_acc": Subject("asr.csv", ("attack",), ("clean_acc", "clean_acc_lo", "clean_acc_hi")),
    "highest_asr": Subject("asr.csv", ("attack",), ("asr", "asr_lo", "asr_hi")),
    "largest_worst_auroc": Subject("ood.csv", ("detector", "ood_set"), ("auroc", "auroc_lo", "auroc_hi")),
}


# ---------------------------------------------------------------------------------------------------- claims

class ClaimError(ValueError):
    """Fields that make no claim: ``problem`` says why (the message adds the fields)."""

    def __init__(self, problem: str, claim: Any) -> None:
        super().__init__(f"{problem}: {claim!r}")
        self.problem = problem


@dataclass(frozen=True)
class Claim:
    """One stated number or comparison (module docstring). ``row``: the key columns and their values (as the CSV
    writes them) that pick the one row of ``table`` it reads; ``names``: the plugins in the order the sentence
    states them; ``where``: the set (and budget) or, for a value, what it is (derived from the cells, see
    ``about``); ``value``, ``lo``, ``hi``: the number quoted and its interval (of the stated order), NaN when there
    is none; ``method``: the table's interval label; ``about``: its subject (:data:`SUBJECTS`). A claim that its
    kind, subject or fields cannot make (a ``first`` naming no detector, a value with names, a ``where`` that is
    not its row's place, a note) raises ValueError."""

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
    about: str = "place"

    def __post_init__(self) -> None:
        problem = self._problem()
        if problem:
            raise ClaimError(problem, self)

    def _problem(self) -> str:
        """Why the fields make no claim of its kind and subject ("" when they do)."""
        if self.kind not in KINDS:
            return f"unknown claim kind {self.kind!r}; valid choices: {', '.join(KINDS)}"
        if self.about not in SUBJECTS:
            return f"unknown subject {self.about!r}; valid choices: {', '.join(SUBJECTS)}"
        if self.note:
            return f"a claim's sentence is rendered from its fields alone; no subject derives a note ({self.note!r})"
        subject = SUBJECTS[self.about]
        if (subject is None) != (self.kind != "value"):
            return f"a {self.kind} claim cannot be about {self.about!r}"
        if not self.row:
            return "a claim names the row it reads"
        if subject is not None:
            if len(self.names) or (self.table, self.columns) != (subject.table, subject.columns) or \
                    not {k for k, _ in self.row} <= set(subject.keys):
                return (f"a value about {self.about!r} quotes {subject.table}'s {', '.join(subject.columns)} on a "
                        f"row picked by {', '.join(subject.keys)}, and names no detector")
            return ""
        if len(self.columns) != 5:
            return "a difference, a tie or a first names 5 columns (detector_a, detector_b, delta, lo, hi)"
        if self.where != place(dict(self.row), self.columns[:2]):
            return f"its where {self.where!r} is not its row's place {place(dict(self.row), self.columns[:2])!r}"
        if self.kind == "first":
            return self._first_problem()
        if len(self.names) != 2:
            return f"a {self.kind} names two detectors"
        if self.quantity != quantity_of(self.columns[2]):
            return f"its quantity {self.quantity!r} is not its column's {quantity_of(self.columns[2])!r}"
        if self.kind == "difference" and not self.lo > 0:
            return "a difference is stated only when its interval excludes 0 above it"
        return ""

    def _first_problem(self) -> str:
        """Why a ``first`` claim's numbers make no sentence ("" when they do)."""
        ranked = self.value
        if not self.names or not (math.isfinite(ranked) and ranked.is_integer() and ranked >= len(self.names)):
            return "a first names at least one detector, and value is the number ranked (a whole number, not fewer)"
        if not (math.isnan(self.hi) or (self.hi.is_integer() and 1 <= self.hi <= ranked)):
            return "a first's hi is the worst rank of a lone first, a whole number from 1 to the number ranked"
        if self.method != "holm":
            return f"a first rests on the Holm-adjusted paired tests (method 'holm'), not {self.method!r}"
        return ""

    @property
    def test(self) -> str:
        """What the claim rests on (:data:`TESTS`)."""
        return TESTS[self.kind]

    @property
    def text(self) -> str:
        """The sentence the report and the summary show, from the claim's fields alone."""
        interval = not (math.isnan(self.lo) or math.isnan(self.hi))
        if self.kind == "first":
            return self._first_text()
        if self.kind == "value":
            span = f"95 % interval {self.lo:.1f} to {self.hi:.1f}, {self.method}, " if interval else "no interval, "
            return f"{self.where}: {self.value:.1f} % ({span}{self.table})"
        a, b = (name(n) for n in self.names)
        span = (f"95 % paired interval [{signed(self.lo)}, {signed(self.hi)}], {self.method}" if interval else
                "no interval")
        if self.kind == "difference":
            return (f"On {self.where}, {a}'s {self.quantity} is higher than {b}'s by {self.value:.1f} points "
                    f"({a} - {b}: {span}).")
        reason = "the interval contains 0" if interval else "there is no interval"
        return (f"{a} vs {b} on {self.where}: {a} - {b} = {self.value:+.1f} {self.quantity} points ({span}); "
                f"no difference shown: {reason}.")

    def _first_text(self) -> str:
        """The sentence of a ``first`` claim."""
        shown = [name(n) for n in self.names]
        if len(shown) == 1 and self.hi == 1:
            return (f"On {self.where}: {shown[0]} is first; the paired tests, Holm-adjusted over every pair on the "
                    f"set, show it higher than every other detector (paired.csv).")
        if len(shown) == 1:
            return (f"On {self.where}: only {shown[0]} can be first; every other detector is shown lower than at "
                    "least one (paired tests Holm-adjusted over every pair on the set; paired.csv).")
        listed = ", ".join(shown[:-1]) + " and " + shown[-1]
        return (f"On {self.where}: {len(shown)} of {int(self.value)} detectors can be first, no paired difference "
                f"shown among them (Holm-adjusted over every pair on the set): {listed} (paired.csv).")

    def as_dict(self) -> dict[str, Any]:
        """The claim as claims.json holds it: its fields, the test and the sentence (NaN as null)."""
        data = asdict(self)
        data.update(row=dict(self.row), columns=list(self.columns), names=list(self.names), test=self.test,
                    text=self.text)
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in data.items()}

    @classmethod
    def from_dict(cls, data: Any) -> Claim:
        """The inverse of :meth:`as_dict` (``test`` and ``text`` are derived, not read); a ValueError naming the
        field when ``data`` is not a claim as claims.json holds one (a field of another type, an unknown field,
        fields no claim of its kind has)."""
        if not isinstance(data, dict):
            raise ValueError(f"a claim is a JSON object, not {json_type(data)}")
        unknown = sorted(set(data) - set(FIELDS))
        if unknown:
            raise ValueError(f"field {unknown[0]!r} is no field of a claim")
        row = data.get("row")
        if not isinstance(row, dict) or not all(isinstance(v, str) for v in row.values()):
            raise ValueError(f"row is {json_type(row)}; valid: an object of key columns and their values as text")
        return cls(kind=_string(data, "kind"), table=_string(data, "table"), row=tuple(row.items()),
                   columns=_strings(data, "columns"), where=_string(data, "where"), value=_number(data, "value"),
                   lo=_number(data, "lo"), hi=_number(data, "hi"), method=_string(data, "method", ""),
                   names=_strings(data, "names"), quantity=_string(data, "quantity", "AUROC"),
                   note=_string(data, "note", ""), about=_string(data, "about", "place"))


def json_type(value: Any) -> str:
    """A JSON value's type as a file shows it, for a message: ``a list``, ``null``, ``a number``, ..."""
    if value is None:
        return "null"
    kinds = {bool: "true or false", str: "a string", list: "a list", dict: "an object"}
    return next((v for k, v in kinds.items() if isinstance(value, k)), "a number")


def _string(data: Mapping[str, Any], key: str, default: str | None = None) -> str:
    value = data.get(key, default)
    if not isinstance(value, str):
        raise ValueError(f"{key} is {json_type(value)}; valid: a string")
    return value


def _strings(data: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{key} is {json_type(value)}; valid: a list of strings")
    return tuple(value)


def _number(data: Mapping[str, Any], key: str) -> float:
    value = data.get(key)
    if value is None and key != "value":
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key} is {json_type(value)}; valid: a number" + (" or null" if key != "value" else ""))
    return float(value)


def pair_claim(row: dict[str, Any], table: str, keys: tuple[str, ...], columns: tuple[str, str, str, str, str],
               where: str | None = None, quantity: str | None = None, note: str = "") -> Claim:
    """The claim of one row of a paired table: a ``difference`` in the order whose difference is positive when the
    interval excludes 0 (A - B with its own interval: a swapped pair negates and swaps the bounds), else a
    ``no_difference`` in the table's order. ``keys``: the columns that pick the row; ``where`` and ``quantity``
    default to the ones the row's cells give (:func:`place`, :func:`quantity_of`), and any other is refused."""
    col_a, col_b, col_d, col_lo, col_hi = columns
    delta, lo, hi = (_num(row[c]) for c in (col_d, col_lo, col_hi))
    names = (str(row[col_a]), str(row[col_b]))
    picked = tuple((k, _cell(row[k])) for k in keys)
    where = place(dict(picked), columns[:2]) if where is None else where
    quantity = quantity_of(col_d) if quantity is None else quantity
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


def parse_claims(text: str) -> dict[str, list[dict[str, Any]]]:
    """``{"claims": [...], "summary": [...]}`` of claims.json's ``text`` as written (objects, ``text`` included); a
    ValueError with one line that says what is wrong when it is not the file the run writes (not JSON, not an
    object, a part that is not a list, an entry that is not an object)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{json_type(data)}, not the object a run writes ({{'format', 'claims', 'summary'}})")
    if data.get("format") != FORMAT_VERSION:
        raise ValueError(f"format {data.get('format')!r}; this version reads format {FORMAT_VERSION}")
    parts = {}
    for part in ("claims", "summary"):
        entries = data.get(part)
        if not isinstance(entries, list):
            raise ValueError(f"{part!r} is {json_type(entries)}; valid: a list of claims")
        bad = [i for i, e in enumerate(entries) if not isinstance(e, dict)]
        if bad:
            raise ValueError(f"{part}[{bad[0]}] is {json_type(entries[bad[0]])}, not a claim (an object); "
                             f"{len(bad)} of {len(entries)} entries are not objects")
        parts[part] = entries
    return parts


def read_claims(out: Path) -> dict[str, list[dict[str, Any]]]:
    """:func:`parse_claims` of ``<out>/claims.json``; empty lists when there is none."""
    path = Path(out) / CLAIMS_FILE
    return parse_claims(path.read_text()) if path.is_file() else {"claims": [], "summary": []}
