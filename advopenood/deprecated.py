"""The table of removed paths: every module path and name of an earlier version that a release removed, where its
names are now and the version that removed it (:data:`TABLE`, rendered in ``CHANGELOG.md`` under *Removed*).

0.2.0 deprecated the paths of the layout before the core's stage packages and 0.3.0 removed them, as 0.2.0's
table said: flat modules such as ``advopenood.protocols`` (a ``"module"`` row, now
``advopenood.config.protocols``), the names that modules turned packages held (a ``"names"`` row:
``from advopenood.data import stack``) and a renamed function (a ``"function"`` row). A removed path fails in one
line that names the new path (``advopenood.plugin.<name>`` where the public plugin module has the name) and the
version that removed it: importing a removed module raises :class:`ModuleNotFoundError` (:func:`install`), reading
a removed name an :class:`AttributeError`, or an :class:`ImportError` in ``from <module> import <name>``
(:func:`removed`, which a package's ``__getattr__`` raises). New code imports from :mod:`advopenood.plugin`.
"""
from __future__ import annotations

import ast
import dis
import importlib
import importlib.abc
import importlib.machinery
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

#: the version that removed every path of :data:`TABLE` (deprecated in 0.2.0, the first release)
REMOVED_IN = "0.3.0"
#: the public plugin module, the first place a message points to
PUBLIC = "advopenood.plugin"
#: the bytecode of ``from <module> import <name>``'s look-up of the name
_IMPORT_FROM = dis.opmap["IMPORT_FROM"]


@dataclass(frozen=True)
class Moved:
    """One row of the table: ``old`` was removed in ``removed_in``; its names are in ``new`` (searched in order).
    ``kind``: ``"module"``, a removed module; ``"names"``, a package (once a module) that no longer hands out the
    names it held; ``"function"``, a removed function."""

    old: str
    new: tuple[str, ...]
    kind: Literal["module", "names", "function"] = "module"
    removed_in: str = REMOVED_IN


def _rows(kind: Literal["module", "names", "function"], moves: dict[str, tuple[str, ...]]) -> dict[str, Moved]:
    return {old: Moved(old, new, kind) for old, new in moves.items()}


#: removed path -> its row; the built-in plugins' package adds its own rows (:func:`add`)
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
    """The one line of using ``old`` (a row of :data:`TABLE`, or a name under one), which ``new`` replaces."""
    row = TABLE[old] if old in TABLE else TABLE[old.rpartition(".")[0]]
    return f"{old} was removed in {row.removed_in}; use {new}"


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


def _defined(module: ModuleType) -> list[str]:
    """The public names that ``module``'s source defines at its top level (not those it imports), in order."""
    names: list[str] = []
    for node in ast.parse(Path(module.__file__ or "").read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [t.id for t in targets if isinstance(t, ast.Name)]
    return [n for n in dict.fromkeys(names) if not n.startswith("_") and hasattr(module, n)]


def _module_message(old: str) -> str:
    """The one line of importing the removed module ``old``: the names of its modules that the public plugin
    module has (``get_protocol for get`` where it has one under another name), and the modules for the rest."""
    row, public = TABLE[old], []
    for target in row.new:
        module = importlib.import_module(target)
        for name in _defined(module):
            path = new_path(target, name, getattr(module, name))
            alias = path.removeprefix(f"{PUBLIC}.")
            if alias != path and alias not in public and f"{alias} for {name}" not in public:
                public.append(alias if alias == name else f"{alias} for {name}")
    modules = ", ".join(row.new)
    where = f"{PUBLIC} ({', '.join(public)}; the rest is in {modules})" if public else modules
    return message(old, where)


def _submodule(package: str, name: str) -> bool:
    """Whether ``name`` is a module or package in the folder of ``package`` (importlib's look-up of a submodule
    reads the package's attribute first)."""
    file = sys.modules[package].__dict__.get("__file__") or ""
    folder = Path(file).parent
    return file.endswith("__init__.py") and ((folder / f"{name}.py").is_file() or (folder / name).is_dir())


def removed(module_name: str, name: str) -> AttributeError | ImportError:
    """The error of reading ``name`` from module ``module_name`` (its ``__getattr__`` raises it): where that is a
    removed path of :data:`TABLE` (a ``"function"`` row, or a name that a ``"names"`` row's package held), its one
    line (:func:`message`) naming the new path; else Python's own message. An ImportError when the read is
    ``from <module> import <name>``'s (that statement replaces an AttributeError's message with its own), else an
    AttributeError, so that ``hasattr`` stays False."""
    old, found = f"{module_name}.{name}", None
    row = TABLE.get(old) or TABLE.get(module_name)
    if row is not None and row.kind == "function" and row.old == old:
        found = message(old, row.new[0])
    elif row is not None and row.kind == "names" and not name.startswith("__") and not _submodule(module_name, name):
        for target in row.new:
            held = importlib.import_module(target)
            if hasattr(held, name):
                found = message(old, new_path(target, name, getattr(held, name)))
                break
    if found is None:
        return AttributeError(f"module {module_name!r} has no attribute {name!r}")
    caller = sys._getframe(1).f_back  # the code that read the name: removed() <- the module's __getattr__ <- it
    if caller is not None and caller.f_code.co_code[caller.f_lasti] == _IMPORT_FROM:
        return ImportError(found, name=module_name)
    return AttributeError(found)


class _Finder(importlib.abc.MetaPathFinder):
    """Fails the import of a removed module (a ``"module"`` row) in one line; last on :data:`sys.meta_path`, so
    it sees only what no other finder found."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        row = TABLE.get(fullname)
        if row is not None and row.kind == "module":
            raise ModuleNotFoundError(_module_message(fullname), name=fullname)
        return None


def add(moved: dict[str, tuple[str, ...]], former: dict[str, tuple[str, ...]] | None = None) -> None:
    """Add a plugin package's removed paths to :data:`TABLE` (its ``__init__`` calls it): ``moved``, a removed
    module -> the modules that hold its names now (``"module"`` rows); ``former``, a package that was a module ->
    the same (``"names"`` rows; the package's ``__getattr__`` raises :func:`removed`)."""
    TABLE.update(_rows("module", moved))
    TABLE.update(_rows("names", former or {}))
    install()


def install() -> None:
    """Make the import of a removed module fail naming its new path (once per process; :mod:`advopenood` calls
    it)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.append(_Finder())
