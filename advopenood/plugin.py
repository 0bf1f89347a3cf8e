"""The public plugin API: every name a plugin needs, in one module (``from advopenood.plugin import ...``).

It re-exports the base classes (:class:`Attack`, :class:`Postprocessor`), the declared capabilities, the registry
(:func:`register`, :func:`provide`, :func:`create`, ...), what evaluators and analyses read and return
(:class:`RunView`, the read-only view of the run a plugin receives, and :class:`RunContext`, the frozen record that
satisfies it; the shared tables the built-ins read, :data:`ROBUST_TABLE` and :data:`SET_GROUPS`, with
:class:`Product` and :class:`Supplied`; :class:`Results` and the report's items, the report's formatting helpers,
the metrics and the intervals, the atomic writers), the evaluation protocols, the verify hook's helpers and the
independent checker (``oracle``) and :class:`UsageError`; and what the built-in plugins build on (the run's parts,
below: models, data, detection, the attack store, provenance, plots; the modules ``registry``, ``io`` and
``deprecated``, and ``__version__``), so that a built-in imports nothing else of the core and a third party can
write what a built-in writes. It is the only import path supported for plugin authors: these names stay here
across versions, while the modules they are defined in may move (a removed path, :data:`advopenood.deprecated.TABLE`,
fails in one line pointing here).
"""
import importlib
from typing import Any

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

# what the built-in plugins build on: the run's parts (each module below is loaded by the imports above already,
# except ``advopenood.models.training``, read on first use through ``__getattr__``)
from advopenood import __version__, deprecated, io, registry
from advopenood.attacks.base import attack_params
from advopenood.attacks.store import AdvSet, AdvStore
from advopenood.config.schema import parse_eps, thaw
from advopenood.data.benchmarks import ADVERSARIAL, natural_group
from advopenood.data.datasets import Subset, dataset_name, make_loader, seeded_prefix, stack
from advopenood.detection.bank import create_detector, fit_subset
from advopenood.detection.outputs import pass_outputs, take_rows
from advopenood.detection.postprocessor import openood_args, vim_dim
from advopenood.detection.scoring import fit_detectors
from advopenood.evaluation.intervals import (LEVEL, ImageSource, bootstrap_p, bound_label, holm, image_sources,
                                            shared_id_replicates, shared_mean_replicates)
from advopenood.evaluation.shared import cells_of
from advopenood.evaluation.verify import as_csv_float, read_npz
from advopenood.models.backbones import Backbone
from advopenood.models.classifier import ARCHS, Classifier, build_model, weights_hash
from advopenood.outputs.plots import (PLOT_DIR, chance_mask, ood_matrix, pick_examples, plot_auroc_heatmap, plot_roc,
                                      roc_sets, safe_name)
from advopenood.params import MAX_DRAWS, MAX_QUERIES
from advopenood.provenance import canonical_key, code_identity, derive_seed, library_versions, seeded

#: names read on first use (their module is not loaded by ``import advopenood.plugin``): name -> its module
_LAZY = {"RECIPE": "advopenood.models.training", "train_classifier": "advopenood.models.training"}


def __getattr__(name: str) -> Any:
    """A name of :data:`_LAZY`, imported from its module on first read (then held here)."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


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
    # what the built-ins build on: the core's modules they call through (``registry.register``, ``io.write_csv``,
    # ``deprecated.add``) and the version
    "registry", "io", "deprecated", "__version__",
    # models and their training
    "ARCHS", "Backbone", "Classifier", "build_model", "weights_hash", "RECIPE", "train_classifier",
    # data: the image lists, their loaders and the benchmark's set groups
    "Subset", "dataset_name", "make_loader", "seeded_prefix", "stack", "ADVERSARIAL", "natural_group",
    # detection: building and fitting detectors, a detector's pass over a batch, OpenOOD's arguments
    "create_detector", "fit_subset", "fit_detectors", "pass_outputs", "take_rows", "openood_args", "vim_dim",
    # attacks: the store of adversarial sets and an attack's parameters
    "AdvSet", "AdvStore", "attack_params", "MAX_DRAWS", "MAX_QUERIES",
    # provenance: keys, seeds and the versions a result depends on
    "canonical_key", "code_identity", "derive_seed", "library_versions", "seeded",
    # configuration values
    "parse_eps", "thaw",
    # plots
    "PLOT_DIR", "chance_mask", "ood_matrix", "pick_examples", "plot_auroc_heatmap", "plot_roc", "roc_sets",
    "safe_name",
    # intervals (the test level, Holm's step-down), the shared cells, and a verify hook's readers
    "LEVEL", "bootstrap_p", "bound_label", "holm", "shared_id_replicates", "cells_of", "as_csv_float", "read_npz",
    "ImageSource", "image_sources", "shared_mean_replicates",
]
