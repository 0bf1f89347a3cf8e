"""The detector plugin base class, :class:`Postprocessor` (OpenOOD's postprocessor interface and the
declared needs of :class:`~advopenood.capabilities.DetectorNeeds`), and OpenOOD's default hyperparameters."""
from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from importlib import resources
from typing import Any, ClassVar

import torch
import torch.nn as nn
from torch import Tensor
from tqdm.auto import tqdm

from advopenood import registry
from advopenood.detection.outputs import (
    FIT_SIZE,
    Batches,
    Outputs,
    collect_outputs,
    iter_xy,
    net_device,
    pass_outputs,
    take_rows,
)
from advopenood.errors import UsageError
from advopenood.params import Params, declared_types, typed


@cache
def openood_config(name: str) -> dict[str, Any]:
    """Our copy of OpenOOD's ``configs/postprocessors/<name>.yml`` as a dict."""
    import yaml

    path = resources.files("advopenood.configs") / "openood" / f"{name}.yml"
    if not path.is_file():
        raise UsageError(f"no OpenOOD config shipped for detector {name!r}")
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def openood_args(name: str) -> dict[str, Any]:
    """OpenOOD's default hyperparameters (``postprocessor_args``) of a detector; empty when it has none."""
    return dict(openood_config(name)["postprocessor"].get("postprocessor_args") or {})


def vim_dim(dim: int, feature_dim: int) -> int:
    """ViM's principal-subspace size: OpenOOD's ``dim`` when it leaves a residual, else half the feature width.

    OpenOOD's 256 (and its 1000 sweep value) assume >= 512-d features; on narrower ones the residual is
    empty, the virtual logit is 0/0 and every score is NaN.
    """
    return int(dim) if int(dim) < feature_dim else max(1, feature_dim // 2)


class Postprocessor:
    """Base class of advopenood's detectors, with OpenOOD's postprocessor interface.

    Subclasses implement :meth:`score` (and :meth:`fit` when ``requires_fit``); the class attributes
    (:class:`advopenood.capabilities.DetectorNeeds`) declare what the shared pass must provide, and a subclass of
    :class:`advopenood.capabilities.DifferentiableDetector` declares a differentiable score (``grad_score``). ``openood_name`` names the OpenOOD postprocessor (and our YAML copy)
    that the ``openood`` backend runs instead; its ``postprocessor_args`` are the default parameters.
    """

    openood_name: ClassVar[str | None] = None
    #: the type of each parameter whose default does not say it (None, a list), merged along the class's bases
    #: (:mod:`advopenood.params`); ``fit_size`` is an int or None
    param_types: ClassVar[dict[str, Any]] = {"fit_size": int | None}
    #: the network wrapper OpenOOD's ``Evaluator`` runs this detector on (module, class), for the ``openood`` backend
    openood_wrapper: ClassVar[tuple[str, str] | None] = None
    #: fits on ID training data (``setup`` / :meth:`fit`)
    requires_fit: ClassVar[bool] = False
    #: runs the network itself while scoring (e.g. ODIN's forward on the perturbed input, or a plain
    #: OpenOOD-interface detector's ``postprocess``): it is handed the real network, not only the shared pass's
    #: outputs, so it is never scored from a set's stored logits and features, and on the ``openood`` backend
    #: OpenOOD's class runs on the real network instead of the cached one
    own_pass: ClassVar[bool] = False
    #: reads every tapped map (``Outputs.taps``); the shared pass records them only when such a detector scores
    needs_taps: ClassVar[bool] = False
    #: differentiates the shared pass's outputs in its input: when such a detector scores, the shared pass runs
    #: with gradients (``x`` a leaf that requires grad, ``Outputs`` carrying the graph) and hands the others the
    #: detached outputs; a detector then gets its input gradient for one backward, without a forward of its own
    needs_input_grad: ClassVar[bool] = False
    #: reads ``Outputs.maps`` (the last block's maps): always scored from a network pass; the others may be
    #: scored from a set's stored logits and features (a re-run with one detector's parameter changed)
    needs_maps: ClassVar[bool] = False
    #: fits from the shared fit pass's outputs (False: only from ``batches``, its own pass)
    shared_fit: ClassVar[bool] = True
    #: fits per-class statistics from the labels (class means, class bounds): a fit set that lacks one of the
    #: model's classes fails its fit (a detector error, exit 3) instead of scoring against the classes it saw
    needs_all_classes: ClassVar[bool] = False
    #: the network output the confidence is computed from, ``"logits"`` or ``"features"`` (the penultimate layer):
    #: the robust ensemble's second objective follows it (the logit margin or a feature distance)
    score_space: ClassVar[str] = "logits"
    #: the per-channel std a network divides its inputs by (OpenOOD's networks), for detectors that step in input
    #: space (ODIN); None for our [0, 1]-input networks
    input_std: tuple[float, ...] | None = None
    #: run settings, overridden per instance by ``score_all`` (and ``setup``)
    device: torch.device = torch.device("cpu")
    seed: int = 0
    batch_size: int = 128
    progress: bool = True

    def __init__(self, **params: Any):
        valid = self.default_params()
        registry.check_params("detector", self.name, params, valid, (FIT_SIZE,))
        fit_size = params.get(FIT_SIZE)
        if fit_size is not None and (not str(fit_size).isdigit() or int(fit_size) < 1):
            raise UsageError(f"{FIT_SIZE} {fit_size!r} for detector {self.name!r} is out of range; "
                             "valid choices: a positive whole number, or null for the whole fit set")
        self.params = {**valid, **params}
        _ = self.p  # every parameter reads with its type, or the plan stops here

    @property
    def p(self) -> Params:
        """The parameters, typed and frozen (defaults' types and :attr:`param_types`; ``fit_size`` an int or
        None): read ``self.p.temperature``; :attr:`params` is the plain mapping the score store's key records."""
        return typed(f"detector {self.name!r}", self.params, self.default_params(), declared_types(type(self)))

    @property
    def name(self) -> str:
        return self.openood_name or type(self).__name__.lower()

    @classmethod
    def default_params(cls) -> dict[str, Any]:
        """The parameters this detector accepts, name -> default: the constructor refuses any other name (besides
        ``fit_size``) in one line and checks each value's type against its default, and ``self.params`` holds the
        defaults updated with the given values. A third-party detector declares its parameters by overriding this
        classmethod (e.g. ``return {"temperature": 1.0}``); for a built-in with an ``openood_name`` it returns
        OpenOOD's ``postprocessor_args`` from our copy of its YAML, and an empty mapping otherwise."""
        return openood_args(cls.openood_name) if cls.openood_name else {}

    @property
    def fit_size(self) -> int | None:
        value = self.params.get(FIT_SIZE)
        return None if value is None else int(value)

    @classmethod
    def openood_adapt_args(cls, args: dict[str, Any], feature_dim: int) -> dict[str, Any]:
        """The ``postprocessor_args`` the ``openood`` backend passes to OpenOOD's class for this detector, given the
        network's feature width (unchanged by default)."""
        return args

    @classmethod
    def openood_adapt(cls, pp: Any) -> None:
        """Adapt the ``openood`` backend's constructed postprocessor to our [0, 1]-input networks (no-op by default)."""

    def fit(self, net: nn.Module, outputs: Outputs, labels: Tensor, batches: Batches) -> None:
        """Fit on ID training data: shared-pass ``outputs`` (logits, features) with ``labels``; ``batches``
        re-reads the same rows as ``(x, y)`` for detectors with their own pass."""

    def score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        """Confidence per sample of batch ``x`` (higher = more ID), from the shared-pass outputs ``out``."""
        raise NotImplementedError

    #: how :meth:`source_score` relates to :meth:`score` (the "source scale" column of docs/detectors.md):
    #: ``"same"``: this detector's confidence is OpenOOD's postprocessor's, value for value; ``"openood"``: it is
    #: not, and :meth:`source_score` computes OpenOOD's formula; ``"unchecked"``: not compared (a defence that
    #: gates the raw value, e.g. ``ross_<det>``, then reads this project's scale and says so)
    source_scale: ClassVar[str] = "unchecked"

    def source_score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        """The confidence on the scale of OpenOOD's postprocessor ``openood_name`` (where ``source_scale`` is
        ``"openood"``; else :meth:`score`): what a defence that is not scale-invariant reads, as its code does
        (ROSS's gate ``lambda / (MAD + 1e-12)``, Hekal et al. 2026, ``ross_postprocessor.py`` line 133)."""
        return self.score(net, x, out)

    def source_grad_score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        """:meth:`source_score` as a differentiable function of ``x`` (a differentiable detector's
        ``grad_score`` unless the subclass computes OpenOOD's formula)."""
        return self.grad_score(net, x, out)  # type: ignore[attr-defined]

    def tap_statistics(self, taps: list[Tensor]) -> Tensor:
        """For a fitting detector with ``needs_taps``: the per-sample statistics (``B x ...``) of one fit batch's
        tapped maps that :meth:`fit` reads as ``outputs.stats`` (the fit pass keeps them, never the maps)."""
        raise NotImplementedError(f"detector {self.name!r} reads no tapped maps when fitting")

    def fit_state(self) -> dict[str, Tensor] | None:
        """The fitted state as tensors, for the store (None: not stored; the detector refits from the fit pass)."""
        return None

    def load_fit_state(self, net: nn.Module, state: dict[str, Tensor]) -> None:
        """Restore a state from :meth:`fit_state` instead of fitting."""
        raise NotImplementedError(f"detector {self.name!r} has no stored fit state")

    def rows_needed(self, n: int) -> int:
        """How many of ``n`` available fit rows :meth:`fit` reads (``fit_size``, or fewer for a small bank)."""
        return n if self.fit_size is None else min(n, self.fit_size)

    def setup(self, net: nn.Module, id_loader_dict: dict[str, Any], ood_loader_dict: dict[str, Any]) -> None:
        """OpenOOD's ``setup``: fit on ``id_loader_dict['train']`` with this detector's own pass."""
        if not self.requires_fit:
            return
        loader = id_loader_dict["train"]
        self.device = net_device(net)
        self.batch_size = getattr(loader, "batch_size", None) or self.batch_size
        dataset = getattr(loader, "dataset", None)
        n = self.rows_needed(len(dataset)) if dataset is not None else self.fit_size
        batches = lambda: take_rows(iter_xy(loader), n)
        reducers = {self.name: self.tap_statistics} if self.needs_taps else None
        fit_pass = collect_outputs(net, batches(), self.device, reducers=reducers)
        self.fit(net, *fit_pass.for_detector(self.name, len(fit_pass.labels)), batches)

    def postprocess(self, net: nn.Module, data: Tensor) -> tuple[Tensor, Tensor]:
        """OpenOOD's ``postprocess``: ``(pred, conf)`` for one batch, with this detector's own pass."""
        data, graph, out = pass_outputs(net, data, self.needs_taps, self.needs_input_grad)
        return out.logits.argmax(1), self.score(net, data, graph)

    def inference(self, net: nn.Module, data_loader: Iterable, progress: bool = True):
        """OpenOOD's ``inference``: ``(pred, conf, label)`` numpy arrays over a loader."""
        device = net_device(net)
        preds, confs, labels = [], [], []
        for x, y in tqdm(iter_xy(data_loader), disable=not progress, leave=False):
            pred, conf = self.postprocess(net, x.to(device))
            preds.append(pred.cpu())
            confs.append(torch.as_tensor(conf).detach().reshape(-1).cpu().double())
            labels.append(torch.as_tensor(y).cpu())
        return (torch.cat(preds).numpy().astype(int), torch.cat(confs).numpy(),
                torch.cat(labels).numpy().astype(int))
