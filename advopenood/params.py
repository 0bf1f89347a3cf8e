"""Typed plugin parameters: a frozen model per plugin, built from the parameters it declares, read by attribute.

A plugin declares its parameters once, as defaults (an attack's ``defaults(input_size)``, a detector's
``default_params()``) and, where a default does not say the type (``None``, a list), in ``param_types``
(name -> type, e.g. ``{"rel_stepsize": float | None}``). The base class checks the values at plan time
(:func:`advopenood.registry.check_params`: unknown names and ill-typed values are a one-line error) and keeps them
as :class:`Params` in ``plugin.p``: ``attack.p.steps`` is an int, ``attack.p.eps`` a float even when the config gave
``1``, and nothing can change them after the plugin was built. ``plugin.params`` stays the plain mapping that cache
keys and ``run.json`` record.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from advopenood.errors import UsageError


class Params(BaseModel):
    """A plugin's parameters, validated and frozen; one attribute per declared parameter."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True, protected_namespaces=())


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
    one-line UsageError."""
    declared = dict(declared or {})
    fields = tuple((name, declared.get(name, field_type(defaults.get(name)))) for name in values)
    try:
        return _model(owner, fields)(**values)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise UsageError(f"parameter {'.'.join(map(str, first['loc']))} of {owner} is {first.get('input')!r}; "
                         f"{first['msg'].lower()}") from None
