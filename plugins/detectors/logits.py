"""The output-based detectors of OpenOOD v1.5 (MSP, ODIN, EBO, KLM, MLS, GEN), on the pytorch-ood backend.

They read the logits only (ODIN also the input gradient). Each class takes OpenOOD's hyperparameters (the
``postprocessor_args`` of our copy of its YAML config) and maps them onto the pytorch-ood detector: scores are
negated into OpenOOD's *confidence* (higher = more ID). With ``--detector-backend openood`` the same names run
OpenOOD's own postprocessor classes instead (``openood_name``); see :mod:`advopenood.detectors`.
Formulas use ``f(x)`` for the logits and ``p = softmax(f(x))``.

Every detector also has ``grad_score``: the same confidence as a differentiable function of the input, for the
detector-adaptive attacks (``plugins/attacks/adaptive.py``); where a part is not differentiable it uses BPDA
(Athalye, Carlini & Wagner, ICML 2018), and the class's docstring says so.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from advopenood.plugin import Batches, DifferentiableDetector, Outputs, Postprocessor, frozen, register
from advopenood_plugins.kit.detectors import pytorch_ood, straight_through


@register("detectors", "msp")
class MSP(Postprocessor, DifferentiableDetector):
    """MSP, maximum softmax probability (Hendrycks & Gimpel, ICLR 2017).

    ``conf = max_k p_k``.
    """

    openood_name = "msp"
    source_scale = "same"  # OpenOOD's postprocessor returns this confidence

    def score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -pytorch_ood().MaxSoftmax.score(out.logits)

    grad_score = score


@register("detectors", "odin")
class ODIN(Postprocessor, DifferentiableDetector):
    """ODIN, temperature scaling + input perturbation (Liang et al., ICLR 2018); the input gradient from the
    shared pass (``needs_input_grad``): one backward and one forward on ``x'`` per batch.

    ``x' = x - noise * sign(-grad_x log max_k softmax(f(x)/T)_k)``, ``conf = max_k softmax(f(x')/T)_k``
    with OpenOOD's ``T = 1000``, ``noise = 0.0014`` in pixel units. ``input_std`` (None for our [0, 1]-input
    networks) divides the gradient sign per channel for networks that take normalised inputs, as OpenOOD does.
    BPDA: the preprocessing step ``x' - x`` is a constant in the backward pass (its sign is piecewise constant).
    """

    openood_name = "odin"
    own_pass = True
    needs_input_grad = True

    @classmethod
    def openood_adapt(cls, pp: Any) -> None:
        """OpenOOD divides the gradient by the normalisation std; our networks take [0, 1] pixels, so it is 1."""
        pp.input_std = [1.0] * len(pp.input_std)

    def score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        """From the shared pass's graph (``x`` a leaf of ``out.logits``): one backward for the input gradient and
        one forward on ``x'``, pytorch-ood's ``odin_preprocessing`` step by step; otherwise pytorch-ood's
        ``ODIN.predict`` (its own forward, backward and forward)."""
        temperature = self.p.temperature
        if out.logits.requires_grad and x.requires_grad:
            x_hat = self._preprocessed(x, out)
            with torch.no_grad():
                return (net(x_hat) / temperature).softmax(dim=1).max(dim=1).values
        det = pytorch_ood().ODIN(net, eps=self.p.noise, temperature=self.p.temperature,
                      norm_std=list(self.input_std) if self.input_std else None)
        with frozen(net):
            return -det.predict(x)

    def _preprocessed(self, x: Tensor, out: Outputs) -> Tensor:
        """``x'`` from the graph of ``out`` (a pass over ``x`` with gradients): one backward, no forward."""
        logits = out.logits / self.p.temperature
        (gradient,) = torch.autograd.grad(F.cross_entropy(logits, logits.max(dim=1).indices), x, retain_graph=True)
        gradient = gradient.sign()
        if self.input_std:
            std = torch.tensor(self.input_std, dtype=gradient.dtype, device=gradient.device)
            gradient = gradient / std.view(1, -1, *([1] * (gradient.ndim - 2)))
        return x.detach() - self.p.noise * gradient

    def grad_score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        """The preprocessing gradient from ``out``'s graph when the caller's pass has one (the adaptive attacks'
        shared pass), else from pytorch-ood's ``odin_preprocessing`` (a forward and a backward of its own)."""
        temperature = self.p.temperature
        if out.logits.requires_grad and x.requires_grad:
            x_hat = self._preprocessed(x, out)
        else:
            x_hat = pytorch_ood().odin.odin_preprocessing(net, x.detach(), eps=self.p.noise,
                                                   temperature=temperature,
                                                   norm_std=list(self.input_std) if self.input_std else None)
        logits = net(x + (x_hat - x).detach()) / temperature
        return logits.softmax(1).max(1).values


@register("detectors", "ebo")
class EBO(Postprocessor, DifferentiableDetector):
    """EBO, energy score (Liu et al., NeurIPS 2020).

    ``conf = T * logsumexp(f(x) / T)`` with OpenOOD's ``T = 1``.
    """

    openood_name = "ebo"
    source_scale = "same"  # OpenOOD's postprocessor returns this confidence

    def score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -pytorch_ood().EnergyBased.score(out.logits, t=self.p.temperature)

    grad_score = score


@register("detectors", "klm")
class KLM(Postprocessor, DifferentiableDetector):
    """KLM, KL matching to class-typical posteriors (Hendrycks et al., ICML 2022).

    ``d_k`` = mean posterior of the fit samples predicted as ``k``; ``conf = -min_k KL(p || d_k)``.
    OpenOOD fits on ID validation data; we use the ID fit set.
    """

    openood_name = "klm"
    requires_fit = True

    def fit(self, net: nn.Module, outputs: Outputs, labels: Tensor, batches: Batches) -> None:
        self.det = pytorch_ood().KLMatching(None).fit_logits(outputs.logits, labels.to(outputs.logits.device))

    def score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -self.det.predict_logits(out.logits)

    grad_score = score


@register("detectors", "mls")
class MLS(Postprocessor, DifferentiableDetector):
    """MLS, maximum logit (Hendrycks et al., ICML 2022).

    ``conf = max_k f_k(x)``.
    """

    openood_name = "mls"
    source_scale = "same"  # OpenOOD's postprocessor returns this confidence

    def score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -pytorch_ood().MaxLogit.score(out.logits)

    grad_score = score


@register("detectors", "gen")
class GEN(Postprocessor, DifferentiableDetector):
    """GEN, generalised entropy of the top-M probabilities (Liu et al., CVPR 2023).

    ``conf = -sum_{top-M} p_j^gamma (1 - p_j)^gamma`` with OpenOOD's ``gamma = 0.1``, ``M = 100``
    (pytorch-ood averages instead of summing; the order is the same).
    """

    openood_name = "gen"
    #: :meth:`source_score` is OpenOOD's summed, unclamped form (this score is pytorch-ood's mean over the top-M
    #: classes, with probabilities clamped to [1e-7, 1 - 1e-7])
    source_scale = "openood"

    def score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -pytorch_ood().GEN.score(out.logits, gamma=self.p.gamma, M=self.p.M)

    grad_score = score

    def source_score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        """OpenOOD's GEN (``gen_postprocessor.py``, ``generalized_entropy``): ``-sum_{top-M} p^gamma (1 - p)^gamma``
        over the softmax sorted ascending, ``[:, -M:]``, unclamped: ``min(M, C)`` times pytorch-ood's mean where no
        probability is clamped (on CIFAR-10, 10 times)."""
        return openood_gen(out.logits, self.p.gamma, self.p.M)

    def source_grad_score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        """:meth:`source_score` forward; the gradient of the same sum with the probabilities clamped to [1e-7,
        1 - 1e-7] (``p ** gamma`` has an infinite derivative at a probability that underflows to 0)."""
        top = out.logits.softmax(1).clamp(1e-7, 1 - 1e-7).sort(1).values[:, -int(self.p.M):]
        surrogate = -(top.pow(self.p.gamma) * (1 - top).pow(self.p.gamma)).sum(1)
        return straight_through(openood_gen(out.logits, self.p.gamma, self.p.M), surrogate)


def openood_gen(logits: Tensor, gamma: float, M: int) -> Tensor:
    """OpenOOD's GEN confidence of ``logits`` (``GENPostprocessor.generalized_entropy`` of the softmax)."""
    top = logits.softmax(1).sort(1).values[:, -int(M):]
    return -(top ** gamma * (1 - top) ** gamma).sum(1)
