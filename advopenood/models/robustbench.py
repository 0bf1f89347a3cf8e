"""RobustBench model-zoo architectures as advopenood backbones, built from local files only.

``model.arch: robustbench:<dataset>/<threat>/<model_id>`` (e.g. ``robustbench:cifar10/Linf/Carmon2019Unlabeled``,
``robustbench:imagenet/Linf/Salman2020Do_R50``) builds the network with the constructor RobustBench's own model zoo
lists for that entry (``robustbench.model_zoo.model_dicts[dataset][threat][model_id]["model"]``, robustbench 1.1.1)
and loads ``model.checkpoint``. RobustBench's ``load_model`` is never called: it downloads the weights. The zoo's
package ``__init__`` (which imports RobustBench's download, data and evaluation code: gdown, pkg_resources,
autoattack) is never run either; only ``robustbench.model_zoo`` is imported (see :func:`zoo`).

Normalisation: RobustBench's models take RGB in [0, 1] and normalise inside (``ImageNormalizer`` layers, ``mu`` /
``sigma`` or ``mean`` / ``std`` buffers), so the :class:`~advopenood.models.Classifier` around them normalises with
mean 0 and std 1, and a config that sets another ``model.mean`` / ``model.std`` is refused (:func:`zoo_normalisation`).

Each supported family declares, as :class:`~advopenood.models.TimmBackbone` does for timm, its penultimate feature
(the input of its final ``nn.Linear``), its stage maps (GRAM's layers) and its Grad-CAM layer: see :data:`FAMILIES`.
"""
from __future__ import annotations

import contextlib
import difflib
import functools
import importlib
import importlib.util
import socket
import sys
import types
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from advopenood.errors import UsageError
from advopenood.models.backbones import ZOO_PREFIX, Backbone, _clean_state_dict, _Tap

INSTALL_HINT = ("pip install --no-deps robustbench==1.1.1 && pip install 'advopenood[robustbench]' "
                "(docs/models.md, 'Installing robustbench (one environment that keeps working)')")
#: buffers holding a model's own normalisation constants; RobustBench loads checkpoints that lack them with
#: ``strict=False`` (robustbench/utils.py, ``_safe_load_state_dict``), keeping the constructor's values
NORMALISATION_BUFFERS = ("mu", "sigma", "mean", "std")


@dataclass(frozen=True)
class Family:
    """One family of zoo networks and the rule detectors read it by.

    ``cls`` (``module:Class``, subclasses included: the zoo's subclasses rescale or normalise the input, then call
    the family's ``forward``); ``head``: the final ``nn.Linear``, whose input is the penultimate feature; ``stages``:
    the modules whose outputs are the stage maps (the stem, the residual stages, and last the activated map the
    head's input average-pools), which are GRAM's layers; Grad-CAM's target layer is the last of them.
    """

    name: str
    cls: str
    head: str
    stages: tuple[str, ...]

    def resolve(self) -> type:
        module, name = self.cls.split(":")
        return getattr(importlib.import_module(module), name)


_ARCH = "robustbench.model_zoo.architectures"
#: The families we read. Pre-activation networks (WideResNet, DM*) apply a last BN + activation after the last
#: residual group; that activated map (the module ``relu``) is their last stage map. The others' last residual
#: group output is the map their head pools.
FAMILIES: tuple[Family, ...] = (
    Family("WideResNet (TRADES layout)", f"{_ARCH}.wide_resnet:WideResNet", "fc", ("conv1", "block1", "block2", "relu")),
    Family("DMWideResNet (DeepMind layout)", f"{_ARCH}.dm_wide_resnet:DMWideResNet", "logits",
           ("init_conv", "layer.0", "layer.1", "relu")),
    Family("DMPreActResNet (DeepMind layout)", f"{_ARCH}.dm_wide_resnet:DMPreActResNet", "logits",
           ("conv_2d", "layer_0", "layer_1", "layer_2", "relu")),
    Family("ResNet (CIFAR layout)", f"{_ARCH}.resnet:ResNet", "linear", ("conv1", "layer1", "layer2", "layer3", "layer4")),
    Family("PreActResNet (CIFAR layout)", f"{_ARCH}.resnet:PreActResNet", "linear",
           ("conv1", "layer1", "layer2", "layer3", "layer4")),
    Family("torchvision ResNet (ImageNet)", "torchvision.models.resnet:ResNet", "fc",
           ("maxpool", "layer1", "layer2", "layer3", "layer4")),
)


def family_names() -> str:
    """The declared families, for error messages."""
    return ", ".join(f.name for f in FAMILIES)


def parse_zoo_name(name: str) -> tuple[str, str, str]:
    """``cifar10/Linf/Carmon2019Unlabeled`` -> ``("cifar10", "Linf", "Carmon2019Unlabeled")``."""
    parts = name.split("/")
    if len(parts) != 3 or not all(parts):
        raise UsageError(f"architecture {ZOO_PREFIX}{name} is not {ZOO_PREFIX}<dataset>/<threat>/<model_id>; valid "
                         f"example: {ZOO_PREFIX}cifar10/Linf/Standard")
    return parts[0], parts[1], parts[2]


@functools.cache
def zoo() -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
    """RobustBench's model zoo as ``{dataset: {threat: {model_id: entry}}}`` (plain strings as keys).

    Only ``robustbench.model_zoo`` is imported: where ``robustbench`` itself is not imported yet, a bare package
    module stands in for it, so that its ``__init__`` (``load_model``, the data loaders and the benchmark, which
    need gdown, pkg_resources and the ``autoattack`` module) does not run; the stand-in stays registered, so the
    zoo's lazy imports resolve to the same modules.
    """
    spec = importlib.util.find_spec("robustbench")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError(f"architecture {ZOO_PREFIX}... needs the robustbench package, which is not installed; "
                         f"{INSTALL_HINT}")
    if "robustbench" not in sys.modules:
        package = types.ModuleType("robustbench")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        package.__file__ = spec.origin
        sys.modules["robustbench"] = package
    try:
        with warnings.catch_warnings():  # robustbench 1.1.1 imports timm's deprecated module paths (timm.models.layers)
            warnings.simplefilter("ignore", FutureWarning)
            from robustbench.model_zoo import model_dicts
    except ImportError as exc:
        raise UsageError(f"robustbench's model zoo cannot be imported ({type(exc).__name__}: {exc}); its architectures "
                         f"need geotorch and torchdiffeq: {INSTALL_HINT}") from None
    return {ds.value: {tm.value: dict(models) for tm, models in threats.items()} for ds, threats in model_dicts.items()}


def _choose(what: str, value: str, choices: list[str]) -> UsageError:
    close = difflib.get_close_matches(value, choices, n=3)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    listed = ", ".join(choices) if len(choices) <= 12 else f"{', '.join(choices[:12])}, ... ({len(choices)} in all)"
    return UsageError(f"unknown RobustBench {what} {value!r}; {hint}valid choices: {listed}")


def zoo_entry(name: str) -> dict[str, Any]:
    """The zoo's entry for ``<dataset>/<threat>/<model_id>``; a UsageError names close matches otherwise."""
    dataset, threat, model_id = parse_zoo_name(name)
    models = zoo()
    if dataset not in models:
        raise _choose("dataset", dataset, list(models))
    if threat not in models[dataset]:
        raise _choose(f"threat model of {dataset}", threat, list(models[dataset]))
    if model_id not in models[dataset][threat]:
        raise _choose(f"model of {dataset}/{threat}", model_id, list(models[dataset][threat]))
    return models[dataset][threat][model_id]


def check_zoo_name(name: str) -> None:
    """``name`` (without the prefix) is an entry of RobustBench's zoo."""
    zoo_entry(name)


class _NetworkRefused(OSError):
    """A zoo constructor tried to open a connection (to download pretrained weights)."""


@contextlib.contextmanager
def no_network() -> Iterator[None]:
    """Every ``socket.connect`` raises for the duration: a zoo constructor that downloads (``pretrained=True``)
    fails instead of fetching weights."""
    real = socket.socket.connect

    def refuse(self: socket.socket, *args: Any, **kwargs: Any) -> None:
        raise _NetworkRefused("advopenood builds RobustBench architectures without network access")

    socket.socket.connect = refuse  # type: ignore[method-assign]
    try:
        yield
    finally:
        socket.socket.connect = real  # type: ignore[method-assign]


def construct(name: str) -> nn.Module:
    """The zoo entry's network with its constructor's (random or cached) weights, built without network access."""
    entry = zoo_entry(name)
    try:
        with no_network(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)  # a fixed initialisation (the checkpoint replaces it), the caller's RNG untouched
            return entry["model"]()
    except Exception as exc:  # any constructor failure: a download it needs, a GPU it assumes, a missing package
        first = (str(exc).strip().splitlines() or [""])[0][:160]
        raise UsageError(f"RobustBench entry {name} cannot be built offline from its architecture alone (its constructor "
                         f"raised {type(exc).__name__}: {first}); valid choices: an entry of the families "
                         f"{family_names()} whose constructor downloads nothing") from None


def find_family(net: nn.Module) -> tuple[Family, str]:
    """``(family, prefix)``: the family of ``net``, or of the network inside RobustBench's ``normalize_model``
    wrapper (``Sequential(normalize=ImageNormalizer, model=net)``, prefix ``model.``)."""
    inner, prefix = net, ""
    if isinstance(net, nn.Sequential) and [n for n, _ in net.named_children()] == ["normalize", "model"]:
        inner, prefix = net.model, "model."
    for family in FAMILIES:
        if isinstance(inner, family.resolve()):
            return family, prefix
    raise UsageError(f"RobustBench network {type(inner).__name__} is not a family advopenood reads (no declared "
                     f"penultimate feature, GRAM layers and Grad-CAM layer); valid choices: {family_names()}")


def zoo_normalisation(mean: Any, std: Any, in_channels: int = 3) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Mean 0 and std 1 for the wrapper: RobustBench's models normalise inside. A configured mean / std other than
    that would normalise twice, and is refused."""
    zeros, ones = (0.0,) * in_channels, (1.0,) * in_channels
    if (mean is not None and tuple(float(v) for v in mean) != zeros) or (std is not None and
                                                                         tuple(float(v) for v in std) != ones):
        raise UsageError(f"model.mean {mean} / model.std {std} would normalise twice: RobustBench's models take RGB in "
                         "[0, 1] and normalise inside; valid choices: leave model.mean and model.std out (or 0 and 1)")
    return zeros, ones


class RobustBenchBackbone(Backbone):
    """A RobustBench zoo network read by its family's declared rule (:class:`Family`).

    One pass of the network's own ``forward`` (so its internal normalisation and input rescaling run exactly as in
    RobustBench) with forward hooks: the penultimate feature is the input of the family's head, the stage maps are
    the outputs of its stage modules (passed on through tap points, GRAM's layers), and Grad-CAM's target layer is
    the last stage module. The checkpoint holds the zoo network's ``state_dict`` in any layout RobustBench's
    ``load_model`` reads (:meth:`checkpoint_state`).
    """

    last_block_name = "last_block"

    def __init__(self, name: str, num_classes: int = 10, in_channels: int = 3, input_size: int = 32):
        super().__init__()
        if in_channels != 3:
            raise UsageError(f"RobustBench models take RGB input; in_channels {in_channels} is not supported; "
                             "valid choices: 3")
        self.zoo_name = name
        self.model = construct(name).eval()
        self.family, prefix = find_family(self.model)
        self._head_name = prefix + self.family.head
        self._stage_names = [prefix + s for s in self.family.stages]
        self.taps = nn.ModuleList(_Tap() for _ in self._stage_names)
        if self.head.out_features != num_classes:
            raise UsageError(f"RobustBench entry {name} has {self.head.out_features} classes but model.num_classes is "
                             f"{num_classes}; valid choices: num_classes: {self.head.out_features}")
        self._check_declaration(input_size)

    @property
    def head(self) -> nn.Linear:
        return self.model.get_submodule(self._head_name)

    @property
    def last_block(self) -> nn.Module:
        return self.model.get_submodule(self._stage_names[-1])

    @property
    def checkpoint_module(self) -> nn.Module:
        return self.model

    def _run(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """``(the network's own logits, its head's input, the stage modules' outputs)`` of one pass."""
        inputs: list[torch.Tensor] = []
        outputs: list[torch.Tensor] = []
        hooks = [self.model.get_submodule(n).register_forward_hook(lambda _m, _i, out: outputs.append(out))
                 for n in self._stage_names]
        hooks.append(self.head.register_forward_pre_hook(lambda _m, args: inputs.append(args[0])))
        try:
            logits = self.model(x)
        finally:
            for h in hooks:
                h.remove()
        if len(inputs) != 1 or len(outputs) != len(self._stage_names):
            raise UsageError(f"RobustBench entry {self.zoo_name}: one pass called its head {len(inputs)} times and "
                             f"its {len(self._stage_names)} stage modules {len(outputs)} times, not once each; its "
                             f"forward differs from the {self.family.name} family's; valid choices: {family_names()}")
        return logits, inputs[0].flatten(1), outputs

    def forward_features(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        _, feature, outputs = self._run(x)
        return feature, [tap(out) for tap, out in zip(self.taps, outputs)]

    def stages(self, x: torch.Tensor) -> list[torch.Tensor]:
        return self.forward_features(x)[1]

    def tap_modules(self) -> list[nn.Module]:
        return list(self.taps)

    def cam_layer(self) -> nn.Module:
        return self.last_block

    def _check_declaration(self, input_size: int) -> None:
        """On one seeded image: the head applied to the declared penultimate feature gives the network's own logits,
        and that feature is the global average of the last stage map (so detectors read what the head reads)."""
        x = torch.rand(1, 3, input_size, input_size, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            logits, feature, outputs = self._run(x)
            again = self.head(feature)
            pooled = torch.flatten(F.adaptive_avg_pool2d(outputs[-1], 1), 1)
        scale = float(logits.abs().max()) + 1.0
        if not torch.allclose(again, logits, atol=1e-5 * scale, rtol=1e-4) or pooled.shape != feature.shape or \
                not torch.allclose(pooled, feature, atol=1e-5 * (float(feature.abs().max()) + 1.0), rtol=1e-4):
            raise UsageError(f"RobustBench entry {self.zoo_name}: the {self.family.name} family's declared penultimate "
                             "feature does not reproduce its logits from the pooled last stage map (its forward "
                             f"differs from the family's); valid choices: {family_names()}")

    def checkpoint_state(self, loaded: Any) -> dict[str, torch.Tensor]:
        """The state dict in any layout RobustBench's ``load_model`` reads (robustbench/utils.py, 1.1.1): a
        ``{"last": ...}`` checkpoint's last model; ``state_dict`` / ``module.`` as :func:`_clean_state_dict`; keys
        with or without the ``model.`` prefix (RobustBench strips it, and adds it back for ImageNet models inside
        ``normalize_model``); and the network's own normalisation buffers (``mu``, ``sigma``, ``mean``, ``std``)
        taken from the constructor where the file lacks them, as RobustBench's ``strict=False`` fallback does."""
        if isinstance(loaded, dict) and isinstance(loaded.get("last"), dict):
            loaded = loaded["last"]
        state = _clean_state_dict(loaded)
        own = self.model.state_dict()
        layouts = [state, {k.removeprefix("model."): v for k, v in state.items()},
                   {"model." + k: v for k, v in state.items()}]
        state = max(layouts, key=lambda s: len(own.keys() & s.keys()))
        for key, value in own.items():
            if key not in state and key.rsplit(".", 1)[-1] in NORMALISATION_BUFFERS:
                state[key] = value
        return state

