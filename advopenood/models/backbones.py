"""Classifier wrapper with OpenOOD's network interface, and the architectures we load.

Inputs are always images in [0, 1]; normalisation happens inside :class:`Classifier`, so attacks
(foolbox) never see normalised tensors. The wrapper speaks OpenOOD's ``ResNet18_32x32`` dialect
(``forward(x, return_feature=..., return_feature_list=...)``, ``forward_threshold``,
``intermediate_forward``, ``get_fc``, ``get_fc_layer``), so OpenOOD's postprocessors run on it unchanged.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from advopenood.errors import UsageError

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _clean_state_dict(obj) -> dict[str, torch.Tensor]:
    """Accept a bare state dict or a checkpoint dict (``state_dict``/``net``/``model``), strip ``module.``."""
    if isinstance(obj, dict):
        for key in ("state_dict", "net", "model"):
            if key in obj and isinstance(obj[key], dict):
                obj = obj[key]
                break
    if not isinstance(obj, dict):
        raise UsageError(f"checkpoint holds a {type(obj).__name__}, not a state dict")
    return {k.removeprefix("module."): v for k, v in obj.items() if torch.is_tensor(v)}


class Backbone(nn.Module):
    """A network cut into stages: ``stages(x)`` returns each stage's map; the last is the last conv block.

    Declared rules every detector and analysis reads (defaults for CNNs, overridden by transformers):

    * :meth:`forward_features`: ``(penultimate feature, stage maps)``; default: the global average pool of the
      last map (the feature before the head);
    * :meth:`tap_modules`: the modules whose outputs GRAM reads; default ``None``, i.e. every ``nn.Conv2d`` and
      ``nn.ReLU`` (OpenOOD's GRAM hooks);
    * :meth:`cam_layer` and :meth:`cam_reshape`: Grad-CAM's target layer and pytorch-grad-cam's
      ``reshape_transform`` (``None`` for ``B x C x H x W`` outputs); default: the last conv block.
    """

    last_block_name: str
    fc_name: str = "fc"

    @property
    def head(self) -> nn.Linear:
        """The final linear layer (named ``fc`` or ``linear`` as in the original checkpoints)."""
        return getattr(self, self.fc_name)

    @property
    def checkpoint_module(self) -> nn.Module:
        """The module whose ``state_dict`` a checkpoint file holds."""
        return self

    def checkpoint_state(self, loaded: Any) -> dict[str, torch.Tensor]:
        """The state dict for :attr:`checkpoint_module` in what ``torch.load`` read (:func:`_clean_state_dict`)."""
        return _clean_state_dict(loaded)

    def stages(self, x: torch.Tensor) -> list[torch.Tensor]:
        raise NotImplementedError

    def forward_features(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``(penultimate feature B x D, stage maps)``: the last map, globally average-pooled."""
        maps = self.stages(x)
        return torch.flatten(F.adaptive_avg_pool2d(maps[-1], 1), 1), maps

    def tap_modules(self) -> list[nn.Module] | None:
        """GRAM's layers; ``None``: every ``nn.Conv2d`` / ``nn.ReLU``."""
        return None

    def cam_layer(self) -> nn.Module:
        """Grad-CAM's target layer."""
        return getattr(self, self.last_block_name)

    def cam_reshape(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """pytorch-grad-cam's ``reshape_transform`` for the target layer's output (``None``: already NCHW)."""
        return None


def _chain(stem: torch.Tensor, layers: tuple[nn.Module, ...]) -> list[torch.Tensor]:
    """A ResNet's stage maps: the stem's output, then each layer applied to the previous map."""
    maps = [stem]
    for layer in layers:
        maps.append(layer(maps[-1]))
    return maps


class _BasicBlockA(nn.Module):
    """CIFAR ResNet basic block with option-A shortcut (subsample + zero-pad channels)."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.pad = (planes - in_planes) // 2 if (stride != 1 or in_planes != planes) else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        short = x if self.pad is None else F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, self.pad, self.pad))
        return F.relu(out + short)


class ResNet20(Backbone):
    """CIFAR ResNet-20 (He et al. 2016, option A), as in akamaster/pytorch_resnet_cifar10."""

    last_block_name = "layer3"
    fc_name = "linear"

    def __init__(self, num_classes: int = 10, in_channels: int = 3):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        planes, layers = 16, []
        for width, stride in ((16, 1), (32, 2), (64, 2)):
            blocks = [_BasicBlockA(planes, width, stride), _BasicBlockA(width, width), _BasicBlockA(width, width)]
            layers.append(nn.Sequential(*blocks))
            planes = width
        self.layer1, self.layer2, self.layer3 = layers
        self.linear = nn.Linear(64, num_classes)

    def stages(self, x: torch.Tensor) -> list[torch.Tensor]:
        return _chain(F.relu(self.bn1(self.conv1(x))), (self.layer1, self.layer2, self.layer3))


class _BasicBlockB(nn.Module):
    """OpenOOD's ResNet18_32x32 basic block (1x1 conv shortcut)."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18_32x32(Backbone):
    """OpenOOD's ResNet18_32x32; its ``best.ckpt`` checkpoints load into it unchanged."""

    last_block_name = "layer4"

    def __init__(self, num_classes: int = 10, in_channels: int = 3):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        planes, layers = 64, []
        for width, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers.append(nn.Sequential(_BasicBlockB(planes, width, stride), _BasicBlockB(width, width)))
            planes = width
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.fc = nn.Linear(512, num_classes)

    def stages(self, x: torch.Tensor) -> list[torch.Tensor]:
        return _chain(F.relu(self.bn1(self.conv1(x))), (self.layer1, self.layer2, self.layer3, self.layer4))


class TorchvisionResNet(Backbone):
    """torchvision ResNet-18/50 (ImageNet layout); weights come from a local checkpoint, never a download."""

    last_block_name = "layer4"

    def __init__(self, depth: int, num_classes: int = 1000, in_channels: int = 3):
        super().__init__()
        import torchvision

        net = getattr(torchvision.models, f"resnet{depth}")(weights=None, num_classes=num_classes)
        if in_channels != 3:
            net.conv1 = nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False)
        self.conv1, self.bn1, self.relu, self.maxpool = net.conv1, net.bn1, net.relu, net.maxpool
        self.layer1, self.layer2, self.layer3, self.layer4 = net.layer1, net.layer2, net.layer3, net.layer4
        self.fc = net.fc

    def stages(self, x: torch.Tensor) -> list[torch.Tensor]:
        return _chain(self.maxpool(self.relu(self.bn1(self.conv1(x)))),
                      (self.layer1, self.layer2, self.layer3, self.layer4))


class DemoCNN(Backbone):
    """Small three-block CNN for the embedded demo (16x16 grey digits); trains in seconds on a CPU."""

    last_block_name = "block3"

    def __init__(self, num_classes: int = 10, in_channels: int = 1):
        super().__init__()

        def block(cin: int, cout: int, stride: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

        self.block1 = block(in_channels, 16, 1)
        self.block2 = block(16, 32, 2)
        self.block3 = block(32, 64, 2)
        self.fc = nn.Linear(64, num_classes)

    def stages(self, x: torch.Tensor) -> list[torch.Tensor]:
        f1 = self.block1(x)
        f2 = self.block2(f1)
        return [f1, f2, self.block3(f2)]


def nhwc_to_nchw(t: torch.Tensor) -> torch.Tensor:
    """Swin's ``B x H x W x C`` tokens -> ``B x C x H x W`` (pytorch-grad-cam's Swin reshape transform)."""
    return t.permute(0, 3, 1, 2)


def tokens_to_grid(t: torch.Tensor, prefix: int = 1) -> torch.Tensor:
    """ViT's ``B x (prefix + N) x D`` tokens -> ``B x D x s x s`` with the ``prefix`` class/register tokens dropped
    and the ``N = s * s`` patch tokens on their grid (pytorch-grad-cam's ViT reshape transform); a non-square
    ``N`` gives ``B x D x N x 1``."""
    patches = t[:, prefix:]
    n = patches.shape[1]
    side = int(round(n ** 0.5))
    shape = (side, side) if side * side == n else (n, 1)
    return patches.transpose(1, 2).reshape(t.shape[0], t.shape[2], *shape)


class _Tap(nn.Identity):
    """A named point where GRAM's hooks read a stage's ``B x C x H x W`` map (no parameters, no computation)."""


class TorchvisionSwin(Backbone):
    """torchvision Swin-T (Liu et al. 2021), state-dict compatible with torchvision's ``swin_t`` weights.

    Stage maps: the output of each of the four Swin stages as ``B x C x H x W`` (the last one after the final
    LayerNorm); penultimate feature: the average-pooled normed last stage (torchvision's, before ``head``);
    GRAM: the four stage outputs; Grad-CAM: the final ``norm`` (7 x 7 tokens at 224 px), NHWC -> NCHW.
    """

    last_block_name = "norm"
    fc_name = "head"

    def __init__(self, num_classes: int = 1000, in_channels: int = 3):
        super().__init__()
        import torchvision

        if in_channels != 3:
            raise UsageError(f"swin_t takes RGB input; in_channels {in_channels} is not supported; valid choices: 3")
        net = torchvision.models.swin_t(weights=None, num_classes=num_classes)
        self.features, self.norm, self.head = net.features, net.norm, net.head
        self.taps = nn.ModuleList(_Tap() for _ in range(4))

    @property
    def head(self) -> nn.Linear:
        return self._modules["head"]

    def _run(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        maps = []
        for i, layer in enumerate(self.features):
            x = layer(x)
            if i % 2 == 1:  # features[1, 3, 5, 7] are the stages; the even ones embed patches or merge them
                maps.append(self.taps[len(maps)](nhwc_to_nchw(x)))
        return x, maps

    def forward_features(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        x, maps = self._run(x)
        last = nhwc_to_nchw(self.norm(x))
        return torch.flatten(F.adaptive_avg_pool2d(last, 1), 1), maps[:-1] + [last]

    def stages(self, x: torch.Tensor) -> list[torch.Tensor]:
        return self.forward_features(x)[1]

    def tap_modules(self) -> list[nn.Module]:
        return list(self.taps)

    def cam_reshape(self) -> Callable[[torch.Tensor], torch.Tensor]:
        return nhwc_to_nchw


class TorchvisionViT(Backbone):
    """torchvision ViT-B/16 (Dosovitskiy et al. 2021), state-dict compatible with torchvision's ``vit_b_16``.

    Stage maps: each encoder block's patch tokens on the 14 x 14 grid (class token dropped; the last one after
    the final LayerNorm); penultimate feature: the normed class token (torchvision's, before ``heads.head``);
    GRAM: the twelve block outputs; Grad-CAM: the last block's ``ln_1`` (its output still reaches the class
    token through the last attention), class token dropped, 14 x 14 grid. Input size: 224.
    """

    last_block_name = "encoder"

    def __init__(self, num_classes: int = 1000, in_channels: int = 3):
        super().__init__()
        import torchvision

        if in_channels != 3:
            raise UsageError(f"vit_b_16 takes RGB input; in_channels {in_channels} is not supported; valid choices: 3")
        net = torchvision.models.vit_b_16(weights=None, num_classes=num_classes)
        self.conv_proj, self.class_token, self.encoder, self.heads = net.conv_proj, net.class_token, net.encoder, net.heads
        self.patch_size, self.image_size, self.hidden_dim = net.patch_size, net.image_size, net.hidden_dim
        self.taps = nn.ModuleList(_Tap() for _ in self.encoder.layers)

    @property
    def head(self) -> nn.Linear:
        return self.heads.head

    def forward_features(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        n, _, h, w = x.shape
        if h != self.image_size or w != self.image_size:
            raise ValueError(f"vit_b_16 takes {self.image_size} x {self.image_size} images, got {h} x {w}")
        tokens = self.conv_proj(x).reshape(n, self.hidden_dim, -1).permute(0, 2, 1)
        tokens = torch.cat([self.class_token.expand(n, -1, -1), tokens], dim=1)
        tokens = self.encoder.dropout(tokens + self.encoder.pos_embedding)
        maps = []
        for block, tap in zip(self.encoder.layers, self.taps):
            tokens = block(tokens)
            maps.append(tap(tokens_to_grid(tokens)))
        tokens = self.encoder.ln(tokens)
        return tokens[:, 0], maps[:-1] + [tokens_to_grid(tokens)]

    def stages(self, x: torch.Tensor) -> list[torch.Tensor]:
        return self.forward_features(x)[1]

    def tap_modules(self) -> list[nn.Module]:
        return list(self.taps)

    def cam_layer(self) -> nn.Module:
        return self.encoder.layers[-1].ln_1

    def cam_reshape(self) -> Callable[[torch.Tensor], torch.Tensor]:
        return tokens_to_grid


TIMM_PREFIX = "timm:"
#: RobustBench's model zoo (:mod:`advopenood.models.robustbench`, imported only when such an architecture is built)
ZOO_PREFIX = "robustbench:"


def check_timm_name(name: str) -> None:
    """``name`` is a timm architecture (``timm.list_models()``); a UsageError names close matches otherwise."""
    try:
        import timm
    except ImportError:
        raise UsageError(f"architecture timm:{name} needs timm, which is not installed; pip install timm") from None
    if not timm.is_model(name):
        import difflib

        close = difflib.get_close_matches(name, timm.list_models(), n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise UsageError(f"unknown timm architecture {name!r}; {hint}valid choices: a name in timm.list_models()")


class TimmBackbone(Backbone):
    """Any timm model by name, built with ``pretrained=False`` (the weights come from the checkpoint file, which
    holds the timm model's own ``state_dict``).

    Declared rule: stage maps and GRAM's layers are the outputs of the modules in the model's ``feature_info``
    (its stages or transformer blocks), made ``B x C x H x W`` (NHWC permuted; token sequences without their
    prefix tokens, on the patch grid); the last map is ``forward_features``' output; the penultimate feature is
    ``forward_head(..., pre_logits=True)`` and the head is ``get_classifier()`` (it must be an ``nn.Linear``).
    Grad-CAM: the last ``feature_info`` module, or for a token model the last block's ``norm1``.
    """

    def __init__(self, name: str, num_classes: int = 1000, in_channels: int = 3):
        super().__init__()
        import timm

        check_timm_name(name)
        self.model = timm.create_model(name, pretrained=False, num_classes=num_classes, in_chans=in_channels)
        if not isinstance(self.model.get_classifier(), nn.Linear):
            raise UsageError(f"timm model {name!r} has a {type(self.model.get_classifier()).__name__} head, not an "
                             "nn.Linear, so detectors cannot read its penultimate feature; valid choices: a timm "
                             "model whose get_classifier() is nn.Linear")
        modules = dict(self.model.named_modules())
        info = list(getattr(self.model, "feature_info", None) or [])
        self._stage_names = [str(f["module"]) for f in info if str(f.get("module", "")) in modules]
        self._prefix = int(getattr(self.model, "num_prefix_tokens", 0))
        self._nhwc = str(getattr(self.model, "output_fmt", "NCHW")) == "NHWC"
        self.taps = nn.ModuleList(_Tap() for _ in self._stage_names)

    @property
    def head(self) -> nn.Linear:
        return self.model.get_classifier()

    @property
    def checkpoint_module(self) -> nn.Module:
        return self.model

    def channels_first(self, t: torch.Tensor) -> torch.Tensor:
        """A stage or token output as ``B x C x H x W``."""
        if t.ndim == 3:
            return tokens_to_grid(t, self._prefix)
        return nhwc_to_nchw(t) if self._nhwc else t

    def forward_features(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        recorded: list[torch.Tensor] = []
        modules = dict(self.model.named_modules())
        handles = [modules[n].register_forward_hook(lambda _m, _i, out: recorded.append(out))
                   for n in self._stage_names]
        try:
            feats = self.model.forward_features(x)
        finally:
            for h in handles:
                h.remove()
        maps = [tap(self.channels_first(out)) for tap, out in zip(self.taps, recorded)]
        return self.model.forward_head(feats, pre_logits=True), maps + [self.channels_first(feats)]

    def stages(self, x: torch.Tensor) -> list[torch.Tensor]:
        return self.forward_features(x)[1]

    def tap_modules(self) -> list[nn.Module] | None:
        return list(self.taps) or None

    def cam_layer(self) -> nn.Module:
        blocks = getattr(self.model, "blocks", None)
        if self._prefix and blocks is not None and hasattr(blocks[-1], "norm1"):
            return blocks[-1].norm1
        return dict(self.model.named_modules())[self._stage_names[-1]] if self._stage_names else self.model

    def cam_reshape(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        return self.channels_first if (self._prefix or self._nhwc) else None
