"""The checks a run's flags pass before torch or any plugin loads, so that a bad value is refused at once (one line,
exit 2): the budgets of ``--eps``, the interval flags, and the plugin names of ``--attack``, ``--detectors``,
``--evaluator`` and ``--analysis`` against the plugin index (:func:`advopenood.plugin_index.index`: names read from its
stored file, generated families included, no import), then the config file's keys and values with the flags applied
and the preflight's checks that read no file (:func:`check_plan`). Plugin parameters, the files' contents and the
checkpoint are checked as before, by the plan and the preflight, before any work."""
from __future__ import annotations

import argparse
from typing import Any

from advopenood import plugin_index, registry
from advopenood.errors import UsageError, choice_message
from advopenood.plugin_names import _singular, parse_chain
from advopenood.flags import CI_METHODS, MAX_RESAMPLES, MIN_RESAMPLES, parse_eps, too_few_resamples

#: flag (argparse dest) -> the plugin kind its comma-separated names select
NAME_FLAGS = {"attack": "attacks", "detectors": "detectors", "evaluator": "evaluators", "analysis": "analyses"}


def check_values(args: argparse.Namespace) -> None:
    """``--eps`` (each budget a number or a fraction), ``--ci`` (a method) and ``--ci-resamples`` (1 to
    :data:`advopenood.flags.MAX_RESAMPLES`, at least :data:`~advopenood.flags.MIN_RESAMPLES` under ``--ci
    bootstrap``; the config's method is not known here, the plan checks the rest); a UsageError names the first bad one."""
    eps = getattr(args, "eps", None)
    if eps is not None:
        for value in str(eps).split(","):
            if value.strip() and parse_eps(value) <= 0:
                raise UsageError(f"--eps {value.strip()} is out of range; valid choices: eps > 0 (at most 1 for an "
                                 "linf attack: images are in [0, 1], e.g. 8/255 = 0.0314)")
    ci = getattr(args, "ci", None)
    if ci is not None and ci not in CI_METHODS:
        raise UsageError(f"ci.method (--ci) {ci!r} is not an interval method; valid choices: {', '.join(CI_METHODS)}")
    resamples = getattr(args, "ci_resamples", None)
    if resamples is not None and not 1 <= resamples <= MAX_RESAMPLES:
        raise UsageError(f"ci.resamples (--ci-resamples) {resamples} is out of range; valid choices: an integer from "
                         f"{MIN_RESAMPLES} to {MAX_RESAMPLES} (any up to {MAX_RESAMPLES} under --ci delong or none, "
                         "where it has no effect)")
    if resamples is not None and resamples < MIN_RESAMPLES and ci == "bootstrap":  # else the config's method decides
        raise UsageError(f"ci.resamples: {too_few_resamples(resamples)}")


def index_grammar(listing: dict) -> dict[str, dict[str, tuple[str, str, str]]]:
    """The families of the plugin index as :func:`~advopenood.plugin_names.parse_chain` reads them: kind -> prefix
    -> (the kind it takes, its pattern, what it wraps)."""
    return {kind: {pattern.split("<")[0]: (row[4], pattern, row[5])
                   for pattern, row in listing["families"][kind].items()} for kind in registry.KINDS}


def check_names(args: argparse.Namespace) -> None:
    """Every name of the plugin flags parses by the grammar (:data:`~advopenood.plugin_names.GRAMMAR`) to a
    registered plugin of the plugin index, each family over a registered plugin it accepts (case-sensitive; ``all``
    selects every detector); whether a family accepts another family's member is left to the full look-up, as is
    anything with a failed plugin package or a clash (the index is incomplete then: the full check after loading
    names the failure or the clash instead). A name a clash makes unusable is refused with the clash's line."""
    listing = plugin_index.index(store=False)
    if listing.get("failed"):
        return
    clashes = listing.get("clashes") or {}
    families = index_grammar(listing)
    registered = lambda k, n: n in listing[k]  # noqa: E731
    for flag, kind in NAME_FLAGS.items():
        value = getattr(args, flag, None)
        if value is None:
            continue
        names = [n.strip() for n in str(value).split(",") if n.strip()]
        if names == ["all"]:
            continue
        for name in names:
            parsed = parse_chain(kind, name, families, registered)
            if name in clashes.get(kind, {}):
                raise UsageError(clashes[kind][name])
            if (parsed is None or _refused(listing, families, *parsed)) and not any(clashes.values()):
                raise UsageError(choice_message(_singular(kind), name, suggestions(listing, kind),
                                                f"advopenood list {kind}"))


def _refused(listing: dict, families: dict, chain: list[tuple[str, str]], _: str, base: str) -> bool:
    """Whether the innermost family of ``chain`` refuses its registered ``base`` (the index's ``refuses``)."""
    if not chain:
        return False
    kind, prefix = chain[-1]
    return base in listing["families"][kind][families[kind][prefix][1]][6]


def suggestions(listing: dict, kind: str) -> list[str]:
    """The names a message suggests from: the registered ones and each family's prefix before each registered
    name it accepts (made here, for the message only; a name is validated by parsing)."""
    out = set(listing[kind])
    for pattern, row in listing["families"][kind].items():
        out |= {pattern.split("<")[0] + base for base in listing[row[4]] if base not in row[6]}
    return sorted(out)


def check_plan(args: argparse.Namespace, flags: dict[str, Any], benchmark: Any = None) -> None:
    """The config with the flags applied (``flags``: :func:`advopenood.config.loading.load_plan`'s keywords) as far
    as it is checked without a plugin (:func:`advopenood.config.loading.check_config`: the file, every key and
    value), then the preflight's checks that read no file (:func:`advopenood.run.preflight.precheck`: the output
    and cache folders, the data files and checkpoint present, a GPU driver for ``--device cuda``)."""
    from advopenood.config.loading import check_config
    from advopenood.run.preflight import precheck as preflight_precheck

    plan = check_config(args.config or "demo", benchmark, **flags)  # a benchmark run: the config it makes
    preflight_precheck(plan, overwrite=getattr(args, "overwrite", False))


def precheck(args: argparse.Namespace, flags: dict[str, Any] | None = None, benchmark: Any = None) -> None:
    """:func:`check_values`, :func:`check_names`, then with ``flags`` :func:`check_plan` (of the config
    ``benchmark`` makes, for ``run --benchmark``): what a run's flags and config must be, before anything heavy
    loads."""
    check_values(args)
    check_names(args)
    if flags is not None:
        check_plan(args, flags, benchmark)
