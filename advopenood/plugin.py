"""The public plugin API: every name a plugin needs, in one module (``from advopenood.plugin import ...``).

It re-exports the base classes (:class:`Attack`, :class:`Postprocessor`), the declared capabilities, the registry
(:func:`register`, :func:`provide`, :func:`create`, ...), what evaluators and analyses read and return
(:class:`RunView`, the read-only view of the run a plugin receives, and :class:`RunContext`, the frozen record that
satisfies it; the shared tables the built-ins read, :data:`ROBUST_TABLE` and :data:`SET_GROUPS`, with
:class:`Product` and :class:`Supplied`; :class:`Results` and the report's items, the report's formatting helpers,
the metrics and the intervals, the atomic writers), the evaluation protocols, the verify hook's helpers and the
independent checker (``oracle``) and :class:`UsageError`. It is the only import path supported for plugin authors: these names stay here
across versions, while the modules they are defined in may move (an old module path keeps working until the version
that :data:`advopenood.deprecated.TABLE` names, with one ``DeprecationWarning`` pointing here).
"""
from advopenood.attacks import Attack, build_attack, default_eps, foolbox_model, frozen
from advopenood.attacks.base import count_step
from advopenood.capabilities import (
    AttackFamily,
    CommandAnalysis,
    Composite,
    Derived,
    DetectorAware,
    DetectorNeeds,
    DetectorTestForms,
    DifferentiableDetector,
    Headline,
    IdNegatives,
    Invertible,
    Randomised,
    RequiresAttacks,
    Verifiable,
    bind_attack,
    is_composite,
    headline_of,
    is_derived,
    is_detector_aware,
    is_differentiable,
    is_family,
    is_id_negative,
    is_randomised,
    is_verifiable,
    requires_attacks,
    twin_of,
)
from advopenood.config.protocols import PROTOCOLS, Protocol
from advopenood.config.protocols import get as get_protocol
from advopenood.context import CleanRecord, RunContext
from advopenood.evaluation.context import RunView
from advopenood.detectors import Batches, Outputs, Postprocessor, Taps, fc_layer, forward_outputs, grad_outputs
from advopenood.claims import Claim, pair_claim
from advopenood.errors import UsageError
from advopenood.evaluation.metrics import NaNScoreError, id_threshold, ood_metrics
from advopenood.evaluation import oracle
from advopenood.evaluation.intervals import (IntervalPolicy, bound_columns, cell_key, empty_bounds, mean_interval,
                                             too_few, wilson)
from advopenood.evaluation.metrics import MIN_CONCLUSIVE, Z95, auroc, auroc_interval, fpr_at_tpr95, hanley_mcneil_se
from advopenood.evaluation.products import Product, Products, Supplied, needs_of, supplied
from advopenood.evaluation.shared import COLUMNS as ROBUST_COLUMNS
from advopenood.evaluation.shared import (ROBUST_METRICS, ROBUST_TABLE, SET_GROUPS, attack_family, close_eps,
                                          robust_attack, robust_intervals, robust_metrics, robust_pairs, robust_table,
                                          set_groups, shared_cells)
from advopenood.evaluation.verify import RunFiles, Unreadable, compare
from advopenood.io import atomic_write, save_figure, write_csv, write_json
from advopenood.outputs import Bullets, Figure, Item, Paragraph, Results, Section, Table, as_written, guarded
from advopenood.outputs.report import CHANCE, eps_label, fmt, join, name, pct
from advopenood.params import DrawCount, IterationCount, Params, QueryCount, bounded, typed
from advopenood.params import EpochCount, ImageCount, PointCount, swept
from advopenood.registry import (KINDS, check_params, create, entries, family, generated, get, names, provide,
                                 register, registered, resolves)

__all__ = [
    # base classes and the attack factory
    "Attack", "build_attack", "default_eps", "foolbox_model", "frozen", "count_step",
    "Postprocessor", "Outputs", "Batches", "Taps", "fc_layer", "forward_outputs", "grad_outputs",
    # typed parameters (a plugin's ``self.p``) and the declared types of bounded budgets
    "Params", "typed", "bounded", "QueryCount", "IterationCount", "DrawCount",
    # the same for an evaluator's or analysis' counts and a swept list's length
    "PointCount", "EpochCount", "ImageCount", "swept",
    # capabilities
    "AttackFamily", "CommandAnalysis", "Composite", "Derived", "DetectorAware", "DetectorNeeds", "DetectorTestForms",
    "DifferentiableDetector", "Headline", "IdNegatives", "Invertible", "Randomised", "RequiresAttacks", "Verifiable",
    "bind_attack", "headline_of", "is_composite", "is_derived", "is_detector_aware", "is_differentiable", "is_family",
    "is_id_negative", "is_randomised", "is_verifiable", "requires_attacks", "twin_of",
    # the registry
    "KINDS", "check_params", "create", "entries", "family", "generated", "get", "names", "provide", "register",
    "registered", "resolves",
    # what evaluators and analyses read and return
    "RunView", "RunContext", "CleanRecord", "Results", "Section", "Item", "Paragraph", "Table", "Bullets", "Figure",
    "as_written", "guarded", "save_figure", "CHANCE", "eps_label", "fmt", "join", "name", "pct",
    "NaNScoreError", "id_threshold", "ood_metrics", "Product", "Supplied",
    # the shared tables (products) the built-ins read, and how a plugin reads its own
    "ROBUST_TABLE", "SET_GROUPS", "ROBUST_METRICS", "ROBUST_COLUMNS", "robust_table", "robust_pairs",
    "robust_metrics", "robust_intervals", "robust_attack", "attack_family", "close_eps", "shared_cells",
    "set_groups", "Products", "needs_of", "supplied",
    # intervals and metrics (the run's one interval policy, ``ctx.intervals``)
    "IntervalPolicy", "bound_columns", "cell_key", "empty_bounds", "mean_interval", "too_few", "wilson",
    "auroc", "auroc_interval", "fpr_at_tpr95", "hanley_mcneil_se", "Z95", "MIN_CONCLUSIVE",
    # results writers (atomic)
    "atomic_write", "write_csv", "write_json",
    # protocols
    "PROTOCOLS", "Protocol", "get_protocol",
    # verify hooks (``oracle``: the independent checker they re-derive with)
    "RunFiles", "Unreadable", "compare", "oracle",
    # errors
    "UsageError", "Claim", "pair_claim",
]
