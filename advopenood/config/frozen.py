"""Run configuration: a typed schema (pydantic) over YAML files and CLI overrides.

Every key at every level is declared in :class:`RunConfig`; an unknown key, a wrong type or an out-of-range
value is refused with one line naming its full path, the closest valid key or the valid choices, and its
YAML line and column. The validated config is a read-only mapping (:class:`Config`): the rest of the code
reads it and never mutates it, and ``run.json`` records it in full. Plugin parameters
(``attack_params.<name>`` and the like) are checked by constructing the plugins (:mod:`advopenood.run.preflight`).
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any




# --- the validated, read-only config -------------------------------------------------------------------------


def freeze(value: Any) -> Any:
    """Mappings -> :class:`Frozen`, lists -> tuples, recursively."""
    if isinstance(value, Mapping):
        return Frozen(value)
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """The inverse of :func:`freeze`: plain dicts and lists (for JSON, YAML and overrides)."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(v) for v in value]
    return value


class Frozen(Mapping):
    """A read-only mapping; nested mappings and sequences are read-only too."""

    def __init__(self, data: Mapping[str, Any] = ()):
        self._data = {k: freeze(v) for k, v in dict(data).items()}

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"Frozen({self._data!r})"


class Config(Frozen):
    """A validated run config, read-only. ``source`` names the YAML it came from; ``folder`` is that file's folder."""

    def __init__(self, data: Mapping[str, Any], source: str = "", folder: Path | None = None,
                 positions: Mapping[tuple, tuple[int, int]] | None = None):
        super().__init__(data)
        self.source, self.folder, self.positions = source, folder, dict(positions or {})
