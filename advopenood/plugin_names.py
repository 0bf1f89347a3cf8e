"""Plugin names, apart from the registry that holds them (:mod:`advopenood.plugin_registry`): the four kinds, the
bound on what a name composes (:func:`check_composition`, checked before any look-up recurses, by the registry and by
the CLI's check of its flags against the plugin index), a plugin's description and the one-line messages of a clash.
"""
from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from advopenood.errors import UsageError, shown

KINDS = ("attacks", "detectors", "evaluators", "analyses")
GROUP_PREFIX = "advopenood."
#: the most families one name composes (``adaptive_apgd_eot_ross_msp`` composes two, ``adaptive_apgd_eot_`` of
#: ``ross_``); a name composes each family at most once (:func:`check_composition`)
MAX_COMPOSITION = 4
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


def check_composition(kind: str, name: str, families: dict[str, dict[str, tuple[str, str]]],
                      registered: Callable[[str, str], bool]) -> None:
    """Refuse a name that composes a family twice or more than :data:`MAX_COMPOSITION` families, before any look-up
    recurses: its prefixes are peeled off in a loop, the longest matching first, until a ``registered`` name or a
    rest that no prefix begins. ``families``: kind -> prefix -> (the kind it takes, its pattern)."""
    peeled: list[tuple[str, str]] = []
    at, rest = kind, name
    while not registered(at, rest):
        prefixes = [p for p in families.get(at, {}) if rest.startswith(p) and len(rest) > len(p)]
        if not prefixes:
            return
        prefix = max(prefixes, key=len)
        takes, pattern = families[at][prefix]
        twice = (at, prefix) in peeled
        if twice or len(peeled) == MAX_COMPOSITION:
            what = f"family {pattern} twice" if twice else f"more than {MAX_COMPOSITION} families"
            raise UsageError(f"{_singular(kind)} {shown(name)} composes {what}; valid choices: a name that composes "
                             f"each family at most once and at most {MAX_COMPOSITION} families in all "
                             "(adaptive_apgd_eot_ross_msp composes two: adaptive_apgd_eot_<detector> of "
                             "ross_<detector> of msp)")
        peeled.append((at, prefix))
        at, rest = takes, rest[len(prefix):]
