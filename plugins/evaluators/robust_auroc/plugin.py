"""The ``robust_auroc`` evaluator: a detector's AUROC when ID images are attacked to look OOD and OOD images to look ID.

Definitions (ATD, Azizmalayeri et al., NeurIPS 2022, ``test_ATD.py``: "just in attacked", "just out attacked",
"both attacked"; AROS, Mirzaei et al., ICLR 2025, ``aros_node/evaluate.py``: ``PGD_AUC`` on the mixed ID/OOD
loader, then ``get_auc_adversarial``), per detector, natural OOD set and eps, with OpenOOD's convention (OOD is
the positive class, the score is ``-conf``; :func:`advopenood.evaluation.metrics.auroc`):

* ``clean_auroc``: ``AUROC(conf(x_id), conf(x_ood))``;
* ``id_attacked_auroc``: ``AUROC(conf(x_id + d_id), conf(x_ood))``, ``d_id`` from ``robust_id_<det>`` (lowers the
  confidence of every ID test image);
* ``ood_attacked_auroc``: ``AUROC(conf(x_id), conf(x_ood + d_ood))``, ``d_ood`` from ``robust_ood_<det>`` (raises
  the confidence of every OOD image);
* ``robust_auroc``, ``robust_fpr95``: both sides attacked, ``AUROC`` / FPR95 of ``(conf(x_id + d_id),
  conf(x_ood + d_ood))``.

Every row of both sets counts (ATD and AROS attack and score every sample; the protocol's positives rule is about
ID->ID adversarial examples and does not apply). Because each attacked image keeps its clean self among its
candidates (:mod:`advopenood_plugins.attacks.robust`), ``robust_auroc <= min(id_attacked_auroc,
ood_attacked_auroc) <= clean_auroc`` as long as the run scores an image exactly as the attack did: always for a
deterministic detector; not necessarily for a randomised one
(:class:`~advopenood.capabilities.Randomised`, e.g. ``smoothed_<det>``), whose attack draws its noise from a stream
independent of the evaluation noise the run scores every set with, so that the attack cannot overfit to it.

Randomised detectors: the attacks' gradient is the EOT one by default (``attack_family`` ``eot``: the
``robust_*_eot_<det>`` attacks, gradient averaged over ``eot`` noise draws, default the detector's own number),
since the plain attacks' noise-free gradient ignores the noise (on ``smoothed_msp`` the EOT attacks are the
stronger: ``tests/test_robust_auroc.py``); ``randomised_attacks: plain`` runs the plain attacks
instead and ``both`` runs both (one row each). Every other detector's rows are ``plain``.

``--evaluator robust_auroc`` adds the sets it needs to the run (:class:`~advopenood.capabilities.RequiresAttacks`):
per selected detector with a differentiable score and per ``method`` (``pgd``: ``robust_id_<det>`` and
``robust_ood_<det>-<set>``; ``apgd``: ``robust_apgd_id_<det>`` and ``robust_apgd_ood_<det>-<set>``; their EOT
twins for a randomised detector, which take the plain attacks' ``attack_params``), one OOD-side set per natural
OOD set, at each Linf budget the config gives its attacks explicitly (``--eps``), else the attacks' default (8/255
at 32 px). Rows pair every ID-side and OOD-side set of the same detector, method, attack family and eps,
whichever way they entered the run.

More methods: ``apgd_aux`` (APGD on a second objective off the score's gradient path) and ``square`` (Square on the
score, gradient-free); ``ensemble: standard`` adds ``apgd``, ``apgd_aux`` and ``square`` (:data:`ENSEMBLES`).
Beside the single-attack rows, it writes the per-image worst case over every attack of a detector (``method``
``ensemble``) and ``robust_ensemble.csv`` (the robust AUROC after each attack added), computed once per run by
:mod:`advopenood_plugins.kit.ensemble` (the leaderboard's robust fields read the same rows), and
``masking_suspected`` (Square below every attack on the score's gradient,
:mod:`~advopenood_plugins.evaluators.robust_auroc.ensemble`).

Intervals: each metric ``m`` has ``m_lo`` / ``m_hi`` (95 %) by the run's ``ci`` plan, named in ``ci``
(:mod:`advopenood.evaluation.intervals`). The bootstrap is paired and stratified (:func:`robust_intervals`): one
draw of ID indices and one of OOD indices per row, seeded by the run seed and the row's key
``robust|<det>|<ID set>|<OOD set>``, each applied to the clean and the attacked array of its side, so an attacked
image moves with its clean twin and the five metrics share their resamples. ``delong`` gives each AUROC's analytic
interval and leaves FPR95's empty; ``error`` says why a row has none (fewer than 2 images a side, attacked sets not
the clean sets' size).
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from advopenood.plugin import (MAX_DRAWS, MAX_QUERIES, Headline, RequiresAttacks, Results, RunContext, Supplied,
                               UsageError, Verifiable, as_written, dataset_name, is_family, is_randomised, register,
                               registry, supplied, swept, thaw)
from advopenood_plugins.attacks.robust import EOT_PREFIXES, GRADIENT_METHODS, PREFIXES, SQUARE_QUERIES
from advopenood_plugins.kit.robust import (COLUMNS, ROBUST_METRICS, ROBUST_TABLE, attack_family,  # noqa: F401
                                           close_eps, robust_intervals, robust_metrics, robust_pairs, robust_table)
from advopenood_plugins.evaluators.robust_auroc.ensemble import ensemble_report, with_masking
from advopenood_plugins.kit.ensemble import ENSEMBLE
from advopenood_plugins.evaluators.robust_auroc.paired import robust_paired_table
from advopenood_plugins.evaluators.robust_auroc.report import HEADLINE, report_sections, robust_sections
from advopenood_plugins.evaluators.robust_auroc.verify import verify_robust
from advopenood_plugins.evaluators.robust_auroc.verify_ensemble import rederive_ensemble

METHODS = ("pgd", "apgd", "apgd_aux", "square")
#: ``ensemble: standard``: the fixed ensemble's methods (AutoAttack's rule for a score: APGD on it, APGD on a second
#: objective, Square), with the EOT twins of the gradient members for a randomised detector
ENSEMBLES = {"none": (), "standard": ("apgd", "apgd_aux", "square")}
#: Square's query budget when ``square_queries`` is not given: AutoAttack's 5,000 on a CUDA device, fewer on a CPU
CPU_SQUARE_QUERIES = 500
#: which attacks a randomised detector gets: EOT (default), plain, or both
RANDOMISED_ATTACKS = ("eot", "plain", "both")


def run_budgets(plan: Any) -> list[float]:
    """The Linf budgets the plan gives its bounded attacks explicitly (an entry's ``eps``, e.g. from ``--eps``)."""
    found: list[float] = []
    for entry in plan.attacks:
        if isinstance(entry, str) or entry.eps is None:
            continue
        entry = thaw(entry)
        cls = registry.get("attacks", str(entry["name"]))
        linf = is_family(cls) or (cls.bounded and str((entry.get("params") or {}).get("norm", cls.norm)) == "linf")
        if linf and cls.bounded:
            values = entry["eps"] if isinstance(entry["eps"], (list, tuple)) else [entry["eps"]]
            found += [float(v) for v in values if not any(close_eps(v, f) for f in found)]
    return found


def member_queries(plan: Any, family: str, name: str, given: int | None, default: int) -> dict[str, int]:
    """The ``n_queries`` the evaluator gives Square member ``name`` (of shorthand ``family``): none where
    ``attack_params.<name or family>.n_queries`` sets its own (the attack checks that value), else ``square_queries``
    (``given``) or the device's ``default``. Both set, and different, is a one-line UsageError."""
    sections = getattr(plan, "attack_params", None) or {}
    own = next((key for key in (name, family) if "n_queries" in (sections.get(key) or {})), None)
    if own is None:
        return {"n_queries": given or default}
    if given is not None and sections[own]["n_queries"] != given:
        raise UsageError(f"evaluator_params.robust_auroc.square_queries {given!r} and attack_params.{own}.n_queries "
                         f"{sections[own]['n_queries']!r} both set the queries of {name}; valid choices: set one of "
                         "them")
    return {}


@register("evaluators", "robust_auroc")
class RobustAUROC(RequiresAttacks, Verifiable):
    """Robust AUROC of every detector with a differentiable score: ID images attacked to look OOD, OOD images to
    look ID (ATD, AROS), next to the clean and one-sided AUROCs."""

    verify = staticmethod(verify_robust)
    #: its headline table, the report's first section in a run that selects it
    headline = Headline(HEADLINE)
    #: per (detector, OOD set, eps as %.6g) the per-image worst case (ID side, OOD side) re-derived from a run
    #: folder's score files (:class:`advopenood.evaluation.runfiles.RunFiles`), for ``advopenood leaderboard``'s
    #: paired ranks
    worst_cases = staticmethod(lambda run: rederive_ensemble(run)[2])
    report_sections = staticmethod(report_sections)  # verify: the sections from the CSVs
    #: each budget of ``eps`` is a set of attacks of its own: a list is bounded (docs/attacks.md, "Budget bounds")
    param_types = {"eps": swept(what="budgets")}
    #: the shared tables it writes (:func:`advopenood_plugins.kit.robust.robust_table` and the ensemble,
    #: :data:`~advopenood_plugins.kit.ensemble.ENSEMBLE`), computed once per run
    needs = (ROBUST_TABLE, ENSEMBLE)

    def __init__(self, method: str | list[str] | tuple[str, ...] = ("pgd",), eps: float | list[float] | None = None,
                 ood_sets: list[str] | None = None, randomised_attacks: str = "eot", eot: int | None = None,
                 ensemble: str = "none", square_queries: int | None = None):
        """``method``: ``pgd`` (default), ``apgd`` or both (a list); ``eps``: budgets of the added sets (default:
        the config's explicit Linf budgets, else the attacks' default); ``ood_sets``: the natural OOD sets to
        attack (default: all of the run's); ``randomised_attacks``: the attacks of a randomised detector, ``eot``
        (default), ``plain`` or ``both``; ``eot``: the EOT attacks' noise draws (default: the detector's own);
        ``ensemble``: ``standard`` adds the fixed ensemble (:data:`ENSEMBLES`); ``square_queries``: the Square
        members' query budget (default 5,000 on a CUDA device, :data:`CPU_SQUARE_QUERIES` on a CPU, where
        ``attack_params`` sets no ``n_queries`` for them). Query and draw counts have the documented bounds
        (:data:`~advopenood.params.MAX_QUERIES`, :data:`~advopenood.params.MAX_DRAWS`)."""
        self.parse_methods(method)  # the settings act through required_attacks; checked here before any work
        self.parse_ensemble(ensemble, square_queries)
        self.parse_families(randomised_attacks, eot)
        budgets = eps if isinstance(eps, (list, tuple)) else [] if eps is None else [eps]
        if any(not isinstance(e, (int, float)) or not 0 < float(e) <= 1 for e in budgets):
            raise UsageError(f"evaluator robust_auroc: eps {eps!r}; valid choices: a number in (0, 1], a list of them")
        if ood_sets is not None and not (isinstance(ood_sets, (list, tuple)) and all(isinstance(o, str) for o in ood_sets)):
            raise UsageError(f"evaluator robust_auroc: ood_sets {ood_sets!r}; valid choices: a list of natural OOD set names")

    @staticmethod
    def parse_methods(method: Any) -> list[str]:
        methods = [m.strip().lower() for m in (method.split(",") if isinstance(method, str) else method or [])]
        bad = [m for m in methods if m not in METHODS] or ([] if methods else [str(method)])
        if bad:
            raise UsageError(f"evaluator robust_auroc: method {bad[0]!r}; valid choices: {', '.join(METHODS)} "
                             "(or a list of them)")
        return list(dict.fromkeys(methods))

    @staticmethod
    def parse_ensemble(ensemble: Any, square_queries: Any) -> tuple[str, ...]:
        """The ensemble's methods; refuses an unknown ensemble or a query budget that is not an integer in
        ``[1, MAX_QUERIES]``."""
        if ensemble not in ENSEMBLES:
            raise UsageError(f"evaluator robust_auroc: ensemble {ensemble!r}; valid choices: {', '.join(ENSEMBLES)}")
        if square_queries is not None and (isinstance(square_queries, bool) or not isinstance(square_queries, int)
                                           or not 1 <= square_queries <= MAX_QUERIES):
            raise UsageError(f"evaluator robust_auroc: square_queries {square_queries!r}; valid choices: an integer "
                             f"in [1, {MAX_QUERIES}] (the documented bound on queries), or null for 5000 on a CUDA "
                             f"device and {CPU_SQUARE_QUERIES} on a CPU")
        return ENSEMBLES[ensemble]

    @staticmethod
    def parse_families(randomised_attacks: Any, eot: Any) -> list[bool]:
        """Whether a randomised detector gets the plain (False) and/or the EOT (True) attacks."""
        if randomised_attacks not in RANDOMISED_ATTACKS:
            raise UsageError(f"evaluator robust_auroc: randomised_attacks {randomised_attacks!r}; valid choices: "
                             f"{', '.join(RANDOMISED_ATTACKS)}")
        if eot is not None and (isinstance(eot, bool) or not isinstance(eot, int) or not 1 <= eot <= MAX_DRAWS):
            raise UsageError(f"evaluator robust_auroc: eot {eot!r}; valid choices: an integer in [1, {MAX_DRAWS}] (the "
                             "documented bound on draws), or null for the detector's own number of draws")
        return {"eot": [True], "plain": [False], "both": [False, True]}[randomised_attacks]

    @classmethod
    def required_attacks(cls, plan: Any, params: Any) -> list[tuple[dict[str, Any], str | None]]:
        """Per method and selected detector with robust attacks: the ID-side set and one OOD-side set per natural
        OOD set (``evaluator_params.robust_auroc.ood_sets``, default all), at the run's budgets."""
        standard = cls.parse_ensemble(params.get("ensemble", "none"), params.get("square_queries"))
        given = cls.parse_methods(params["method"]) if "method" in params else [] if standard else ["pgd"]
        methods = list(dict.fromkeys([*given, *standard]))
        families = cls.parse_families(params.get("randomised_attacks", "eot"), params.get("eot"))
        draws = {} if params.get("eot") is None else {"eot": params["eot"]}
        queries = params.get("square_queries")
        default_queries = SQUARE_QUERIES if str(plan.device).startswith("cuda") else CPU_SQUARE_QUERIES
        natural = [dataset_name(spec) for spec in plan.data.ood]
        chosen = params.get("ood_sets") or natural
        unknown = [s for s in chosen if s not in natural]
        if unknown:
            raise UsageError(f"evaluator robust_auroc: ood_sets {unknown[0]!r} is not a natural OOD set of this run; "
                             f"valid choices: {', '.join(natural) or 'none (add data.ood to the config)'}")
        eps = params.get("eps")
        eps = (list(eps) if isinstance(eps, (list, tuple)) else [eps]) if eps is not None else run_budgets(plan)
        budget = {} if not eps else {"eps": eps if len(eps) > 1 else eps[0]}
        out: list[tuple[dict[str, Any], str | None]] = []
        for method in methods:
            for det in plan.detectors:
                randomised = is_randomised(registry.get("detectors", det)) and method in GRADIENT_METHODS
                for eot in families if randomised else [False]:
                    prefixes, extra = (EOT_PREFIXES, draws) if eot else (PREFIXES, {})
                    id_name, ood_name = prefixes["id", method] + det, prefixes["ood", method] + det
                    if not (registry.resolves("attacks", id_name) and registry.resolves("attacks", ood_name)):
                        continue
                    # the plain attacks' family: an EOT attack takes their attack_params (steps, eps, ...)
                    id_family, ood_family = PREFIXES["id", method].rstrip("_"), PREFIXES["ood", method].rstrip("_")
                    id_extra, ood_extra = extra, extra
                    if method == "square":
                        id_extra = member_queries(plan, id_family, id_name, queries, default_queries)
                        ood_extra = member_queries(plan, ood_family, ood_name, queries, default_queries)
                    out.append(({"name": id_name, **budget, **({"params": id_extra} if id_extra else {})}, id_family))
                    out += [({"name": ood_name, **budget, "params": {"ood_set": s, **ood_extra},
                              "label": f"{ood_name}-{s}"}, ood_family) for s in chosen]
        return out

    def __call__(self, ctx: RunContext, products: Supplied | None = None) -> Results:
        given = supplied(ctx, self, products)
        table, ensemble = given[ROBUST_TABLE], given[ENSEMBLE]
        if not len(table):
            return Results(tables={"robust_auroc.csv": table}, skipped=ensemble.skipped)
        rows = ensemble.rows  # concatenating an empty frame would turn every column into objects
        table = with_masking(ctx, pd.concat([table, rows], ignore_index=True).infer_objects() if len(rows) else table)
        paired = robust_paired_table(ctx, table, ensemble.worst)
        tables, figures = ensemble_report(ctx, ensemble)
        steps = tables.get("robust_ensemble.csv")
        sections = robust_sections(as_written(table, ctx.protocol), as_written(paired, ctx.protocol),
                                   None if steps is None else as_written(steps, ctx.protocol),
                                   figures[0] if figures else None,
                                   {name: dict(adv.params) for name, adv in ctx.adv_sets.items()})
        return Results(tables={"robust_auroc.csv": table, "robust_paired.csv": paired, **tables},
                       sections=sections, figures=figures, skipped=ensemble.skipped)
