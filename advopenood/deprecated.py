"""The compatibility table: every path of an earlier version that still works, where it went and the version that
removes it (:data:`TABLE`, rendered in ``CHANGELOG.md`` under *Deprecated*).

When the core moved into packages by stage, flat modules such as ``advopenood.protocols`` moved (to
``advopenood.config.protocols``), and modules that became packages (``advopenood.config``, ``advopenood.data``,
...) kept only their docstring. A plugin written against an old path still loads: an old module imports (a
``"module"`` row), a package that was a module hands out the names it held (a ``"names"`` row: its
``__getattr__`` calls :func:`forward`), and a renamed function warns itself (a ``"function"`` row). Reading an old
name gives exactly one ``DeprecationWarning``, which names the new path (``advopenood.plugin.<name>`` where the
public plugin module has it) and the version that removes the old one. New code imports from
:mod:`advopenood.plugin`.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import inspect
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

#: the version that removes every path of :data:`TABLE` (the next minor version after 0.2.0, the first release)
REMOVED_IN = "0.3.0"
#: the public plugin module, the first place a warning points to
PUBLIC = "advopenood.plugin"


@dataclass(frozen=True)
class Moved:
    """One row of the compatibility table: ``old`` works until ``removed_in``; its names are in ``new`` now
    (searched in order). ``kind``: ``"module"``, an old module that imports as a re-export; ``"names"``, a
    package (once a module) that hands out the names it held; ``"function"``, a function that warns itself."""

    old: str
    new: tuple[str, ...]
    kind: Literal["module", "names", "function"] = "module"
    removed_in: str = REMOVED_IN


def _rows(kind: Literal["module", "names", "function"], moves: dict[str, tuple[str, ...]]) -> dict[str, Moved]:
    return {old: Moved(old, new, kind) for old, new in moves.items()}


#: old path -> its row; the built-in plugins' package adds its own rows (:func:`add`)
TABLE: dict[str, Moved] = {
    **_rows("module", {
        "advopenood.protocols": ("advopenood.config.protocols",),
        "advopenood.metrics": ("advopenood.evaluation.metrics",),
        "advopenood.report": ("advopenood.outputs.report",),
        "advopenood.plots": ("advopenood.outputs.plots",),
        "advopenood.store": ("advopenood.attacks.store", "advopenood.provenance"),
        "advopenood.verify": ("advopenood.evaluation.verify",),
        "advopenood.training": ("advopenood.models.training",),
        "advopenood.demo": ("advopenood.models.demo",),
        "advopenood.openood_benchmarks": ("advopenood.data.benchmarks",),
        "advopenood.scorecache": ("advopenood.detection.scorecache",),
        "advopenood.pipeline": ("advopenood.run.pipeline", "advopenood.run.prepare", "advopenood.run.attack",
                                "advopenood.run.detect", "advopenood.run.evaluate", "advopenood.run.report",
                                "advopenood.run.preflight", "advopenood.config.plan"),
        "advopenood.preflight": ("advopenood.run.preflight",),
        "advopenood.export": ("advopenood.run.export",),
        "advopenood.openood_bridge": ("advopenood.cli.openood_evaluator", "advopenood.cli.eval_ood"),
    }),
    **_rows("names", {
        "advopenood.config": ("advopenood.config.schema", "advopenood.config.loading", "advopenood.config.plan",
                              "advopenood.config.packaged", "advopenood.data.specs", "advopenood.models.specs"),
        "advopenood.data": ("advopenood.data.datasets",),
        "advopenood.models": ("advopenood.models.classifier", "advopenood.models.backbones"),
        "advopenood.detectors": ("advopenood.detection.outputs", "advopenood.detection.postprocessor",
                                 "advopenood.detection.bank", "advopenood.detection.scoring",
                                 "advopenood.detection.openood_backend"),
        "advopenood.outputs": ("advopenood.outputs.results",),
        "advopenood.cli": ("advopenood.cli.main", "advopenood.cli.parsing"),
    }),
    **_rows("function", {"advopenood.io.staging_dir": ("advopenood.io.staging_dirs",)}),
}


def message(old: str, new: str) -> str:
    """The one warning of reading ``old`` (a row of :data:`TABLE`, or a name under one) that ``new`` replaces."""
    row = TABLE[old] if old in TABLE else TABLE[old.rpartition(".")[0]]
    return f"{old} is deprecated, use {new}; {old} is removed in advopenood {row.removed_in}"


def new_path(target: str, name: str, obj: Any) -> str:
    """Where a plugin reads ``obj`` (``name`` of module ``target``) now: ``advopenood.plugin.<name>`` where the
    public plugin module has it (under its own name, or a class or function under another), else
    ``<target>.<name>``."""
    public = importlib.import_module(PUBLIC)
    if getattr(public, name, None) is obj:
        return f"{PUBLIC}.{name}"
    if inspect.isclass(obj) or inspect.isroutine(obj):
        for alias in public.__all__:
            if getattr(public, alias) is obj:
                return f"{PUBLIC}.{alias}"
    return f"{target}.{name}"


def _by_import_machinery() -> bool:
    """Whether the ``__getattr__`` that called :func:`forward` was reached from ``from <package> import <name>``'s
    first look (importlib's ``_handle_fromlist``), which the statement follows with the read that warns."""
    return sys._getframe(3).f_code.co_name == "_handle_fromlist"


def forward(module_name: str, name: str) -> Any:
    """``name`` as the old path ``module_name`` held it, from the module that holds it now, with one warning (an
    old module's or a package's ``__getattr__``); an AttributeError when none does, or when ``name`` is a dunder or
    one of the package's submodules."""
    module = sys.modules[module_name]
    file = module.__dict__.get("__file__") or ""
    folder = Path(file).parent if file.endswith("__init__.py") else None
    if not name.startswith("__") and not (folder and ((folder / f"{name}.py").is_file() or (folder / name).is_dir())):
        for target in TABLE[module_name].new:
            held = importlib.import_module(target)
            if hasattr(held, name):
                obj = getattr(held, name)
                if not _by_import_machinery():
                    warnings.warn(message(f"{module_name}.{name}", new_path(target, name, obj)), DeprecationWarning,
                                  stacklevel=3)
                return obj
    raise AttributeError(f"module {module_name!r} has no attribute {name!r}")


def _star(module: ModuleType) -> list[str]:
    """``from <old module> import *``: one warning for the module, and every public name of the modules that
    replace it copied in (the first module's names win), so that the names read next do not warn again."""
    targets = TABLE[module.__name__].new
    names: dict[str, Any] = {}
    for target in reversed(targets):
        names.update({k: v for k, v in vars(importlib.import_module(target)).items()
                      if not k.startswith("_") and not isinstance(v, ModuleType)})
    warnings.warn(message(module.__name__, f"{PUBLIC} (the names a plugin needs) or {' and '.join(targets)}"),
                  DeprecationWarning, stacklevel=3)
    module.__dict__.update(names)
    return sorted(names)


class _Loader(importlib.abc.Loader):
    """Makes an old module of a ``"module"`` row: each name read from it comes from the modules that replace it,
    with one warning the first time (:func:`forward`); ``from <old> import *`` warns once (:func:`_star`)."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        module.__doc__ = f"Deprecated: moved to {', '.join(TABLE[module.__name__].new)}; import from {PUBLIC}."

        def __getattr__(name: str) -> Any:
            if name == "__all__":
                return _star(module)
            module.__dict__[name] = forward(module.__name__, name)  # read once, warned once
            return module.__dict__[name]

        module.__getattr__ = __getattr__  # type: ignore[method-assign]


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the old modules of the ``"module"`` rows."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        row = TABLE.get(fullname)
        return importlib.machinery.ModuleSpec(fullname, _Loader()) if row and row.kind == "module" else None


def add(moved: dict[str, tuple[str, ...]], former: dict[str, tuple[str, ...]] | None = None) -> None:
    """Add a plugin package's former paths to :data:`TABLE` (its ``__init__`` calls it): ``moved``, old module ->
    the modules that hold its names now (``"module"`` rows); ``former``, a package that was a module -> the same
    (``"names"`` rows; the package defines ``__getattr__`` with :func:`forward`)."""
    TABLE.update(_rows("module", moved))
    TABLE.update(_rows("names", former or {}))
    install()


def install() -> None:
    """Make the old module paths importable (once per process; :mod:`advopenood` calls it)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.append(_Finder())
