"""Shared products: tables that more than one evaluator reads, declared by name, computed once per run by the core.

A product is a :class:`Product`: a name and the function that computes it from the run's context (what every
plugin may read). An evaluator (or analysis) that reads one declares it on its class, ``needs = (ROBUST_TABLE,
...)``, and is called as ``plugin(ctx, products)``; the evaluate stage (:func:`advopenood.run.evaluate.evaluate`)
holds one :class:`Products` per run, computes each declared product the first time a plugin needs it and hands
every later plugin that declares it the same result (each a copy of its own, :func:`copy.copy`: a DataFrame is
copied, so one reader's change never reaches the next). A plugin that declares nothing is called ``plugin(ctx)``,
as before. The products the built-ins share (the robust table, the natural sets' groups) are defined in
:mod:`advopenood.evaluation.shared` and public through :mod:`advopenood.plugin`, so that a third party's evaluator
reads them as a built-in does; the core names no plugin.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Generic, Iterable, TypeVar

if TYPE_CHECKING:
    from advopenood.evaluation.context import RunContext

T = TypeVar("T")


@dataclass(frozen=True)
class Product(Generic[T]):
    """A table (or any value) several plugins read: ``name`` (unique in a run) and ``compute(ctx)``."""

    name: str
    compute: Callable[[RunContext], T]
    doc: str = ""


def needs_of(plugin: Any) -> tuple[Product[Any], ...]:
    """The products a plugin declares (``needs`` on its class or instance); refuses an entry that is no
    :class:`Product`."""
    needs = tuple(getattr(plugin, "needs", ()) or ())
    bad = [n for n in needs if not isinstance(n, Product)]
    if bad:
        raise TypeError(f"{type(plugin).__name__}.needs holds {bad[0]!r}; each entry must be an "
                        "advopenood.plugin.Product")
    return needs


class Supplied:
    """What one plugin receives: the products it declared, read by the product (typed) or by its name."""

    def __init__(self, values: dict[str, Any]):
        self._values = values

    def __getitem__(self, product: Product[T] | str) -> T:
        name = product.name if isinstance(product, Product) else product
        if name not in self._values:
            raise KeyError(f"product {name!r} was not declared in the plugin's needs "
                           f"(declared: {', '.join(self._values) or 'none'})")
        return copy.copy(self._values[name])

    def __contains__(self, product: object) -> bool:
        return (product.name if isinstance(product, Product) else product) in self._values

    def names(self) -> tuple[str, ...]:
        """The names of the products handed over."""
        return tuple(self._values)


class Products:
    """The products of one run: each computed once, the first time a plugin declares it, and memoised on this
    object (the evaluate stage makes one per run). Two different products under one name are refused."""

    def __init__(self, ctx: RunContext):
        self._ctx = ctx
        self._made: dict[str, tuple[Product[Any], Any]] = {}

    def get(self, product: Product[T]) -> T:
        """The product's value for this run (computed on first use)."""
        made = self._made.get(product.name)
        if made is None:
            made = self._made[product.name] = (product, product.compute(self._ctx))
        elif made[0] != product:
            raise ValueError(f"two different products are named {product.name!r} "
                             f"({made[0].compute.__qualname__} and {product.compute.__qualname__})")
        return made[1]

    def supply(self, needs: Iterable[Product[Any]]) -> Supplied:
        """What a plugin that declares ``needs`` receives."""
        return Supplied({p.name: self.get(p) for p in needs})

    @property
    def computed(self) -> tuple[str, ...]:
        """The names of the products computed so far."""
        return tuple(self._made)


def supplied(ctx: RunContext, plugin: Any, products: Supplied | None) -> Supplied:
    """``products`` as handed by the run, or (a plugin called directly, ``plugin(ctx)``) its declared products
    computed for ``ctx`` alone."""
    return products if products is not None else Products(ctx).supply(needs_of(plugin))
