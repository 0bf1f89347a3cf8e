"""The 16 post-hoc detectors of OpenOOD v1.5 that the paper evaluates, on the pytorch-ood backend.

Each class takes OpenOOD's hyperparameters (the ``postprocessor_args`` of our copy of its YAML config) and
maps them onto the pytorch-ood detector: scores are negated into OpenOOD's *confidence* (higher = more ID),
percentiles become fractions, and the detectors that OpenOOD applies to the penultimate feature (REACT,
ASH, SCALE, DICE) get the penultimate feature. With ``--detector-backend openood`` the same names run
OpenOOD's own postprocessor classes instead (``openood_name``); see :mod:`advopenood.detectors`.
Formulas use ``z`` for the penultimate feature, ``f(x) = W z + b`` for the logits and ``p = softmax(f(x))``.

Every detector also has ``grad_score``: the same confidence as a differentiable function of the input, for
the detector-adaptive attacks (``plugins/adaptive.py``). Where the detector has a non-differentiable part,
``grad_score`` uses BPDA (Athalye, Carlini & Wagner, ICML 2018), the forward value unchanged and a surrogate
in the backward pass; each class's docstring says which (``BPDA:`` line). Selections (the closest class
mean, the K-th neighbour, the top-k activations, the predicted class's GRAM range) are differentiated
through the currently selected element, which is the exact gradient almost everywhere.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from advopenood.attacks.base import frozen
from advopenood.capabilities import DifferentiableDetector
from advopenood.detection.outputs import Batches, Outputs, Taps, fc_layer
from advopenood.detection.postprocessor import Postprocessor, vim_dim
from advopenood.registry import register
from advopenood.provenance import seeded

if TYPE_CHECKING:
    from pytorch_ood.detector import ASH as PodASH
    from pytorch_ood.detector import SCALE as PodSCALE


def _pod() -> Any:
    """``pytorch_ood.detector``, imported on first use (it pulls in torchvision's model zoo: seconds), so that
    listing and validating detectors stays fast."""
    import pytorch_ood.detector

    return pytorch_ood.detector


#: The 16 built-in detectors in the paper's order (OpenOOD v1.5's post-hoc methods).
BUILTIN_DETECTORS = ("msp", "odin", "mds", "rmds", "gram", "ebo", "klm", "mls", "react", "vim", "knn", "dice", "ash",
                     "gen", "nnguide", "scale")


def with_grad(method: Callable) -> Callable:
    """A bound pytorch-ood scoring method without its decorators (``@torch.no_grad()`` and pytorch-ood's
    device mover, which both keep the original as ``__wrapped__``), so the attack differentiates the very
    code that scores; the caller's tensors are already on the detector's device."""
    return inspect.unwrap(method.__func__).__get__(method.__self__)


def straight_through(value: Tensor, surrogate: Tensor) -> Tensor:
    """BPDA straight-through: the forward value of ``value``, the gradient of ``surrogate``."""
    return surrogate + (value - surrogate).detach()


def _head(net: nn.Module) -> Callable[[Tensor], Tensor]:
    """The final linear layer applied to (possibly ``B x D x 1 x 1``) features."""
    fc = fc_layer(net)
    return lambda z: fc(z.flatten(1))


@register("detectors", "msp")
class MSP(Postprocessor, DifferentiableDetector):
    """MSP, maximum softmax probability (Hendrycks & Gimpel, ICLR 2017).

    ``conf = max_k p_k``.
    """

    openood_name = "msp"

    def score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -_pod().MaxSoftmax.score(out.logits)

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
        temperature = float(self.params["temperature"])
        if out.logits.requires_grad and x.requires_grad:
            x_hat = self._preprocessed(x, out)
            with torch.no_grad():
                return (net(x_hat) / temperature).softmax(dim=1).max(dim=1).values
        det = _pod().ODIN(net, eps=float(self.params["noise"]), temperature=float(self.params["temperature"]),
                      norm_std=list(self.input_std) if self.input_std else None)
        with frozen(net):
            return -det.predict(x)

    def _preprocessed(self, x: Tensor, out: Outputs) -> Tensor:
        """``x'`` from the graph of ``out`` (a pass over ``x`` with gradients): one backward, no forward."""
        logits = out.logits / float(self.params["temperature"])
        (gradient,) = torch.autograd.grad(F.cross_entropy(logits, logits.max(dim=1).indices), x, retain_graph=True)
        gradient = gradient.sign()
        if self.input_std:
            std = torch.tensor(self.input_std, dtype=gradient.dtype, device=gradient.device)
            gradient = gradient / std.view(1, -1, *([1] * (gradient.ndim - 2)))
        return x.detach() - float(self.params["noise"]) * gradient

    def grad_score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        """The preprocessing gradient from ``out``'s graph when the caller's pass has one (the adaptive attacks'
        shared pass), else from pytorch-ood's ``odin_preprocessing`` (a forward and a backward of its own)."""
        temperature = float(self.params["temperature"])
        if out.logits.requires_grad and x.requires_grad:
            x_hat = self._preprocessed(x, out)
        else:
            x_hat = _pod().odin.odin_preprocessing(net, x.detach(), eps=float(self.params["noise"]),
                                                   temperature=temperature,
                                                   norm_std=list(self.input_std) if self.input_std else None)
        logits = net(x + (x_hat - x).detach()) / temperature
        return logits.softmax(1).max(1).values


@register("detectors", "mds")
class MDS(Postprocessor, DifferentiableDetector):
    """MDS, Mahalanobis distance to the closest class mean (Lee et al., NeurIPS 2018).

    Class means ``mu_k`` and one shared covariance ``S`` of the training features;
    ``conf = -min_k (z - mu_k)^T S^-1 (z - mu_k)`` (pytorch-ood halves it; the order is the same).
    """

    openood_name = "mds"
    requires_fit = True
    needs_all_classes = True

    def fit(self, net: nn.Module, outputs: Outputs, labels: Tensor, batches: Batches) -> None:
        self.det = _pod().Mahalanobis(None).fit_features(outputs.features.float(), labels.to(outputs.features.device))

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

    openood_name = "rmds"
    requires_fit = True
    needs_all_classes = True

    def fit(self, net: nn.Module, outputs: Outputs, labels: Tensor, batches: Batches) -> None:
        self.det = _pod().RMD(None).fit_features(outputs.features.float(), labels.to(outputs.features.device))

    def score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -self.det.predict_features(out.features)

    def grad_score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -with_grad(self.det.predict_features)(out.features)


GRAM_CHUNK = 64


def raise_powers(flat: Tensor, powers: list[int]) -> dict[int, Tensor]:
    """``{p: F^p}`` for every power. Integer powers >= 1 are built by repeated multiplication
    (``F^p = F^(p-1) F``), as ``torch.pow`` itself computes ``p`` = 2 and 3; for ``p`` >= 4 this is within a few
    ulp of ``pow`` (which calls a vectorised ``exp(p log x)``, 4-8x the cost of a multiplication). Other
    powers use ``pow``."""
    if not all(float(p).is_integer() and p >= 1 for p in powers):
        return {p: flat ** p for p in powers}
    raised, current = {}, flat
    for p in range(1, int(max(powers)) + 1):
        current = flat if p == 1 else current * flat
        if p in powers:
            raised[p] = current
    return raised


def gram_vectors(maps: list[Tensor], powers: list[int]) -> Tensor:
    """GRAM's per-sample statistics for fitting, ``B x P x sum_l C_l``, in pytorch-ood's summation order.

    ``G = sign(S) |S|^(1/p)`` with ``S = rowsum((F^p)(F^p)^T)``: the ``C_l x C_l`` Gram matrix is formed and its
    rows summed, as ``pytorch_ood.detector.Gram._gram_vector`` does (Sastry & Oore, ICML 2020). The class
    bounds are sensitive to that order: fitting on :func:`gram_statistics`'s ``F^p colsum(F^p)`` moved GRAM's
    scores by up to 5.8e-4 of their scale against pytorch-ood's (fit on 200 rows; 1.2e-5 on 1,000). The powers
    come from :func:`raise_powers`: their last-ulp differences from ``pow`` moved the scores by at most 1.2e-7
    of their scale (fits on 200, 1,000 and 10,000 rows, the benchmark's five sets) and cut the fit's time by a
    third to a half.
    """
    stats = []
    for feature in maps:
        raised = raise_powers(feature.detach().flatten(2), powers)
        rows = []
        for p in powers:
            s = torch.matmul(raised[p], raised[p].transpose(2, 1)).sum(2)
            rows.append(s.sign() * torch.abs(s) ** (1 / p))
        stats.append(torch.stack(rows, 1))
    return torch.cat(stats, 2)


def gram_statistics(maps: list[Tensor], powers: list[int]) -> Tensor:
    """GRAM's per-sample statistics of a batch, all tapped layers and powers at once: ``B x P x sum_l C_l``.

    Per tapped map ``F_l`` (``C_l x HW``) and power ``p``: ``S = rowsum(F^p (F^p)^T) = F^p colsum(F^p)`` (the
    ``C_l x C_l`` Gram matrix is never formed; ``F^p colsum(F^p)`` is a multiplication and a sum over ``HW``,
    about twice as fast on the CPU as a batched matrix-vector product) and ``G = sign(S) |S|^(1/p)`` (Sastry &
    Oore, ICML 2020); ``|S|`` is clamped to the smallest positive float before the root, so the result is
    differentiable. Powers come from :func:`raise_powers`. A batch is taken in nearly equal pieces of at most
    :data:`GRAM_CHUNK` samples, which bounds the memory of the powers (each sample's statistics are the same
    either way).
    """
    if len(maps[0]) > GRAM_CHUNK:
        pieces = -(-len(maps[0]) // GRAM_CHUNK)
        return torch.cat([gram_statistics(list(chunk), powers)
                          for chunk in zip(*(m.tensor_split(pieces) for m in maps))])
    stats = []
    for feature in maps:
        raised = raise_powers(feature.flatten(2), powers)  # B x C x HW each
        rowsum = torch.stack([(raised[p] * raised[p].sum(1, keepdim=True)).sum(2) for p in powers], 1)  # B x P x C
        root = 1 / torch.as_tensor(powers, dtype=rowsum.dtype, device=rowsum.device)[None, :, None]
        stats.append(rowsum.sign() * rowsum.abs().clamp_min(torch.finfo(rowsum.dtype).tiny) ** root)
    return torch.cat(stats, 2)


def gram_layer_deviation(g: Tensor, lo: Tensor, hi: Tensor, layer_of: Tensor, n_layers: int) -> Tensor:
    """``delta_l = sum_{p, c in l} relu(min - G) / |min + 1e-6| + relu(G - max) / |max + 1e-6|`` per sample
    and layer (``B x L``), for statistics ``g`` and bounds ``lo``/``hi`` (all ``B x P x sum_l C_l``)."""
    per_entry = (F.relu(lo - g) / (lo + 1e-6).abs() + F.relu(g - hi) / (hi + 1e-6).abs()).sum(1)  # B x sum_l C_l
    return per_entry.new_zeros(len(g), n_layers).index_add_(1, layer_of, per_entry)


def gram_deviation(maps: list[Tensor], predictions: Tensor, powers: list[int], mins: Tensor, maxs: Tensor,
                   layer_of: Tensor, layer_norm: Tensor) -> Tensor:
    """GRAM's total deviation of a batch (Sastry & Oore, ICML 2020), all layers and powers at once:
    ``Delta = sum_l delta_l / E[delta_l]`` against the predicted class's bounds ``mins``/``maxs``
    (``K x P x sum_l C_l``; :func:`gram_statistics`, :func:`gram_layer_deviation`); ``layer_of`` maps each
    column to its layer, ``layer_norm`` is ``E[delta_l]``."""
    g = gram_statistics(maps, powers)
    per_layer = gram_layer_deviation(g, mins[predictions], maxs[predictions], layer_of, len(layer_norm))
    return (per_layer / layer_norm).sum(1)


def gram_fit(stats: Tensor, labels: Tensor, num_classes: int, layer_of: Tensor, n_layers: int,
             validation_fraction: float = 0.1) -> tuple[Tensor, Tensor, Tensor]:
    """GRAM's fit from per-sample statistics ``N x P x sum_l C_l`` (:func:`gram_statistics`), vectorised.

    As pytorch-ood's ``Gram.fit``: per class ``c`` (in order) a ``torch.randperm`` of its rows holds out the
    first ``int(0.1 n_c)`` (seed the caller's generator); ``min``/``max`` of the rest are the class bounds
    (``K x P x sum_l C_l``); ``E[delta_l]`` is the held-out rows' mean deviation per layer (1 where it is 0 or
    no row is held out). Negative labels are ignored; a class without rows raises ValueError.
    """
    labels = labels.to(stats.device)
    train_rows, val_rows, val_class = [], [], []
    for c in range(num_classes):
        rows = (labels == c).nonzero().flatten()
        if len(rows) == 0:
            raise ValueError(f"No ID samples for class {c}")
        perm = torch.randperm(len(rows)).to(rows.device)
        n_val = int(validation_fraction * len(rows))
        train_rows.append(rows[perm[n_val:]])
        val_rows.append(rows[perm[:n_val]])
        val_class.append(torch.full((n_val,), c, dtype=torch.long, device=rows.device))
    mins = torch.stack([stats[r].min(0).values for r in train_rows])
    maxs = torch.stack([stats[r].max(0).values for r in train_rows])
    val, cls = torch.cat(val_rows), torch.cat(val_class)
    norm = torch.ones(n_layers, dtype=stats.dtype, device=stats.device)
    if len(val):
        mean = gram_layer_deviation(stats[val], mins[cls], maxs[cls], layer_of, n_layers).mean(0)
        norm = torch.where(mean > 0, mean, norm)
    return mins, maxs, norm


@register("detectors", "gram")
class GRAM(Postprocessor, DifferentiableDetector):
    """GRAM, Gram-matrix deviations (Sastry & Oore, ICML 2020), scored from the shared pass's tapped maps.

    Per tapped layer ``l`` and power ``p``: ``G = rowsum((F^p)(F^p)^T)^(1/p)``; ``delta`` sums how far each
    entry leaves the ``[min, max]`` seen in training for the predicted class; layers are normalised by the
    mean deviation of a held-out 10 % and, as in OpenOOD, ``conf = -sum_l delta_l / E[delta_l] / max_k p_k``
    (:func:`gram_deviation`). Fitting reads the shared fit pass: its per-sample statistics
    (:meth:`tap_statistics`) go to :func:`gram_fit`, pytorch-ood's ``Gram.fit`` vectorised (same seeded split).
    BPDA: none needed; the min/max hinges are piecewise linear and the predicted class is a selection.
    """

    openood_name = "gram"
    requires_fit = True
    needs_all_classes = True
    needs_taps = True

    def tap_statistics(self, taps: list[Tensor]) -> Tensor:
        """Per-sample statistics of the fit pass's tapped maps, kept instead of the maps: ``B x P x sum_l C_l``
        (:func:`gram_vectors`, pytorch-ood's summation order)."""
        return gram_vectors(taps, list(self.params["powers"]))

    def fit(self, net: nn.Module, outputs: Outputs, labels: Tensor, batches: Batches) -> None:
        if outputs.stats is None:
            raise ValueError("GRAM fits from the fit pass's tap statistics, which the fit pass did not record")
        self.taps = Taps(net)
        x0, _ = next(iter(batches()))
        sizes = [m.shape[1] for m in self.taps(x0[:1].to(self.device))[1]]
        self.powers = list(self.params["powers"])
        self.layer_of = torch.cat([torch.full((c,), i, dtype=torch.long) for i, c in enumerate(sizes)]).to(self.device)
        with seeded(self.seed):
            # pytorch-ood's Gram.fit drew its split after iterating a DataLoader, which takes one int64 draw for
            # its base seed; taking it here keeps the held-out split (and every score) as before
            torch.empty((), dtype=torch.int64).random_()
            self.mins, self.maxs, self.layer_norm = gram_fit(outputs.stats.to(self.device), labels,
                                                             outputs.logits.shape[1], self.layer_of, len(sizes))

    def fit_state(self) -> dict[str, Tensor]:
        return {"mins": self.mins, "maxs": self.maxs, "layer_of": self.layer_of, "layer_norm": self.layer_norm}

    def load_fit_state(self, net: nn.Module, state: dict[str, Tensor]) -> None:
        self.taps = Taps(net)
        self.powers = list(self.params["powers"])
        self.mins, self.maxs, self.layer_of, self.layer_norm = (state[k].to(self.device) for k in
                                                                ("mins", "maxs", "layer_of", "layer_norm"))

    def _confidence(self, logits: Tensor, maps: list[Tensor]) -> Tensor:
        deviation = gram_deviation(maps, logits.argmax(1), self.powers, self.mins, self.maxs, self.layer_of,
                                   self.layer_norm)
        return -deviation / logits.softmax(1).max(1).values

    def score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        if out.taps is None:
            logits, maps = self.taps(x)
            return self._confidence(logits, maps)
        return self._confidence(out.logits, out.taps)

    def grad_score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        """From ``out``'s tapped maps when the caller's pass recorded them (the adaptive attacks' shared pass),
        else from a pass of its own."""
        return self._confidence(*((out.logits, out.taps) if out.taps is not None else self.taps.forward(x)))


@register("detectors", "ebo")
class EBO(Postprocessor, DifferentiableDetector):
    """EBO, energy score (Liu et al., NeurIPS 2020).

    ``conf = T * logsumexp(f(x) / T)`` with OpenOOD's ``T = 1``.
    """

    openood_name = "ebo"

    def score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -_pod().EnergyBased.score(out.logits, t=float(self.params["temperature"]))

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
        self.det = _pod().KLMatching(None).fit_logits(outputs.logits, labels.to(outputs.logits.device))

    def score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -self.det.predict_logits(out.logits)

    grad_score = score


@register("detectors", "mls")
class MLS(Postprocessor, DifferentiableDetector):
    """MLS, maximum logit (Hendrycks et al., ICML 2022).

    ``conf = max_k f_k(x)``.
    """

    openood_name = "mls"

    def score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -_pod().MaxLogit.score(out.logits)

    grad_score = score


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
        self.det = _pod().ReAct(backbone=None, head=_head(net), percentile=float(self.params["percentile"]) / 100.0)
        self.det.fit_feature_maps(outputs.features, labels)

    def score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -self.det.predict_feature_maps(out.features)

    def grad_score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        z = straight_through(out.features.clip(max=self.det.threshold), out.features)
        return -self.det.detector(self.det.head(z))


@register("detectors", "vim")
class VIM(Postprocessor, DifferentiableDetector):
    """VIM, virtual-logit matching (Wang et al., CVPR 2022).

    Origin ``u = -W^+ b``; ``R`` = the residual of the top-``dim`` principal subspace of the training features;
    ``conf = logsumexp(f(x)) - alpha * ||(z - u) R||`` with ``alpha`` matching mean max-logit and residual norm.
    ``dim`` is OpenOOD's 256, or half the feature width when that leaves no residual.
    """

    openood_name = "vim"
    requires_fit = True

    @classmethod
    def openood_adapt_args(cls, args: dict[str, Any], feature_dim: int) -> dict[str, Any]:
        """OpenOOD's ``dim`` only where it leaves a residual (:func:`~advopenood.detectors.vim_dim`)."""
        return {**args, "dim": vim_dim(args["dim"], feature_dim)}

    def fit(self, net: nn.Module, outputs: Outputs, labels: Tensor, batches: Batches) -> None:
        fc = fc_layer(net)
        self.det = _pod().ViM(None, d=vim_dim(self.params["dim"], fc.in_features), w=fc.weight, b=fc.bias)
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

    openood_name = "knn"
    requires_fit = True

    def fit(self, net: nn.Module, outputs: Outputs, labels: Tensor, batches: Batches) -> None:
        self.det = _pod().KNN(None, k=int(self.params["K"])).fit_features(outputs.features.float().cpu(), labels)
        self.bank = F.normalize(outputs.features.float(), dim=1, eps=1e-12)

    def score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -self.det.predict_features(out.features)

    def grad_score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        z = F.normalize(out.features.float(), dim=1, eps=1e-12)
        distances = torch.cdist(z, self.bank.to(z.device))
        return -distances.kthvalue(int(self.params["K"]), dim=1).values


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
        self.det = _pod().DICE(None, w=fc.weight, b=fc.bias, p=float(self.params["p"]) / 100.0)
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
        return _pod().ASH(backbone=None, head=_head(net), variant="ash-b", percentile=float(self.params["percentile"]) / 100.0)

    def score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -self._det(net).predict_feature_maps(out.features[:, :, None, None])

    def grad_score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -with_grad(self._det(net).predict_feature_maps)(out.features[:, :, None, None])


@register("detectors", "gen")
class GEN(Postprocessor, DifferentiableDetector):
    """GEN, generalised entropy of the top-M probabilities (Liu et al., CVPR 2023).

    ``conf = -sum_{top-M} p_j^gamma (1 - p_j)^gamma`` with OpenOOD's ``gamma = 0.1``, ``M = 100``
    (pytorch-ood averages instead of summing; the order is the same).
    """

    openood_name = "gen"

    def score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -_pod().GEN.score(out.logits, gamma=float(self.params["gamma"]), M=int(self.params["M"]))

    grad_score = score


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

    openood_name = "nnguide"
    requires_fit = True

    def rows_needed(self, n: int) -> int:
        n = super().rows_needed(n)
        return nnguide_bank_size(n, float(self.params["alpha"]), self.batch_size, int(self.params["K"]))

    def fit(self, net: nn.Module, outputs: Outputs, labels: Tensor, batches: Batches) -> None:
        self.det = _pod().NNGuide(None, head=fc_layer(net), k=int(self.params["K"]))
        self.det.fit_features(outputs.features, labels)

    def score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -self.det.predict_features(out.features)

    def grad_score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -with_grad(self.det.predict_features)(out.features)


@register("detectors", "scale")
class SCALE(Postprocessor, DifferentiableDetector):
    """SCALE, activation scaling + energy (Xu et al., ICLR 2024).

    ``r = sum(z) / sum(top (100 - percentile) % of z)`` (OpenOOD: percentile 85);
    ``conf = logsumexp(W z exp(r) + b)``.
    """

    openood_name = "scale"
    openood_wrapper = ("openood.networks.scale_net", "ScaleNet")

    def _det(self, net: nn.Module) -> PodSCALE:
        return _pod().SCALE(backbone=None, head=_head(net), percentile=float(self.params["percentile"]) / 100.0)

    def score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -self._det(net).predict_feature_maps(out.features[:, :, None, None])

    def grad_score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return -with_grad(self._det(net).predict_feature_maps)(out.features[:, :, None, None])


# GRAM as the paper ran it (OpenOOD's before bdf6a55); importing the module registers ``gram_legacy``
from advopenood_plugins import gram_legacy as _gram_legacy  # noqa: E402,F401
from advopenood_plugins import smoothed  # noqa: E402,F401  smoothed_<det> for every detector (plugins/smoothed.py)
