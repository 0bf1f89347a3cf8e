"""Classifier wrapper with OpenOOD's network interface, and the architectures we load.

Inputs are always images in [0, 1]; normalisation happens inside :class:`Classifier`, so attacks
(foolbox) never see normalised tensors. The wrapper speaks OpenOOD's ``ResNet18_32x32`` dialect
(``forward(x, return_feature=..., return_feature_list=...)``, ``forward_threshold``,
``intermediate_forward``, ``get_fc``, ``get_fc_layer``), so OpenOOD's postprocessors run on it unchanged.
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from advopenood.errors import UsageError

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class Backbone(nn.Module):
    """A network cut into stages: ``stages(x)`` returns each stage's map; the last is the last conv block."""

    last_block_name: str
    fc_name: str = "fc"

    @property
    def head(self) -> nn.Linear:
        """The final linear layer (named ``fc`` or ``linear`` as in the original checkpoints)."""
        return getattr(self, self.fc_name)

    def stages(self, x: torch.Tensor) -> list[torch.Tensor]:
        raise NotImplementedError


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
        f1 = F.relu(self.bn1(self.conv1(x)))
        f2 = self.layer1(f1)
        f3 = self.layer2(f2)
        return [f1, f2, f3, self.layer3(f3)]


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
        f1 = F.relu(self.bn1(self.conv1(x)))
        f2 = self.layer1(f1)
        f3 = self.layer2(f2)
        f4 = self.layer3(f3)
        return [f1, f2, f3, f4, self.layer4(f4)]


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
        f1 = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        f2 = self.layer1(f1)
        f3 = self.layer2(f2)
        f4 = self.layer3(f3)
        return [f1, f2, f3, f4, self.layer4(f4)]


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


ARCHS: dict[str, Callable[..., Backbone]] = {
    "resnet20": ResNet20,
    "resnet18_32x32": ResNet18_32x32,
    "resnet18": lambda num_classes=1000, in_channels=3: TorchvisionResNet(18, num_classes, in_channels),
    "resnet50": lambda num_classes=1000, in_channels=3: TorchvisionResNet(50, num_classes, in_channels),
    "democnn": DemoCNN,
}


class Classifier(nn.Module):
    """Normalising wrapper exposing logits, penultimate features, the final linear layer and the last block.

    ``forward`` follows OpenOOD's networks: ``net(x)`` gives logits, ``net(x, return_feature=True)``
    gives ``(logits, penultimate)`` and ``net(x, return_feature_list=True)`` gives
    ``(logits, [stage maps..., pooled feature])``.
    """

    def __init__(self, backbone: Backbone, mean: tuple[float, ...], std: tuple[float, ...], arch: str,
                 input_size: int, in_channels: int):
        super().__init__()
        self.backbone = backbone
        self.arch = arch
        self.input_size = input_size
        self.in_channels = in_channels
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))

    @property
    def fc(self) -> nn.Linear:
        return self.backbone.head

    @property
    def last_block(self) -> nn.Module:
        """The last convolutional block (Grad-CAM's target layer)."""
        return getattr(self.backbone, self.backbone.last_block_name)

    @property
    def num_classes(self) -> int:
        return self.backbone.head.out_features

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std

    def forward_all(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """One pass: ``(logits, penultimate feature, stage maps)``."""
        maps = self.backbone.stages(self.normalize(x))
        feature = torch.flatten(F.adaptive_avg_pool2d(maps[-1], 1), 1)
        return self.backbone.head(feature), feature, maps

    def forward(self, x: torch.Tensor, return_feature: bool = False, return_feature_list: bool = False):
        logits, feature, maps = self.forward_all(x)
        if return_feature:
            return logits, feature
        if return_feature_list:
            return logits, maps + [feature[:, :, None, None]]
        return logits

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Penultimate features (global-average-pooled last block)."""
        return self.forward_all(x)[1]

    def forward_threshold(self, x: torch.Tensor, threshold: float) -> torch.Tensor:
        """Logits with penultimate features clipped at ``threshold`` (ReAct), as OpenOOD's networks."""
        return self.backbone.head(self.features(x).clip(max=threshold))

    def intermediate_forward(self, x: torch.Tensor, layer_index: int) -> torch.Tensor:
        """Map of stage ``layer_index`` (1 = first residual stage), as OpenOOD's networks."""
        maps = self.backbone.stages(self.normalize(x))
        if not 1 <= layer_index < len(maps):
            raise ValueError(f"layer_index {layer_index} out of range 1..{len(maps) - 1}")
        return maps[layer_index]

    def get_fc(self):
        return self.fc.weight.detach().cpu().numpy(), self.fc.bias.detach().cpu().numpy()

    def get_fc_layer(self) -> nn.Linear:
        return self.fc


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


def build_model(arch: str, num_classes: int, checkpoint: str | Path | None = None, *, mean=None, std=None,
                input_size: int = 32, in_channels: int = 3, device: str | torch.device = "cpu") -> Classifier:
    """Build ``arch``, load ``checkpoint`` strictly, and wrap it with its normalisation, in eval mode."""
    if arch not in ARCHS:
        raise UsageError(f"unknown architecture {arch!r}; valid choices: {', '.join(ARCHS)}")
    backbone = ARCHS[arch](num_classes=num_classes, in_channels=in_channels)
    if checkpoint is not None:
        path = Path(checkpoint)
        if not path.is_file():
            raise UsageError(f"checkpoint {str(path)!r} not found")
        try:
            loaded = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # any unpickling or format error: the file is not a safe state dict
            first = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else ""
            raise UsageError(f"checkpoint {str(path)!r} cannot be loaded as a state dict (torch.load with weights_only=True "
                             f"raised {type(exc).__name__}: {first}); valid choices: a file saved with "
                             "torch.save(model.state_dict(), path)") from None
        state = _clean_state_dict(loaded)
        expected = {k: v for k, v in backbone.state_dict().items() if not k.endswith("num_batches_tracked")}
        state = {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}
        bad = sorted(set(expected) ^ set(state))
        bad += [k for k, v in state.items() if k in expected and expected[k].shape != v.shape]
        if bad:
            raise UsageError(f"checkpoint {str(path)!r} does not match architecture {arch!r} ({len(bad)} missing, "
                             f"unexpected or mis-shaped keys, e.g. {', '.join(bad[:3])}); valid choices: {', '.join(ARCHS)}")
        backbone.load_state_dict(state, strict=False)
    mean = tuple(mean) if mean is not None else (IMAGENET_MEAN if in_channels == 3 else (0.5,))
    std = tuple(std) if std is not None else (IMAGENET_STD if in_channels == 3 else (0.5,))
    return Classifier(backbone, mean, std, arch, input_size, in_channels).to(device).eval()


def weights_hash(model: nn.Module) -> str:
    """SHA-256 over the model's state dict (names, dtypes, shapes and bytes), independent of file format."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.float().numpy().tobytes())
    return h.hexdigest()


def build_from_config(model_cfg: Mapping[str, Any], checkpoint: Path | None, device: torch.device | str) -> Classifier:
    """:func:`build_model` from a config's ``model`` section."""
    return build_model(str(model_cfg.get("arch")), int(model_cfg["num_classes"]), checkpoint, mean=model_cfg.get("mean"),
                       std=model_cfg.get("std"), input_size=int(model_cfg["input_size"]),
                       in_channels=int(model_cfg["in_channels"]), device=device)
