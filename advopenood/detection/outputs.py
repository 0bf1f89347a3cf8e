"""The shared network pass: :class:`Outputs` (logits, penultimate features, last-block maps, tapped maps)
of a batch, computed once and handed to every detector, and the fit pass's :class:`FitPass`."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch import Tensor
from tqdm.auto import tqdm

from advopenood.attacks.base import frozen
from advopenood.errors import UsageError
from advopenood.models.classifier import Classifier

#: Extra parameter every detector accepts: fit on the first ``fit_size`` rows of the (seeded, shuffled) fit set.
FIT_SIZE = "fit_size"

Batches = Callable[[], Iterable[tuple[Tensor, Tensor]]]


# ----------------------------------------------------------------------------------------------- shared pass


@dataclass
class Outputs:
    """One network pass over a batch: logits ``B x K``, penultimate features ``B x D`` and, where the network
    exposes it, the last block's maps ``B x C x H x W`` (``None`` for fit-set outputs and a set's stored
    outputs, which keep logits and features only; a detector that reads them declares ``needs_maps``) and,
    when a detector asks for them (``needs_taps``), every ``nn.Conv2d`` / ``nn.ReLU`` output (:class:`Taps`);
    for a fitting detector, ``stats`` holds its per-sample statistics of those maps (``tap_statistics``)."""

    logits: Tensor
    features: Tensor
    maps: Tensor | None = None
    taps: list[Tensor] | None = None
    stats: Tensor | None = None

    def detached(self) -> Outputs:
        """The same outputs cut from the autograd graph (what detectors that do not differentiate read)."""
        cut = lambda t: None if t is None else t.detach()
        return Outputs(self.logits.detach(), self.features.detach(), cut(self.maps),
                       None if self.taps is None else [t.detach() for t in self.taps], cut(self.stats))

    def rows(self, index: Tensor | slice) -> Outputs:
        return Outputs(self.logits[index], self.features[index], None if self.maps is None else self.maps[index],
                       None if self.taps is None else [t[index] for t in self.taps],
                       None if self.stats is None else self.stats[index])


def grad_outputs(net: nn.Module, x: Tensor, keep_maps: bool = True, taps: bool = False) -> Outputs:
    """Logits, penultimate features and last-block maps of ``x`` in one pass, with gradients; with ``taps``,
    also every tapped map (:class:`Taps`, recorded by forward hooks during the same pass).

    Uses :meth:`advopenood.models.Classifier.forward_all` for our classifiers, and OpenOOD's network dialect
    ``net(x, return_feature=True)`` for any other network (e.g. an OpenOOD network inside OpenOOD's ``Evaluator``).
    """
    with Taps(net).recording() if taps else contextlib.nullcontext([]) as tapped:
        if isinstance(net, Classifier):
            logits, features, maps = net.forward_all(x)
            last = maps[-1] if keep_maps else None
        else:
            logits, features = net(x, return_feature=True)
            features, last = features.flatten(1), None
    return Outputs(logits, features, last, tapped if taps else None)


@torch.no_grad()
def forward_outputs(net: nn.Module, x: Tensor, keep_maps: bool = True, taps: bool = False) -> Outputs:
    """:func:`grad_outputs` without gradients: the shared pass."""
    return grad_outputs(net, x, keep_maps, taps)


def pass_outputs(net: nn.Module, x: Tensor, taps: bool, input_grad: bool) -> tuple[Tensor, Outputs, Outputs]:
    """One network pass over a batch: ``(x, graph, outputs)``. With ``input_grad`` (a detector that
    ``needs_input_grad`` scores) ``x`` comes back as a leaf requiring grad, ``graph`` carries the autograd graph
    (parameters frozen: only the input gradient can be taken) and ``outputs`` is it detached; otherwise both are
    :func:`forward_outputs`."""
    if not input_grad:
        out = forward_outputs(net, x, taps=taps)
        return x, out, out
    with torch.inference_mode(False), torch.enable_grad(), frozen(net):
        x = (x.clone() if torch.is_inference(x) else x).detach().requires_grad_()
        graph = grad_outputs(net, x, taps=taps)
    return x, graph, graph.detached()


def fc_layer(net: nn.Module) -> nn.Linear:
    """The final linear layer: ``get_fc_layer()`` (our classifiers and OpenOOD's networks), else ``net.fc`` (a
    foreign network in torchvision's dialect). The one place a network's dialect is read."""
    get = getattr(net, "get_fc_layer", None)
    return get() if callable(get) else net.fc


def net_device(net: nn.Module) -> torch.device:
    """The device of the network's first parameter (CPU for a parameter-free network)."""
    param = next(iter(net.parameters()), None)
    return param.device if param is not None else torch.device("cpu")


def iter_xy(loader: Iterable) -> Iterator[tuple[Tensor, Tensor]]:
    """``(x, y)`` batches from a loader yielding tuples or OpenOOD's ``{'data', 'label'}`` dicts."""
    for batch in loader:
        if isinstance(batch, dict):
            yield batch["data"], batch["label"]
        else:
            yield batch[0], batch[1]


@dataclass
class FitPass:
    """The shared pass over the fit rows: logits and features (``outputs``), labels, and per fitting detector
    that reads tapped maps its per-sample statistics (``stats[name]``); ``batches``: the indices of the batches
    covered, ``sizes`` their row counts."""

    outputs: Outputs
    labels: Tensor
    stats: dict[str, Tensor] = field(default_factory=dict)
    batches: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)

    def for_detector(self, name: str, n: int) -> tuple[Outputs, Tensor]:
        """The first ``n`` rows as a detector's fit input (its statistics in ``stats``)."""
        out = self.outputs.rows(slice(0, n))
        out.stats = self.stats[name][:n] if name in self.stats else None
        return out, self.labels[:n]

    def to(self, device: torch.device) -> FitPass:
        """The same pass with every tensor on ``device`` (labels stay on the CPU)."""
        return FitPass(Outputs(self.outputs.logits.to(device), self.outputs.features.to(device)), self.labels.cpu(),
                       {k: v.to(device) for k, v in self.stats.items()}, self.batches, self.sizes)

    def state(self) -> dict[str, object]:
        """The pass as plain data (tensors, lists of ints) that ``torch.load(weights_only=True)`` reads back."""
        return {"logits": self.outputs.logits, "features": self.outputs.features, "labels": self.labels,
                "stats": dict(self.stats), "batches": list(self.batches), "sizes": list(self.sizes)}

    @classmethod
    def from_state(cls, state: dict[str, object]) -> FitPass:
        """The inverse of :meth:`state`."""
        return cls(Outputs(state["logits"], state["features"]), state["labels"], dict(state["stats"]),
                   list(state["batches"]), list(state["sizes"]))

    def chunks(self) -> Iterator[tuple[int, FitPass]]:
        """``(batch index, that batch's rows)`` in stored order."""
        start = 0
        for b, n in zip(self.batches, self.sizes):
            rows = slice(start, start + n)
            yield b, FitPass(self.outputs.rows(rows), self.labels[rows], {k: v[rows] for k, v in self.stats.items()})
            start += n


def merge_fit_passes(parts: Iterable[FitPass]) -> FitPass:
    """Concatenate fit-pass shares (one per rank) in batch order: the same rows as one process's pass."""
    chunks = sorted((chunk for part in parts for chunk in part.chunks()), key=lambda c: c[0])
    if not chunks:
        raise UsageError("the fit set is empty; detectors that fit on ID data need at least one training image")
    whole = [c for _, c in chunks]
    return FitPass(Outputs(torch.cat([c.outputs.logits for c in whole]), torch.cat([c.outputs.features for c in whole])),
                   torch.cat([c.labels for c in whole]),
                   {k: torch.cat([c.stats[k] for c in whole]) for k in whole[0].stats},
                   [b for b, _ in chunks], [len(c.labels) for c in whole])


def collect_outputs(net: nn.Module, batches: Iterable[tuple[Tensor, Tensor]], device: torch.device,
                    desc: str = "fit pass", progress: bool = False,
                    reducers: dict[str, Callable[[list[Tensor]], Tensor]] | None = None,
                    select: Callable[[int], bool] | None = None) -> FitPass:
    """Concatenated logits and features (no maps) of every batch, the labels (on the CPU) and, per entry of
    ``reducers``, the per-sample statistics it computes from the tapped maps (the pass records them only then).
    ``select`` keeps only the batches whose index it accepts (a rank's share under torchrun)."""
    reducers = reducers or {}
    logits, features, labels, index = [], [], [], []
    stats: dict[str, list[Tensor]] = {k: [] for k in reducers}
    for b, (x, y) in enumerate(tqdm(batches, desc=desc, unit="batch", disable=not progress, leave=False)):
        if select is not None and not select(b):
            continue
        out = forward_outputs(net, x.to(device), keep_maps=False, taps=bool(reducers))
        logits.append(out.logits)
        features.append(out.features)
        labels.append(torch.as_tensor(y).cpu())
        index.append(b)
        for key, reduce in reducers.items():
            stats[key].append(reduce(out.taps))
    if not labels and select is None:
        raise UsageError("the fit set is empty; detectors that fit on ID data need at least one training image")
    cat = lambda parts: torch.cat(parts) if parts else torch.empty(0)
    return FitPass(Outputs(cat(logits), cat(features)), cat(labels).long(), {k: cat(v) for k, v in stats.items()},
                   index, [len(t) for t in labels])


def take_rows(batches: Iterable[tuple[Tensor, Tensor]], n: int | None) -> Iterator[tuple[Tensor, Tensor]]:
    """The first ``n`` rows of a batch stream (all rows when ``n`` is None)."""
    left = n
    for x, y in batches:
        if left is not None:
            if left <= 0:
                return
            x, y = x[:left], y[:left]
            left -= len(y)
        yield x, y


class Taps:
    """Records the output of every ``nn.Conv2d`` and ``nn.ReLU`` module in call order during a forward pass.

    These are the layers OpenOOD's GRAM ``FeatureExtractor`` hooks (inspired by paaatcha/gram-ood). A network
    that declares its own layers (``tap_modules()``, e.g. a transformer's stage or block outputs) is read there.
    """

    def __init__(self, net: nn.Module):
        self.net = net
        declared = net.tap_modules() if hasattr(net, "tap_modules") else None
        self.layers = declared or [m for m in net.modules() if isinstance(m, (nn.Conv2d, nn.ReLU))]

    @torch.no_grad()
    def __call__(self, x: Tensor) -> tuple[Tensor, list[Tensor]]:
        return self.forward(x)

    def forward(self, x: Tensor) -> tuple[Tensor, list[Tensor]]:
        """Logits and the tapped maps, differentiable (``__call__`` is the same without gradients)."""
        with self.recording() as maps:
            logits = self.net(x)
        return logits, maps

    @contextlib.contextmanager
    def recording(self) -> Iterator[list[Tensor]]:
        """Hooks on every tapped layer for the duration; the list fills with their outputs in call order."""
        if not self.layers:
            raise ValueError("the network has no nn.Conv2d or nn.ReLU layers for GRAM to read")
        maps: list[Tensor] = []
        handles = [m.register_forward_hook(lambda _m, _i, out: maps.append(out)) for m in self.layers]
        try:
            yield maps
        finally:
            for h in handles:
                h.remove()
