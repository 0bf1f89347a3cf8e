"""The ``openood`` backend: OpenOOD's own postprocessor classes run on the shared pass (:class:`CachedNet`),
their ``.cuda()`` calls redirected to the run's device, and third-party classes with OpenOOD's interface."""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn as nn
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, IterableDataset

from advopenood.attacks.base import frozen
from advopenood.config.schema import BACKENDS
from advopenood.detection.outputs import (
    FIT_SIZE,
    Batches,
    Outputs,
    fc_layer,
    forward_outputs,
    net_device,
)
from advopenood.detection.postprocessor import (
    Postprocessor,
    openood_args,
    openood_config,
)
from advopenood.errors import UsageError
from advopenood.provenance import seeded

INSTALL_SECTION = "docs/openood.md, section 'Installing OpenOOD (and the imgaug patch for NumPy 2)'"
# the verified sequence of that section, shortened to one line: OpenOOD without its own requirements (faiss-gpu,
# opencv-python, pins), then this checkout's ``openood`` extra; imgaug (--no-deps) and libmr follow in the section
OPENOOD_INSTALL = ("git clone https://github.com/Jingkang50/OpenOOD && pip install --no-deps -e ./OpenOOD && "
                   "pip install -e '.[openood]' from the advopenood checkout, then imgaug and libmr as in "
                   f"{INSTALL_SECTION}")


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
    pp_settings = dict(raw["postprocessor"])
    pp_settings["postprocessor_args"] = {**(pp_settings.get("postprocessor_args") or {}), **args}
    config = Config({"postprocessor": pp_settings, "dataset": {"name": openood_dataset_name(num_classes)}})
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

    Adaptations, all documented in docs/detectors.md: no automatic parameter search (APS needs an OOD
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
    def needs_all_classes(self) -> bool:  # type: ignore[override]
        """As the registered detector declares."""
        return self.declared.needs_all_classes

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
