"""The feature-distance detectors of OpenOOD v1.5 (MDS, RMDS, VIM, KNN, NNGuide), on the pytorch-ood backend.

They fit on the training set's penultimate features ``z`` and score a sample by its distance to them. Each class
takes OpenOOD's hyperparameters and maps them onto the pytorch-ood detector, scores negated into OpenOOD's
*confidence* (higher = more ID); ``openood_name`` names OpenOOD's own class for ``--detector-backend openood``.
Formulas use ``z`` for the penultimate feature and ``f(x) = W z + b`` for the logits. ``grad_score`` is the same
confidence as a differentiable function of the input (selections such as the closest class mean or the K-th
neighbour are differentiated through the selected element, the exact gradient almost everywhere).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from advopenood.plugin import Batches, DifferentiableDetector, Outputs, Postprocessor, fc_layer, register, vim_dim
from advopenood_plugins.kit.detectors import pytorch_ood, with_grad


@register("detectors", "mds")
class MDS(Postprocessor, DifferentiableDetector):
    """MDS, Mahalanobis distance to the closest class mean (Lee et al., NeurIPS 2018).

    Class means ``mu_k`` and one shared covariance ``S`` of the training features;
    ``conf = -min_k (z - mu_k)^T S^-1 (z - mu_k)`` (pytorch-ood halves it; the order is the same).
    """

    score_space = "features"

    openood_name = "mds"
    requires_fit = True
    needs_all_classes = True

    def fit(self, net: nn.Module, outputs: Outputs, labels: Tensor, batches: Batches) -> None:
        self.det = pytorch_ood().Mahalanobis(None).fit_features(outputs.features.float(),
                                                                labels.to(outputs.features.device))

    def score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -self.det.predict_features(out.features)

    def grad_score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        centered = out.features.float()[:, None, :] - self.det.mu[None]
        distance = torch.einsum("bkd,de,bke->bk", centered, self.det.precision, centered)
        return -0.5 * distance.min(1).values


@register("detectors", "rmds")
class RMDS(Postprocessor, DifferentiableDetector):
    """RMDS, relative Mahalanobis distance (Ren et al., arXiv 2021).

    ``conf = -min_k [d_k(z) - d_0(z)]`` with ``d_k`` the class-conditional and ``d_0`` the class-agnostic
    (background) squared Mahalanobis distance, both fitted on the training features.
    """

    score_space = "features"

    openood_name = "rmds"
    requires_fit = True
    needs_all_classes = True

    def fit(self, net: nn.Module, outputs: Outputs, labels: Tensor, batches: Batches) -> None:
        self.det = pytorch_ood().RMD(None).fit_features(outputs.features.float(), labels.to(outputs.features.device))

    def score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -self.det.predict_features(out.features)

    def grad_score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -with_grad(self.det.predict_features)(out.features)


@register("detectors", "vim")
class VIM(Postprocessor, DifferentiableDetector):
    """VIM, virtual-logit matching (Wang et al., CVPR 2022).

    Origin ``u = -W^+ b``; ``R`` = the residual of the top-``dim`` principal subspace of the training features;
    ``conf = logsumexp(f(x)) - alpha * ||(z - u) R||`` with ``alpha`` matching mean max-logit and residual norm.
    ``dim`` is OpenOOD's 256, or half the feature width when that leaves no residual.
    """

    score_space = "features"

    openood_name = "vim"
    requires_fit = True

    @classmethod
    def openood_adapt_args(cls, args: dict[str, Any], feature_dim: int) -> dict[str, Any]:
        """OpenOOD's ``dim`` only where it leaves a residual (:func:`~advopenood.detectors.vim_dim`)."""
        return {**args, "dim": vim_dim(args["dim"], feature_dim)}

    def fit(self, net: nn.Module, outputs: Outputs, labels: Tensor, batches: Batches) -> None:
        fc = fc_layer(net)
        self.det = pytorch_ood().ViM(None, d=vim_dim(self.p.dim, fc.in_features), w=fc.weight, b=fc.bias)
        self.det.fit_features(outputs.features, labels)

    def score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -self.det.predict_features(out.features)

    def grad_score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        z = out.features.float()
        residual = ((z - self.det.u) @ self.det.principal_subspace).norm(dim=-1) * self.det.alpha
        return torch.logsumexp(z @ self.det.w.T + self.det.b, dim=-1) - residual


@register("detectors", "knn")
class KNN(Postprocessor, DifferentiableDetector):
    """KNN, distance to the K-th nearest training feature (Sun et al., ICML 2022).

    ``conf = -||z/||z|| - z_(K)||`` over L2-normalised training features, OpenOOD's ``K = 50``
    (OpenOOD uses the squared distance; the order is the same).
    BPDA: the neighbour search is a constant selection; the gradient is that of the distance to the current
    K-th neighbour (exact almost everywhere), computed against the normalised training features in torch.
    """

    score_space = "features"

    openood_name = "knn"
    requires_fit = True

    def fit(self, net: nn.Module, outputs: Outputs, labels: Tensor, batches: Batches) -> None:
        self.det = pytorch_ood().KNN(None, k=self.p.K).fit_features(outputs.features.float().cpu(), labels)
        self.bank = F.normalize(outputs.features.float(), dim=1, eps=1e-12)

    def score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -self.det.predict_features(out.features)

    def grad_score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        z = F.normalize(out.features.float(), dim=1, eps=1e-12)
        distances = torch.cdist(z, self.bank.to(z.device))
        return -distances.kthvalue(self.p.K, dim=1).values

    #: OpenOOD ranks by the squared distance (faiss ``IndexFlatL2``): :meth:`source_score` squares it
    source_scale = "openood"

    def source_score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        """OpenOOD's KNN confidence (``knn_postprocessor.py``: ``kth_dist = -D[:, -1]``, faiss ``IndexFlatL2``
        distances, which are squared): ``-d_K ** 2``."""
        return -self.score(net, x, out) ** 2

    def source_grad_score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -self.grad_score(net, x, out) ** 2


def nnguide_bank_size(n: int, alpha: float, batch_size: int, k: int) -> int:
    """Rows in NNGuide's bank as OpenOOD takes them: whole batches until more than ``int(n * alpha)`` rows
    (1 % by default), but at least ``k`` and at most ``n``."""
    rows = (int(n * alpha) // batch_size + 1) * batch_size
    return min(n, max(rows, k))


@register("detectors", "nnguide")
class NNGuide(Postprocessor, DifferentiableDetector):
    """NNGuide, nearest-neighbour-guided energy (Park et al., ICCV 2023).

    Bank: ``E(z') z'/||z'||`` of the first 1 % of the (shuffled) fit set; ``conf = E(x) * mean of the K = 100
    largest inner products <z/||z||, bank>`` with ``E = logsumexp(f)``.
    BPDA: the neighbour search is a constant selection; the gradient flows through the K selected inner products.
    """

    score_space = "features"

    openood_name = "nnguide"
    requires_fit = True

    def rows_needed(self, n: int) -> int:
        n = super().rows_needed(n)
        return nnguide_bank_size(n, self.p.alpha, self.batch_size, self.p.K)

    def fit(self, net: nn.Module, outputs: Outputs, labels: Tensor, batches: Batches) -> None:
        self.det = pytorch_ood().NNGuide(None, head=fc_layer(net), k=self.p.K)
        self.det.fit_features(outputs.features, labels)

    def score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -self.det.predict_features(out.features)

    def grad_score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -with_grad(self.det.predict_features)(out.features)
