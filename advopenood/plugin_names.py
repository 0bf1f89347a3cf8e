"""Plugin names, apart from the registry that holds them (:mod:`advopenood.plugin_registry`): the four kinds, the
grammar of a name (:data:`GRAMMAR`: :func:`check_composition` and :func:`parse_chain`, used before any look-up
recurses by the registry and by the CLI's check of its flags against the plugin index, which stores the families, not
their members), a plugin's description and the one-line messages of a clash.
"""
from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from advopenood.errors import UsageError, shown

KINDS = ("attacks", "detectors", "evaluators", "analyses")
GROUP_PREFIX = "advopenood."
#: the most families one name composes: one of each kind (``adaptive_apgd_eot_ross_msp`` composes two,
#: ``adaptive_apgd_eot_`` of ``ross_``), so never more than there are kinds (:data:`GRAMMAR`)
MAX_COMPOSITION = len(KINDS)
#: what a family wraps (:class:`~advopenood.plugin_registry.Family`'s ``wraps``): ``registered``, only the
#: registered plugins of the kind it takes (``ross_<detector>``: ``ross_msp``, never ``ross_smoothed_msp``);
#: ``names``, those and the members of that kind's families, when that kind is another than its own
#: (``adaptive_<detector>``: ``adaptive_msp`` and ``adaptive_ross_msp``)
WRAPS = ("registered", "names")
#: the grammar of a name, which the registry (not a family's ``accepts``) enforces, stated as messages quote it
GRAMMAR = (f"a name that composes each family at most once and at most {MAX_COMPOSITION} families in all, one of "
           "each kind, each wrapping a registered plugin or another kind's member (adaptive_apgd_eot_ross_msp "
           "composes two: adaptive_apgd_eot_<detector> of ross_<detector> of msp)")
#: the families a name composes, outermost first: ``(kind, prefix)`` each
Chain = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Failure:
    """An entry point whose import failed: its group's kind, the entry point, the package and the reason."""

    kind: str
    entry: str
    package: str
    reason: str


class Claim(Protocol):
    """What a clash's message reads of a plugin under a name (a registry's
    :class:`~advopenood.plugin_registry.Entry`)."""

    kind: str
    name: str
    obj: Any
    family: str

    @property
    def origin(self) -> str: ...


def _singular(kind: str) -> str:
    return kind[:-1] if kind != "analyses" else "analysis"


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise UsageError(f"unknown plugin kind {kind!r}; valid kinds: {', '.join(KINDS)}")


#: words ending in a full stop that end no sentence (``Moosavi-Dezfooli et al. 2016``, ``e.g. MSP``)
ABBREVIATIONS = ("al.", "e.g.", "i.e.", "cf.", "vs.", "etc.", "approx.", "resp.", "Sec.", "Fig.", "Eq.", "No.")
#: reST inline markup: a role (``:mod:`x```, ``:class:`~a.B```) or double backticks, shown as its text
_REST = re.compile(r"(?::[\w:.-]+:)?`{1,2}~?([^`]+?)`{1,2}")


def _first_line(obj: Any) -> str:
    """A plugin's description: the first sentence of its docstring's first paragraph (lines joined, so a
    sentence wrapped over several lines is shown whole; an abbreviation such as ``et al.`` ends no sentence),
    with reST markup shown as plain text (``:mod:`x``` and ````x```` as ``x``)."""
    doc = inspect.getdoc(obj) or ""
    paragraph = _REST.sub(lambda m: m.group(1).split(" <")[0], " ".join(doc.strip().split("\n\n")[0].split()))
    words = paragraph.split(" ")
    for i, word in enumerate(words[:-1]):
        if word.endswith(".") and word.lstrip("([") not in ABBREVIATIONS:
            return " ".join(words[:i + 1])
    return paragraph


def _clash(held: Claim, entry: Claim) -> str:
    """The one line for a registered plugin under a name a family generates, not declaring ``overrides = True``."""
    made, taker = (held, entry) if held.family else (entry, held)
    return (f"{_singular(entry.kind)} {entry.name!r} of {taker.origin} takes a name that {made.origin} generates "
            f"({made.family}); declare overrides = True on it to replace the generated one on purpose, or rename it")


def _duplicate(claims: list[Claim]) -> str:
    """The one line for several plugins under one name, none or more than one declaring ``overrides = True``
    (their sources sorted: the line does not depend on the order they registered in)."""
    what = f"{_singular(claims[0].kind)} {claims[0].name!r}"
    origins = sorted(e.origin for e in claims)
    declaring = sum(_declares_override(e.obj) for e in claims)
    if len(claims) == 2:
        rule = "both declare overrides = True" if declaring == 2 else \
            "declare overrides = True on the one that replaces the other on purpose"
        return f"{what} is registered twice, by {' and '.join(origins)}; {rule}"
    rule = f"{declaring} of them declare overrides = True; keep it on one" if declaring else \
        "declare overrides = True on the one that replaces the others on purpose"
    return f"{what} is registered {len(claims)} times, by {', '.join(origins[:-1])} and {origins[-1]}; {rule}"


def _same_plugin(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are one plugin: the same object, or the same definition (module and qualified
    name) imported afresh."""
    return a is b or (getattr(a, "__module__", None), getattr(a, "__qualname__", None)) == \
        (getattr(b, "__module__", object()), getattr(b, "__qualname__", object()))


def _declares_override(obj: Any) -> bool:
    """``overrides = True`` set on ``obj`` itself (a subclass of an overriding plugin does not inherit it)."""
    return vars(obj).get("overrides") is True if hasattr(obj, "__dict__") else False


def check_composition(kind: str, name: str, families: dict[str, dict[str, tuple[str, str, str]]],
                      registered: Callable[[str, str], bool]) -> None:
    """Refuse a name outside the grammar (:data:`GRAMMAR`) before any look-up recurses: its prefixes are peeled off
    in a loop, the longest matching first, until a ``registered`` name or a rest that no prefix begins; a family met
    twice, a second family of one kind, or a family under one that wraps only registered plugins is a UsageError.
    ``families``: kind -> prefix -> (the kind it takes, its pattern, what it wraps: :data:`WRAPS`)."""
    peeled: list[tuple[str, str]] = []
    at, rest = kind, name
    while not registered(at, rest):
        prefixes = [p for p in families.get(at, {}) if rest.startswith(p) and len(rest) > len(p)]
        if not prefixes:
            return
        prefix = max(prefixes, key=len)
        takes, pattern, _ = families[at][prefix]
        if (at, prefix) in peeled:
            raise UsageError(f"{_singular(kind)} {shown(name)} composes family {pattern} twice; valid choices: "
                             f"{GRAMMAR}")
        if peeled:
            outer_kind, outer_prefix = peeled[-1]
            outer = families[outer_kind][outer_prefix]
            if outer[2] == "registered" or any(k == at for k, _ in peeled):
                why = "wraps only registered plugins" if outer[2] == "registered" else \
                    f"is of a kind ({at}) the name composes already"
                raise UsageError(f"{_singular(kind)} {shown(name)} nests family {pattern} inside {outer[1]}, which "
                                 f"{why}; valid choices: {GRAMMAR}")
        peeled.append((at, prefix))
        at, rest = takes, rest[len(prefix):]


def parse_chain(kind: str, name: str, families: dict[str, dict[str, tuple[str, str, str]]],
                registered: Callable[[str, str], bool]) -> tuple[list[tuple[str, str]], str, str] | None:
    """``name`` parsed by the grammar (:data:`GRAMMAR`, checked first by :func:`check_composition`): the families
    it composes, outermost first as ``(kind, prefix)``, and its base plugin's kind and name; None when it parses to
    no registered plugin. A name is validated by parsing, not by membership in a list of every name."""
    check_composition(kind, name, families, registered)
    chain: list[tuple[str, str]] = []
    at, rest = kind, name
    while not registered(at, rest):
        prefixes = [p for p in families.get(at, {}) if rest.startswith(p) and len(rest) > len(p)]
        if not prefixes:
            return None
        prefix = max(prefixes, key=len)
        chain.append((at, prefix))
        at, rest = families[at][prefix][0], rest[len(prefix):]
    return chain, at, rest
