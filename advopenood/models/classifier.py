"""Classifier wrapper with OpenOOD's network interface, and the architectures we load.

Inputs are always images in [0, 1]; normalisation happens inside :class:`Classifier`, so attacks
(foolbox) never see normalised tensors. The wrapper speaks OpenOOD's ``ResNet18_32x32`` dialect
(``forward(x, return_feature=..., return_feature_list=...)``, ``forward_threshold``,
``intermediate_forward``, ``get_fc``, ``get_fc_layer``), so OpenOOD's postprocessors run on it unchanged.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn

from advopenood.errors import UsageError
from advopenood.models.backbones import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    TIMM_PREFIX,
    ZOO_PREFIX,
    Backbone,
    DemoCNN,
    ResNet18_32x32,
    ResNet20,
    TimmBackbone,
    TorchvisionResNet,
    TorchvisionSwin,
    TorchvisionViT,
)

ARCHS: dict[str, Callable[..., Backbone]] = {
    "resnet20": ResNet20,
    "resnet18_32x32": ResNet18_32x32,
    "resnet18": lambda num_classes=1000, in_channels=3: TorchvisionResNet(18, num_classes, in_channels),
    "resnet50": lambda num_classes=1000, in_channels=3: TorchvisionResNet(50, num_classes, in_channels),
    "swin_t": TorchvisionSwin,
    "vit_b_16": TorchvisionViT,
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
        #: autocast dtype of the forward pass (None: full precision) and channels-last inputs; see set_precision
        self.autocast_dtype: torch.dtype | None = None
        self.channels_last = False

    @property
    def fc(self) -> nn.Linear:
        return self.backbone.head

    @property
    def last_block(self) -> nn.Module:
        """The last convolutional block (for CNNs, Grad-CAM's target layer)."""
        return getattr(self.backbone, self.backbone.last_block_name)

    @property
    def cam_layer(self) -> nn.Module:
        """Grad-CAM's target layer, as the backbone declares it (:meth:`Backbone.cam_layer`)."""
        return self.backbone.cam_layer()

    @property
    def cam_reshape(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """pytorch-grad-cam's ``reshape_transform`` for :attr:`cam_layer` (None for NCHW maps)."""
        return self.backbone.cam_reshape()

    def tap_modules(self) -> list[nn.Module] | None:
        """GRAM's layers, as the backbone declares them (None: every ``nn.Conv2d`` / ``nn.ReLU``)."""
        return self.backbone.tap_modules()

    @property
    def num_classes(self) -> int:
        return self.backbone.head.out_features

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std

    def forward_all(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """One pass: ``(logits, penultimate feature, stage maps)``, in float32; under :func:`set_precision`'s
        autocast the network itself runs in ``autocast_dtype`` on channels-last inputs."""
        x = self.normalize(x)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        if self.autocast_dtype is None:
            feature, maps = self.backbone.forward_features(x)
            return self.backbone.head(feature), feature, maps
        with torch.autocast(x.device.type, dtype=self.autocast_dtype):
            feature, maps = self.backbone.forward_features(x)
            logits = self.backbone.head(feature)
        return logits.float(), feature.float(), [m.float() for m in maps]

    def forward(self, x: torch.Tensor, return_feature: bool = False, return_feature_list: bool = False):
        logits, feature, maps = self.forward_all(x)
        if return_feature:
            return logits, feature
        if return_feature_list:
            return logits, maps + [feature[:, :, None, None]]
        return logits

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Penultimate features (the pooled or class-token feature before the head)."""
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


def html_page(path: Path) -> bool:
    """The file starts like a web page (``<!DOCTYPE html``, ``<html``, or a ``<`` tag with ``<html`` soon after): what a
    failed download saves under the checkpoint's name (RobustBench issues 158, 174, 177)."""
    with open(path, "rb") as f:
        head = f.read(2048).lstrip().lower()
    return head.startswith((b"<!doctype html", b"<html")) or (head.startswith(b"<") and b"<html" in head)


def build_model(arch: str, num_classes: int, checkpoint: str | Path | None = None, *, mean=None, std=None,
                input_size: int = 32, in_channels: int = 3, device: str | torch.device = "cpu") -> Classifier:
    """Build ``arch`` (a name in :data:`ARCHS`, ``timm:<name>`` or ``robustbench:<dataset>/<threat>/<model_id>``)
    without downloading anything, load ``checkpoint`` strictly (NaN or infinite weights refused), and wrap it
    with its normalisation, in eval mode (mean 0 and std 1 for RobustBench's models, which normalise inside)."""
    path = Path(checkpoint) if checkpoint is not None else None
    if path is not None and not path.is_file():
        raise UsageError(f"checkpoint {str(path)!r} not found")
    if path is not None and html_page(path):
        raise UsageError(f"checkpoint {str(path)!r} is an HTML page ({path.stat().st_size} bytes), not a checkpoint: "
                         "a download that failed saved the web page under the checkpoint's name; valid choices: the "
                         "model's weights file (download it again, e.g. in a browser)")
    if arch.startswith(TIMM_PREFIX):
        backbone: Backbone = TimmBackbone(arch[len(TIMM_PREFIX):], num_classes=num_classes, in_channels=in_channels)
    elif arch.startswith(ZOO_PREFIX):
        from advopenood.models.robustbench import RobustBenchBackbone, zoo_normalisation

        mean, std = zoo_normalisation(mean, std, in_channels)
        backbone = RobustBenchBackbone(arch[len(ZOO_PREFIX):], num_classes, in_channels, input_size)
    elif arch in ARCHS:
        backbone = ARCHS[arch](num_classes=num_classes, in_channels=in_channels)
    else:
        raise UsageError(f"unknown architecture {arch!r}; valid choices: {', '.join(ARCHS)}, {TIMM_PREFIX}<name>, "
                         f"{ZOO_PREFIX}<dataset>/<threat>/<model_id>")
    if path is not None:
        try:
            loaded = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # any unpickling or format error: the file is not a safe state dict
            first = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else ""
            raise UsageError(f"checkpoint {str(path)!r} cannot be loaded as a state dict (torch.load with weights_only=True "
                             f"raised {type(exc).__name__}: {first}); valid choices: a file saved with "
                             "torch.save(model.state_dict(), path)") from None
        state = backbone.checkpoint_state(loaded)
        target = backbone.checkpoint_module
        expected = {k: v for k, v in target.state_dict().items() if not k.endswith("num_batches_tracked")}
        state = {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}
        bad = sorted(set(expected) ^ set(state))
        bad += [k for k, v in state.items() if k in expected and expected[k].shape != v.shape]
        if bad:
            raise UsageError(f"checkpoint {str(path)!r} does not match architecture {arch!r} ({len(bad)} missing, "
                             f"unexpected or mis-shaped keys, e.g. {', '.join(bad[:3])}); valid choices: {', '.join(ARCHS)}")
        broken = [k for k, v in state.items()
                  if torch.is_tensor(v) and v.is_floating_point() and not v.isfinite().all()]
        if broken:
            raise UsageError(f"checkpoint {str(path)!r} holds NaN or infinite weights ({len(broken)} of {len(state)} "
                             f"tensors, e.g. {', '.join(broken[:3])}); valid choices: a checkpoint of a model whose "
                             "training did not diverge")
        target.load_state_dict(state, strict=False)
    mean = tuple(mean) if mean is not None else (IMAGENET_MEAN if in_channels == 3 else (0.5,))
    std = tuple(std) if std is not None else (IMAGENET_STD if in_channels == 3 else (0.5,))
    return Classifier(backbone, mean, std, arch, input_size, in_channels).to(device).eval()


def set_precision(model: Classifier, device: torch.device | str, amp: bool, channels_last: bool) -> dict[str, object]:
    """Mixed precision and channels-last for every forward pass of ``model`` (attacks, the shared pass, Grad-CAM).

    On a CUDA device, ``amp`` runs the network under ``torch.autocast`` in bfloat16 (float32's exponent range, so
    attack gradients do not underflow and no loss scaling is needed; float16 where the GPU lacks bfloat16) and
    ``channels_last`` stores weights and inputs NHWC. On the CPU both are no-ops: bfloat16 autocast on a CPU is
    slower than float32 where the CPU lacks bfloat16 units, and it would change every number for no gain. The
    returned record (for run.json) says what was asked, what is active, and why.
    """
    device = torch.device(device)
    on_gpu = device.type == "cuda"
    dtype = None
    if amp and on_gpu:
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    model.autocast_dtype = dtype
    model.channels_last = bool(channels_last and on_gpu)
    if model.channels_last:
        model.to(memory_format=torch.channels_last)
    note = "" if on_gpu or not (amp or channels_last) else \
        "no-op on the CPU (float32 throughout): CPU autocast is slower without bfloat16 units and changes every number"
    return {"amp_requested": bool(amp), "amp_active": dtype is not None, "autocast_dtype": str(dtype) if dtype else None,
            "channels_last_requested": bool(channels_last), "channels_last_active": model.channels_last,
            "device": str(device), "note": note}


def weights_hash(model: nn.Module) -> str:
    """SHA-256 over the model's state dict (names, dtypes, shapes and bytes), independent of file format; a model
    run under autocast or channels-last (:func:`set_precision`) also hashes that mode, so cached attacks and
    scores made in one numeric mode are never reused for another."""
    h = hashlib.sha256()
    if getattr(model, "autocast_dtype", None) is not None or getattr(model, "channels_last", False):
        h.update(f"precision|{model.autocast_dtype}|channels_last={model.channels_last}".encode())
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.float().numpy().tobytes())
    return h.hexdigest()


def build_from_config(spec: Any, checkpoint: Path | None, device: torch.device | str) -> Classifier:
    """:func:`build_model` from a plan's ``model`` section (:class:`~advopenood.models.specs.ModelSpec`)."""
    m = spec
    return build_model(m.arch, m.num_classes, checkpoint, mean=m.mean, std=m.std, input_size=m.input_size,
                       in_channels=m.in_channels, device=device)
