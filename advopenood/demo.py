"""The embedded demo's classifier: a small CNN trained on scikit-learn's bundled digits, cached after first use.

Needs nothing beyond a fresh ``pip install``: the digits ship with scikit-learn, the far-OOD textures
with scikit-image. Training is seeded and takes a few seconds on two CPU cores.
"""
from __future__ import annotations

import io
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from advopenood import io as aio
from advopenood.data import build_dataset, stack
from advopenood.models import Classifier, build_model
from advopenood.store import canonical_key, library_versions

RECIPE = {"arch": "democnn", "data": "sklearn-digits-train-16x16", "epochs": 30, "lr": 0.01, "batch": 64, "version": 1}


def train_demo_model(seed: int = 0, device: torch.device | str = "cpu", progress: bool = True) -> Classifier:
    """Train ``democnn`` on the digits training split (Adam, cosine schedule) and return it in eval mode."""
    torch.manual_seed(seed)
    model = build_model("democnn", 10, None, mean=(0.5,), std=(0.5,), input_size=16, in_channels=1, device=device)
    x, y = stack(build_dataset({"kind": "demo", "name": "digits", "split": "train"}, None, 1, 16))
    x, y = x.to(device), y.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=RECIPE["lr"])
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, RECIPE["epochs"])
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in tqdm(range(RECIPE["epochs"]), desc="train demo CNN", unit="epoch", disable=not progress, leave=False):
        for idx in torch.randperm(len(x), generator=gen).split(RECIPE["batch"]):
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
        sched.step()
    return model.eval()


def demo_model(cache: Path, seed: int = 0, device: torch.device | str = "cpu", progress: bool = True) -> Classifier:
    """The trained demo CNN, loaded from ``cache`` or trained once and saved there atomically."""
    key = canonical_key({"recipe": RECIPE, "seed": seed, "torch": library_versions()["torch"]})[:16]
    path = Path(cache) / "models" / f"democnn-{key}.pt"
    if path.is_file():
        return build_model("democnn", 10, path, mean=(0.5,), std=(0.5,), input_size=16, in_channels=1, device=device)
    model = train_demo_model(seed, device, progress)
    buf = io.BytesIO()
    torch.save(model.backbone.state_dict(), buf)
    aio.atomic_write(path, lambda f: f.write(buf.getvalue()))
    return model
