"""Module paths of earlier versions, kept working as re-exports that warn (``DeprecationWarning``).

When the core moved into packages by stage, flat modules such as ``advopenood.protocols`` moved (to
``advopenood.config.protocols``), and modules that became packages (``advopenood.config``, ``advopenood.data``,
...) kept only their docstring. A plugin written against an old path still loads: :data:`MOVED` makes each old
module importable as a re-export of the modules that hold its names now, and :data:`FORMER` lets a package that
was a module hand out the names it held (``from advopenood.data import stack``), each with a warning that names
the new place. New code imports from :mod:`advopenood.plugin`.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

#: old module -> the modules that hold its names now, searched in order
MOVED: dict[str, tuple[str, ...]] = {
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
}

#: a module that is now a package (or a shim) -> the modules that hold the names it held, searched in order
FORMER: dict[str, tuple[str, ...]] = {
    "advopenood.config": ("advopenood.config.schema", "advopenood.config.loading", "advopenood.config.plan",
                          "advopenood.config.packaged", "advopenood.data.specs", "advopenood.models.specs"),
    "advopenood.data": ("advopenood.data.datasets",),
    "advopenood.models": ("advopenood.models.classifier", "advopenood.models.backbones"),
    "advopenood.detectors": ("advopenood.detection.outputs", "advopenood.detection.postprocessor",
                             "advopenood.detection.bank", "advopenood.detection.scoring",
                             "advopenood.detection.openood_backend"),
    "advopenood.outputs": ("advopenood.outputs.results",),
    "advopenood.cli": ("advopenood.cli.main", "advopenood.cli.parsing"),
}


def _message(old: str, new: str) -> str:
    return f"{old} is deprecated, use {new} (every name a plugin needs is in advopenood.plugin)"


def forward(package: str, name: str) -> Any:
    """``name`` as ``package`` held it when it was a module, from the module that holds it now, with a warning
    (a package's ``__getattr__``); an AttributeError when none does, or when ``name`` is one of its submodules."""
    module = sys.modules[package]
    folder = Path(module.__file__ or "").parent if module.__file__ and module.__file__.endswith("__init__.py") else None
    if not name.startswith("__") and not (folder and ((folder / f"{name}.py").is_file() or (folder / name).is_dir())):
        for target in FORMER[package]:
            held = importlib.import_module(target)
            if hasattr(held, name):
                warnings.warn(_message(f"{package}.{name}", f"{target}.{name}"), DeprecationWarning, stacklevel=3)
                return getattr(held, name)
    raise AttributeError(f"module {package!r} has no attribute {name!r}")


class _Loader(importlib.abc.Loader):
    """Fills an old module with every name of the modules in :data:`MOVED` that replace it, and warns."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        targets = MOVED[module.__name__]
        for target in reversed(targets):  # the first module's names win
            module.__dict__.update({k: v for k, v in vars(importlib.import_module(target)).items()
                                    if not k.startswith("__")})
        module.__doc__ = f"Deprecated: moved to {', '.join(targets)}; import from advopenood.plugin."
        warnings.warn(_message(module.__name__, " and ".join(targets)), DeprecationWarning, stacklevel=2)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the old modules of :data:`MOVED`."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.machinery.ModuleSpec(fullname, _Loader()) if fullname in MOVED else None


def add(moved: dict[str, tuple[str, ...]], former: dict[str, tuple[str, ...]] | None = None) -> None:
    """Keep a plugin package's former module paths importable the same way (its ``__init__`` calls it): ``moved``
    as :data:`MOVED`, ``former`` as :data:`FORMER` (a package that was a module defines ``__getattr__`` with
    :func:`forward`)."""
    MOVED.update(moved)
    FORMER.update(former or {})
    install()


def install() -> None:
    """Make the old module paths importable (once per process; :mod:`advopenood` calls it)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.append(_Finder())
