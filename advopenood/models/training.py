"""Training classifiers: ``model.train`` configs, the embedded demo's CNN and surrogate models.

Training is seeded and takes seconds to a few minutes on two CPU cores; :func:`trained_model` caches the weights
under ``<cache>/models/`` keyed by architecture, data identity, recipe, seed and torch.
"""
from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from advopenood import io as aio
from advopenood.data.datasets import stack
from advopenood.errors import UsageError
from advopenood.models.classifier import Classifier, build_from_config
from advopenood.models.specs import ModelSpec, as_model_spec
from advopenood.provenance import canonical_key, library_versions, seeded

#: The default recipe (``model.train`` fills the rest from here): Adam, cosine schedule, no mixup.
RECIPE = {"epochs": 30, "lr": 0.01, "batch": 64}

#: torch's intra-op threads while :func:`trained_model` trains on the CPU. The weights depend on the thread count
#: (it sets the order of the sums in the convolutions), so the count is fixed for the block rather than taken from
#: the process (a test worker or a run at one thread gets the weights a 2-core default gets, as before this rule).
TRAIN_THREADS = 2


@contextlib.contextmanager
def _cpu_threads(n: int) -> Iterator[None]:
    """torch's intra-op thread count ``n`` for the block, the caller's count after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train_classifier(model: Classifier, data: Dataset, recipe: dict[str, Any], seed: int, progress: bool = True) -> Classifier:
    """Adam with a cosine schedule and cross-entropy on ``data``; returns the model in eval mode.

    ``recipe['mixup']`` (default 0, off) > 0 trains on mixup batches (Zhang et al. 2018): each batch blended
    with a shuffled copy of itself by a weight drawn from Beta(mixup, mixup), the loss blended alike.
    """
    mixup = float(recipe.get("mixup") or 0.0)
    if mixup < 0:
        raise UsageError(f"train mixup {mixup!r} is out of range; valid choices: 0 (off) or a positive Beta parameter")
    torch.manual_seed(seed)
    device = next(model.parameters()).device
    x, y = stack(data)
    x, y = x.to(device), y.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=float(recipe["lr"]))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, int(recipe["epochs"]))
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    model.train()
    for _ in tqdm(range(int(recipe["epochs"])), desc=f"train {model.arch}", unit="epoch", disable=not progress, leave=False):
        for idx in torch.randperm(len(x), generator=gen).split(int(recipe["batch"])):
            opt.zero_grad()
            if mixup > 0:
                lam = float(rng.beta(mixup, mixup))
                other = idx[torch.randperm(len(idx), generator=gen)]
                out = model(lam * x[idx] + (1 - lam) * x[other])
                loss = lam * F.cross_entropy(out, y[idx]) + (1 - lam) * F.cross_entropy(out, y[other])
            else:
                loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
        sched.step()
    return model.eval()


def trained_model(spec: ModelSpec | Mapping[str, Any], data: Dataset, cache: Path, seed: int = 0,
                  device: torch.device | str = "cpu", progress: bool = True) -> Classifier:
    """``spec``'s architecture trained on ``data`` with its ``train`` recipe (over :data:`RECIPE`),
    loaded from ``cache`` or trained once and saved there atomically (and then loaded from there, so the first
    run and later ones share the weights hash that keys their adversarial sets). The initial weights are drawn
    from ``seed`` too and CPU training runs on :data:`TRAIN_THREADS` threads, so the key determines the weights in
    any process, whatever its own thread count."""
    spec = as_model_spec(spec)
    recipe = {**RECIPE, **(spec.train.model_dump() if spec.train else {})}
    arch = {k: getattr(spec, k) for k in ("arch", "num_classes", "in_channels", "input_size", "mean", "std")}
    key = canonical_key({"model": arch, "data": data.identity(), "recipe": recipe, "seed": seed, "init": "seeded",
                         "torch": library_versions()["torch"]})[:16]
    path = aio.os_path(cache) / "models" / f"{spec.arch}-{key}.pt"
    aio.sweep_temp_files(path.parent, depth=0)  # what a writer killed mid-write left (ours, older than any writer's)
    if path.is_file():
        return build_from_config(spec, path, device)
    # the initial weights come from the seed, not from whatever drew from torch's generator earlier in the process
    fixed = _cpu_threads(TRAIN_THREADS) if torch.device(device).type == "cpu" else contextlib.nullcontext()
    with seeded(seed, torch.device(device)), fixed:
        model = train_classifier(build_from_config(spec, None, device), data, recipe, seed, progress)
    buf = io.BytesIO()
    torch.save(model.backbone.state_dict(), buf)
    aio.atomic_write(path, lambda f: f.write(buf.getvalue()))
    return build_from_config(spec, path, device)  # as a later run loads it, so both hash the same
