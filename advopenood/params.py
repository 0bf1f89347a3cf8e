"""Typed plugin parameters: a frozen model per plugin, built from the parameters it declares, read by attribute.

A plugin declares its parameters once, as defaults (an attack's ``defaults(input_size)``, a detector's
``default_params()``) and, where a default does not say the type (``None``, a list), in ``param_types``
(name -> type, e.g. ``{"rel_stepsize": float | None}``). The base class checks the values at plan time
(:func:`advopenood.registry.check_params`: unknown names and ill-typed values are a one-line error) and keeps them
as :class:`Params` in ``plugin.p``: ``attack.p.steps`` is an int, ``attack.p.eps`` a float even when the config gave
``1``, and nothing can change them after the plugin was built. ``plugin.params`` stays the plain mapping that cache
keys and ``run.json`` record.

A budget parameter (a query, iteration or draw count) declares its type with its documented upper bound
(:func:`bounded`; :data:`QueryCount`, :data:`IterationCount`, :data:`DrawCount`, :data:`PointCount`,
:data:`EpochCount`, :data:`ImageCount`; a swept list's length with :func:`swept`), so ``typed`` refuses a value outside
it in one line at plan time, naming the parameter and the bound (docs/attacks.md, "Budget bounds"). An evaluator or
analysis declares ``param_types`` for its constructor's parameters the same way (:func:`check_declared_types`).
"""
from __future__ import annotations

import difflib
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, create_model

from advopenood.errors import UsageError


class Params(BaseModel):
    """A plugin's parameters, validated and frozen; one attribute per declared parameter."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True, protected_namespaces=())


#: The documented upper bounds of budget parameters (docs/attacks.md, "Budget bounds"; the noise copies in
#: docs/detectors.md too): far above what any real run needs (AutoAttack's 5,000 queries and 100 iterations, ROSS's 25
#: noise copies), so that a slip (``10**12`` queries) is refused at plan time instead of running for days.
MAX_QUERIES = 10**6
MAX_ITERATIONS = 10**5
#: EOT draws of an attack and noise copies of a randomised detector's confidence
MAX_DRAWS = 10**4
#: random points sampled per image (the binarization test's ``n_inner``, ``n_random``)
MAX_POINTS = 10**6
#: training epochs of a model a plugin trains (the transfer analysis' surrogates)
MAX_EPOCHS = 10**4
#: images a plugin makes or draws (the transfer analysis' Jacobian augmentation, an analysis' ``limit`` or
#: ``max_samples``)
MAX_IMAGES = 10**7
#: values of a swept parameter, each a run of its own (an adaptive attack's ``lam``, the transfer analysis'
#: ``fractions`` and ``attacks``, the binarization test's ``attacks``)
MAX_SWEEP = 100


@dataclass(frozen=True)
class Bound:
    """The range a number parameter declares (:func:`bounded`), as its error line states it."""

    kind: type
    low: float
    high: float
    low_open: bool = False
    #: what the bound counts (``queries``), named in the error line
    what: str = ""

    def choices(self, optional: bool = False) -> str:
        """The valid choices as an error line states them (``optional``: null is one too)."""
        if self.kind is list:
            text = f"one value or a list of at most {int(self.high)}" + (", or null" if optional else "")
            return f"{text} (the documented bound on {self.what})" if self.what else text
        noun = "an integer" if self.kind is int else "a number"
        low, high = (int(v) if float(v).is_integer() else v for v in (self.low, self.high))
        text = f"{noun} in {'(' if self.low_open else '['}{low}, {high}]" + (", or null" if optional else "")
        return f"{text} (the documented bound on {self.what})" if self.what else text


def bounded(kind: type, low: float, high: float, what: str = "", *, low_open: bool = False) -> Any:
    """The declared type (``param_types``) of a number parameter of type ``kind`` in ``[low, high]`` (``(low, high]``
    with ``low_open``); a value outside is a one-line UsageError naming the range and ``what`` it counts."""
    interval = Field(gt=low, le=high) if low_open else Field(ge=low, le=high)
    return Annotated[kind, interval, Bound(kind, low, high, low_open, what)]


def swept(high: int = MAX_SWEEP, what: str = "swept values") -> Any:
    """The declared type (``param_types``) of a parameter that takes one value or a list of at most ``high``
    (each a run of its own); a longer list is a one-line UsageError naming its length and the bound. The values
    themselves are the plugin's to check."""
    def at_most(value: Any) -> Any:
        if isinstance(value, (list, tuple)) and len(value) > high:
            raise ValueError(f"{len(value)} values")
        return value

    return Annotated[Any, AfterValidator(at_most), Bound(list, 0, high, what=what)]


#: the declared type of a query budget (Square's ``n_queries``)
QueryCount = bounded(int, 1, MAX_QUERIES, "queries")
#: the declared type of an iteration count (``steps``, ``n_iter``, ``n_restarts``, ``binary_search_steps``)
IterationCount = bounded(int, 1, MAX_ITERATIONS, "iterations")
#: the declared type of a number of random draws (an EOT attack's ``eot``)
DrawCount = bounded(int, 1, MAX_DRAWS, "draws")
#: the declared type of a number of points sampled per image
PointCount = bounded(int, 1, MAX_POINTS, "points per image")
#: the declared type of a number of training epochs
EpochCount = bounded(int, 1, MAX_EPOCHS, "epochs")
#: the declared type of a number of images made or drawn
ImageCount = bounded(int, 1, MAX_IMAGES, "images")


def bound_of(tp: Any) -> Bound | None:
    """The :class:`Bound` a declared type carries (also inside ``X | None``), None when it has none."""
    for arg in get_args(tp):
        if isinstance(arg, Bound):
            return arg
        found = bound_of(arg)
        if found is not None:
            return found
    return None


def field_type(default: Any) -> Any:
    """The type a parameter's default declares: bool, int, float (which takes an int), str; any value for a
    default of None or a sequence (a sequence parameter often takes one value too)."""
    for kind in (bool, int, float, str):
        if isinstance(default, kind):
            return kind
    return Any


def declared_types(cls: type) -> dict[str, Any]:
    """The ``param_types`` of ``cls`` and its bases, a subclass's entry over its base's."""
    out: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        out.update(vars(klass).get("param_types") or {})
    return out


@functools.lru_cache(maxsize=None)
def _model(owner: str, fields: tuple[tuple[str, Any], ...]) -> type[Params]:
    return create_model(f"Params[{owner}]", __base__=Params, **{name: (kind, ...) for name, kind in fields})


def typed(owner: str, values: Mapping[str, Any], defaults: Mapping[str, Any],
          declared: Mapping[str, Any] | None = None) -> Params:
    """``values`` (every parameter of plugin ``owner``, already checked against its ``defaults``) as frozen
    :class:`Params`: each field has its ``declared`` type (name -> type), else its default's
    (:func:`field_type`), so an int given for a float parameter reads as a float. A value the type refuses is a
    one-line UsageError; one outside a declared :func:`bounded` range names the range."""
    declared = dict(declared or {})
    fields = tuple((name, declared.get(name, field_type(defaults.get(name)))) for name in values)
    try:
        return _model(owner, fields)(**values)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(map(str, first["loc"]))
        kind = dict(fields).get(first["loc"][0])
        bound = bound_of(kind)
        value = first.get("input")
        if bound is not None and bound.kind is list and isinstance(value, (list, tuple)):
            raise UsageError(f"{key}: a list of {len(value)} values for {owner}; valid choices: "
                             f"{bound.choices(type(None) in get_args(kind))}") from None
        if bound is not None and first["type"] in ("greater_than", "greater_than_equal", "less_than_equal"):
            raise UsageError(f"{key} {first.get('input')!r} for {owner}; valid choices: "
                             f"{bound.choices(type(None) in get_args(kind))}") from None
        raise UsageError(f"parameter {key} of {owner} is {first.get('input')!r}; {first['msg'].lower()}") from None


def check_declared_types(what: str, cls: Any, params: Mapping[str, Any]) -> None:
    """The values of ``params`` whose type ``cls`` declares in ``param_types`` (an evaluator's or analysis'
    constructor parameters: budgets with their :func:`bounded` range, swept lists with :func:`swept`), checked
    by :func:`typed` before the plugin is built: a one-line UsageError naming the parameter, ``what`` (``analysis
    'bintest'``) and the bound."""
    declared = declared_types(cls) if isinstance(cls, type) else {}
    given = {k: v for k, v in params.items() if k in declared}
    if given:
        typed(what, given, {}, declared)


def check_params(what: str, name: str, params: dict[str, Any], declared: dict[str, Any],
                 extra: tuple[str, ...] = ()) -> None:
    """``params`` are among the ``declared`` ones (name -> default; ``extra`` names accepted besides) and each
    has its default's type (:func:`check_types`), and no number is NaN or infinite; a one-line UsageError names the
    first bad one otherwise.
    ``what``: the plugin's kind in the singular (``attack``), ``name`` its registered name."""
    for key, value in params.items():  # NaN would be written as null in a saved plan, and read back as the default
        if any(isinstance(v, float) and not math.isfinite(v) for v in (value if isinstance(value, (list, tuple))
                                                                          else (value,))):
            raise UsageError(f"parameter {key} of {what} {name!r} is {value!r}; valid choices: a finite number "
                             "(not NaN or an infinity)")
    valid = sorted({*declared, *extra})
    unknown = sorted(set(params) - set(valid))
    if unknown:
        close = difflib.get_close_matches(unknown[0], valid, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ";"
        raise UsageError(f"unknown parameter {unknown[0]!r} for {what} {name!r}{hint} valid choices: "
                         f"{', '.join(valid) or '(none)'}")
    check_types(f"{what} {name!r}", {k: v for k, v in params.items() if k not in extra}, declared)


def check_types(what: str, params: dict[str, Any], defaults: dict[str, Any]) -> None:
    """Each scalar parameter has the type of its declared default (an int where a float is declared); parameters
    whose default is None or a sequence are left to the plugin (a sequence parameter often takes one value too).
    A UsageError names the first mismatch and the expected type."""
    for key, value in params.items():
        default = defaults.get(key)
        if default is None or value is None or isinstance(default, (list, tuple, dict)):
            continue
        expected: tuple[type, ...]
        if isinstance(default, bool):
            expected = (bool,)
        elif isinstance(default, (int, float)):
            expected = (int, float) if isinstance(default, float) else (int,)
        else:
            expected = (type(default),)
        if not isinstance(value, expected) or (isinstance(value, bool) and not isinstance(default, bool)):
            names = " or ".join(t.__name__ for t in expected)
            raise UsageError(f"parameter {key} of {what} is {value!r}; valid choices: {names} (default {default!r})")
