"""Post-hoc OOD detectors: OpenOOD's postprocessor interface, two backends, and the shared pass.

Every detector follows OpenOOD's ``BasePostprocessor`` interface: ``setup(net, id_loader_dict,
ood_loader_dict)``, ``postprocess(net, data) -> (pred, conf)`` with *higher conf = more in-distribution*,
and ``inference(net, loader) -> (pred, conf, label)``. Two backends implement the 16 built-in detectors:

* ``openood`` (default when ``import openood`` works): OpenOOD's own postprocessor classes, built from our
  copies of its YAML configs (``advopenood/configs/openood/*.yml``), so OpenOOD never tries to download a
  config. Its hard-coded ``.cuda()`` calls are redirected to the run's device, and the network is wrapped
  in ``ReactNet`` / ``ASHNet`` / ``ScaleNet`` for REACT / ASH / SCALE exactly as OpenOOD's ``Evaluator`` does.
* ``pytorch-ood`` (always available): the same detectors from the pytorch-ood package with OpenOOD's default
  hyperparameters mapped (see ``plugins/detectors.py`` and README.md, "Detectors").

:func:`score_all` scores every selected detector from *one* network pass per input batch (logits,
penultimate features and last-block maps are computed once and handed to each detector; GRAM reads every
tapped map of the same pass); only ODIN (input gradients) adds its own step. Fitting works the same way: one
pass over the fit set, shared by every detector that fits on ID data (GRAM keeps per-sample statistics of
the tapped maps, never the maps). With a :class:`~advopenood.scorecache.ScoreCache`, the fit pass, fitted
states, each scored set's logits and features, and score vectors are read back instead of recomputed; under
``torchrun`` the fit pass and the scoring are sharded by batch over the ranks.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn as nn
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, IterableDataset
from tqdm.auto import tqdm

from advopenood import registry
from advopenood.attacks import frozen
from advopenood.config import BACKENDS
from advopenood.data import Subset, make_loader, seeded_prefix
from advopenood.errors import UsageError
from advopenood.models import Classifier
from advopenood.scorecache import ScoreCache, detector_key, fit_pass_key, set_pass_key
from advopenood.store import canonical_key, distribution_version, seeded

OPENOOD_INSTALL = ("git clone https://github.com/Jingkang50/OpenOOD && pip install -e ./OpenOOD && "
                   "pip install 'advopenood[openood]'")
#: Extra parameter every detector accepts: fit on the first ``fit_size`` rows of the (seeded, shuffled) fit set.
FIT_SIZE = "fit_size"

Batches = Callable[[], Iterable[tuple[Tensor, Tensor]]]


# ----------------------------------------------------------------------------------------------- shared pass


@dataclass
class Outputs:
    """One network pass over a batch: logits ``B x K``, penultimate features ``B x D`` and, where the network
    exposes it, the last block's maps ``B x C x H x W`` (``None`` for fit-set outputs and a set's stored
    outputs, which keep logits and features only; a detector that reads them declares ``needs_maps``) and,
    when a detector asks for them (``needs_taps``), every ``nn.Conv2d`` / ``nn.ReLU`` output (:class:`Taps`);
    for a fitting detector, ``stats`` holds its per-sample statistics of those maps (``tap_statistics``)."""

    logits: Tensor
    features: Tensor
    maps: Tensor | None = None
    taps: list[Tensor] | None = None
    stats: Tensor | None = None

    def detached(self) -> Outputs:
        """The same outputs cut from the autograd graph (what detectors that do not differentiate read)."""
        cut = lambda t: None if t is None else t.detach()
        return Outputs(self.logits.detach(), self.features.detach(), cut(self.maps),
                       None if self.taps is None else [t.detach() for t in self.taps], cut(self.stats))

    def rows(self, index: Tensor | slice) -> Outputs:
        return Outputs(self.logits[index], self.features[index], None if self.maps is None else self.maps[index],
                       None if self.taps is None else [t[index] for t in self.taps],
                       None if self.stats is None else self.stats[index])


def grad_outputs(net: nn.Module, x: Tensor, keep_maps: bool = True, taps: bool = False) -> Outputs:
    """Logits, penultimate features and last-block maps of ``x`` in one pass, with gradients; with ``taps``,
    also every tapped map (:class:`Taps`, recorded by forward hooks during the same pass).

    Uses :meth:`advopenood.models.Classifier.forward_all` for our classifiers, and OpenOOD's network dialect
    ``net(x, return_feature=True)`` for any other network (e.g. an OpenOOD network inside OpenOOD's ``Evaluator``).
    """
    with Taps(net).recording() if taps else contextlib.nullcontext([]) as tapped:
        if isinstance(net, Classifier):
            logits, features, maps = net.forward_all(x)
            last = maps[-1] if keep_maps else None
        else:
            logits, features = net(x, return_feature=True)
            features, last = features.flatten(1), None
    return Outputs(logits, features, last, tapped if taps else None)


@torch.no_grad()
def forward_outputs(net: nn.Module, x: Tensor, keep_maps: bool = True, taps: bool = False) -> Outputs:
    """:func:`grad_outputs` without gradients: the shared pass."""
    return grad_outputs(net, x, keep_maps, taps)


def pass_outputs(net: nn.Module, x: Tensor, taps: bool, input_grad: bool) -> tuple[Tensor, Outputs, Outputs]:
    """One network pass over a batch: ``(x, graph, outputs)``. With ``input_grad`` (a detector that
    ``needs_input_grad`` scores) ``x`` comes back as a leaf requiring grad, ``graph`` carries the autograd graph
    (parameters frozen: only the input gradient can be taken) and ``outputs`` is it detached; otherwise both are
    :func:`forward_outputs`."""
    if not input_grad:
        out = forward_outputs(net, x, taps=taps)
        return x, out, out
    with torch.inference_mode(False), torch.enable_grad(), frozen(net):
        x = (x.clone() if torch.is_inference(x) else x).detach().requires_grad_()
        graph = grad_outputs(net, x, taps=taps)
    return x, graph, graph.detached()


def fc_layer(net: nn.Module) -> nn.Linear:
    """The final linear layer: ``get_fc_layer()`` (our classifiers and OpenOOD's networks), else ``net.fc`` (a
    foreign network in torchvision's dialect). The one place a network's dialect is read."""
    get = getattr(net, "get_fc_layer", None)
    return get() if callable(get) else net.fc


def net_device(net: nn.Module) -> torch.device:
    """The device of the network's first parameter (CPU for a parameter-free network)."""
    param = next(iter(net.parameters()), None)
    return param.device if param is not None else torch.device("cpu")


def iter_xy(loader: Iterable) -> Iterator[tuple[Tensor, Tensor]]:
    """``(x, y)`` batches from a loader yielding tuples or OpenOOD's ``{'data', 'label'}`` dicts."""
    for batch in loader:
        if isinstance(batch, dict):
            yield batch["data"], batch["label"]
        else:
            yield batch[0], batch[1]


@dataclass
class FitPass:
    """The shared pass over the fit rows: logits and features (``outputs``), labels, and per fitting detector
    that reads tapped maps its per-sample statistics (``stats[name]``); ``batches``: the indices of the batches
    covered, ``sizes`` their row counts."""

    outputs: Outputs
    labels: Tensor
    stats: dict[str, Tensor] = field(default_factory=dict)
    batches: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)

    def for_detector(self, name: str, n: int) -> tuple[Outputs, Tensor]:
        """The first ``n`` rows as a detector's fit input (its statistics in ``stats``)."""
        out = self.outputs.rows(slice(0, n))
        out.stats = self.stats[name][:n] if name in self.stats else None
        return out, self.labels[:n]

    def to(self, device: torch.device) -> FitPass:
        """The same pass with every tensor on ``device`` (labels stay on the CPU)."""
        return FitPass(Outputs(self.outputs.logits.to(device), self.outputs.features.to(device)), self.labels.cpu(),
                       {k: v.to(device) for k, v in self.stats.items()}, self.batches, self.sizes)

    def chunks(self) -> Iterator[tuple[int, FitPass]]:
        """``(batch index, that batch's rows)`` in stored order."""
        start = 0
        for b, n in zip(self.batches, self.sizes):
            rows = slice(start, start + n)
            yield b, FitPass(self.outputs.rows(rows), self.labels[rows], {k: v[rows] for k, v in self.stats.items()})
            start += n


def merge_fit_passes(parts: Iterable[FitPass]) -> FitPass:
    """Concatenate fit-pass shares (one per rank) in batch order: the same rows as one process's pass."""
    chunks = sorted((chunk for part in parts for chunk in part.chunks()), key=lambda c: c[0])
    if not chunks:
        raise UsageError("the fit set is empty; detectors that fit on ID data need at least one training image")
    whole = [c for _, c in chunks]
    return FitPass(Outputs(torch.cat([c.outputs.logits for c in whole]), torch.cat([c.outputs.features for c in whole])),
                   torch.cat([c.labels for c in whole]),
                   {k: torch.cat([c.stats[k] for c in whole]) for k in whole[0].stats},
                   [b for b, _ in chunks], [len(c.labels) for c in whole])


def collect_outputs(net: nn.Module, batches: Iterable[tuple[Tensor, Tensor]], device: torch.device,
                    desc: str = "fit pass", progress: bool = False,
                    reducers: dict[str, Callable[[list[Tensor]], Tensor]] | None = None,
                    select: Callable[[int], bool] | None = None) -> FitPass:
    """Concatenated logits and features (no maps) of every batch, the labels (on the CPU) and, per entry of
    ``reducers``, the per-sample statistics it computes from the tapped maps (the pass records them only then).
    ``select`` keeps only the batches whose index it accepts (a rank's share under torchrun)."""
    reducers = reducers or {}
    logits, features, labels, index = [], [], [], []
    stats: dict[str, list[Tensor]] = {k: [] for k in reducers}
    for b, (x, y) in enumerate(tqdm(batches, desc=desc, unit="batch", disable=not progress, leave=False)):
        if select is not None and not select(b):
            continue
        out = forward_outputs(net, x.to(device), keep_maps=False, taps=bool(reducers))
        logits.append(out.logits)
        features.append(out.features)
        labels.append(torch.as_tensor(y).cpu())
        index.append(b)
        for key, reduce in reducers.items():
            stats[key].append(reduce(out.taps))
    if not labels and select is None:
        raise UsageError("the fit set is empty; detectors that fit on ID data need at least one training image")
    cat = lambda parts: torch.cat(parts) if parts else torch.empty(0)
    return FitPass(Outputs(cat(logits), cat(features)), cat(labels).long(), {k: cat(v) for k, v in stats.items()},
                   index, [len(t) for t in labels])


def take_rows(batches: Iterable[tuple[Tensor, Tensor]], n: int | None) -> Iterator[tuple[Tensor, Tensor]]:
    """The first ``n`` rows of a batch stream (all rows when ``n`` is None)."""
    left = n
    for x, y in batches:
        if left is not None:
            if left <= 0:
                return
            x, y = x[:left], y[:left]
            left -= len(y)
        yield x, y


class Taps:
    """Records the output of every ``nn.Conv2d`` and ``nn.ReLU`` module in call order during a forward pass.

    These are the layers OpenOOD's GRAM ``FeatureExtractor`` hooks (inspired by paaatcha/gram-ood). A network
    that declares its own layers (``tap_modules()``, e.g. a transformer's stage or block outputs) is read there.
    """

    def __init__(self, net: nn.Module):
        self.net = net
        declared = net.tap_modules() if hasattr(net, "tap_modules") else None
        self.layers = declared or [m for m in net.modules() if isinstance(m, (nn.Conv2d, nn.ReLU))]

    @torch.no_grad()
    def __call__(self, x: Tensor) -> tuple[Tensor, list[Tensor]]:
        return self.forward(x)

    def forward(self, x: Tensor) -> tuple[Tensor, list[Tensor]]:
        """Logits and the tapped maps, differentiable (``__call__`` is the same without gradients)."""
        with self.recording() as maps:
            logits = self.net(x)
        return logits, maps

    @contextlib.contextmanager
    def recording(self) -> Iterator[list[Tensor]]:
        """Hooks on every tapped layer for the duration; the list fills with their outputs in call order."""
        if not self.layers:
            raise ValueError("the network has no nn.Conv2d or nn.ReLU layers for GRAM to read")
        maps: list[Tensor] = []
        handles = [m.register_forward_hook(lambda _m, _i, out: maps.append(out)) for m in self.layers]
        try:
            yield maps
        finally:
            for h in handles:
                h.remove()


@contextlib.contextmanager
def cuda_redirect(device: torch.device) -> Iterator[None]:
    """Make ``Tensor.cuda()`` mean ``Tensor.to(device)`` (OpenOOD hard-codes ``.cuda()``); restored after."""
    original = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *args, **kwargs: self.to(device)
    try:
        yield
    finally:
        torch.Tensor.cuda = original


# -------------------------------------------------------------------------------------------- the interface


@cache
def openood_config(name: str) -> dict[str, Any]:
    """Our copy of OpenOOD's ``configs/postprocessors/<name>.yml`` as a dict."""
    import yaml

    path = resources.files("advopenood.configs") / "openood" / f"{name}.yml"
    if not path.is_file():
        raise UsageError(f"no OpenOOD config shipped for detector {name!r}")
    return yaml.safe_load(path.read_text())


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
    #: the network wrapper OpenOOD's ``Evaluator`` runs this detector on (module, class), for the ``openood`` backend
    openood_wrapper: ClassVar[tuple[str, str] | None] = None
    #: fits on ID training data (``setup`` / :meth:`fit`)
    requires_fit: ClassVar[bool] = False
    #: needs input gradients or intermediate maps: scored with its own network pass
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

    @property
    def name(self) -> str:
        return self.openood_name or type(self).__name__.lower()

    @classmethod
    def default_params(cls) -> dict[str, Any]:
        """OpenOOD's ``postprocessor_args`` for this detector (from our YAML copy)."""
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


# ------------------------------------------------------------------------------------------ openood backend


def openood_importable() -> tuple[bool, str]:
    """Whether OpenOOD's postprocessors import, and why not."""
    try:
        importlib.import_module("openood.evaluation_api.postprocessor")
    except Exception as exc:  # any import-time failure of OpenOOD means the backend is unavailable
        return False, f"{type(exc).__name__}: {exc}"
    return True, ""


def resolve_backend(backend: str) -> str:
    """``auto`` -> ``openood`` when OpenOOD imports, else ``pytorch-ood``; validate explicit choices."""
    key = (backend or "auto").strip().lower()
    if key not in BACKENDS:
        raise UsageError(f"unknown detector backend {backend!r}; valid choices: {', '.join(BACKENDS)}")
    if key == "pytorch-ood":
        return key
    ok, why = openood_importable()
    if key == "auto":
        if not ok and importlib.util.find_spec("openood") is not None:
            warnings.warn(f"advopenood: OpenOOD is installed but its postprocessors do not import ({why}); "
                          "using the pytorch-ood backend", stacklevel=2)
        return "openood" if ok else "pytorch-ood"
    if not ok:
        raise UsageError(f"detector backend 'openood' needs OpenOOD, which does not import ({why}); install it with: "
                         f"{OPENOOD_INSTALL}; or choose --detector-backend pytorch-ood")
    return key


def openood_dataset_name(num_classes: int) -> str:
    """An OpenOOD dataset name with ``num_classes`` classes (OpenOOD sizes MDS/RMDS/KLM/GRAM from it)."""
    return {10: "cifar10", 100: "cifar100", 200: "imagenet200", 1000: "imagenet"}.get(num_classes, "cifar10")


def make_openood_postprocessor(name: str, args: dict[str, Any], num_classes: int):
    """OpenOOD's postprocessor ``name`` built from our YAML copy with ``args`` overriding its defaults."""
    from openood.evaluation_api.postprocessor import postprocessors
    from openood.utils.config import Config

    raw = openood_config(name)
    pp_cfg = dict(raw["postprocessor"])
    pp_cfg["postprocessor_args"] = {**(pp_cfg.get("postprocessor_args") or {}), **args}
    config = Config({"postprocessor": pp_cfg, "dataset": {"name": openood_dataset_name(num_classes)}})
    pp = postprocessors[name](config)
    pp.APS_mode = config.postprocessor.APS_mode
    pp.hyperparam_search_done = False
    if hasattr(pp, "num_classes"):
        pp.num_classes = num_classes
    return pp


def wrap_openood_net(wrapper: tuple[str, str] | None, net: nn.Module) -> nn.Module:
    """``net`` in the OpenOOD wrapper a detector declares (``openood_wrapper``: module and class, e.g. ReactNet for
    REACT, as OpenOOD's ``Evaluator.__init__`` wraps it), or ``net`` itself."""
    if wrapper is None:
        return net
    module, cls = wrapper
    return getattr(importlib.import_module(module), cls)(net)


class CachedNet(nn.Module):
    """OpenOOD's network dialect answered from the shared pass.

    ``load(x, out)`` caches the current batch; ``net(x)``, ``net(x, return_feature=True)`` and
    ``forward_threshold`` on that same tensor return (copies of) the cached logits and features, so
    OpenOOD's postprocessors run unchanged without another pass. A 1-D tensor is read as row indices
    into the fit-set outputs (the fit loader yields those instead of images). Anything else runs the
    real network.
    """

    def __init__(self, model: nn.Module, fit: Outputs | None = None):
        super().__init__()
        self.model = model
        self.fit_outputs = fit
        self._batch: tuple[Tensor, Outputs] | None = None

    def load(self, x: Tensor, out: Outputs) -> None:
        self._batch = (x, out)

    def clear(self) -> None:
        self._batch = None

    def _outputs(self, x: Tensor) -> Outputs:
        if x.dim() == 1 and self.fit_outputs is not None:
            rows = x.long().to(self.fit_outputs.logits.device)
            return self.fit_outputs.rows(rows)
        if self._batch is not None:
            cached_x, out = self._batch
            if x is cached_x or (x.shape == cached_x.shape and x.device == cached_x.device
                                 and x.data_ptr() == cached_x.data_ptr()):
                return out
        return forward_outputs(self.model, x)

    def forward(self, x: Tensor, return_feature: bool = False, return_feature_list: bool = False):
        if return_feature_list:
            return self.model(x, return_feature_list=True)
        out = self._outputs(x)
        logits, features = out.logits.clone(), out.features.clone()
        return (logits, features) if return_feature else logits

    def forward_threshold(self, x: Tensor, threshold: float) -> Tensor:
        return self.get_fc_layer()(self._outputs(x).features.clip(max=threshold))

    @property
    def fc(self) -> nn.Linear:
        return self.get_fc_layer()

    def get_fc(self):
        layer = self.get_fc_layer()
        return layer.weight.detach().cpu().numpy(), layer.bias.detach().cpu().numpy()

    def get_fc_layer(self) -> nn.Linear:
        return fc_layer(self.model)


class _RowDataset(Dataset):
    """Fit-set rows as OpenOOD batches: ``data`` is the row index (served by :class:`CachedNet`)."""

    def __init__(self, labels: Tensor):
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        return {"data": torch.tensor(i), "label": self.labels[i]}


class _DictBatches(IterableDataset):
    """Image batches streamed as OpenOOD's ``{'data', 'label'}`` dicts (for detectors with their own fit pass)."""

    def __init__(self, batches: Batches):
        self.batches = batches

    def __iter__(self) -> Iterator[dict[str, Tensor]]:
        for x, y in self.batches():
            yield {"data": x, "label": torch.as_tensor(y)}


class OpenOODPostprocessor(Postprocessor):
    """One of OpenOOD's own postprocessors (unchanged), fed by the shared pass through :class:`CachedNet`.

    Adaptations, all documented in README.md ("Detectors"): no automatic parameter search (APS needs an OOD
    validation set; the YAML's ``postprocessor_args`` are used, as with ``APS_mode: False``); ID "val" data
    (KLM, REACT) is the fit set; ODIN's gradient is not divided by the normalisation std, because our
    networks take [0, 1] pixels (the step stays ``noise`` in pixel units, as in OpenOOD); ViM's ``dim``
    falls back to half the feature width when OpenOOD's 256 leaves no residual (:func:`vim_dim`).
    """

    def __init__(self, declared: type[Postprocessor], **params: Any):
        self._openood_name = str(declared.openood_name)
        self.declared = declared
        super().__init__(**params)
        self.pp = None
        self._cached: CachedNet | None = None
        self._net: nn.Module | None = None

    @property
    def name(self) -> str:
        return self._openood_name

    def default_params(self) -> dict[str, Any]:  # type: ignore[override]
        return openood_args(self._openood_name)

    @property
    def requires_fit(self) -> bool:  # type: ignore[override]
        """As the registered detector declares."""
        return self.declared.requires_fit

    @property
    def own_pass(self) -> bool:  # type: ignore[override]
        """As declared, and also for a detector that reads tapped maps: :class:`CachedNet` serves logits and
        features only, so OpenOOD's own implementation must run the real network."""
        return self.declared.own_pass or self.declared.needs_taps

    def _build(self, net: nn.Module, outputs: Outputs | None) -> None:
        """Construct OpenOOD's postprocessor for ``net`` and adapt it to [0, 1] inputs and the feature width."""
        fc = fc_layer(net)
        args = self.declared.openood_adapt_args({k: v for k, v in self.params.items() if k != FIT_SIZE}, fc.in_features)
        self.pp = make_openood_postprocessor(self._openood_name, args, fc.out_features)
        self.declared.openood_adapt(self.pp)
        self._cached = CachedNet(net, outputs)
        self._net = net if self.own_pass else wrap_openood_net(self.declared.openood_wrapper, self._cached)

    def fit(self, net: nn.Module, outputs: Outputs, labels: Tensor, batches: Batches) -> None:
        self._build(net, outputs)
        if self.own_pass:  # OpenOOD's fit runs the real network: images, not shared-pass rows
            loader = DataLoader(_DictBatches(batches), batch_size=None)
        else:
            loader = DataLoader(_RowDataset(labels), batch_size=self.batch_size)
        with _openood_call(self.device, self.progress), seeded(self.seed):
            self.pp.setup(self._net, {"train": loader, "val": loader}, {})
        self._cached.fit_outputs = None

    def score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        if self.pp is None:
            self._build(net, None)
        with _openood_call(self.device, self.progress):
            if self.own_pass:
                with frozen(net):
                    _, conf = self.pp.postprocess(net, x.detach().clone())
            else:
                self._cached.load(x, out)
                try:
                    _, conf = self.pp.postprocess(self._net, x)
                finally:
                    self._cached.clear()
        return torch.as_tensor(conf).detach().reshape(-1)

    def setup(self, net: nn.Module, id_loader_dict: dict[str, Any], ood_loader_dict: dict[str, Any]) -> None:
        """OpenOOD's own ``setup`` on the real network (the per-detector path); it reads the loaders whole,
        so ``fit_size`` applies only in :func:`score_all`."""
        self.device = net_device(net)
        self._build(net, None)
        self._net = net if self.own_pass else wrap_openood_net(self.declared.openood_wrapper, net)
        with _openood_call(self.device, self.progress), seeded(self.seed):
            self.pp.setup(self._net, id_loader_dict, ood_loader_dict)

    def postprocess(self, net: nn.Module, data: Tensor) -> tuple[Tensor, Tensor]:
        if self.pp is None:
            self._build(net, None)
            self._net = net if self.own_pass else wrap_openood_net(self.declared.openood_wrapper, net)
        with _openood_call(self.device, self.progress):
            if self.own_pass:
                with frozen(net):
                    pred, conf = self.pp.postprocess(net, data.detach().clone())
            else:
                pred, conf = self.pp.postprocess(self._net, data)
        return pred, torch.as_tensor(conf).detach().reshape(-1)


class _Null:
    """A write-only sink for OpenOOD's prints and progress bars."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


@contextlib.contextmanager
def _openood_call(device: torch.device, progress: bool) -> Iterator[None]:
    """Around every call into OpenOOD: ``.cuda()`` -> ``device``, its prints muted, its tqdm bars too unless ``progress``."""
    with cuda_redirect(device), contextlib.redirect_stdout(_Null()), \
            (contextlib.nullcontext() if progress else contextlib.redirect_stderr(_Null())):
        yield


# ---------------------------------------------------------------------------------------- creating detectors


class _PlainDetector(Postprocessor):
    """A third-party class with only OpenOOD's interface: ``setup`` on the fit loader, ``postprocess`` per batch."""

    own_pass = True
    requires_fit = True
    shared_fit = False

    def __init__(self, name: str, inner: Any):
        self._name = name
        self.inner = inner
        self.params = {}

    @property
    def name(self) -> str:
        return self._name

    def fit(self, net: nn.Module, outputs: Outputs, labels: Tensor, batches: Batches) -> None:
        if hasattr(self.inner, "setup"):
            loader = DataLoader(_DictBatches(batches), batch_size=None)
            with cuda_redirect(self.device):
                self.inner.setup(net, {"train": loader, "val": loader}, {})

    def score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        with cuda_redirect(self.device):
            _, conf = self.inner.postprocess(net, x)
        return torch.as_tensor(conf).detach().reshape(-1)


def _construct_plain(name: str, obj: Any, params: dict[str, Any], num_classes: int) -> Any:
    """Instantiate a third-party detector: OpenOOD ``BasePostprocessor`` subclasses get a ``Config``."""
    if not inspect.isclass(obj):
        return obj
    try:
        from openood.postprocessors import BasePostprocessor
    except Exception:  # OpenOOD absent: the class cannot be one of its postprocessors
        BasePostprocessor = None
    if BasePostprocessor is not None and issubclass(obj, BasePostprocessor):
        from openood.utils.config import Config

        return obj(Config({"postprocessor": {"name": name, "APS_mode": False, "postprocessor_args": dict(params),
                                             "postprocessor_sweep": {}},
                           "dataset": {"name": openood_dataset_name(num_classes)}}))
    return obj(**params)


def create_detector(name: str, backend: str, params: dict[str, Any] | None = None, *, num_classes: int = 10,
                    device: torch.device | str = "cpu", seed: int = 0, batch_size: int = 128,
                    progress: bool = False) -> Postprocessor:
    """The detector registered as ``name`` for a resolved ``backend``; unknown names raise a UsageError."""
    obj = registry.get("detectors", name)
    params = dict(params or {})
    key = name.strip().lower()
    if backend == "openood" and inspect.isclass(obj) and issubclass(obj, Postprocessor) and obj.openood_name:
        det: Postprocessor = OpenOODPostprocessor(obj, **params)
    elif inspect.isclass(obj) and issubclass(obj, Postprocessor):
        det = obj(**params)
    else:
        det = _PlainDetector(key, _construct_plain(key, obj, params, num_classes))
    det.device = torch.device(device)
    det.seed = int(seed)
    det.batch_size = int(batch_size)
    det.progress = bool(progress)
    return det


def backend_label(name: str, resolved: str) -> str:
    """What computes detector ``name``'s scores, for the ``backend`` column: ``openood`` (OpenOOD's own class),
    ``pytorch-ood`` (a built-in implementation, checked against pytorch-ood), or ``plugin:<distribution==version>``
    (``plugin:<module>`` when no installed distribution ships it) for a third party's detector."""
    obj = registry.get("detectors", name)
    cls = obj if inspect.isclass(obj) else type(obj)
    module = cls.__module__
    if module.split(".")[0] == "openood" or (resolved == "openood" and issubclass(cls, Postprocessor)
                                               and cls.openood_name and module.startswith("advopenood_plugins")):
        return "openood"
    if module.startswith("advopenood_plugins"):
        return "pytorch-ood"
    return f"plugin:{distribution_version(cls) or module}"


# ----------------------------------------------------------------------------------------------- score_all


@dataclass
class ScoreResult:
    """Per-sample confidences ``scores[detector][set]`` (float64, set order), skipped detectors with a
    one-line reason, the resolved backend, seconds spent per detector (fit + score, shared pass apart) and
    the fitted :class:`DetectorBank`, which scores further sets.

    ``work`` (``run.json``'s ``detector_work``): ``fitted`` detectors set up this run vs ``fits_reused`` (all
    their score vectors stored); of those set up, ``fits_computed`` ran their fit and ``fit_states_reused``
    read a stored fitted state; ``fit_pass_computed`` / ``fit_pass_reused`` whether the fit pass ran or was
    read back; ``set_passes_computed`` / ``set_passes_reused`` scored sets whose network pass ran or whose
    stored logits and features were read back (one process only; see :func:`score_all`);
    ``score_sets_computed`` / ``score_sets_reused`` (detector, set) score vectors."""

    scores: dict[str, dict[str, np.ndarray]]
    errors: dict[str, str]
    backend: str
    seconds: dict[str, float] = field(default_factory=dict)
    bank: DetectorBank | None = None
    work: dict[str, int] = field(default_factory=dict)
    #: the traceback of each failure in ``errors`` (for the run's log file; ``errors`` holds one line each)
    traces: dict[str, str] = field(default_factory=dict)
    #: what computed each detector's scores (:func:`backend_label`)
    backends: dict[str, str] = field(default_factory=dict)


def _reason(stage: str, exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{stage} failed: {type(exc).__name__}: {text[:300]}"


def _fail(errors: dict[str, str], traces: dict[str, str], key: str, stage: str, exc: BaseException) -> None:
    """Record a detector's failure: one line in ``errors``, the current traceback in ``traces``."""
    errors[key] = _reason(stage, exc)
    traces[key] = traceback.format_exc()


def fit_rows(n: int, fit_size: int | None, seed: int) -> np.ndarray:
    """Fit-set rows in a seeded random order, the first ``fit_size`` of them (all when None).

    Every detector fits on a prefix of the same order, so one pass serves all fit sizes, and NNGuide's
    1 % bank (the first rows, as in OpenOOD) is a seeded random subset even when the data is class-sorted.
    """
    return seeded_prefix(n, fit_size, seed, sort=False)


def fit_subset(fit_set: Dataset, seed: int, fit_size: int | None = None) -> Subset:
    """The fit rows :func:`score_all` uses, in its order (:func:`fit_rows`)."""
    return Subset(fit_set, fit_rows(len(fit_set), fit_size, seed))


def reads_outputs_only(det: Postprocessor) -> bool:
    """Whether a detector scores from a batch's logits and features alone (no own pass, taps, input gradient or
    maps), so that a set's stored outputs can stand in for the network pass."""
    return not (det.own_pass or det.needs_taps or det.needs_input_grad or det.needs_maps)


class DetectorBank:
    """Fitted detectors that score any set with one shared network pass per batch (:func:`fit_detectors`).

    A run keeps its bank (``RunContext.bank``), so analyses score new sets (e.g. adversarial examples they
    make themselves) without fitting again. A detector that fails to score is dropped with its reason in ``errors``.
    ``work`` counts the fit work done and read back (:func:`fit_detectors`).
    """

    def __init__(self, model: nn.Module, dets: dict[str, Postprocessor], order: list[str], errors: dict[str, str],
                 backend: str, device: torch.device, seconds: dict[str, float], work: dict[str, int] | None = None):
        self.model, self.dets, self.order, self.errors = model, dets, order, errors
        self.backend, self.device, self.seconds = backend, device, seconds
        self.work = dict(work or {})
        self.traces: dict[str, str] = {}

    @property
    def names(self) -> list[str]:
        """Detectors that are fitted and have not failed, in the requested order."""
        return [k for k in self.order if k in self.dets]

    def score_batches(self, set_name: str, batches: Iterable[tuple[Tensor, Tensor]], only: Iterable[str] | None = None,
                      progress: bool = True, select: Callable[[int], bool] | None = None,
                      stored: Outputs | None = None, record: list[Outputs] | None = None
                      ) -> dict[str, dict[int, np.ndarray]]:
        """``scores[detector][batch index]`` (float64) for the batches of one set that ``select`` accepts (all
        by default: under torchrun, a rank's share), one shared network pass per batch.

        ``stored``: the whole set's logits and features from an earlier pass (:func:`reads_outputs_only`
        detectors only); each batch's rows are read from it instead of a network pass. ``record``: a list that
        receives each batch's logits and features (on the CPU), for the store."""
        chosen = None if only is None else set(only)
        active = [k for k in self.dets if chosen is None or k in chosen]
        taps = any(self.dets[k].needs_taps for k in active)
        parts: dict[str, dict[int, np.ndarray]] = {k: {} for k in active}
        offset = 0
        for b, (x, _) in enumerate(tqdm(batches, desc=f"score {set_name}", unit="batch", disable=not progress,
                                        leave=False)):
            if not active:
                break
            rows = slice(offset, offset + len(x))
            offset += len(x)
            if select is not None and not select(b):
                continue
            if stored is not None:
                if rows.stop > len(stored.logits):
                    raise ValueError(f"the stored pass of {set_name!r} has {len(stored.logits)} rows; the set has more")
                x, out = x.to(self.device), stored.rows(rows)
                graph = out
            else:
                x, graph, out = pass_outputs(self.model, x.to(self.device), taps,
                                             any(self.dets[k].needs_input_grad for k in active))
                if record is not None:
                    record.append(Outputs(out.logits.cpu(), out.features.cpu()))
            for key in list(active):
                start = time.perf_counter()
                try:
                    det = self.dets[key]
                    conf = det.score(self.model, x, graph if det.needs_input_grad else out)
                    conf = torch.as_tensor(conf).detach().reshape(-1).cpu().double().numpy()
                    if len(conf) != len(x):
                        raise ValueError(f"{len(conf)} scores for a batch of {len(x)}")
                    parts[key][b] = conf
                except Exception as exc:  # skipped with its reason
                    self.traces[key] = traceback.format_exc()
                    self.drop(key, _reason(f"scoring {set_name!r}", exc))
                    active.remove(key)
                    parts.pop(key)
                self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - start
        if stored is not None and active and offset != len(stored.logits):
            raise ValueError(f"the stored pass of {set_name!r} has {len(stored.logits)} rows; the set has {offset}")
        return parts

    def drop(self, key: str, reason: str) -> None:
        """Skip a detector from now on, with its reason in ``errors``."""
        self.errors[key] = reason
        self.dets.pop(key, None)

    def score(self, sets: dict[str, Callable[[], Iterable[tuple[Tensor, Tensor]]]], progress: bool = True,
              only: Iterable[str] | None = None) -> dict[str, dict[str, np.ndarray]]:
        """``scores[detector][set]`` (float64, sample order) for zero-argument callables yielding ``(x, y)``;
        ``only`` restricts the detectors."""
        chosen = None if only is None else set(only)
        scores: dict[str, dict[str, np.ndarray]] = {k: {} for k in self.dets if chosen is None or k in chosen}
        for set_name, make_batches in sets.items():
            for key, by_batch in self.score_batches(set_name, make_batches(), list(scores), progress).items():
                scores[key][set_name] = join_batches(by_batch)
        return {k: scores[k] for k in self.order if k in scores and k in self.dets}


def join_batches(by_batch: dict[int, np.ndarray]) -> np.ndarray:
    """One score vector from per-batch scores, in batch order."""
    return np.concatenate([by_batch[b] for b in sorted(by_batch)]) if by_batch else np.zeros(0, dtype=np.float64)


class LazyBank(DetectorBank):
    """A :class:`DetectorBank` whose detectors are fitted on first need: a run whose scores all come from the
    store fits nothing, and an analysis that scores new sets (``score``, ``dets``) fits them then."""

    def __init__(self, fit: Callable[[list[str]], DetectorBank], order: list[str], errors: dict[str, str],
                 backend: str, model: nn.Module, device: torch.device):
        super().__init__(model, {}, order, errors, backend, device, {})
        self._fit, self._fitted = fit, set()

    def fit(self, names: Iterable[str]) -> None:
        """Fit the named detectors that are not fitted yet (failures go to ``errors``)."""
        todo = [k for k in names if k not in self._fitted and k not in self.errors]
        if todo:
            bank = self._fit(todo)
            self._fitted |= set(todo)
            self.dets.update(bank.dets)
            self.errors.update(bank.errors)
            self.traces.update(bank.traces)
            for k, v in bank.seconds.items():
                self.seconds[k] = self.seconds.get(k, 0.0) + v
            for k, v in bank.work.items():
                self.work[k] = self.work.get(k, 0) + v

    @property
    def names(self) -> list[str]:
        return [k for k in self.order if k not in self.errors]

    def fit_all(self) -> None:
        self.fit(self.order)

    def score(self, sets: dict[str, Callable[[], Iterable[tuple[Tensor, Tensor]]]], progress: bool = True,
              only: Iterable[str] | None = None) -> dict[str, dict[str, np.ndarray]]:
        self.fit(self.order if only is None else list(only))
        return super().score(sets, progress, only)


def _barrier(world_size: int) -> None:
    if world_size > 1:
        import torch.distributed as dist

        dist.barrier()


def check_detectors(names: list[str], params: dict[str, dict] | None) -> dict[str, dict]:
    """Raise a UsageError for an unknown detector, parameters for an unknown detector, or an unknown parameter of
    a built-in detector (its ``Postprocessor`` class checks them); returns ``params`` keyed by lower-case name.
    Cheap, so a run calls it before any work."""
    params = {str(k).lower(): dict(v or {}) for k, v in (params or {}).items()}
    for key in [n.strip().lower() for n in names]:
        obj = registry.get("detectors", key)
        if inspect.isclass(obj) and issubclass(obj, Postprocessor):
            obj(**params.get(key, {}))
    stray = sorted(set(params) - set(registry.names("detectors")))
    if stray:
        raise UsageError(f"parameters given for unknown detector {stray[0]!r}; "
                         f"valid choices: {', '.join(registry.names('detectors'))}")
    return params


#: Fit work counters of :func:`fit_detectors` (``DetectorBank.work``), all zero.
FIT_WORK = {"fits_computed": 0, "fit_states_reused": 0, "fit_pass_computed": 0, "fit_pass_reused": 0}


def _detector_key(det: Postprocessor, key: str, backend: str, model_hash: str, fit_set: Dataset, seed: int,
                  batch_size: int) -> str:
    return detector_key(model_hash=model_hash, name=key, backend=backend, detector=det, params=det.params,
                        fit_identity=fit_set.identity(), seed=seed, batch_size=batch_size)


def run_fit_pass(model: nn.Module, fit_data: Dataset, *, batch_size: int, device: torch.device,
                 reducers: dict[str, Callable[[list[Tensor]], Tensor]], cache: ScoreCache | None, model_hash: str,
                 rank: int = 0, world_size: int = 1, progress: bool = True) -> tuple[FitPass, bool]:
    """The shared fit pass, and whether it was computed (False: read from the store).

    Logits, features and labels are stored (never the tap statistics, which only fitting detectors without a
    stored state need: then the pass runs again with taps). Under torchrun each rank runs the batches
    ``b % world_size == rank`` and the ranks exchange their shares through the store.
    """
    key = fit_pass_key(model_hash=model_hash, model=model, fit_identity=fit_data.identity(), batch_size=batch_size)
    if cache is not None and not reducers:
        stored = cache.load_tensors("fitpass", key)
        if stored is not None:
            return FitPass(Outputs(stored["logits"], stored["features"]), stored["labels"]).to(device), False
    loader = make_loader(fit_data, batch_size)
    if cache is None or world_size == 1:
        result = collect_outputs(model, loader, device, desc="fit pass", progress=progress, reducers=reducers)
    else:
        share = collect_outputs(model, loader, device, desc="fit pass", progress=progress, reducers=reducers,
                                select=lambda b: b % world_size == rank)
        run_key = canonical_key({"fit-pass": key, "stats": sorted(reducers), "world": world_size})
        cache.save_part(run_key, rank, share.to(torch.device("cpu")))
        _barrier(world_size)
        result = merge_fit_passes(cache.load_parts(run_key, world_size)).to(device)
        _barrier(world_size)
        if rank == 0:
            cache.drop_parts(run_key)
    if cache is not None and rank == 0:
        cache.save_tensors("fitpass", key, {"logits": result.outputs.logits, "features": result.outputs.features,
                                            "labels": result.labels})
    return result, True


def fit_detectors(names: list[str], backend: str, model: nn.Module, fit_set: Dataset, *, batch_size: int,
                  device: torch.device, seed: int, params: dict[str, dict] | None = None,
                  progress: bool = True, cache: ScoreCache | None = None, model_hash: str = "",
                  rank: int = 0, world_size: int = 1, refit: set[str] | None = None) -> DetectorBank:
    """Build and fit every detector in ``names`` with one shared pass over the fit set.

    A detector that fails to build or fit is skipped with its reason in ``errors``; the others go on.
    An unknown detector name (or parameter) raises :class:`~advopenood.errors.UsageError` before any work.
    With a ``cache``, stored fitted states are read back and the fit pass's outputs too when no detector left
    to fit needs the tapped maps; the bank's ``work`` counts ``fits_computed``, ``fit_states_reused``,
    ``fit_pass_computed`` and ``fit_pass_reused``. Under torchrun (``world_size > 1``, with a cache) every
    rank calls this; the fit pass is sharded by batch and every rank ends with the same fitted detectors.
    ``refit``: detectors fitted again even when a fitted state is stored.
    """
    resolved = resolve_backend(backend)
    params = check_detectors(names, params)
    keys = [n.strip().lower() for n in names]
    device = torch.device(device)
    num_classes = fc_layer(model).out_features
    dets: dict[str, Postprocessor] = {}
    errors: dict[str, str] = {}
    traces: dict[str, str] = {}
    seconds: dict[str, float] = {}
    work = dict(FIT_WORK)
    for key in keys:
        try:
            dets[key] = create_detector(key, resolved, params.get(key), num_classes=num_classes, device=device,
                                        seed=seed, batch_size=batch_size, progress=progress)
        except UsageError:
            raise
        except Exception as exc:  # a broken detector is skipped, never fatal for the others
            _fail(errors, traces, key, "construction", exc)
    model.eval()

    fitting = [k for k, d in dets.items() if d.requires_fit]
    det_keys = {k: _detector_key(dets[k], k, resolved, model_hash, fit_set, seed, batch_size) for k in fitting} \
        if cache is not None else {}
    for key in list(fitting):
        if key in (refit or ()):
            continue
        state = cache.load_tensors(f"state-{key}", det_keys[key]) if cache is not None else None
        if state is not None:
            dets[key].load_fit_state(model, state)
            fitting.remove(key)
            work["fit_states_reused"] += 1
    if fitting:
        sizes = [dets[k].fit_size for k in fitting]
        fit_data = fit_subset(fit_set, seed, None if None in sizes else max(sizes))
        fit_pass = FitPass(Outputs(torch.empty(0), torch.empty(0)), torch.empty(0, dtype=torch.long))
        if any(dets[k].shared_fit for k in fitting):
            reducers = {k: dets[k].tap_statistics for k in fitting if dets[k].needs_taps and dets[k].shared_fit}
            fit_pass, computed = run_fit_pass(model, fit_data, batch_size=batch_size, device=device, reducers=reducers,
                                              cache=cache, model_hash=model_hash, rank=rank, world_size=world_size,
                                              progress=progress)
            work["fit_pass_computed" if computed else "fit_pass_reused"] += 1
        for key in fitting:
            det = dets[key]
            n = det.rows_needed(len(fit_data))
            batches = lambda n=n: take_rows(make_loader(fit_data, batch_size), n)
            start = time.perf_counter()
            try:
                det.fit(model, *fit_pass.for_detector(key, n), batches)
                work["fits_computed"] += 1
                state = det.fit_state()
                if cache is not None and state is not None and rank == 0:
                    cache.save_tensors(f"state-{key}", det_keys[key], state)
            except Exception as exc:  # skipped with its reason
                _fail(errors, traces, key, "fit", exc)
                del dets[key]
            seconds[key] = seconds.get(key, 0.0) + time.perf_counter() - start
    bank = DetectorBank(model, dets, keys, errors, resolved, device, seconds, work)
    bank.traces.update(traces)
    return bank


def score_all(names: list[str], backend: str, model: nn.Module, fit_set: Dataset,
              sets: dict[str, Callable[[], Iterable[tuple[Tensor, Tensor]]]], *, batch_size: int,
              device: torch.device, seed: int, params: dict[str, dict] | None = None,
              progress: bool = True, cache: ScoreCache | None = None,
              identities: dict[str, dict[str, Any]] | None = None, model_hash: str = "",
              rank: int = 0, world_size: int = 1, recompute: set[str] | None = None) -> ScoreResult:
    """Fit (:func:`fit_detectors`) and score every detector in ``names`` with one shared network pass per batch.

    ``sets`` maps a set name to a zero-argument callable yielding ``(x, y)`` batches of [0, 1] images. With a
    ``cache`` (and each set's identity in ``identities``), score vectors already in the store are read back,
    only the detectors with a missing vector are fitted (from the stored fit pass and states where possible),
    and only the missing vectors are computed; ``work`` counts both. Each scored set's logits and features are
    stored too (one process only): when every detector missing a vector of that set scores from those alone
    (:func:`reads_outputs_only`), they are read back instead of running the network. The returned bank (a
    :class:`LazyBank`) fits the rest when an analysis needs them.

    Under torchrun (``world_size > 1``; needs a ``cache``, the shared store) every rank calls this: the fit
    pass is sharded by batch, each rank scores the batches ``b % world_size == rank`` of every set and writes
    its share to the store, and rank 0 merges them into the score vectors, bit-identical to one process's
    (same batches, same fitted detectors). Only rank 0's result holds the scores.

    ``recompute``: detectors whose stored work (score vectors, fitted state) is ignored, computed again and
    replaced; the sets they score run their network pass again.
    """
    resolved = resolve_backend(backend)
    params = check_detectors(names, params)
    keys = [n.strip().lower() for n in names]
    device = torch.device(device)
    if world_size > 1 and cache is None:
        raise UsageError("sharded scoring over torchrun ranks needs the shared store (a ScoreCache)")
    sharding = {"rank": rank, "world_size": world_size}
    recompute = set(recompute or ())

    def fit(subset: list[str]) -> DetectorBank:
        return fit_detectors(subset, resolved, model, fit_set, batch_size=batch_size, device=device, seed=seed,
                             params=params, progress=progress, cache=cache, model_hash=model_hash,
                             refit=recompute, **sharding)

    if cache is None:
        bank = fit(keys)
        scores = bank.score(sets, progress)
        computed = sum(len(v) for v in scores.values())
        return ScoreResult(scores, bank.errors, bank.backend, bank.seconds, bank,
                           {**bank.work, "fitted": len(bank.dets), "fits_reused": 0, "score_sets_computed": computed,
                            "score_sets_reused": 0}, bank.traces, {k: backend_label(k, resolved) for k in keys})
    identities = identities or {}
    num_classes = fc_layer(model).out_features
    errors: dict[str, str] = {}
    traces: dict[str, str] = {}
    det_keys: dict[str, str] = {}
    for key in keys:
        try:
            det = create_detector(key, resolved, params.get(key), num_classes=num_classes, device=device, seed=seed,
                                  batch_size=batch_size)
        except UsageError:
            raise
        except Exception as exc:  # a broken detector is skipped, never fatal for the others
            _fail(errors, traces, key, "construction", exc)
            continue
        det_keys[key] = _detector_key(det, key, resolved, model_hash, fit_set, seed, batch_size)
    found: dict[str, dict[str, np.ndarray]] = {k: {} for k in det_keys}
    for key, det_key in det_keys.items():
        if key in recompute:
            continue
        for set_name in sets:
            cached = cache.load(key, det_key, identities[set_name])
            if cached is not None:
                found[key][set_name] = cached
    reused = sum(len(v) for v in found.values())
    bank = LazyBank(fit, list(det_keys), errors, resolved, model, device)
    bank.traces.update(traces)
    need = [k for k in det_keys if len(found[k]) < len(sets)]
    bank.fit(need)
    sharding.update(rank=0, world_size=1)  # later fits (analyses, on rank 0 alone) run unsharded
    todo = {set_name: [k for k in need if set_name not in found[k] and k in bank.dets] for set_name in sets}
    select = None if world_size == 1 else (lambda b: b % world_size == rank)
    share: dict[str, dict[str, dict[int, np.ndarray]]] = {}
    pass_work = {"set_passes_computed": 0, "set_passes_reused": 0}
    for set_name, make_batches in sets.items():
        who = [k for k in todo[set_name] if k in bank.dets]  # a detector that failed on an earlier set is gone
        if not who:
            continue
        # one process keeps each scored set's logits and features, so that a detector whose parameter changed
        # scores from them without a network pass
        pass_key = set_pass_key(model_hash=model_hash, model=model, identity=identities[set_name],
                                batch_size=batch_size) if world_size == 1 else None
        stored = None
        if pass_key is not None and not recompute & set(who) and all(reads_outputs_only(bank.dets[k]) for k in who):
            tensors = cache.load_tensors("setpass", pass_key)
            if tensors is not None:
                stored = Outputs(tensors["logits"].to(device), tensors["features"].to(device))
        record: list[Outputs] | None = [] if pass_key is not None and stored is None else None
        share[set_name] = bank.score_batches(set_name, make_batches(), who, progress, select, stored, record)
        pass_work["set_passes_reused" if stored is not None else "set_passes_computed"] += 1
        if record and any(k in bank.dets for k in who):
            cache.save_tensors("setpass", pass_key, {"logits": torch.cat([o.logits for o in record]),
                                                     "features": torch.cat([o.features for o in record])})
    if world_size > 1:
        run_key = canonical_key({"score": det_keys, "sets": {k: identities[k] for k in sets}, "world": world_size})
        cache.save_part(run_key, rank, {"scores": share, "errors": {k: bank.errors[k] for k in need
                                                                     if k in bank.errors}})
        _barrier(world_size)
        if rank != 0:
            return ScoreResult({}, bank.errors, resolved, bank.seconds, bank,
                               {**FIT_WORK, **bank.work, **pass_work,
                                "fitted": len([k for k in need if k not in bank.errors])})
        parts = cache.load_parts(run_key, world_size)
        cache.drop_parts(run_key)
        for part in parts:
            for key, reason in part["errors"].items():
                bank.drop(key, reason)
        share = {set_name: {key: {b: conf for part in parts for b, conf in part["scores"].get(set_name, {})
                                  .get(key, {}).items()} for key in who if key in bank.dets}
                 for set_name, who in todo.items() if who}
    computed = 0
    for set_name, by_det in share.items():
        for key, by_batch in by_det.items():
            if key not in bank.dets:
                continue
            found[key][set_name] = join_batches(by_batch)
            cache.save(key, det_keys[key], identities[set_name], found[key][set_name])
            computed += 1
    scores = {k: found[k] for k in keys if k in det_keys and k not in bank.errors}
    return ScoreResult(scores, bank.errors, resolved, bank.seconds, bank,
                       {**FIT_WORK, **bank.work, **pass_work, "fitted": len([k for k in need if k not in bank.errors]),
                        "fits_reused": len(det_keys) - len(need),
                        "score_sets_computed": computed, "score_sets_reused": reused}, bank.traces,
                       {k: backend_label(k, resolved) for k in keys})
