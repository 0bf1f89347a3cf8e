"""Every attack and detector name that resolved at 0.1 still resolves, to the same behaviour and parameters (issue
41, item 5: families resolved by name instead of generated classes). ``tests/data/names_0.1.json.gz`` was recorded from
the registry of commit 70120bb, before families, by ``python tests/test_registry_names.py --record``: per kind, every
name ``advopenood list <kind>`` printed, with what it resolves to (:func:`describe`)."""
from __future__ import annotations

import gzip
import inspect
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from advopenood import capabilities, registry

RECORD = Path(__file__).resolve().parent / "data" / "names_0.1.json.gz"
#: class attributes the generated plugins set and read (what they attack, which side, which family they shorten)
ATTRIBUTES = ("detector", "source", "side", "plain_attack", "base_name", "prefix", "method", "bounded", "norm",
              "threat", "hint", "smoothing", "component", "surrogate")
CAPABILITIES = sorted(n for n, c in vars(capabilities).items() if isinstance(c, type) and c.__module__ ==
                      capabilities.__name__ and n[0].isupper() and n not in ("DetectorNeeds",))


def _plain(value: Any) -> Any:
    """A JSON value of a class attribute or a default (tuples as lists, anything else as its repr)."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return repr(value)


def _params(obj: Any) -> Any:
    """The declared parameters and defaults: an attack's ``defaults`` at sides 32 and 224, a detector's
    ``default_params``, else the constructor's signature."""
    if isinstance(obj, type) and callable(getattr(obj, "defaults", None)) and hasattr(obj, "perturb"):
        try:
            return {str(size): _plain(obj.defaults(size)) for size in (32, 224)}
        except NotImplementedError:
            return None
    if isinstance(obj, type) and callable(getattr(obj, "default_params", None)):
        return _plain(obj.default_params())
    try:
        return sorted(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        return None


def _files(cls: type) -> list[str]:
    """The modules of the classes in the MRO whose source files an attack's store key hashes
    (:func:`advopenood.provenance.code_identity`), in order."""
    out: list[str] = []
    for klass in cls.__mro__:
        try:
            inspect.getsourcefile(klass)
        except TypeError:
            continue
        if klass.__module__ not in out:
            out.append(klass.__module__)
    return out


def describe(kind: str, name: str) -> dict[str, Any]:
    """What ``name`` of ``kind`` resolves to: class name and module, the MRO's class names, its capabilities, its
    declared parameters, the class attributes in :data:`ATTRIBUTES`, the list description and, for a class, the
    modules whose files its store key hashes."""
    entry = registry.entries(kind)[name]
    obj, description = entry.obj, entry.description
    out: dict[str, Any] = {"qualname": getattr(obj, "__qualname__", repr(obj)), "module": obj.__module__,
                           "description": description, "params": _params(obj)}
    if isinstance(obj, type):
        out["mro"] = [f"{k.__module__}.{k.__qualname__}" for k in obj.__mro__]
        out["capabilities"] = [c for c in CAPABILITIES if issubclass(obj, getattr(capabilities, c))]
        out["attributes"] = {a: _plain(getattr(obj, a)) for a in ATTRIBUTES + ("name",)
                             if hasattr(obj, a) and not isinstance(getattr(obj, a), property)}
        out["code"] = _files(obj)
    return out


def record() -> dict[str, Any]:
    return {kind: {name: describe(kind, name) for name in registry.names(kind)} for kind in registry.KINDS}


def recorded() -> dict[str, Any]:
    return json.loads(gzip.decompress(RECORD.read_bytes()))


@pytest.mark.parametrize("kind", registry.KINDS)
def test_every_name_that_resolved_at_0_1_resolves_to_the_same_plugin(kind):
    """Each recorded name resolves (``registry.get``) to a plugin of the same class name, module, bases,
    capabilities, parameters and defaults, attributes and description; and the names that resolve now are the
    recorded ones (none lost, none gained)."""
    before = recorded()[kind]
    lost = [name for name in before if not _resolves(kind, name)]
    assert lost == [], f"{len(lost)} {kind} no longer resolve, e.g. {lost[:5]}"
    changed = {name: (old, describe(kind, name)) for name, old in before.items() if describe(kind, name) != old}
    assert not changed, f"{len(changed)} {kind} resolve to something else, e.g. {next(iter(changed.items()))}"
    assert sorted(registry.names(kind)) == sorted(before)


def _resolves(kind: str, name: str) -> bool:
    try:
        registry.get(kind, name)
    except registry.UsageError:
        return False
    return True


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    RECORD.write_bytes(gzip.compress(json.dumps(record(), sort_keys=True, separators=(",", ":")).encode(), mtime=0))
