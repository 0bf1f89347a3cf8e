"""Provenance: what a stored result depends on, as keys and seeds.

Content-addressed keys (:func:`canonical_key`), the library versions written into every key and result, the
code identity of a plugin (its source files and distribution version), per-shard seeds and a seeded block that
leaves the caller's generators untouched.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Iterator

import torch


def library_versions() -> dict[str, str]:
    """Versions that change attack results; written into every key and every result."""
    import foolbox
    import numpy
    import torchvision

    import advopenood

    return {"advopenood": advopenood.__version__, "torch": torch.__version__, "torchvision": torchvision.__version__,
            "foolbox": foolbox.__version__, "numpy": numpy.__version__}



def source_sha(obj: Any) -> str:
    """SHA-256 of the file that defines ``obj`` (its class for an instance); ``""`` when there is none."""
    target = obj if inspect.isclass(obj) or inspect.ismodule(obj) else type(obj)
    try:
        path = inspect.getsourcefile(target)
    except TypeError:
        return ""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else ""



def distribution_version(obj: Any) -> str:
    """``name==version`` of the installed distribution that ships ``obj``'s module; ``""`` when none does
    (a module on ``sys.path`` only)."""
    from importlib import metadata

    module = (obj if inspect.isclass(obj) else type(obj)).__module__.split(".")[0]
    names = _distributions().get(module) or []
    for name in names:
        try:
            return f"{name}=={metadata.version(name)}"
        except metadata.PackageNotFoundError:
            continue
    return ""



def ships_with_core(obj: Any) -> bool:
    """Whether ``obj``'s module (its class's for an instance) comes from the installed distribution that ships
    ``advopenood`` itself, i.e. is a built-in plugin: read off the installed metadata, not off a module name (a
    third party's ``advopenood_plugins_x`` is not built in)."""
    module = (obj if inspect.isclass(obj) else type(obj)).__module__.split(".")[0]
    dists = _distributions()
    return bool(set(dists.get(module) or ()) & set(dists.get("advopenood") or ()))


@functools.lru_cache(maxsize=1)
def _distributions() -> dict[str, list[str]]:
    """Top-level module -> the distributions that ship it (one scan of the installed metadata per process)."""
    from importlib import metadata

    return dict(metadata.packages_distributions())



def code_identity(cls: type) -> dict[str, Any]:
    """What an attack's results depend on besides its parameters: the SHA-256 of every file defining a class of
    its MRO (its own module, the base classes it inherits behaviour from; builtins have none) and the version of
    the distribution that ships it. Part of the attack key, so editing ``perturb`` recomputes the sets."""
    files = []
    for klass in cls.__mro__:
        sha = source_sha(klass)
        if sha and sha not in files:
            files.append(sha)
    return {"files": files, "distribution": distribution_version(cls)}



def canonical_key(spec: dict[str, Any]) -> str:
    """SHA-256 of the spec as canonical JSON (sorted keys, no whitespace)."""
    blob = json.dumps(spec, sort_keys=True, separators=(",", ":"),
                      default=lambda o: dict(o) if isinstance(o, Mapping) else str(o))
    return hashlib.sha256(blob.encode()).hexdigest()



def derive_seed(seed: int, shard: int) -> int:
    """Per-shard seed, independent of which process or run generates the shard."""
    return int(hashlib.sha256(f"{seed}:{shard}".encode()).hexdigest()[:15], 16)



@contextlib.contextmanager
def seeded(seed: int, device: torch.device | None = None) -> Iterator[None]:
    """Seed Python's and torch's generators (and a CUDA ``device``'s) for the block, without disturbing the
    caller's state: what the block draws depends on ``seed`` alone, and the caller's generators resume after."""
    state = random.getstate()
    random.seed(seed)
    try:
        with torch.random.fork_rng(devices=[device] if device is not None and device.type == "cuda" else []):
            torch.manual_seed(seed)
            yield
    finally:
        random.setstate(state)
