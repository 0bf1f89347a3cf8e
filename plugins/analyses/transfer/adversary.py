"""The black-box adversary of the transfer analysis (``plugin.py``): the surrogate network,
the oracle it queries, Jacobian-based dataset augmentation, and surrogate training round by round.

Two adversaries share this code: ours (protocol ``strong``) and the authors' (``mahmood2021``). The authors'
code is MetaMain/BewareAdvML at commit ``52d489b565b0df36cb588b5709c29c2e8e4d3f49`` (TensorFlow 1 / Keras,
CleverHans 3.0); paths below are under ``AdversarialSampleGeneratorV11/AdversarialSampleGeneratorV11/``. Its
Jacobian step is CleverHans v.3.0.1's (commit ``8942beadbafe4ef618723e9da79a97350ecd7471``).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import TensorDataset
from tqdm.auto import tqdm

from advopenood.plugin import (Backbone, Classifier, UsageError, canonical_key, derive_seed, forward_outputs, frozen,
                               seeded_prefix, train_classifier)

#: Inputs of the authors' surrogate: their images lie in [-0.5, 0.5] (``clipMin``/``clipMax``,
#: DefaultMethodsVanilla.py L59-60), i.e. our [0, 1] images minus 0.5, unscaled.
CW_CNN_MEAN, CW_CNN_STD = 0.5, 1.0


def fraction_rows(n: int, fraction: float, seed: int) -> np.ndarray:
    """Sorted rows of a seeded random ``fraction`` percent (at least one) of ``n``; the first
    ``round(n * fraction / 100)`` of one permutation, so a smaller fraction is a subset of a larger one (ours)."""
    k = max(1, int(round(n * float(fraction) / 100.0)))
    return seeded_prefix(n, k, seed)


def first_rows(n: int, fraction: float) -> np.ndarray:
    """The first ``round(n * fraction / 100)`` rows (at least one), as the authors' mixed adversary takes its data:
    ``queryNum = round(totalSampleNum * f)`` (DefaultMethodsVanilla.py L63-66), ``xSub = xTrain[:queryNum]``
    (AttackWrappersBlackBox.py L33)."""
    return np.arange(max(1, int(np.round(n * float(fraction) / 100.0))))


def surrogate_seed(seed: int, mode: str, fraction: float) -> int:
    """The training seed of one surrogate, derived from the run seed, the threat model and the fraction."""
    return int(canonical_key({"seed": int(seed), "mode": mode, "fraction": float(fraction)})[:15], 16)


def jacobian_lambdas(rounds: int, lam: float, schedule: str) -> list[float]:
    """The signed step of each augmentation round ``r = 0 .. rounds - 1``.

    ``constant``: ``+lam`` every round, Papernot et al. 2017 Algorithm 1 (``S_{rho+1} = {x + lambda *
    sgn(J_F[O(x)]) : x in S_rho} u S_rho``; ours). ``cleverhans``: ``lam * (2 * [r // 3 != 0] - 1)``, i.e.
    ``-lam`` for the first three rounds and ``+lam`` after, CleverHans' ``mnist_blackbox`` tutorial as the
    authors copy it (AttackWrappersBlackBox.py L185, ``lmbda_coef = 2 * int(int(rho / 3) != 0) - 1``)."""
    if schedule == "constant":
        return [float(lam)] * int(rounds)
    return [float(lam) * (2 * int(r // 3 != 0) - 1) for r in range(int(rounds))]


def jacobian_augment(model: torch.nn.Module, x: Tensor, labels: Tensor, lam: float, batch_size: int,
                     clip: bool = True) -> Tensor:
    """New points ``x + lam * sign(d F_label(x) / dx)`` for the rows ``x`` (CPU tensor), ``F_label`` the
    surrogate's logit of each row's (oracle) label, with the surrogate in eval mode and its parameters frozen;
    ``lam`` may be negative (a step against the label's logit). ``clip`` clamps the points to [0, 1].

    Papernot et al. 2017, ``sign(J_F(x)[O(x)])``; CleverHans v.3.0.1 ``attacks_tf.jacobian_augmentation``
    (L536: ``X_batch[ind] + lmbda * grad_val[Y_sub[indx], ind, ...]``, the gradient of the logits, L199-216,
    and no clipping), which the authors call (AttackWrappersBlackBox.py L172, L187). ``clip=True`` is ours."""
    device = next(model.parameters()).device
    out = []
    with frozen(model), torch.enable_grad():
        for i in range(0, len(x), batch_size):
            xb = x[i:i + batch_size].to(device).requires_grad_(True)
            logits, yb = model(xb), labels[i:i + batch_size].to(device)
            (grad,) = torch.autograd.grad(logits.gather(1, yb[:, None]).sum(), xb)
            step = xb.detach() + lam * grad.sign()
            out.append((step.clamp(0.0, 1.0) if clip else step).cpu())
    return torch.cat(out)


class CWCNN(Backbone):
    """The authors' synthetic network, ``ConstructCarliniNetwork`` (NetworkConstructors.py L19-45, Carlini and
    Wagner's CIFAR-10 model; Mahmood et al. Table 4): conv 3x3x64 + ReLU, conv 3x3x64 + ReLU, max-pool 2x2,
    conv 3x3x128 + ReLU, conv 3x3x128 + ReLU, max-pool 2x2, fully connected 256 + ReLU, dropout 0.5 (L37; not
    in Table 4), fully connected 256 + ReLU, fully connected to the classes (the head; softmax in the loss).
    Unpadded convolutions (32 -> 5 x 5 x 128); Keras' default initialisation (Glorot-uniform weights, zero
    biases). The last stage is the second 256-unit layer as a 1x1 map, so :class:`advopenood.models.Classifier`'s
    pooling is the identity. Built with mean 0.5 and std 1 (:data:`CW_CNN_MEAN`), it sees the authors' inputs."""

    last_block_name = "dense"

    def __init__(self, num_classes: int = 10, in_channels: int = 3, input_size: int = 32):
        super().__init__()
        nn = torch.nn
        self.block1 = nn.Sequential(nn.Conv2d(in_channels, 64, 3), nn.ReLU(), nn.Conv2d(64, 64, 3), nn.ReLU(),
                                    nn.MaxPool2d(2))
        self.block2 = nn.Sequential(nn.Conv2d(64, 128, 3), nn.ReLU(), nn.Conv2d(128, 128, 3), nn.ReLU(),
                                    nn.MaxPool2d(2))
        side = ((input_size - 4) // 2 - 4) // 2
        self.dense = nn.Sequential(nn.Flatten(), nn.Linear(128 * side * side, 256), nn.ReLU(), nn.Dropout(0.5),
                                   nn.Linear(256, 256), nn.ReLU())
        self.fc = nn.Linear(256, num_classes)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    def stages(self, x: Tensor) -> list[Tensor]:
        f1 = self.block1(x)
        f2 = self.block2(f1)
        return [f1, f2, self.dense(f2)[:, :, None, None]]


class Oracle:
    """The defended target as the adversary sees it: top-1 labels, and whether the query detector accepts each
    image (``conf >= threshold``; all accepted without a detector). Counts every image sent (``queries``)."""

    def __init__(self, model: Classifier, detector: Any, threshold: float | None, batch_size: int,
                 device: torch.device):
        self.model, self.detector, self.threshold = model, detector, threshold
        self.batch_size, self.device = batch_size, device
        self.queries = 0

    def __call__(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(labels, accepted)`` for the images ``x`` (CPU tensors)."""
        labels, accepted = [], []
        for i in range(0, len(x), self.batch_size):
            xb = x[i:i + self.batch_size].to(self.device)
            out = forward_outputs(self.model, xb)
            labels.append(out.logits.argmax(1).cpu())
            if self.detector is None:
                accepted.append(torch.ones(len(xb), dtype=torch.bool))
            else:
                conf = torch.as_tensor(self.detector.score(self.model, xb, out)).detach().reshape(-1).cpu().double()
                accepted.append(conf >= self.threshold)
        self.queries += len(x)
        return torch.cat(labels), torch.cat(accepted)


class RoundTrainer:
    """Trains one surrogate, round after round, on the adversary's current data.

    ``optimizer="cosine"`` (ours): :func:`advopenood.models.training.train_classifier` each round, Adam with a cosine
    schedule restarted every round. ``optimizer="adam"`` (the authors'): one Adam optimizer with a constant
    learning rate for the surrogate's whole life, as Keras' ``model.fit`` called once per round on a model
    compiled once (NetworkConstructors.py L42-44, AttackWrappersBlackBox.py L176); each epoch shuffles the data
    (Keras' default) and ends with the partial batch; dropout is active while training only."""

    def __init__(self, model: Classifier, settings: dict[str, Any], progress: bool):
        self.model, self.settings, self.progress = model, settings, progress
        self.opt = (torch.optim.Adam(model.parameters(), lr=float(settings["lr"]))
                    if settings["optimizer"] == "adam" else None)

    def __call__(self, x: Tensor, y: Tensor, seed: int, epochs: int) -> None:
        """Train ``epochs`` epochs on ``(x, y)``, shuffling with ``seed``."""
        if self.opt is None:
            recipe = {"epochs": epochs, "lr": self.settings["lr"], "batch": self.settings["train_batch"]}
            train_classifier(self.model, TensorDataset(x, y), recipe, seed, self.progress)
            return
        device = next(self.model.parameters()).device
        x, y = x.to(device), y.to(device)
        gen = torch.Generator().manual_seed(seed)
        self.model.train()
        for _ in tqdm(range(int(epochs)), desc=f"train {self.model.arch}", unit="epoch", disable=not self.progress,
                      leave=False):
            for idx in torch.randperm(len(x), generator=gen).split(int(self.settings["train_batch"])):
                self.opt.zero_grad()
                F.cross_entropy(self.model(x[idx]), y[idx]).backward()
                self.opt.step()
        self.model.eval()


def train_pure(model: Classifier, x: Tensor, y: Tensor, settings: dict[str, Any], seed: int, progress: bool) -> None:
    """The pure adversary's surrogate: ``pure_epochs`` (``epochs`` when None) epochs on the training data with
    the true labels; no query, no augmentation."""
    epochs = settings["pure_epochs"] if settings["pure_epochs"] is not None else settings["epochs"]
    RoundTrainer(model, settings, progress)(x, y, seed, int(epochs))


def train_mixed(model: Classifier, oracle: Oracle, x: Tensor, settings: dict[str, Any], seed: int, batch_size: int,
                progress: bool) -> None:
    """The mixed adversary (Papernot et al. 2017 Algorithm 1 with the training data as the initial set): label
    ``x`` by querying the oracle and drop the rejected rows (App. B.4; the authors' ``FilterData``,
    AttackWrappersBlackBox.py L194-226), then ``jacobian_rounds`` times: train, step up to ``max_augment``
    seeded rows by the round's lambda (:func:`jacobian_lambdas`, :func:`jacobian_augment`), label by the oracle,
    and train once more at the end (``jacobian_rounds + 1`` trainings of ``epochs`` each, from the current
    weights). ``requery=False`` (ours) queries the new points only; ``requery=True`` (the authors', L189)
    queries and filters the whole augmented set again, old points included."""
    start = len(x)  # the adversary's own data: ``max_augment="fraction"`` augments as many rows per round
    y, accepted = oracle(x)
    x, y = x[accepted], y[accepted]
    if not len(x):
        raise UsageError(f"transfer: the query detector rejected all {oracle.queries} queries of a mixed adversary; "
                         "valid choices: a larger fraction")
    train = RoundTrainer(model, settings, progress)
    rng = np.random.default_rng(seed)
    cap, rounds = settings["max_augment"], int(settings["jacobian_rounds"])
    for r, lam in enumerate(jacobian_lambdas(rounds, settings["jacobian_lambda"], settings["jacobian_schedule"])):
        train(x, y, derive_seed(seed, r), settings["epochs"])
        k = len(x) if cap is None else min(start if cap == "fraction" else int(cap), len(x))
        pick = np.sort(rng.choice(len(x), size=k, replace=False))
        x_new = jacobian_augment(model, x[pick], y[pick], lam, batch_size, settings["jacobian_clip"])
        if settings["requery"]:
            x = torch.cat([x, x_new])
            y, accepted = oracle(x)
            x, y = x[accepted], y[accepted]
        else:
            y_new, accepted = oracle(x_new)
            x, y = torch.cat([x, x_new[accepted]]), torch.cat([y, y_new[accepted]])
    train(x, y, derive_seed(seed, rounds), settings["epochs"])
