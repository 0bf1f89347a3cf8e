"""One plugin registry for attacks, detectors, evaluators and analyses.

Plugins register with a decorator (as timm's ``register_model``)::

    from advopenood.registry import register

    @register("detectors", "mydet")
    class MyDetector(...):
        \"\"\"One-line description shown by ``advopenood list detectors``.\"\"\"

and are discovered through Python entry points (as pytest's ``pytest11``): a package declares
``[options.entry_points] advopenood.detectors = mypkg = mypkg.detectors`` and importing that
module runs its decorators. An entry point may also name an object directly
(``mydet = mypkg.detectors:MyDetector``); it is then registered under the entry point's name.
The built-in plugins in ``plugins/`` are found the same way, through this package's own entry points.

Generated plugins come in families (:func:`family`, :class:`Family`): a family is registered once with a name
prefix and what it takes (``ross_`` takes a detector), and a name such as ``ross_msp`` or
``adaptive_apgd_eot_ross_msp`` is parsed into family and base plugin at look-up, its plugin made on the first
look-up and kept (once per name per registry). ``advopenood list <kind>`` shows the families, ``--all`` every name
(streamed), ``--filter PATTERN`` the names that match.

The registry is an instance (:class:`Registry`, as pluggy's ``PluginManager``): the package uses one
(:func:`default`), which the module-level functions here read; a test takes a fresh one (:meth:`Registry.copy`,
:func:`using`). Names are lower-case when registered and case-sensitive when looked up (``ROSS_MSP`` is no name; the
message suggests ``ross_msp``). What a name composes is bounded by the registry's grammar, not by a family's
``accepts`` (:data:`~advopenood.plugin_names.GRAMMAR`: each family at most once, one family of each kind, so at most
:data:`~advopenood.plugin_registry.MAX_COMPOSITION`; a family that ``wraps="registered"`` wraps no member), checked by
parsing before any look-up recurses.

It is strict, and a clash costs only its names: two plugins under one name are a *clash* (its line names both sources
and the fix) unless exactly one of them declares ``overrides = True`` on itself (not inherited); the override is
then recorded (:func:`overrides`, ``run.json``'s ``plugin_overrides``). A name a family generates (``ross_msp``,
``adaptive_msp``) is as reserved: a plugin under it without ``overrides = True``, registered before or after the
family's base plugin, is a clash naming the generating family; so are two families under one prefix and two
families of different packages whose prefixes overlap (one begins the other). A clashing name is unusable (a look-up
of it, or of a name made from it, is the clash's line; ``all`` is refused) and every other name works:
:func:`clashes` lists them all, the CLI warns once per clash and ``advopenood list`` marks them. A family with an
empty prefix is refused when it registers. An entry point that fails to import is remembered (:func:`failures`): a
name that is not registered while one failed is refused with "plugin package X failed to load: <reason>". What
exists never depends on the order in which entry points load.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, TypeVar

from advopenood import plugin_registry as _core
from advopenood.capabilities import is_derived
from advopenood.errors import UsageError
from advopenood.params import check_params, check_types  # re-exported: plugins call registry.check_params
from advopenood.params import check_declared_types
from advopenood.plugin_registry import (GROUP_PREFIX, KINDS, MAX_COMPOSITION, Entry, Failure, Family, Registry,
                                        _check_kind, _singular, default, using)

__all__ = ["GROUP_PREFIX", "KINDS", "MAX_COMPOSITION", "Entry", "Failure", "Family", "Registry", "check_declared",
           "check_params", "check_types", "clash_lines", "clashes", "create", "default", "discover", "entries",
           "failure_message", "failures", "families", "family", "generated", "get", "iter_entries", "names",
           "overrides",
           "parse_names", "provide", "register", "registered", "resolves", "unregister", "using"]

T = TypeVar("T")


def register(kind: str, name: str | None = None, description: str | None = None,
             family: str | None = None) -> Callable[[T], T]:
    """Decorator that adds a class or function to the registry of ``kind`` under ``name`` (lower-cased). A name
    that is taken is a clash (:func:`clashes`: the name is unusable, its look-up a UsageError naming both plugins'
    sources), unless exactly one of them declares ``overrides = True`` on itself: that one holds the name, whichever
    registered first, and the override is recorded. Registering the same plugin again (the same object, or its
    module imported afresh) replaces it silently. A name a family generates (:func:`family`) is taken as well.
    ``family``: the pattern a registered plugin reserves besides its own name's (an attack family's shorthand,
    ``adaptive_eot``), shown in a clash's message."""
    return _core.default().register(kind, name, description, family)


def family(kind: str, prefix: str, make: Callable[[str], Any] | None = None, *, accepts: Callable[[Any], bool],
           takes: str = "detectors", description: str = "", hint: str = "", source: str = "",
           shorthand: str = "", wraps: str = "names") -> Any:
    """Register a family of ``kind``: every name ``<prefix><base>`` where ``base`` resolves among ``takes`` to a
    plugin that ``accepts(plugin)`` is true of, made by ``make(base)`` on its first look-up (once per name; the
    name then resolves to that object). Its names are reserved as a registered plugin's are. Used as a decorator
    on ``make`` (which it returns), or called with ``make``. ``description`` (default: ``make``'s docstring's first
    sentence) and ``hint`` (what it takes) are its line in ``advopenood list``; ``shorthand``: the registered
    name selecting one member per selected detector. An empty prefix is a UsageError naming the package; a second
    family under one prefix, or a family of another package whose prefix overlaps this one's (one begins the
    other), is a clash: the names of both are unusable (:func:`clashes`). A member is never a member of its own
    family again (``accepts`` need not refuse them). ``wraps`` (``registered`` or ``names``) and the registry's
    grammar (:data:`~advopenood.plugin_names.GRAMMAR`: one family of each kind per name) bound what a name composes,
    whatever ``accepts`` takes."""
    return _core.default().family(kind, prefix, make, accepts=accepts, takes=takes, description=description, hint=hint,
                                  source=source, shorthand=shorthand, wraps=wraps)


def generated(kind: str, name: str) -> bool:
    """Whether ``name`` is a name the project or a plugin generates: a family's (``ross_msp``, ``adaptive_msp``,
    whoever holds it now, an override included) or one a registered plugin reserves with ``family=``
    (``adaptive_eot``). Such a name is as reserved as a registered one."""
    return _core.default().generated(kind, name)


def overrides() -> list[dict[str, str]]:
    """Every plugin that replaces another of the same name on purpose (``overrides = True``): kind, name, the
    replacing plugin's source and the replaced one's, with the family when one generates it (``run.json``'s
    ``plugin_overrides``)."""
    return _core.default().overrides()


def clashes() -> dict[str, dict[str, str]]:
    """Every clash after discovery, ``{kind: {name or family pattern: its line}}``: plugins registered twice, a
    plugin under a generated name without ``overrides = True``, families under one prefix or overlapping ones. Each
    such name (and every name made from it) is unusable; every other name works."""
    return _core.default().clashes()


def clash_lines(table: dict[str, dict[str, str]]) -> list[str]:
    """One line per clash of a :func:`clashes` table (an overlap of two families is one clash): its line and the
    names it makes unusable."""
    named: dict[str, list[str]] = {}
    for kind, rows in table.items():
        for name, line in rows.items():
            named.setdefault(line, []).append(name)
    return [f"{line} (unusable until then: {', '.join(names)}; every other name works)" for line, names in
            named.items()]


def failures() -> list[Failure]:
    """The entry points that failed to load in this process."""
    return list(_core.default().failed)


def failure_message() -> str:
    """One line naming each plugin package that failed to load and why (empty when none did)."""
    return _core.default().failure_message()


def unregister(kind: str, name: str) -> None:
    """Remove the registered plugin ``name`` from the registry of ``kind`` (plugins registered for a test or a
    session; a family's names go with their base plugin)."""
    _core.default().unregister(kind, name)


def discover(kind: str) -> None:
    """Load every entry point of every group ``advopenood.<kind>`` once (a module named in one group may register
    plugins of another kind: the detectors' module registers the ``smoothed`` evaluator, so a fresh process that
    looks up only the evaluators must load it too). A broken plugin warns and is remembered (:func:`failures`);
    the others go on."""
    _core.default().discover(kind)


def provide(kind: str, provider: Callable[[], None] | None = None) -> Any:
    """Add a *provider* of ``kind`` (the API before families, kept for third-party packages): a callable that
    registers generated plugins, run before a listing of ``kind`` and when a name is found nowhere else. A family
    (:func:`family`) is cheaper: its names are made one at a time, when looked up."""
    if provider is None:  # used as a decorator
        return lambda fn: provide(kind, fn)
    return _core.default().provide(kind, provider)


def registered(kind: str, name: str) -> bool:
    """Whether ``name`` is registered under ``kind`` now (no discovery, no family: for providers themselves)."""
    _check_kind(kind)
    return name.strip().lower() in _core.default().table[kind]


def resolves(kind: str, name: str) -> bool:
    """Whether ``name`` resolves among ``kind`` (a registered plugin or a family's name), without listing all; a
    UsageError for a name a clash makes unusable or one that composes too many families."""
    return _core.default().resolve(kind, name) is not None


def iter_entries(kind: str) -> Any:
    """``(name, entry)`` of every name of ``kind`` that resolves, sorted, made one at a time (``list --all``
    prints as it goes)."""
    return _core.default().iter_entries(kind)


def entries(kind: str) -> dict[str, Entry]:
    """All plugins of ``kind`` by name: registered, provided and every name a family generates (not the names a
    clash makes unusable)."""
    return _core.default().entries(kind)


def families(kind: str) -> dict[str, Family]:
    """The families of ``kind`` by pattern (``ross_<detector>``), after entry-point discovery."""
    _core.default().discover(kind)
    return {fam.pattern: fam for fam in sorted(_core.default().families[kind].values(), key=lambda f: f.prefix)}


def names(kind: str) -> list[str]:
    """Every name of ``kind`` that resolves, sorted."""
    return list(entries(kind))


def get(kind: str, name: str) -> Any:
    """The plugin object ``name`` of ``kind`` (a family's made on its first look-up); a UsageError lists the valid
    names otherwise."""
    return _core.default().get(kind, name)


def parse_names(kind: str, spec: str | list[str] | None, default: list[str] | None = None) -> list[str]:
    """Split a comma-separated selection (``all`` selects every plugin except the generated ones,
    :class:`~advopenood.capabilities.Derived`) and validate each name (case-sensitive)."""
    if spec is None:
        return list(default or [])
    items = spec if isinstance(spec, list) else [s for s in spec.split(",") if s.strip()]
    if len(items) == 1 and str(items[0]).strip() == "all":  # every plugin but the derived ones
        table = entries(kind)
        if _core.default().failed:  # "all" would silently lack the failed package's plugins
            raise UsageError(f"{failure_message()} (so '{kind}: all' cannot select all of them)")
        clashing = [line for name, line in clashes()[kind].items() if "<" not in name]
        if clashing:  # likewise the clashing names
            raise UsageError(f"{clashing[0]} (so '{kind}: all' cannot select it)")
        return [n for n, e in table.items() if not is_derived(e.obj)]
    out = []
    for item in items:
        get(kind, str(item))
        out.append(str(item).strip())
    return out


def check_declared(kind: str, name: str, params: dict[str, Any]) -> None:
    """The check :func:`create` makes before it builds ``name``, without building it: the parameters are among the
    constructor's and of their defaults' types (for a constructor taking ``**params``, its base class checks them
    when it is built). For a plugin whose parameters are read before it is built (``required_attacks``)."""
    obj = get(kind, name)
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):  # a builtin or extension object: it checks its own arguments
        return
    fields = signature.parameters.values()
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in fields):
        declared = {p.name: (None if p.default is inspect.Parameter.empty else p.default) for p in fields
                    if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
        check_params(_singular(kind), name.strip(), params, declared)
        check_declared_types(f"{_singular(kind)} {name.strip()!r}", obj, params)


def create(kind: str, name: str, **params: Any) -> Any:
    """The one factory: build the plugin ``name`` of ``kind`` with ``params``. Parameters are declared in one place
    per plugin: the constructor's signature (checked here), or, for a constructor taking ``**params``, the mapping
    the plugin's base class checks (attacks: ``defaults``; detectors: ``default_params``). An unknown or ill-typed
    parameter is a one-line UsageError naming the valid ones, raised before the plugin runs any code."""
    obj = get(kind, name)
    check_declared(kind, name, params)
    try:
        return obj(**params)
    except UsageError:
        raise
    except (TypeError, ValueError) as exc:  # a constructor's own conversion of a bad value, e.g. int("ten")
        raise UsageError(f"bad parameters for {_singular(kind)} {name!r}: {exc}") from None
