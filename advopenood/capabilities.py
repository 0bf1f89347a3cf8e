"""What a plugin can do, declared by the plugin and read by the core (never probed with ``hasattr``).

A plugin states a capability by inheriting one of these bases; the core checks ``isinstance`` /
``issubclass`` (or the predicates below) and calls the documented methods. A third-party plugin that inherits
the same base gets exactly the treatment a built-in one gets.

Attacks (:class:`advopenood.attacks.base.Attack` subclasses):

* :class:`DetectorAware`: attacks a detector fitted on the run's ID fit data; the core binds it with
  :func:`bind_attack` before use (``bind``), records its ``context`` in the cache key, and analyses read the
  attacked detector's confidence through ``detector_score``.
* :class:`Invertible`: has an ``inverted()`` twin (the binarization test's inverted variant).
* :class:`DetectorTestForms`: names its own forms for the binarization test's regular and inverted detector
  tests (``test_form``), e.g. an attack that moves only a detector's score.
* :class:`IdNegatives`: perturbs ID images that stay ID negatives (it pushes a detector to reject them): its
  sets are never OOD positives (:attr:`advopenood.context.RunContext.positive_sets`).
* :class:`AttackFamily` (a registered class that is not an attack): a name standing for several attacks,
  ``members(plan)``, expanded when a config is read.

Detectors (:class:`advopenood.detectors.Postprocessor` subclasses) declare what the shared pass must provide
with class attributes (``requires_fit``, ``own_pass``, ``needs_taps``, ``needs_input_grad``, ``needs_maps``,
``shared_fit``; see :class:`DetectorNeeds`), and a differentiable confidence by inheriting
:class:`DifferentiableDetector` (``grad_score``), which is what detector-adaptive attacks need.

A detector whose confidence depends on random draws as well as on the image (e.g. ``smoothed_<det>``'s noise)
declares :class:`Randomised`: the run scores every set with evaluation noise independent of every draw an attack
takes, and detector-adaptive attacks get EOT twins for it (``is_randomised``).

A generated plugin (a wrapper of another) declares :class:`Derived`: ``all`` does not select it.

Analyses may declare a command-line subcommand (:class:`CommandAnalysis`); evaluators and analyses may declare
that ``advopenood verify`` can re-derive their tables (:class:`Verifiable`) and which attack sets they need
(:class:`RequiresAttacks`, added to the run's attacks when the config is expanded). An evaluator declares its
headline table, the section that answers the question it was selected for, with a class attribute ``headline``
(a :class:`Headline`; :func:`headline_of`): the report opens on the headline of the run's lead evaluator
(:func:`lead_evaluator`).
"""
from __future__ import annotations

import abc
import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    import torch
    from torch import Tensor


class DetectorNeeds(Protocol):
    """The declarations every detector class carries (defaults on ``Postprocessor``), read by the detector bank."""

    #: fits on ID training data (``fit``)
    requires_fit: ClassVar[bool]
    #: runs the network itself while scoring (e.g. ODIN's forward on the perturbed input, or a plain
    #: OpenOOD-interface detector's ``postprocess``): it is handed the real network, not only the shared pass's
    #: outputs, so it is never scored from a set's stored logits and features, and on the ``openood`` backend
    #: OpenOOD's class runs on the real network instead of the cached one
    own_pass: ClassVar[bool]
    #: reads every tapped intermediate map (``Outputs.taps``); the shared pass records them only then
    needs_taps: ClassVar[bool]
    #: takes the input gradient of the shared pass's outputs: the pass then runs with gradients
    needs_input_grad: ClassVar[bool]
    #: reads the last block's maps (``Outputs.maps``): always scored from a network pass, never from a scored
    #: set's stored logits and features
    needs_maps: ClassVar[bool]
    #: fits from the shared fit pass's outputs (False: only from re-read image batches)
    shared_fit: ClassVar[bool]
    #: fits per-class statistics: its fit fails unless the fit set holds every one of the model's classes
    needs_all_classes: ClassVar[bool]


class DifferentiableDetector(abc.ABC):
    """A detector whose confidence is differentiable in the input (BPDA where a part is not: Athalye et al.,
    ICML 2018, "the forward value is the detector's, the backward pass a surrogate"). Every registered detector
    that inherits this gets ``adaptive_<name>``, ``adaptive_ood_<name>`` and ``adaptive_apgd_<name>`` attacks."""

    @abc.abstractmethod
    def grad_score(self, net: Any, x: Tensor, out: Any) -> Tensor:
        """The detector's confidence (higher = more ID) of ``x`` as a differentiable function of ``x``; ``out``:
        the network's outputs for ``x`` from a pass with gradients."""


class Randomised(abc.ABC):
    """A detector whose confidence is a function of random draws as well as of the image (e.g. ``smoothed_<det>``'s
    Gaussian noise). It draws from one of two independent streams, named by :attr:`noise_stream`: ``"eval"`` (the
    default: the run's scoring of every set, clean and attacked, seeded by :meth:`evaluation_noise_seed`, which
    ``run.json`` records and the score store's key holds) or ``"attack"`` (:meth:`for_attack`: every draw of an
    attack on it, from the run's seed), so that no attack picks its examples with the noise they are evaluated
    with. Every such detector with a differentiable score gets EOT attacks (:meth:`with_eot`), which the
    ``robust_auroc`` evaluator uses by default."""

    #: the stream this instance draws from: ``"eval"`` or ``"attack"``
    noise_stream: str = "eval"
    #: the parameter whose value is :attr:`draws` (``n``: a smoothed or ROSS detector's noise copies), so that the
    #: plan's bound on draws is checked on the declared parameters, before anything is built (:meth:`declared_draws`);
    #: None: the class declares none, and the run checks :attr:`draws` of the detector it builds once
    draws_parameter: ClassVar[str | None] = None

    @classmethod
    def declared_draws(cls, params: Mapping[str, Any]) -> int | None:
        """The draws one confidence takes under the parameters ``params`` (the class's ``default_params`` updated
        with them), read from :attr:`draws_parameter` without constructing the detector; None when the class
        declares no such parameter or its value is not an integer (which the constructor refuses)."""
        if cls.draws_parameter is None:
            return None
        defaults = getattr(cls, "default_params", dict)()
        value = {**defaults, **params}.get(cls.draws_parameter)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @abc.abstractmethod
    def evaluation_noise_seed(self) -> int:
        """The seed of the evaluation stream (from the run's seed and the detector's parameters)."""

    @abc.abstractmethod
    def with_eot(self, samples: int) -> Randomised:
        """The same fitted detector whose gradient is the mean over ``samples`` of its random draws (EOT)."""

    @property
    @abc.abstractmethod
    def draws(self) -> int:
        """How many random draws one confidence takes (the EOT attacks' default number of draws)."""

    def for_attack(self) -> Randomised:
        """The same fitted detector drawing from the attack stream."""
        twin = copy.copy(self)
        twin.noise_stream = "attack"
        return twin


class Composite(abc.ABC):
    """A detector built on another registered detector, fitted with it and held as :attr:`base` (e.g. ``ross_<det>``
    over ``<det>``): an attack set to differentiate the base detector instead of the whole (ROSS's published
    ``--attack-base-pp``; ``hekal_min_<det>`` / ``hekal_max_<det>`` with ``through: base``) reads it here."""

    #: the fitted base detector
    base: Any


def is_composite(detector: Any) -> bool:
    """Whether a detector (class or instance) is built on a base detector (:class:`Composite`)."""
    cls = detector if isinstance(detector, type) else type(detector)
    return issubclass(cls, Composite)


class DetectorAware(abc.ABC):
    """An attack on a detector fitted on the run's ID fit data; :func:`bind_attack` binds it before use."""

    #: the registered name of the attacked detector
    detector: ClassVar[str] = ""

    @abc.abstractmethod
    def bind(self, net: Any, fit_set: Any, *, seed: int, batch_size: int, device: torch.device | str,
             detector_params: Mapping[str, Any] | None = None) -> DetectorAware:
        """Fit data and settings for the attacked detector; returns the attack."""

    @abc.abstractmethod
    def detector_score(self, x: Tensor) -> Tensor:
        """The attacked detector's confidence of ``x`` (higher = more ID), without gradients."""

    def use_fitted(self, detector: Any) -> None:
        """The run's own fitted detector (a handle, :class:`advopenood.detection.bank.FittedDetector`:
        ``detector.get()`` is the detector the run scores with, fitted once on first need; ``detector.memo`` keeps
        what the run's attacks derive from it); the core calls it after :meth:`bind` (:func:`bind_attack`). An
        attack that does not override it fits its own detector from what :meth:`bind` gave it."""


class Invertible(abc.ABC):
    """An attack with an inverted twin (e.g. seeking detected rather than undetected examples)."""

    @abc.abstractmethod
    def inverted(self) -> Invertible:
        """The same attack with its secondary objective negated."""


class DetectorTestForms(abc.ABC):
    """An attack on a detector whose binarization-test forms are not simply itself and its :class:`Invertible`
    twin (e.g. an attack that moves only the detector's score, in one direction)."""

    @abc.abstractmethod
    def test_form(self, test: str) -> Any:
        """The attack to run in the detector variant's ``"regular"`` test (an example the detector does not flag)
        or ``"inverted"`` test (one it flags)."""


class IdNegatives(abc.ABC):
    """An attack on ID images whose outputs stay ID samples, the negatives of OOD detection: it pushes a detector to
    reject in-distribution images (the ID side of a robust AUROC). Its sets are never OOD positives: they are
    left out of :attr:`advopenood.context.RunContext.positive_sets` and ``id_adv_sets``."""


class AttackFamily(abc.ABC):
    """A registered attack name that stands for several attacks chosen from the config (``members``)."""

    #: whether the members take an eps budget (the CLI's ``--eps`` applies to them)
    bounded: ClassVar[bool] = True
    #: what the family stands for, and what to select so that it has members (the one-line error when it has none)
    hint: ClassVar[str] = ""
    remedy: ClassVar[str] = ""

    @classmethod
    @abc.abstractmethod
    def members(cls, plan: Any) -> list[str]:
        """Registered attack names the family stands for in ``plan`` (its ``detectors``, ``attacks``; possibly none)."""


class CommandAnalysis(abc.ABC):
    """An analysis with its own subcommand ``advopenood <command>``: the run's flags without the detection ones,
    with ``settings`` forced over the config (e.g. this analysis alone, no detectors)."""

    command: ClassVar[str] = ""
    command_help: ClassVar[str] = ""
    #: config overrides (``apply_overrides`` keywords) the subcommand forces
    command_settings: ClassVar[Mapping[str, Any]] = {}


class Derived(abc.ABC):
    """A plugin generated from another registered one (e.g. ``smoothed_<det>`` from ``<det>``): selected by its
    name, never by ``all``, so that a default run (``--detectors all``) keeps to the plugins themselves. Its
    :attr:`base_name` names the plugin it derives from: its twin, which the ``ood`` evaluator's paired comparisons
    always pair it with (``paired.csv``)."""

    #: the registered name of the plugin this one is generated from ("" when none)
    base_name: ClassVar[str] = ""


def is_derived(obj: Any) -> bool:
    """Whether a registered object (class) is :class:`Derived`."""
    return isinstance(obj, type) and issubclass(obj, Derived)


def twin_of(obj: Any) -> str:
    """The registered name a :class:`Derived` plugin (class or instance) is generated from; "" for any other."""
    cls = obj if isinstance(obj, type) else type(obj)
    return str(cls.base_name) if issubclass(cls, Derived) else ""


class RequiresAttacks(abc.ABC):
    """An evaluator or analysis that needs attack sets of its own: when the config is expanded
    (:func:`advopenood.config.plan.attack_entries`) its ``required_attacks`` are added to the run's attacks, after the
    configured ones and without repeating a set name the config already has."""

    @classmethod
    @abc.abstractmethod
    def required_attacks(cls, plan: Any, params: Mapping[str, Any]) -> list[tuple[dict[str, Any], str | None]]:
        """``(entry, family)`` pairs: ``entry`` as a config ``attacks`` item (``name``, optional ``eps``, ``params``,
        ``label``), ``family`` the registered name whose ``attack_params`` apply below the attack's own (or None);
        ``params`` is the plugin's ``evaluator_params`` / ``analysis_params`` entry."""


def is_differentiable(detector: Any) -> bool:
    """Whether a registered detector (class or instance) declares a differentiable confidence."""
    cls = detector if isinstance(detector, type) else type(detector)
    return issubclass(cls, DifferentiableDetector)


def is_randomised(detector: Any) -> bool:
    """Whether a registered detector (class or instance) declares :class:`Randomised`."""
    cls = detector if isinstance(detector, type) else type(detector)
    return issubclass(cls, Randomised)


def is_family(obj: Any) -> bool:
    """Whether a registered attack object is a family of attacks."""
    return isinstance(obj, type) and issubclass(obj, AttackFamily)


def is_detector_aware(attack: Any) -> bool:
    """Whether an attack (class or instance) attacks a fitted detector and must be bound first."""
    cls = attack if isinstance(attack, type) else type(attack)
    return issubclass(cls, DetectorAware)


def bind_attack(attack: Any, model: Any, fit_set: Any, *, seed: int, batch_size: int, device: torch.device | str,
                detector_params: Mapping[str, Any] | None = None, fitted: Any = None) -> Any:
    """Bind a :class:`DetectorAware` attack to the model, the fit set, the run's seed and batch size and the run's
    ``detector_params`` entry for its detector (so it attacks the detector the run evaluates), then, with
    ``fitted`` (the run's handle on that detector), to the run's fitted detector itself
    (:meth:`DetectorAware.use_fitted`); other attacks are returned unchanged."""
    if isinstance(attack, DetectorAware):
        params = {str(k).lower(): v for k, v in (detector_params or {}).items()}
        attack.bind(model, fit_set, seed=int(seed), batch_size=int(batch_size), device=device,
                    detector_params=params.get(attack.detector))
        if fitted is not None:
            attack.use_fitted(fitted)
    return attack


class Verifiable(abc.ABC):
    """An evaluator or analysis whose tables ``advopenood verify RUN`` re-derives from the run's files
    (:mod:`advopenood.evaluation.verify`). Write ``verify`` as its own code path, apart from the code that wrote the tables
    (e.g. a ``verify_<name>.py`` module, set as ``verify = staticmethod(fn)``)."""

    @staticmethod
    @abc.abstractmethod
    def verify(run: Any) -> list[str]:
        """One line per difference between the run's tables and their re-derivation from ``run``
        (:class:`advopenood.evaluation.verify.RunFiles`); empty when every number is re-derived."""


def is_verifiable(obj: Any) -> bool:
    """Whether a registered evaluator or analysis declares :class:`Verifiable`."""
    return isinstance(obj, type) and issubclass(obj, Verifiable)


def is_id_negative(attack: Any) -> bool:
    """Whether an attack (class or instance) declares :class:`IdNegatives`."""
    cls = attack if isinstance(attack, type) else type(attack)
    return issubclass(cls, IdNegatives)


def requires_attacks(obj: Any) -> bool:
    """Whether a registered evaluator or analysis declares :class:`RequiresAttacks`."""
    return isinstance(obj, type) and issubclass(obj, RequiresAttacks)


@dataclass(frozen=True)
class Headline:
    """An evaluator's headline: ``section``, the title of the report section of its results that answers the
    question it is selected for (its headline table). A ``general`` headline (e.g. the AUROC of every detector on
    every set) leads the report only when no selected evaluator declares a specific one."""

    section: str
    general: bool = False


def headline_of(obj: Any) -> Headline | None:
    """The :class:`Headline` an evaluator (class or instance) declares as its class attribute ``headline``; None
    for one that declares none."""
    declared = getattr(obj if isinstance(obj, type) else type(obj), "headline", None)
    return declared if isinstance(declared, Headline) else None


def lead_evaluator(evaluators: Sequence[str], declared: Mapping[str, Headline | None], chosen: str | None = None
                   ) -> str | None:
    """The evaluator whose headline opens the report: ``chosen`` (the config's ``report.lead``) when given, else the
    first of ``evaluators`` (the user's order) whose ``declared`` headline is specific, else the first with a
    general one; None when none declares a headline."""
    if chosen:
        return chosen
    have = [e for e in evaluators if declared.get(e) is not None]
    return next((e for e in have if not declared[e].general), have[0] if have else None)
