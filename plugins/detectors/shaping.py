"""The activation-shaping detectors of OpenOOD v1.5 (REACT, DICE, ASH, SCALE), on the pytorch-ood backend.

They reshape the penultimate feature ``z`` (clip, sparsify, prune or rescale it) before the energy of the logits
``f(x) = W z + b``. Each class takes OpenOOD's hyperparameters (percentiles become fractions) and maps them onto
the pytorch-ood detector, scores negated into OpenOOD's *confidence* (higher = more ID); ``openood_name`` names
OpenOOD's own class for ``--detector-backend openood``. ``grad_score`` is the same confidence as a differentiable
function of the input, with BPDA (a straight-through surrogate) where the shaping is not differentiable.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch.nn as nn
from torch import Tensor

from advopenood.plugin import Batches, DifferentiableDetector, Outputs, Postprocessor, fc_layer, register
from advopenood_plugins.kit.detectors import classifier_head, pytorch_ood, straight_through, with_grad

if TYPE_CHECKING:
    from pytorch_ood.detector import ASH as PodASH
    from pytorch_ood.detector import SCALE as PodSCALE


@register("detectors", "react")
class REACT(Postprocessor, DifferentiableDetector):
    """REACT, rectified penultimate activations + energy (Sun et al., NeurIPS 2021).

    ``c`` = the ``percentile``-th percentile (OpenOOD: 90) of the fit set's penultimate activations;
    ``conf = logsumexp(W min(z, c) + b)``.
    BPDA: the clipping is the identity in the backward pass (straight-through), so clipped units still move.
    """

    openood_name = "react"
    openood_wrapper = ("openood.networks.react_net", "ReactNet")
    requires_fit = True

    def fit(self, net: nn.Module, outputs: Outputs, labels: Tensor, batches: Batches) -> None:
        self.det = pytorch_ood().ReAct(backbone=None, head=classifier_head(net),
                                       percentile=self.p.percentile / 100.0)
        self.det.fit_feature_maps(outputs.features, labels)

    def score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -self.det.predict_feature_maps(out.features)

    def grad_score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        z = straight_through(out.features.clip(max=self.det.threshold), out.features)
        return -self.det.detector(self.det.head(z))


@register("detectors", "dice")
class DICE(Postprocessor, DifferentiableDetector):
    """DICE, sparsified final layer + energy (Sun & Li, ECCV 2022).

    Weights whose contribution ``mean(z) * W`` lies below its ``p``-th percentile (OpenOOD: 90) are zeroed;
    ``conf = logsumexp(W_masked z + b)``.
    """

    openood_name = "dice"
    requires_fit = True

    def fit(self, net: nn.Module, outputs: Outputs, labels: Tensor, batches: Batches) -> None:
        fc = fc_layer(net)
        self.det = pytorch_ood().DICE(None, w=fc.weight, b=fc.bias, p=self.p.p / 100.0)
        self.det.fit_features(outputs.features, labels.to(outputs.features.device))

    def score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -self.det.predict_features(out.features)

    def grad_score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -with_grad(self.det.predict_features)(out.features)


@register("detectors", "ash")
class ASH(Postprocessor, DifferentiableDetector):
    """ASH-B, binarised activation shaping + energy (Djurisic et al., ICLR 2023).

    Of the penultimate feature, the lowest ``percentile`` % (OpenOOD: 90) are zeroed and the rest set to
    ``sum(z) / k``; ``conf = logsumexp(W ash_b(z) + b)`` (OpenOOD's ``ASHNet`` uses ASH-B).
    """

    openood_name = "ash"
    openood_wrapper = ("openood.networks.ash_net", "ASHNet")

    def _det(self, net: nn.Module) -> PodASH:
        return pytorch_ood().ASH(backbone=None, head=classifier_head(net), variant="ash-b",
                                 percentile=self.p.percentile / 100.0)

    def score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -self._det(net).predict_feature_maps(out.features[:, :, None, None])

    def grad_score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -with_grad(self._det(net).predict_feature_maps)(out.features[:, :, None, None])


@register("detectors", "scale")
class SCALE(Postprocessor, DifferentiableDetector):
    """SCALE, activation scaling + energy (Xu et al., ICLR 2024).

    ``r = sum(z) / sum(top (100 - percentile) % of z)`` (OpenOOD: percentile 85);
    ``conf = logsumexp(W z exp(r) + b)``.
    """

    openood_name = "scale"
    openood_wrapper = ("openood.networks.scale_net", "ScaleNet")

    def _det(self, net: nn.Module) -> PodSCALE:
        return pytorch_ood().SCALE(backbone=None, head=classifier_head(net),
                                   percentile=self.p.percentile / 100.0)

    def score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -self._det(net).predict_feature_maps(out.features[:, :, None, None])

    def grad_score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -with_grad(self._det(net).predict_feature_maps)(out.features[:, :, None, None])


# GRAM as the paper ran it (OpenOOD's before bdf6a55); importing the module registers ``gram_legacy``
