"""The public plugin API: every name a plugin needs, in one module (``from advopenood.plugin import ...``).

It re-exports the base classes (:class:`Attack`, :class:`Postprocessor`), the declared capabilities, the registry
(:func:`register`, :func:`provide`, :func:`create`, ...), what evaluators and analyses read and return
(:class:`RunContext`, the shared tables they declare, :class:`Product` and :class:`Supplied`, :class:`Results` and
the report's items, the report's formatting helpers, the metrics), the evaluation protocols, the verify hook's
helpers and :class:`UsageError`. It is the only import path supported for plugin authors: these names stay here
across versions, while the modules they are defined in may move (an old module path keeps working until the version
that :data:`advopenood.deprecated.TABLE` names, with one ``DeprecationWarning`` pointing here).
"""
from advopenood.attacks import Attack, build_attack, default_eps, foolbox_model, frozen
from advopenood.capabilities import (
    AttackFamily,
    CommandAnalysis,
    Derived,
    DetectorAware,
    DetectorNeeds,
    DetectorTestForms,
    DifferentiableDetector,
    IdNegatives,
    Invertible,
    Randomised,
    RequiresAttacks,
    Verifiable,
    bind_attack,
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
from advopenood.detectors import Batches, Outputs, Postprocessor, Taps, fc_layer, forward_outputs, grad_outputs
from advopenood.claims import Claim, pair_claim
from advopenood.errors import UsageError
from advopenood.evaluation.metrics import NaNScoreError, id_threshold, ood_metrics
from advopenood.evaluation.products import Product, Supplied
from advopenood.evaluation.verify import RunFiles, compare
from advopenood.io import save_figure
from advopenood.outputs import Bullets, Figure, Item, Paragraph, Results, Section, Table, as_written, guarded
from advopenood.outputs.report import CHANCE, eps_label, fmt, join, name, pct
from advopenood.params import DrawCount, IterationCount, Params, QueryCount, bounded, typed
from advopenood.params import EpochCount, ImageCount, PointCount, swept
from advopenood.registry import (KINDS, check_params, create, entries, family, generated, get, names, provide,
                                 register, registered, resolves)

__all__ = [
    # base classes and the attack factory
    "Attack", "build_attack", "default_eps", "foolbox_model", "frozen",
    "Postprocessor", "Outputs", "Batches", "Taps", "fc_layer", "forward_outputs", "grad_outputs",
    # typed parameters (a plugin's ``self.p``) and the declared types of bounded budgets
    "Params", "typed", "bounded", "QueryCount", "IterationCount", "DrawCount",
    # the same for an evaluator's or analysis' counts and a swept list's length
    "PointCount", "EpochCount", "ImageCount", "swept",
    # capabilities
    "AttackFamily", "CommandAnalysis", "Derived", "DetectorAware", "DetectorNeeds", "DetectorTestForms",
    "DifferentiableDetector", "IdNegatives", "Invertible", "Randomised", "RequiresAttacks", "Verifiable",
    "bind_attack", "is_derived", "is_detector_aware", "is_differentiable", "is_family", "is_id_negative",
    "is_randomised", "is_verifiable", "requires_attacks", "twin_of",
    # the registry
    "KINDS", "check_params", "create", "entries", "family", "generated", "get", "names", "provide", "register",
    "registered", "resolves",
    # what evaluators and analyses read and return
    "RunContext", "CleanRecord", "Results", "Section", "Item", "Paragraph", "Table", "Bullets", "Figure",
    "as_written", "guarded", "save_figure", "CHANCE", "eps_label", "fmt", "join", "name", "pct",
    "NaNScoreError", "id_threshold", "ood_metrics", "Product", "Supplied",
    # protocols
    "PROTOCOLS", "Protocol", "get_protocol",
    # verify hooks
    "RunFiles", "compare",
    # errors
    "UsageError", "Claim", "pair_claim",
]
