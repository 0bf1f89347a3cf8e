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

The registry is strict: a second plugin under a taken name is a one-line UsageError naming both sources, unless one
of the two declares ``overrides = True`` on itself (not inherited); the override is then recorded (:func:`overrides`,
``run.json``'s ``plugin_overrides``). A name a provider generates (``ross_msp``, ``adaptive_msp``) is as reserved:
a plugin under it, registered before or after the provider ran, is the same error naming the generating family. An
entry point that fails to import is remembered (:func:`failures`): a name that is not registered while one failed is
refused with "plugin package X failed to load: <reason>". What exists never depends on the order in which entry
points load.
"""
from __future__ import annotations

import difflib
import inspect
import math
import re
import warnings
from dataclasses import dataclass
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any, Callable, TypeVar

from advopenood.capabilities import is_derived
from advopenood.errors import UsageError, choice_list

KINDS = ("attacks", "detectors", "evaluators", "analyses")
GROUP_PREFIX = "advopenood."

T = TypeVar("T")


@dataclass(frozen=True)
class Entry:
    """A registered plugin: its kind, name, the object itself and a one-line description."""

    kind: str
    name: str
    obj: Any
    description: str
    source: str
    #: the names a provider generates this one among (``ross_<detector>``); empty for a registered plugin
    family: str = ""

    @property
    def origin(self) -> str:
        """Where it comes from, as messages name it: its module and, when an entry point's distribution ships
        that module's package, the distribution (``name==version``)."""
        dist = _DISTS.get(self.source.split(".")[0])
        return f"{self.source} ({dist})" if dist else self.source


@dataclass(frozen=True)
class Failure:
    """An entry point whose import failed: its group's kind, the entry point, the package and the reason."""

    kind: str
    entry: str
    package: str
    reason: str


_REGISTRY: dict[str, dict[str, Entry]] = {kind: {} for kind in KINDS}
_DISCOVERED: set[str] = set()
#: (kind, name) -> the entry that an ``overrides = True`` plugin replaced
_OVERRIDDEN: dict[tuple[str, str], Entry] = {}
_FAILED: list[Failure] = []
#: top-level module named by an entry point -> its distribution, ``name==version``
_DISTS: dict[str, str] = {}
_PROVIDERS: dict[str, list[Callable[[], None]]] = {kind: [] for kind in KINDS}
_PROVIDING: set[str] = set()


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


def register(kind: str, name: str | None = None, description: str | None = None,
             family: str | None = None) -> Callable[[T], T]:
    """Decorator that adds a class or function to the registry of ``kind`` under ``name``. A name that is taken is
    a UsageError naming both plugins' sources, unless exactly one of the two declares ``overrides = True`` on
    itself: that one holds the name, whichever registered first, and the override is recorded. Registering the
    same plugin again (the same object, or its module imported afresh) replaces it silently. ``family``: set by a
    provider for a plugin it generates (the pattern of its names, ``ross_<detector>``; see :func:`generated`)."""
    _check_kind(kind)

    def deco(obj: T) -> T:
        key = (name or getattr(obj, "name", None) or obj.__name__).lower()
        if isinstance(obj, type) and hasattr(obj, "name") and not obj.__dict__.get("name"):
            obj.name = key
        entry = Entry(kind, key, obj, description or _first_line(obj), obj.__module__, family or "")
        held = _REGISTRY[kind].get(key)
        if held is None or _same_plugin(held.obj, obj):
            _REGISTRY[kind][key] = entry
        elif _declares_override(obj) and not _declares_override(held.obj):
            _REGISTRY[kind][key], _OVERRIDDEN[kind, key] = entry, held
        elif _declares_override(held.obj) and not _declares_override(obj):
            _OVERRIDDEN[kind, key] = entry
        else:
            raise UsageError(_clash(held, entry))
        return obj

    return deco


def _clash(held: Entry, entry: Entry) -> str:
    """The one line for two plugins under one name, neither (or both) declaring ``overrides = True``."""
    what = f"{_singular(entry.kind)} {entry.name!r}"
    if held.family or entry.family:  # a registered plugin under a name a provider generates
        made, taker = (held, entry) if held.family else (entry, held)
        return (f"{what} of {taker.origin} takes a name that {made.origin} generates ({made.family}); declare "
                f"overrides = True on it to replace the generated one on purpose, or rename it")
    both = " and ".join(sorted((held.origin, entry.origin)))
    rule = ("both declare overrides = True" if _declares_override(entry.obj) else
            "declare overrides = True on the one that replaces the other on purpose")
    return f"{what} is registered twice, by {both}; {rule}"


def generated(kind: str, name: str) -> bool:
    """Whether a provider has generated ``name`` already (it holds the name, or a plugin that declares ``overrides =
    True`` replaced it). False when the name is free, and when another plugin took it without declaring so: the
    provider then registers its own, which is refused naming both (a generated name is as reserved as a registered
    one, whichever came first)."""
    _check_kind(kind)
    key = name.strip().lower()
    held, replaced = _REGISTRY[kind].get(key), _OVERRIDDEN.get((kind, key))
    return bool(held and held.family) or bool(held and replaced and replaced.family)


def _same_plugin(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are one plugin: the same object, or the same definition (module and qualified
    name) imported afresh."""
    return a is b or (getattr(a, "__module__", None), getattr(a, "__qualname__", None)) == \
        (getattr(b, "__module__", object()), getattr(b, "__qualname__", object()))


def _declares_override(obj: Any) -> bool:
    """``overrides = True`` set on ``obj`` itself (a subclass of an overriding plugin does not inherit it)."""
    return vars(obj).get("overrides") is True if hasattr(obj, "__dict__") else False


def overrides() -> list[dict[str, str]]:
    """Every plugin that replaces another of the same name on purpose (``overrides = True``): kind, name, the
    replacing plugin's source and the replaced one's, with the family when a provider generates it (``run.json``'s
    ``plugin_overrides``)."""
    return [{"kind": kind, "name": key, "plugin": _REGISTRY[kind][key].origin,
             "replaces": f"{replaced.origin}, which generates {replaced.family}" if replaced.family else replaced.origin}
            for (kind, key), replaced in sorted(_OVERRIDDEN.items()) if key in _REGISTRY[kind]]


def failures() -> list[Failure]:
    """The entry points that failed to load in this process."""
    return list(_FAILED)


def failure_message() -> str:
    """One line naming each plugin package that failed to load and why (empty when none did)."""
    rows = dict.fromkeys((f.package, f.reason) for f in _FAILED)
    return "; ".join(f"plugin package {pkg} failed to load: {reason}" for pkg, reason in rows)


def unregister(kind: str, name: str) -> None:
    """Remove ``name`` from the registry of ``kind`` (plugins registered for a test or a session)."""
    _check_kind(kind)
    _REGISTRY[kind].pop(name.strip().lower(), None)
    _OVERRIDDEN.pop((kind, name.strip().lower()), None)


def discover(kind: str) -> None:
    """Load every entry point of every group ``advopenood.<kind>`` once (a module named in one group may register
    plugins of another kind: the detectors' module registers the ``smoothed`` evaluator, so a fresh process that
    looks up only the evaluators must load it too). A broken plugin warns and is remembered (:func:`failures`);
    the others go on."""
    _check_kind(kind)
    for group in KINDS:
        _discover_group(group)


def _discover_group(kind: str) -> None:
    """Load the entry points of group ``advopenood.<kind>`` once."""
    if kind in _DISCOVERED:
        return
    _DISCOVERED.add(kind)
    installed = entry_points()  # every group's, so that a message names a package's distribution before it loads
    _DISTS.update({ep.module.split(".")[0]: f"{ep.dist.name}=={ep.dist.version}" for group in KINDS
                   for ep in installed.select(group=GROUP_PREFIX + group) if ep.dist})
    for ep in entry_points(group=GROUP_PREFIX + kind):
        try:
            obj = ep.load()
            if not isinstance(obj, ModuleType):
                register(kind, ep.name)(obj)
        except UsageError:  # a name registered twice: no registry is right, whichever loaded first
            _DISCOVERED.discard(kind)  # so every later look-up says so again
            raise
        except Exception as exc:  # a third-party plugin must not break the others
            reason = " ".join(f"{type(exc).__name__}: {exc}".split())
            failure = Failure(kind, f"{ep.name} = {ep.value}", ep.dist.name if ep.dist else ep.module, reason)
            if failure not in _FAILED:  # a group loads again after a duplicate was refused
                _FAILED.append(failure)
            warnings.warn(f"advopenood: could not load plugin {ep.name!r} ({ep.value}): {exc}", stacklevel=2)


# --------------------------------------------------------------------------------------------------- index
# ``advopenood --help`` and ``advopenood list`` answer from an index of the installed plugins instead of importing
# them (which imports torch): names, descriptions, sources and the analyses' subcommands, stored beside the cache
# and rebuilt whenever the entry points or any file they name changed.

INDEX_VERSION = 4


def _index_path() -> Any:
    import os
    from pathlib import Path

    return Path(os.environ.get("ADVOPENOOD_CACHE") or "~/.cache/advopenood").expanduser() / "registry-index.json"


def _fingerprint() -> str:
    """Every entry point of the four groups and the size and modification time of every module file in the folders
    of the modules they name (their packages' and the sibling modules they import), read without importing them."""
    import hashlib
    import os
    from pathlib import Path

    from advopenood import __version__

    parts = [f"v{INDEX_VERSION}", __version__]
    folders: set[str] = set()
    for kind in KINDS:
        for ep in sorted(entry_points(group=GROUP_PREFIX + kind), key=lambda e: e.name):
            parts.append(f"{kind}:{ep.name}={ep.value}")
            folders |= {os.path.dirname(f) for f in _module_files(ep.value.split(":")[0])}
    # every module beside the ones the entry points name: they import siblings that register plugins too
    for origin in sorted(str(f) for folder in folders for f in Path(folder).glob("*.py")):
        try:
            st = os.stat(origin)
            parts.append(f"{origin}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            parts.append(f"{origin}:missing")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _module_files(module: str) -> list[str]:
    """The source files of a dotted module and of its packages, found without importing any of them (a
    package's ``__init__`` may import torch)."""
    import importlib.util
    import os

    head, *rest = module.split(".")
    try:
        spec = importlib.util.find_spec(head)  # a top-level name: located, not imported
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    files = [spec.origin] if spec.origin and os.path.isfile(spec.origin) else []
    folders = list(spec.submodule_search_locations or [])
    for part in rest:
        found = None
        for folder in folders:
            for candidate in (os.path.join(folder, part, "__init__.py"), os.path.join(folder, part + ".py")):
                if os.path.isfile(candidate):
                    found = candidate
                    break
            if found:
                break
        if found is None:
            return files
        files.append(found)
        folders = [os.path.dirname(found)] if found.endswith("__init__.py") else []
    return files


def build_index() -> dict[str, Any]:
    """Import every plugin (entry points and providers) and describe it: ``{kind: {name: [description,
    source]}}`` and ``commands: {command: help}`` of the analyses that declare one."""
    from advopenood.capabilities import CommandAnalysis

    out: dict[str, Any] = {kind: {n: [e.description, e.source] for n, e in entries(kind).items()} for kind in KINDS}
    out["commands"] = {obj.command: obj.command_help for obj in (e.obj for e in entries("analyses").values())
                       if isinstance(obj, type) and issubclass(obj, CommandAnalysis) and obj.command}
    out["failed"] = failure_message()
    return out


def index(store: bool = True) -> dict[str, Any]:
    """The plugin index, read from its file when it matches the installed plugins, else built (and stored when
    ``store`` and every entry point loaded; ``failed``: :func:`failure_message`). In a process that has already
    loaded or registered plugins, it is built from them (no file involved)."""
    import json

    if _DISCOVERED or any(_REGISTRY.values()):
        return build_index()
    path, fingerprint = _index_path(), _fingerprint()
    try:
        stored = json.loads(path.read_text())
        if stored.get("fingerprint") == fingerprint:
            return stored["index"]
    except (OSError, ValueError, KeyError, AttributeError):
        pass
    built = build_index()
    if not store or built["failed"]:  # a failure may go away without any file changing (a dependency installed)
        return built
    try:
        from advopenood.io import write_text

        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, json.dumps({"fingerprint": fingerprint, "index": built}, sort_keys=True))
    except OSError:  # a read-only home: the index is rebuilt next time
        pass
    return built


def provide(kind: str, provider: Callable[[], None] | None = None) -> Any:
    """Add a *provider* of ``kind``: a callable that registers generated plugins (e.g. one attack per registered
    detector). Every look-up of ``kind`` runs the providers after entry-point discovery, so generated plugins
    follow whatever is registered by then, a third party's plugins and ones registered at run time included."""
    _check_kind(kind)
    if provider is None:  # used as a decorator
        return lambda fn: provide(kind, fn)
    _PROVIDERS[kind].append(provider)
    return provider


def registered(kind: str, name: str) -> bool:
    """Whether ``name`` is registered under ``kind`` now (no discovery, no providers: for providers themselves)."""
    _check_kind(kind)
    return name.strip().lower() in _REGISTRY[kind]


def entries(kind: str) -> dict[str, Entry]:
    """All plugins of ``kind`` by name, after entry-point discovery and the kind's providers."""
    discover(kind)
    if kind not in _PROVIDING:
        _PROVIDING.add(kind)
        try:
            # by position in the live list: a provider may import a module that adds another provider of ``kind``
            # (the adaptive attacks look up the detectors, whose discovery imports smoothed.py and its EOT
            # provider); a copy of the list would skip it on this look-up and serve it only on the next one
            done = 0
            while done < len(_PROVIDERS[kind]):
                done += 1
                _PROVIDERS[kind][done - 1]()
        finally:
            _PROVIDING.discard(kind)
    return dict(sorted(_REGISTRY[kind].items()))


def names(kind: str) -> list[str]:
    """Registered names of ``kind``, sorted."""
    return list(entries(kind))


def get(kind: str, name: str) -> Any:
    """The plugin object ``name`` of ``kind``; a UsageError lists the valid names otherwise."""
    table = entries(kind)
    key = name.strip().lower()
    if key not in table and _FAILED:  # it may be one of the failed package's plugins: say why, not "unknown"
        named = [f.package for f in _FAILED if f.kind == kind and f.entry.split(" = ")[0].lower() == key]
        what = f"{_singular(kind)} {name!r} is " + (f"an entry point of {named[0]}" if named else
                                                     "not among the plugins that loaded")
        raise UsageError(f"{failure_message()} ({what})")
    if key not in table:
        close = difflib.get_close_matches(key, list(table), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ";"
        listed = choice_list(list(table), f"advopenood list {kind}") or "(none installed)"
        raise UsageError(f"unknown {_singular(kind)} {name!r}{hint} valid choices: {listed}")
    return table[key].obj


def parse_names(kind: str, spec: str | list[str] | None, default: list[str] | None = None) -> list[str]:
    """Split a comma-separated selection (``all`` selects every plugin except the generated ones,
    :class:`~advopenood.capabilities.Derived`) and validate each name."""
    if spec is None:
        return list(default or [])
    items = spec if isinstance(spec, list) else [s for s in spec.split(",") if s.strip()]
    if len(items) == 1 and str(items[0]).strip().lower() == "all":  # every plugin but the derived ones
        table = entries(kind)
        if _FAILED:  # "all" would silently lack the failed package's plugins
            raise UsageError(f"{failure_message()} (so '{kind}: all' cannot select all of them)")
        return [n for n, e in table.items() if not is_derived(e.obj)]
    out = []
    for item in items:
        get(kind, str(item))
        out.append(str(item).strip().lower())
    return out


def _singular(kind: str) -> str:
    return kind[:-1] if kind != "analyses" else "analysis"


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


def create(kind: str, name: str, **params: Any) -> Any:
    """The one factory: build the plugin ``name`` of ``kind`` with ``params``. Parameters are declared in one place
    per plugin: the constructor's signature (checked here), or, for a constructor taking ``**params``, the mapping
    the plugin's base class checks (attacks: ``defaults``; detectors: ``default_params``). An unknown or ill-typed
    parameter is a one-line UsageError naming the valid ones, raised before the plugin runs any code."""
    obj = get(kind, name)
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):  # a builtin or extension object: let it check its own arguments
        return obj(**params)
    fields = signature.parameters.values()
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in fields):
        declared = {p.name: (None if p.default is inspect.Parameter.empty else p.default) for p in fields
                    if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
        check_params(_singular(kind), name.strip().lower(), params, declared)
    try:
        return obj(**params)
    except UsageError:
        raise
    except (TypeError, ValueError) as exc:  # a constructor's own conversion of a bad value, e.g. int("ten")
        raise UsageError(f"bad parameters for {_singular(kind)} {name!r}: {exc}") from None


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
