"""The plugin index: ``advopenood --help`` and ``advopenood list`` answer from an index of the installed plugins
instead of importing them (which imports torch): every registered name with its description and source, the families
(what each takes and wraps, and the registered names it refuses), and the analyses' subcommands, stored beside the
cache and rebuilt whenever the entry points or any file they name changed. It stores families, not their members: a
generated name is checked by parsing it (:func:`advopenood.plugin_names.parse_chain`)."""
from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from advopenood import registry
from advopenood.registry import GROUP_PREFIX, KINDS


INDEX_VERSION = 7


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
    """Import every plugin (entry points, families, providers) and describe it: ``{kind: {name: [description,
    source, ""]}}`` for every registered name (the third field, a member's family, is kept empty for readers of
    earlier indexes), ``families: {kind: {pattern: [description, source, hint, shorthand, takes, wraps, refuses]}}``
    (``refuses``: the registered names of ``takes`` whose member its ``accepts`` refuses), ``commands: {command:
    help}`` of the analyses that declare one and ``clashes: {kind: {name or pattern: line}}``
    (:func:`advopenood.registry.clashes`: the names that do not resolve because of a clash)."""
    from advopenood.capabilities import CommandAnalysis

    reg = registry.default()
    held = {kind: reg.registered_entries(kind) for kind in KINDS}
    out: dict[str, Any] = {kind: {n: [e.description, e.source, ""] for n, e in held[kind].items()} for kind in KINDS}
    out["families"] = {kind: {p: [f.description, f.source, f.hint, f.shorthand, f.takes, f.wraps,
                                  sorted(n for n, e in held[f.takes].items() if not f.accepts(e.obj))]
                              for p, f in registry.families(kind).items()} for kind in KINDS}
    out["commands"] = {obj.command: obj.command_help for obj in (e.obj for e in held["analyses"].values())
                       if isinstance(obj, type) and issubclass(obj, CommandAnalysis) and obj.command}
    out["failed"] = registry.failure_message()
    out["clashes"] = registry.clashes()
    return out


def index(store: bool = True) -> dict[str, Any]:
    """The plugin index, read from its file when it matches the installed plugins, else built (and stored when
    ``store`` and every entry point loaded; ``failed``: :func:`advopenood.registry.failure_message`). In a process
    that has already loaded or registered plugins, it is built from them (no file involved)."""
    import json

    if registry.default().discovered or any(registry.default().table.values()):
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


