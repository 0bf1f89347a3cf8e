"""Base class for attack plugins, and the foolbox plumbing they share.

An attack plugin is a class registered under ``advopenood.attacks.base``: ``defaults(input_size)`` gives its
parameters for an input size under the default protocol (``strong``, ours), ``protocol_defaults(protocol,
input_size)`` what a named protocol (e.g. ``lorenz2024``) sets over them, the constructor takes (and
validates) parameters, and calling it on ``(model, x, y, seed)`` returns adversarial images in [0, 1]. The model is a
:class:`advopenood.models.Classifier`, which normalises internally, so attacks work in pixel space.

Progress inside a shard: an attack that declares ``counts_steps`` calls :func:`count_step` once per iteration (or
query) it takes, and :meth:`Attack.planned_steps` says how many one call on a shard takes; the store's bar of the shard
moves with them. Any other attack's bar counts the model's forward passes. Every built-in attack counts its iterations
(Square and the robust-AUROC attacks their queries).
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Iterator

import torch
import torch.nn as nn

from advopenood import registry
from advopenood.errors import UsageError
from advopenood.params import Params, declared_types, typed


#: where :func:`count_step` reports while a shard is attacked (:func:`counting_steps`); nowhere otherwise
_STEPS: contextvars.ContextVar[Callable[[int], None] | None] = contextvars.ContextVar("advopenood_steps", default=None)
#: the parameters that set an attack's iterations per call, and what they count (:meth:`Attack.planned_steps`)
STEP_PARAMS = (("n_queries", "queries"), ("n_iter", "iterations"), ("steps", "iterations"))


def count_step(n: int = 1) -> None:
    """Count ``n`` iterations (or queries) of the attack running now: its shard's progress bar moves (a no-op
    outside a shard being attacked)."""
    report = _STEPS.get()
    if report is not None:
        report(n)


@contextlib.contextmanager
def counting_steps(report: Callable[[int], None]) -> Iterator[None]:
    """Route every :func:`count_step` of the block to ``report``."""
    token = _STEPS.set(report)
    try:
        yield
    finally:
        _STEPS.reset(token)


@contextlib.contextmanager
def frozen(model: nn.Module) -> Iterator[nn.Module]:
    """Eval mode (batch-norm statistics frozen) and no parameter gradients while attacking; restored after."""
    flags = [p.requires_grad for p in model.parameters()]
    was_training = model.training
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        yield model
    finally:
        for p, flag in zip(model.parameters(), flags):
            p.requires_grad_(flag)
        model.train(was_training)


class Attack:
    """An attack with validated parameters; subclasses set ``name``, ``norm`` and implement ``perturb``."""

    name: ClassVar[str] = ""
    norm: ClassVar[str] = "linf"
    #: the threat model evaluators group attacks by (MEAD): ``linf``, ``l2``, ``l1`` or ``patch``; a class that
    #: does not set it (nor inherits an explicit one) gets its ``norm``
    threat: ClassVar[str] = "linf"
    _explicit_threat: ClassVar[bool] = False
    #: False for minimal-perturbation attacks (DeepFool) whose ``eps`` is not a budget.
    bounded: ClassVar[bool] = True
    #: the images attacked: ``"id"`` (the ID test set) or ``"ood"`` (a natural OOD set: OOD->ID attacks,
    #: which take the set's name as parameter ``ood_set``, default the run's first)
    source: ClassVar[str] = "id"
    #: what the attack was fitted on besides its parameters (e.g. a detector's fit data); part of the cache key
    context: dict[str, Any] = {}
    #: the type of each parameter whose default does not say it (None, a list), merged along the class's bases;
    #: :attr:`p` reads the parameters with these types (:mod:`advopenood.params`)
    param_types: ClassVar[dict[str, Any]] = {"eps": float | None, "rel_stepsize": float | None,
                                             "abs_stepsize": float | None}
    #: True for an attack that calls :func:`count_step` per iteration or query (its bar counts those, not passes)
    counts_steps: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        if "threat" in cls.__dict__:
            cls._explicit_threat = True
        elif not getattr(cls, "_explicit_threat", False):
            cls.threat = cls.norm

    def __init__(self, **params: Any):
        valid = self.defaults(32)
        budget = ("eps",) if "eps" in valid else ()  # eps takes a list (a sweep) in configs: not type-checked
        registry.check_params("attack", self.name, params, {k: v for k, v in valid.items() if k != "eps"}, budget)
        self.params = {**valid, **params}
        eps = self.params.get("eps")
        limit = 1.0 if self.norm == "linf" else math.inf
        if self.bounded and (eps is None or not 0.0 < float(eps) <= limit):
            raise UsageError(f"eps {eps!r} for attack {self.name!r} is out of range; valid choices: "
                             + ("0 < eps <= 1 (images are in [0, 1], e.g. 8/255 = 0.0314)" if limit == 1.0 else "eps > 0"))
        if "steps" in self.params and int(self.params["steps"]) < 1:
            raise UsageError(f"steps {self.params['steps']!r} for attack {self.name!r}; valid choices: an integer >= 1")
        _ = self.p  # every parameter reads with its type, or the plan stops here

    @property
    def p(self) -> Params:
        """The parameters, typed and frozen (``self.p.steps`` is an int, ``self.p.eps`` a float or None): the
        defaults' types and :attr:`param_types`; :attr:`params` is the plain mapping the cache key records."""
        return typed(f"attack {self.name!r}", self.params, self.defaults(32), declared_types(type(self)))

    @classmethod
    def defaults(cls, input_size: int) -> dict[str, Any]:
        """Default parameters (protocol ``strong``) for images of side ``input_size``; every valid key appears."""
        raise NotImplementedError

    @classmethod
    def protocol_defaults(cls, protocol: str, input_size: int) -> dict[str, Any]:
        """Parameters a named protocol (:mod:`advopenood.config.protocols`) sets over :meth:`defaults`; none by default.

        The effective parameters are ``{**defaults(size), **protocol_defaults(protocol, size), **user params}``,
        so an attack that ignores protocols keeps its defaults under every protocol.
        """
        return {}

    def perturb(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Adversarial images for ``(x, y)``; randomness comes from the torch generator seeded by ``__call__``."""
        raise NotImplementedError

    def planned_steps(self, images: int | None = None, classes: int | None = None) -> tuple[int, str] | None:
        """How many :func:`count_step` calls one call of the attack on ``images`` images of a ``classes``-class model
        makes (at most: an attack that stops once every image is fooled counts fewer), and what they count
        (``queries`` or ``iterations``): by default its ``n_queries``, else ``n_iter`` x ``n_restarts``, else
        ``steps``; None when it declares no ``counts_steps`` or has none of them. ``images`` and ``classes`` (None:
        unknown) matter to an attack whose iterations depend on them (a patch per group of images, a target per
        class)."""
        if not self.counts_steps:
            return None
        for key, unit in STEP_PARAMS:
            if isinstance(self.params.get(key), int):
                return int(self.params[key]) * int(self.params.get("n_restarts") or 1 if key == "n_iter" else 1), unit
        return None

    def succeeded(self, model: nn.Module, x_adv: torch.Tensor, y: torch.Tensor, adv_pred: torch.Tensor) -> torch.Tensor:
        """Per-sample success as stored in the set's records: misclassified (``adv_pred != y``) by default."""
        return adv_pred != y

    @property
    def in_range(self) -> bool:
        """Whether the attack's images lie in [0, 1]: the call clamps them and the store refuses any outside. True
        unless an attack leaves the pixel range as a paper's did (``hekal_*`` with ``clip: false``)."""
        return True

    def pixel_budget(self) -> float | None:
        """The radius (in [0, 1] pixel units, under :attr:`norm`) the store checks every perturbation against:
        ``eps`` unless the attack's ball is set in other units (``hekal_*`` in normalised units)."""
        eps = self.params.get("eps")
        return None if eps is None else float(eps)

    def __call__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, seed: int) -> torch.Tensor:
        devices = [x.device] if x.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), frozen(model):
            torch.manual_seed(seed)
            x_adv = self.perturb(model, x, y)
        return x_adv.detach().clamp(0.0, 1.0) if self.in_range else x_adv.detach()


def default_eps(input_size: int) -> float:
    """Lorenz et al.'s budget (Sec. 4.1): "8/255 for CIFAR-10/100 and 4/255 for the ImageNet" (by input side)."""
    return 8 / 255 if input_size <= 64 else 4 / 255


def foolbox_model(model: nn.Module, device: torch.device):
    """Wrap a [0, 1]-input model for foolbox."""
    import foolbox as fb

    return fb.PyTorchModel(model, bounds=(0.0, 1.0), device=device)


def attack_params(name: str, input_size: int, protocol: str | None = "strong",
                  *overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """The parameters of attack ``name``: its ``defaults(input_size)``, then what ``protocol`` sets
    (``protocol_defaults``; no protocol layer when None), then each mapping of ``overrides`` in order."""
    cls = registry.get("attacks", name)
    params = {**cls.defaults(input_size), **(cls.protocol_defaults(protocol, input_size) if protocol else {})}
    for layer in overrides:
        params.update(layer or {})
    return params


def build_attack(name: str, params: Mapping[str, Any] | None = None, *, input_size: int | None = None,
                 protocol: str | None = "strong", eps: float | None = None) -> Attack:
    """The one attack factory: the registered attack ``name`` built through :func:`advopenood.registry.create`.

    Without ``input_size``, ``params`` are the full parameters (an :class:`~advopenood.config.AttackSpec`'s);
    with it, they override :func:`attack_params`. ``eps`` (when given) replaces the budget of a bounded attack.
    Unknown or ill-typed parameters raise a one-line UsageError before the attack runs.
    """
    full = dict(params or {}) if input_size is None else attack_params(name, input_size, protocol, params)
    if eps is not None and registry.get("attacks", name).bounded:
        full["eps"] = eps
    return registry.create("attacks", name, **full)
