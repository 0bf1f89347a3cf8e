"""The configs shipped inside the package (``configs/``, installed as ``advopenood.configs``), listed without
importing anything heavy (the CLI's help names them)."""
from __future__ import annotations

from importlib import resources


def packaged_configs() -> list[str]:
    """Names of the configs shipped inside the package (``advopenood.configs``)."""
    return sorted(p.name[:-5] for p in resources.files("advopenood.configs").iterdir() if p.name.endswith(".yaml"))
