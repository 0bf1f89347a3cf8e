"""``gram_legacy``: the GRAM postprocessor Lorenz et al. ran, OpenOOD's before its fix, transcribed.

Source: ``openood/postprocessors/gram_postprocessor.py`` of adverML/AdvOpenOOD at 14393a1 (the paper's code,
2024-06-21), blob 1d214a1, the same file as Jingkang50/OpenOOD before bdf6a55 ("fix gram-matrix detector",
C. Sastry, merged into OpenOOD's main with PR 228, e24fad5, 2025-12-01); OpenOOD's configs/postprocessors/gram.yml:
``powers: [1,2,3,4,5]``. What that version computes, and what bdf6a55 changed (docs/detectors.md, "`gram_legacy`"):

* Layers: the network's ``return_feature_list`` (OpenOOD's ResNet18_32x32: the stem's ReLU output, the four
  stages' outputs with the last one average-pooled, ``num_layer = 5  # 4 for lenet``). bdf6a55: every
  ``nn.Conv2d`` / ``nn.ReLU`` output through forward hooks (``FeatureExtractor``).
* Statistic per layer, power ``p``, channel ``c``: ``G_c = sign(S_c) |S_c|^(1/p)``,
  ``S = rowsum((F^p)(F^p)^T)``; unchanged by bdf6a55 (its ``G_p``).
* Class bounds: ``feature_class[label][layer][pole]`` is set to the first sample's channel list and then
  ``.extend``-ed with every further sample's, so it ends as one flat list, and ``feature.min(dim=0)`` /
  ``max(dim=0)`` of it are scalars: the least / largest ``G_c`` over all channels and all training samples of
  the class (all of them; the running-bound branch, which would take ``max(current_min, ...)``, is never
  reached). bdf6a55: per-channel bounds from 90 % of each class, the other 10 % held out.
* Deviation against the predicted class ``k`` (argmax of the softmax): ``sum(temp[idx])``, the channel sum
  ``T = sum_c G_c``, is compared with the scalar bounds:
  ``dev = sum_{layer, p} relu(min_k - T) / |min_k + 1e-6| + relu(T - max_k) / |max_k + 1e-6|``.
  bdf6a55: per channel, summed, each layer divided by its mean held-out deviation.
* Returned confidence: ``conf = dev / 50``, not negated, so a larger deviation reads as *more*
  in-distribution (OpenOOD's convention: higher conf = more ID). bdf6a55: ``-deviation / max_k p_k``.

Statistics are float32 (the reference's tensors on the GPU), bounds and deviations float64 (its
``tolist()`` Python floats). Two adaptations, both stated: the layers come from our
:class:`~advopenood.models.Classifier` as OpenOOD's ``return_feature_list`` lays them out (stage maps, the last
one average-pooled, which is the penultimate feature), taking the first ``NUM_LAYER`` = 5 where there are more
and all where there are fewer (ResNet-20 has 4; the reference's hard-coded 5 would raise ``IndexError``); and
the bounds come from the run's fit set (OpenOOD's ``id_loader_dict['train']``, the whole training set).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from advopenood.plugin import Batches, Classifier, Outputs, Postprocessor, openood_args, register

#: the reference's ``num_layer = 5  # 4 for lenet``
NUM_LAYER = 5
#: the reference's ``conf = [i / 50 for i in dev]``
SCALE = 50.0


def feature_list(net: nn.Module, x: Tensor) -> tuple[Tensor, list[Tensor]]:
    """``(logits, maps)`` as OpenOOD's ``net(x, return_feature_list=True)`` gives them for its ResNets: each
    stage's map, the last one average-pooled (``B x D x 1 x 1``); at most :data:`NUM_LAYER` of them. A network
    that is not our :class:`Classifier` is asked in OpenOOD's dialect."""
    if isinstance(net, Classifier):
        logits, feature, maps = net.forward_all(x)
        layers = maps[:-1] + [feature[:, :, None, None]]
    else:
        logits, layers = net(x, return_feature_list=True)
    return logits, list(layers)[:NUM_LAYER]


def legacy_statistics(maps: list[Tensor], powers: list[int]) -> list[Tensor]:
    """Per layer, ``B x P x C``: ``G = sign(S) |S|^(1/p)`` with ``S = ((F^p) @ (F^p)^T).sum(dim=2)``, the
    reference's ``temp`` (float32, its order of operations)."""
    stats = []
    for feature in maps:
        rows = []
        for p in powers:
            temp = feature.detach() ** p
            temp = temp.reshape(temp.shape[0], temp.shape[1], -1)
            temp = torch.matmul(temp, temp.transpose(dim0=2, dim1=1)).sum(dim=2)
            rows.append(temp.sign() * torch.abs(temp) ** (1 / p))
        stats.append(torch.stack(rows, 1))
    return stats


def legacy_bounds(stats: list[Tensor], labels: Tensor, num_classes: int) -> tuple[Tensor, Tensor]:
    """The reference's class bounds of one batch, ``K x L x P`` (float64): per class, layer and power the least
    and largest ``G_c`` over all channels and all rows of the class (the flat list's ``min`` / ``max``); ``+inf`` /
    ``-inf`` for a class without rows, so batches combine with ``torch.minimum`` / ``torch.maximum``."""
    labels = labels.to(stats[0].device).long()
    lo = torch.stack([s.double().amin(2) for s in stats], 1)  # B x L x P: least over channels
    hi = torch.stack([s.double().amax(2) for s in stats], 1)
    index = labels[:, None, None].expand_as(lo)
    mins = lo.new_full((num_classes, *lo.shape[1:]), float("inf")).scatter_reduce(0, index, lo, "amin")
    maxs = hi.new_full((num_classes, *hi.shape[1:]), float("-inf")).scatter_reduce(0, index, hi, "amax")
    return mins, maxs


def legacy_confidence(stats: list[Tensor], predictions: Tensor, mins: Tensor, maxs: Tensor) -> Tensor:
    """The reference's ``conf = dev / 50`` (float64, higher = more ID as OpenOOD reads it):
    ``dev = sum_{l, p} relu(min - T) / |min + 1e-6| + relu(T - max) / |max + 1e-6|`` with ``T = sum_c G_c``
    and the predicted class's scalar bounds."""
    total = torch.stack([s.double().sum(2) for s in stats], 1)  # B x L x P: sum(temp[idx])
    lo, hi = mins[predictions], maxs[predictions]
    dev = F.relu(lo - total) / torch.abs(lo + 1e-6) + F.relu(total - hi) / torch.abs(hi + 1e-6)
    return dev.sum((1, 2)) / SCALE


@register("detectors", "gram_legacy")
class GRAMLegacy(Postprocessor):
    """GRAM as the paper ran it: OpenOOD's GRAM before bdf6a55 (scalar class bounds, channel-summed statistic,
    confidence not negated; see :mod:`advopenood_plugins.detectors.gram_legacy`).

    ``conf = sum_{l, p} [relu(min_k - T) / |min_k + 1e-6| + relu(T - max_k) / |max_k + 1e-6|] / 50`` with
    ``T = sum_c sign(S_c) |S_c|^(1/p)``, ``S = rowsum((F^p)(F^p)^T)``, ``k`` the predicted class and
    ``min_k`` / ``max_k`` the least / largest single-channel statistic of class ``k``'s fit rows. Its own pass
    (stage maps, which the shared pass does not keep); no OpenOOD class runs it (OpenOOD's ``gram`` is the
    fixed one), so both backends score this transcription.
    """

    requires_fit = True
    own_pass = True
    shared_fit = False
    needs_all_classes = True

    @property
    def name(self) -> str:
        return "gram_legacy"

    @classmethod
    def default_params(cls) -> dict[str, Any]:
        """OpenOOD's ``gram.yml`` ``postprocessor_args`` (``powers: [1,2,3,4,5]``), unchanged by bdf6a55."""
        return openood_args("gram")

    @torch.no_grad()
    def fit(self, net: nn.Module, outputs: Outputs, labels: Tensor, batches: Batches) -> None:
        self.powers = list(self.p.powers)
        num_classes = None
        mins = maxs = None
        for x, y in batches():
            logits, maps = feature_list(net, x.to(self.device))
            num_classes = logits.shape[1]
            lo, hi = legacy_bounds(legacy_statistics(maps, self.powers), torch.as_tensor(y), num_classes)
            mins = lo if mins is None else torch.minimum(mins, lo)
            maxs = hi if maxs is None else torch.maximum(maxs, hi)
        if mins is None:
            raise ValueError("gram_legacy needs at least one fit image")
        empty = torch.isinf(mins).flatten(1).any(1).nonzero().flatten().tolist()
        if empty:
            raise ValueError(f"No ID samples for class {empty[0]}")
        self.mins, self.maxs = mins, maxs

    def fit_state(self) -> dict[str, Tensor]:
        return {"mins": self.mins, "maxs": self.maxs}

    def load_fit_state(self, net: nn.Module, state: dict[str, Tensor]) -> None:
        self.powers = list(self.p.powers)
        self.mins, self.maxs = (state[k].to(self.device) for k in ("mins", "maxs"))

    @torch.no_grad()
    def score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        logits, maps = feature_list(net, x.detach())
        predictions = F.softmax(logits, dim=1).argmax(1)
        return legacy_confidence(legacy_statistics(maps, self.powers), predictions, self.mins, self.maxs)
