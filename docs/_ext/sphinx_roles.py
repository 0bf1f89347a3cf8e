"""A griffe extension for the API reference: the docstrings' Sphinx roles (``:class:`~pkg.Name```) as code spans.

mkdocstrings renders docstrings as Markdown, where a Sphinx role would show as literal text; ``:role:`target```
becomes ```target``` (``~`` keeps the last component, as Sphinx shows it). Loaded from ``mkdocs.yml``.
"""
from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):`(~?)([^`]+)`")


def plain(text: str) -> str:
    """``text`` with every Sphinx cross-reference role replaced by a code span of its target."""
    return ROLE.sub(lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}`", text)


class SphinxRoles(griffe.Extension):
    """Rewrite the roles of every docstring as griffe loads it."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain(obj.docstring.value)
