"""Black-box transfer attacks on the detector-defended classifier (pure and mixed black-box adversaries).

Mahmood, Gurevin, van Dijk, Nguyen, "Beware the Black-Box: on the Robustness of Recent Defenses to Adversarial
Examples" (Entropy 2021), after Nguyen et al. 2019 and Papernot et al. 2017. The adversary never sees the
target's weights, gradients or scores; it trains a *surrogate* ("synthetic") model, crafts white-box attacks
(FGSM, PGD, MIM, ...) on it, and submits them to the defended target, here the classifier plus a post-hoc OOD
detector that rejects inputs below its 95 %-TPR threshold.

Threat models (one surrogate each):

* **pure** black-box (Sec. 2.1 A, "The synthetic model is built using only the original training dataset"):
  the surrogate is trained on the ID training data (the run's fit set) with the *true* labels; no query
  reaches the target (``queries = 0``).
* **mixed** black-box (Sec. 2.1 C, Nguyen et al.): the adversary holds ``fraction`` percent of the training
  data (a seeded random subset; smaller fractions are prefixes of larger ones) and "can label both synthetic
  and original training data by querying the defense", which answers with its top-1 label; inputs the query
  detector rejects get no label and are dropped (App. B.4: "we do not use data which has an null class
  label"). Then ``jacobian_rounds`` rounds of Jacobian-based dataset augmentation (App. B.3, Algorithm 1):
  train the surrogate ``F`` on the current set, step up to ``max_augment`` seeded rows ``x`` of it by
  ``lambda`` along a gradient sign (:func:`jacobian_augment`), label the new points by querying the target
  (rejected ones dropped), and train again from the current weights. Every image sent to the target counts
  as one query; the detector sees the same query.

The adversary's settings come from ``ctx.protocol`` (:data:`PROTOCOL_SETTINGS`): ``mahmood2021`` is the
paper's CIFAR-10 adversary as far as the paper specifies it (App. B.2, B.3, Tables 2-4); every other protocol
(``strong``, the default) uses our own, much cheaper adversary, which is *not* the paper's and whose numbers
are not comparable with it. A parameter set in ``analysis_params.transfer`` wins over the protocol's value.
Under ``mahmood2021`` the ``deviations`` column lists where a row's adversary differs from the paper's.

Metrics per (surrogate, attack) and per detector, in percent, all on the **clean-correct** ID test rows (the
rows the target classifies correctly when clean; their count is ``n``): the paper attacks and scores only such
samples (Sec. 2, "A trained classifier [F], correctly identified sample [x] with class label [y]. The goal of
the adversary is to modify [x] ... such that [F] produces [a] class label [other than y]"). Hence
``undefended_acc = 100 - asr`` on every row.

* ``asr`` (:func:`transfer_asr`), ``undefended_acc`` and ``defense_acc`` (:func:`defense_accuracy`, Sec. 3.10),
  ``improvement = defense_acc - undefended_acc`` (the paper's defense accuracy improvement; never negative
  here because a detector can only add correct decisions). The detector rejects an input whose confidence is
  below its operating threshold: the 5 % quantile of its confidences on *all* clean ID test images
  (:func:`advopenood.evaluation.metrics.id_threshold`), since a deployed detector cannot know which clean inputs the
  classifier gets right. Clean ID images it rejects are its price, fixed at 5 % by the threshold.
* ``auroc``, ``fpr95`` (:func:`detection_metrics`): negatives are the detector's confidences on the
  clean-correct ID test rows of the run, positives those of the transferred examples (of clean-correct rows)
  that fool the target; OpenOOD's convention (adversarial = OOD = positive). Clean images the target
  misclassifies are left out, so the AUROC does not partly measure misclassification detection.

Surrogates are cached under ``<cache>/surrogates/<key16>.pt``, keyed by everything that determines them
(target weights and query detector for mixed ones, fit-set identity, fraction, hyper-parameters, seed, library
versions); the crafted examples live in an :class:`advopenood.attacks.store.AdvStore` under ``<cache>/transfer_adv``
keyed by the surrogate's weights, so a re-run trains and attacks nothing.
"""
from __future__ import annotations

import io
import math
from dataclasses import dataclass
from numbers import Real
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch
from torch import Tensor
from torch.utils.data import Dataset, TensorDataset
from tqdm.auto import tqdm

from advopenood import io as aio
from advopenood import registry
from advopenood.attacks.base import Attack, build_attack, frozen
from advopenood.capabilities import is_detector_aware
from advopenood.config.schema import parse_eps
from advopenood.evaluation.context import RunContext
from advopenood.data.datasets import Subset, seeded_prefix, stack
from advopenood.detection.outputs import forward_outputs
from advopenood.errors import UsageError
from advopenood.evaluation.metrics import id_threshold, ood_metrics
from advopenood.models.classifier import ARCHS, Classifier, build_model, weights_hash
from advopenood.models.backbones import Backbone
from advopenood.outputs.results import Bullets, Paragraph, Results, Section, Table, as_written, guarded
from advopenood.registry import register
from advopenood.outputs.report import fmt
from advopenood.outputs.report import name as label
from advopenood.attacks.store import AdvStore
from advopenood.provenance import canonical_key, derive_seed, library_versions, seeded
from advopenood.models.training import RECIPE, train_classifier

CSV_COLUMNS = ["protocol", "surrogate", "data_fraction", "queries", "attack", "asr", "detector", "auroc", "fpr95",
               "defense_acc", "undefended_acc", "improvement", "surrogate_acc", "n", "eps", "seed", "deviations"]
PAPER_TRAIN_SIZE = 50_000  # Table 3: the CIFAR-10 training set
#: The adversary of each protocol. ``mahmood2021``: the CIFAR-10 setting of Mahmood et al. (App. B.2 for the
#: attacks, App. B.3 / Tables 2-4 for the synthetic model, Sec. 4 and App. A.1 for the data fractions).
#: ``strong``: ours. ``eps``/``steps`` ``None``: each attack's own default; ``max_augment`` ``None``: every row.
PROTOCOL_SETTINGS: dict[str, dict[str, Any]] = {
    "strong": {"fractions": (1, 25, 50, 75, 100), "attacks": ("fgsm", "pgd", "mim"), "eps": None, "steps": None,
               "arch": "democnn", "epochs": 5, "lr": RECIPE["lr"], "train_batch": RECIPE["batch"],
               "jacobian_rounds": 2, "jacobian_lambda": 0.1, "jacobian_direction": "logit",
               "max_augment": "fraction"},
    "mahmood2021": {"fractions": (1, 25, 50, 75, 100), "attacks": ("fgsm", "pgd", "mim"), "eps": 0.05, "steps": 10,
                    "arch": "cw_cnn", "epochs": 100, "lr": 1e-4, "train_batch": 64, "jacobian_rounds": 4,
                    "jacobian_lambda": 0.1, "jacobian_direction": "loss", "max_augment": None},
}
DIRECTIONS = ("logit", "loss")
SURROGATE_ARCHS = ("cw_cnn", *ARCHS)


# ------------------------------------------------------------------------------------------------ metrics


def clean_correct(y: np.ndarray, clean_pred: np.ndarray) -> np.ndarray:
    """Mask of the rows the target classifies correctly when clean (``clean_pred_i = y_i``): the only rows
    Mahmood et al. attack and score (Sec. 2, "correctly identified sample [x] with class label [y]")."""
    return np.asarray(clean_pred) == np.asarray(y)


def transfer_asr(y: np.ndarray, clean_pred: np.ndarray, adv_pred: np.ndarray) -> float:
    """``100 * |{i: clean_pred_i = y_i, adv_pred_i != y_i}| / |{i: clean_pred_i = y_i}|`` (NaN without a
    clean-correct row): the untargeted attack "is considered successful as long as" the target's label of the
    transferred image differs from the true one (Mahmood et al. Sec. 2), over clean-correct rows."""
    correct = clean_correct(y, clean_pred)
    fooled = np.asarray(adv_pred) != np.asarray(y)
    return float(100.0 * fooled[correct].mean()) if correct.any() else math.nan


def defense_accuracy(y: np.ndarray, clean_pred: np.ndarray, adv_pred: np.ndarray,
                     rejected: np.ndarray | None = None) -> float:
    """``100 * mean_{i: clean_pred_i = y_i}(adv_pred_i = y_i or rejected_i)`` (NaN without a clean-correct row).

    Mahmood et al. Sec. 3.10: "The vanilla defense accuracy is the percent of adversarial examples the vanilla
    network correctly identifies"; the adversarial examples are made from correctly identified samples (Sec. 2).
    With ``rejected`` it is the defended system's accuracy: right when it keeps the true label or refuses the
    input. Without it, ``100 - transfer_asr`` exactly."""
    correct = clean_correct(y, clean_pred)
    right = np.asarray(adv_pred) == np.asarray(y)
    if rejected is not None:
        right = right | np.asarray(rejected, dtype=bool)
    return float(100.0 * right[correct].mean()) if correct.any() else math.nan


def detection_metrics(conf_id: np.ndarray, id_correct: np.ndarray, conf_adv: np.ndarray,
                      adv_fooled: np.ndarray) -> dict[str, float]:
    """``{auroc, fpr95}`` in percent (:func:`advopenood.evaluation.metrics.ood_metrics`, adversarial = positive) of the
    clean-correct ID confidences ``conf_id[id_correct]`` against the confidences of the transferred examples
    that fool the target, ``conf_adv[adv_fooled]``; NaN when a side is empty or a score is NaN."""
    try:
        m = ood_metrics(np.asarray(conf_id)[np.asarray(id_correct, bool)],
                        np.asarray(conf_adv)[np.asarray(adv_fooled, bool)])
    except ValueError:  # empty side or NaN scores: undefined
        return {"auroc": math.nan, "fpr95": math.nan}
    return {"auroc": m["auroc"], "fpr95": m["fpr95"]}


# ------------------------------------------------------------------------------------------- the adversary


def fraction_rows(n: int, fraction: float, seed: int) -> np.ndarray:
    """Sorted rows of a seeded random ``fraction`` percent (at least one) of ``n``; the first
    ``round(n * fraction / 100)`` of one permutation, so a smaller fraction is a subset of a larger one."""
    k = max(1, int(round(n * float(fraction) / 100.0)))
    return seeded_prefix(n, k, seed)


def surrogate_seed(seed: int, mode: str, fraction: float) -> int:
    """The training seed of one surrogate, derived from the run seed, the threat model and the fraction."""
    return int(canonical_key({"seed": int(seed), "mode": mode, "fraction": float(fraction)})[:15], 16)


def jacobian_augment(model: torch.nn.Module, x: Tensor, labels: Tensor, lam: float, batch_size: int,
                     direction: str = "logit") -> Tensor:
    """One Jacobian-based augmentation step (Papernot et al. 2017; Mahmood et al. App. B.3, Algorithm 1, "the
    data augmentation trick (i.e., Jacobian trick) is used to increase the samples in training dataset"):
    ``clip(x + lam * sign(g), 0, 1)`` with the surrogate in eval mode, parameters frozen, on the CPU.

    ``direction="logit"``: ``g = d F_label(x) / dx``, the gradient of the surrogate's logit of each row's label
    (Papernot et al.'s ``sign(J_F(x)[O(x)])``; ours under ``strong``). ``direction="loss"``: ``g = d CE(F(x),
    label) / dx``, an untargeted FGSM step of size ``lam`` on the oracle label, as the authors' reference
    implementation of the mixed black-box attack builds its synthetic data (``mahmood2021``): it moves away from
    the label instead of towards it."""
    device = next(model.parameters()).device
    out = []
    with frozen(model), torch.enable_grad():
        for i in range(0, len(x), batch_size):
            xb = x[i:i + batch_size].to(device).requires_grad_(True)
            logits, yb = model(xb), labels[i:i + batch_size].to(device)
            objective = (logits.gather(1, yb[:, None]).sum() if direction == "logit"
                         else torch.nn.functional.cross_entropy(logits, yb, reduction="sum"))
            (grad,) = torch.autograd.grad(objective, xb)
            out.append((xb.detach() + lam * grad.sign()).clamp(0.0, 1.0).cpu())
    return torch.cat(out)


class CWCNN(Backbone):
    """The synthetic network of Mahmood et al. Table 4 (from Carlini and Wagner 2017 and Nguyen et al. 2019):
    conv 3x3x64 + ReLU, conv 3x3x64 + ReLU, max-pool 2x2, conv 3x3x128 + ReLU, conv 3x3x128 + ReLU, max-pool
    2x2, fully connected 256 + ReLU, fully connected 256 + ReLU, softmax over the classes (the head). The last
    stage is the second 256-unit layer as a 1x1 map, so :class:`advopenood.models.Classifier`'s pooling is the
    identity. Unpadded convolutions as in Carlini and Wagner's Keras model (32 -> 5 x 5 x 128)."""

    last_block_name = "dense"

    def __init__(self, num_classes: int = 10, in_channels: int = 3, input_size: int = 32):
        super().__init__()
        nn = torch.nn
        self.block1 = nn.Sequential(nn.Conv2d(in_channels, 64, 3), nn.ReLU(), nn.Conv2d(64, 64, 3), nn.ReLU(),
                                    nn.MaxPool2d(2))
        self.block2 = nn.Sequential(nn.Conv2d(64, 128, 3), nn.ReLU(), nn.Conv2d(128, 128, 3), nn.ReLU(),
                                    nn.MaxPool2d(2))
        side = ((input_size - 4) // 2 - 4) // 2
        self.dense = nn.Sequential(nn.Flatten(), nn.Linear(128 * side * side, 256), nn.ReLU(), nn.Linear(256, 256),
                                   nn.ReLU())
        self.fc = nn.Linear(256, num_classes)

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


@dataclass
class Surrogate:
    """A trained surrogate: threat model, data fraction (percent), target queries spent."""

    mode: str
    fraction: float
    model: Classifier
    queries: int

    @property
    def label(self) -> str:
        return "pure" if self.mode == "pure" else f"mixed{self.fraction:g}"


# --------------------------------------------------------------------------------------------- the analysis


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise UsageError(message)


def _transferable_attacks() -> list[str]:
    """Registered attacks (not families) that perturb ID images without binding to the target or a detector."""
    classes = {n: registry.get("attacks", n) for n in registry.names("attacks")}
    return [n for n, cls in classes.items() if isinstance(cls, type) and issubclass(cls, Attack)
            and cls.source == "id" and not is_detector_aware(cls)]


def _eval_rows(correct: np.ndarray, limit: int | None, seed: int) -> np.ndarray:
    """The clean-correct ID rows (``correct`` is :func:`clean_correct` of the ID test set), or a sorted seeded
    sample of ``limit`` of them."""
    rows = np.flatnonzero(correct)
    if limit is None or limit >= len(rows):
        return rows
    return rows[seeded_prefix(len(rows), limit, seed)]


@torch.no_grad()
def _predict(model: Classifier, batches: Any, device: torch.device) -> np.ndarray:
    return torch.cat([model(x.to(device)).argmax(1).cpu() for x, _ in batches]).numpy()


def read_transfer(table: pd.DataFrame) -> list[str]:
    """Per surrogate and data fraction: the attack with the highest transfer ASR (or that none fools the target),
    and the detector that adds the most defense accuracy (or that none adds any), on ``n`` clean-correct rows."""
    out = []
    for (surrogate, fraction), part in table.groupby(["surrogate", "data_fraction"], sort=False):
        line = (f"{surrogate} surrogate, {fmt(fraction)} % of the training data "
                f"({int(part['n'].max())} clean-correct test images): ")
        asr = part.dropna(subset=["asr"])
        if asr.empty:
            out.append(line + "nothing to attack.")
            continue
        best = asr.loc[asr["asr"].idxmax()]
        line += (f"the highest transfer ASR is {best['asr']:.1f} % ({best['attack']})" if best["asr"] > 0
                 else "no transferred example fools the target")
        scored = part.dropna(subset=["improvement"])
        scored = scored[scored["detector"].astype("string").fillna("") != ""]
        if len(scored):
            top = scored.loc[scored["improvement"].idxmax()]
            line += (f"; {label(top['detector'])} adds the most defense accuracy, {top['improvement']:+.1f} points on "
                     f"{top['attack']} ({top['undefended_acc']:.1f} % -> {top['defense_acc']:.1f} %)"
                     if top["improvement"] > 0 else "; no detector adds defense accuracy")
        out.append(line + ".")
    return out


def transfer_section(table: pd.DataFrame) -> Section:
    """``Black-box transfer``: transfer ASR and defense accuracy per surrogate, attack and detector."""
    protocols = set(table["protocol"].astype(str)) if "protocol" in table else {"strong"}
    adversary = ("the adversary is Mahmood et al.'s CIFAR-10 one (protocol mahmood2021); the deviations column "
                 "lists where it differs from the paper's" if protocols == {"mahmood2021"} else
                 "the adversary is ours (protocol " + ", ".join(sorted(protocols)) + "), weaker than the paper's; "
                 "its numbers are not comparable with the paper's")
    return Section("Black-box transfer", [
        Paragraph("Mahmood et al., Beware the Black-Box: adversarial examples crafted on a surrogate (pure: trained on "
                  "the true labels; mixed: labels queried from the target, rejected queries dropped) and submitted to "
                  "the target; " + adversary + ". Every metric is on the n test images the target classifies "
                  "correctly when clean, as in the paper. asr: transfer success rate; undefended_acc = 100 - asr; "
                  "defense_acc: share handled correctly (right label or rejected); percent."),
        Table(table.drop(columns=["deviations"], errors="ignore")), Bullets(read_transfer(table)),
        *[Paragraph(f"Deviations from the paper's adversary: {text}.") for text in
          (table["deviations"].dropna().astype(str).unique() if "deviations" in table else []) if text]])


@register("analyses", "transfer")
class TransferAnalysis:
    """Pure and mixed black-box transfer attacks: ASR, detector AUROC/FPR95 and defense accuracy.

    Adversary parameters (``None``: the value of the run's protocol, :data:`PROTOCOL_SETTINGS`): ``fractions``
    (percent of the fit set held by mixed adversaries; empty = pure only), ``attacks`` (registered attacks
    crafted on each surrogate), ``eps`` (budget, e.g. ``8/255``), ``steps`` (iterations of the iterative
    attacks, each of ``eps / steps``), ``arch`` (surrogate architecture: ``cw_cnn`` or one of
    :data:`advopenood.models.ARCHS`), ``epochs``, ``lr``, ``train_batch`` (surrogate training per round, Adam
    with a cosine schedule), ``jacobian_rounds``, ``jacobian_lambda``, ``jacobian_direction`` (``logit`` or
    ``loss``, :func:`jacobian_augment`), ``max_augment`` (rows augmented per round). Run parameters:
    ``query_detector`` (detector guarding the queries, default the run's first), ``limit`` (seeded subset of the
    clean-correct ID test rows attacked), ``batch_size`` (default the run's), ``progress``.
    """

    def __init__(self, fractions: Sequence[float] | float | None = None, attacks: Sequence[str] | str | None = None,
                 eps: float | str | None = None, steps: int | None = None, arch: str | None = None,
                 epochs: int | None = None, lr: float | None = None, train_batch: int | None = None,
                 jacobian_rounds: int | None = None, jacobian_lambda: float | None = None,
                 jacobian_direction: str | None = None, max_augment: int | None = None,
                 query_detector: str | None = None, limit: int | None = None, batch_size: int | None = None,
                 progress: bool = True):
        explicit: dict[str, Any] = {}
        if fractions is not None:
            fractions = [fractions] if isinstance(fractions, Real) else list(fractions)
            for f in fractions:
                _check(isinstance(f, Real) and not isinstance(f, bool) and 0.0 < float(f) <= 100.0,
                       f"transfer fraction {f!r} is out of range; valid choices: percentages in (0, 100], "
                       "e.g. [1, 25, 100]")
            explicit["fractions"] = tuple(sorted({float(f) for f in fractions}))
        if attacks is not None:
            valid = _transferable_attacks()
            attacks = [attacks] if isinstance(attacks, str) else list(attacks)
            _check(bool(attacks), f"transfer attacks is empty; valid choices: {', '.join(valid)}")
            for name in attacks:
                _check(str(name).strip().lower() in valid,
                       f"unknown transfer attack {name!r}; valid choices: {', '.join(valid)}")
            explicit["attacks"] = tuple(str(a).strip().lower() for a in dict.fromkeys(attacks))
        if eps is not None:
            explicit["eps"] = parse_eps(eps)
        _check(arch is None or arch in SURROGATE_ARCHS,
               f"unknown transfer arch {arch!r}; valid choices: {', '.join(SURROGATE_ARCHS)}")
        _check(jacobian_direction is None or jacobian_direction in DIRECTIONS,
               f"unknown transfer jacobian_direction {jacobian_direction!r}; valid choices: {', '.join(DIRECTIONS)}")
        for key, value in (("steps", steps), ("epochs", epochs), ("train_batch", train_batch),
                           ("max_augment", max_augment), ("limit", limit), ("batch_size", batch_size)):
            _check(value is None or (isinstance(value, Real) and int(value) == value and int(value) >= 1),
                   f"transfer {key} {value!r} is out of range; valid choices: an integer >= 1 or null")
        _check(jacobian_rounds is None or (isinstance(jacobian_rounds, Real) and int(jacobian_rounds) >= 0),
               f"transfer jacobian_rounds {jacobian_rounds!r} is out of range; valid choices: an integer >= 0")
        _check(lr is None or float(lr) > 0, f"transfer lr {lr!r} is out of range; valid choices: a number > 0")
        _check(jacobian_lambda is None or 0.0 < float(jacobian_lambda) <= 1.0,
               f"transfer jacobian_lambda {jacobian_lambda!r} is out of range; valid choices: 0 < lambda <= 1")
        detectors = registry.names("detectors")
        _check(query_detector is None or str(query_detector).lower() in detectors,
               f"unknown transfer query_detector {query_detector!r}; valid choices: {', '.join(detectors)}")
        for key, value, cast in (("arch", arch, str), ("steps", steps, int), ("epochs", epochs, int),
                                 ("lr", lr, float), ("train_batch", train_batch, int),
                                 ("jacobian_rounds", jacobian_rounds, int), ("jacobian_lambda", jacobian_lambda, float),
                                 ("jacobian_direction", jacobian_direction, str), ("max_augment", max_augment, int)):
            if value is not None:
                explicit[key] = cast(value)
        self.explicit = explicit
        self.query_detector = None if query_detector is None else str(query_detector).lower()
        self.limit = None if limit is None else int(limit)
        self.batch_size = None if batch_size is None else int(batch_size)
        self.progress = bool(progress)
        for protocol in PROTOCOL_SETTINGS:  # eps and steps against every attack either protocol may run
            settings = self.settings(protocol)
            for name in settings["attacks"]:
                self._attack(name, settings, 32)

    def settings(self, protocol: str) -> dict[str, Any]:
        """The adversary for ``protocol``: its :data:`PROTOCOL_SETTINGS` entry (``strong``'s for any protocol
        without one), overridden by the parameters set explicitly."""
        return {**PROTOCOL_SETTINGS.get(protocol, PROTOCOL_SETTINGS["strong"]), **self.explicit}

    @staticmethod
    def _attack(name: str, settings: dict[str, Any], input_size: int) -> Attack:
        defaults = registry.get("attacks", name).defaults(input_size)
        steps = {}
        if settings["steps"] is not None and "steps" in defaults:
            steps = {"steps": settings["steps"], **({"rel_stepsize": 1.0 / settings["steps"]}
                                                    if "rel_stepsize" in defaults else {})}
        return build_attack(name, steps, input_size=input_size, protocol=None, eps=settings["eps"])

    @staticmethod
    def _recipe(settings: dict[str, Any]) -> dict[str, Any]:
        return {"epochs": settings["epochs"], "lr": settings["lr"], "batch": settings["train_batch"]}

    def deviations(self, ctx: RunContext, settings: dict[str, Any]) -> str:
        """Under ``mahmood2021``, where this run's adversary differs from the paper's CIFAR-10 one ("; "-joined);
        empty under any other protocol, whose adversary is ours and claims nothing of the paper."""
        if ctx.protocol != "mahmood2021":
            return ""
        paper = PROTOCOL_SETTINGS["mahmood2021"]
        out = [f"{key}={_show(settings[key])} (paper {_show(paper[key])})" for key in self.explicit
               if settings[key] != paper[key]]
        if ctx.dataset.lower() != "cifar10":
            out.append(f"dataset {ctx.dataset} (paper CIFAR-10)")
        if len(ctx.fit_set) != PAPER_TRAIN_SIZE:
            out.append(f"adversary data {len(ctx.fit_set)} training images (paper {PAPER_TRAIN_SIZE}, Table 3)")
        out.append("surrogate training: Adam with a cosine schedule, restarted each round (paper: Adam, lr 1e-4, "
                   "Table 2)")
        return "; ".join(out)

    # ------------------------------------------------------------------------------------------- the run

    def __call__(self, ctx: RunContext) -> Results:
        settings = self.settings(ctx.protocol)
        show = self.progress and ctx.progress
        detectors = list(ctx.bank.names) if ctx.bank is not None else []
        query = self._query_detector(detectors)
        thresholds = {d: id_threshold(ctx.scores[d]["id"]) for d in detectors}
        id_correct = clean_correct(ctx.clean.y, ctx.clean.pred)
        rows = _eval_rows(id_correct, self.limit, ctx.seed)
        tag = {"protocol": ctx.protocol, "deviations": self.deviations(ctx, settings)}
        targets = [("pure", 100.0)] + [("mixed", float(f)) for f in settings["fractions"]]
        out: list[dict[str, Any]] = []
        for mode, fraction in tqdm(targets, desc="transfer", unit="surrogate", disable=not show, leave=False):
            sur = self._surrogate(ctx, settings, mode, fraction, query, thresholds.get(query), show)
            out += [{**row, **tag} for row in self._evaluate(ctx, settings, sur, rows, detectors, thresholds,
                                                             id_correct, show)]
        table = pd.DataFrame(out, columns=CSV_COLUMNS)
        sections = guarded("Black-box transfer", lambda: [transfer_section(as_written(table))]) if len(table) else []
        return Results(tables={"transfer.csv": table}, sections=sections)

    def _query_detector(self, detectors: list[str]) -> str | None:
        if self.query_detector is None:
            return detectors[0] if detectors else None
        _check(self.query_detector in detectors,
               f"transfer query_detector {self.query_detector!r} is not a fitted detector of this run; "
               f"valid choices: {', '.join(detectors) or 'none (the run has no detectors)'}")
        return self.query_detector

    # ------------------------------------------------------------------------------------------ surrogates

    def _surrogate(self, ctx: RunContext, settings: dict[str, Any], mode: str, fraction: float, query: str | None,
                   threshold: float | None, show: bool) -> Surrogate:
        """The surrogate of one threat model, from the cache or trained and saved there atomically."""
        spec = self._spec(ctx, settings, mode, fraction, query, threshold)
        key = canonical_key(spec)
        path = ctx.plan.cache / "surrogates" / f"{key[:16]}.pt"
        if path.is_file():
            queries = int(torch.load(path, map_location="cpu", weights_only=True)["queries"])
            return Surrogate(mode, fraction, self._build(ctx, settings["arch"], path), queries)
        seed = surrogate_seed(ctx.seed, mode, fraction)
        with seeded(seed, ctx.device):
            model = self._build(ctx, settings["arch"], None)
            if mode == "pure":
                queries = 0
                train_classifier(model, ctx.fit_set, self._recipe(settings), seed, show)
            else:
                det = ctx.bank.dets[query] if query is not None else None
                oracle = Oracle(ctx.model, det, threshold, self.batch_size or ctx.batch_size, ctx.device)
                self._train_mixed(ctx, settings, model, oracle, fraction, seed, show)
                queries = oracle.queries
        buf = io.BytesIO()
        torch.save({"state_dict": model.backbone.state_dict(), "queries": queries}, buf)
        aio.atomic_write(path, lambda f: f.write(buf.getvalue()))
        return Surrogate(mode, fraction, self._build(ctx, settings["arch"], path), queries)  # as a re-run loads it

    def _train_mixed(self, ctx: RunContext, settings: dict[str, Any], model: Classifier, oracle: Oracle,
                     fraction: float, seed: int, show: bool) -> None:
        """Query-label a fraction of the fit set, then Jacobian-augment and retrain ``jacobian_rounds`` times."""
        rows = fraction_rows(len(ctx.fit_set), fraction, ctx.seed)
        x, _ = stack(ctx.fit_set, rows)  # the true labels stay unused: the target labels the data
        y, accepted = oracle(x)
        x, y = x[accepted], y[accepted]
        rng = np.random.default_rng(seed)
        bs = self.batch_size or ctx.batch_size
        rounds, cap = settings["jacobian_rounds"], settings["max_augment"]
        _check(len(x) > 0, f"transfer: the query detector rejected all {oracle.queries} queries of the mixed "
                           f"adversary at fraction {fraction:g} %; valid choices: a larger fraction")
        for r in range(rounds + 1):
            train_classifier(model, TensorDataset(x, y), self._recipe(settings), derive_seed(seed, r), show)
            if r == rounds:
                break
            k = len(x) if cap is None else min(len(rows) if cap == "fraction" else int(cap), len(x))
            pick = np.sort(rng.choice(len(x), size=k, replace=False))
            x_new = jacobian_augment(model, x[pick], y[pick], settings["jacobian_lambda"], bs,
                                     settings["jacobian_direction"])
            y_new, accepted = oracle(x_new)
            x, y = torch.cat([x, x_new[accepted]]), torch.cat([y, y_new[accepted]])

    @staticmethod
    def _build(ctx: RunContext, arch: str, checkpoint: Path | None) -> Classifier:
        m = ctx.model
        mean, std = m.mean.flatten().tolist(), m.std.flatten().tolist()
        if arch != "cw_cnn":
            return build_model(arch, m.num_classes, checkpoint, mean=mean, std=std, input_size=m.input_size,
                               in_channels=m.in_channels, device=ctx.device)
        _check(m.input_size >= 16, f"transfer arch 'cw_cnn' needs inputs of at least 16 x 16, not {m.input_size}; "
                                   f"valid choices: {', '.join(ARCHS)}")
        backbone = CWCNN(m.num_classes, m.in_channels, m.input_size)
        if checkpoint is not None:
            backbone.load_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"])
        return Classifier(backbone, tuple(mean), tuple(std), arch, m.input_size, m.in_channels).to(ctx.device).eval()

    def _spec(self, ctx: RunContext, settings: dict[str, Any], mode: str, fraction: float, query: str | None,
              threshold: float | None) -> dict[str, Any]:
        """What determines a surrogate (its cache key). A pure surrogate never meets the target, so only its
        input format enters; a mixed one depends on the target's weights and the query detector."""
        m = ctx.model
        spec: dict[str, Any] = {
            "kind": "transfer-surrogate", "mode": mode, "fraction": float(fraction), "fit": ctx.fit_set.identity(),
            "arch": {"arch": settings["arch"], "num_classes": m.num_classes, "in_channels": m.in_channels,
                     "input_size": m.input_size, "mean": m.mean.flatten().tolist(), "std": m.std.flatten().tolist()},
            "recipe": self._recipe(settings), "seed": int(ctx.seed), "versions": library_versions()}
        if mode == "mixed":
            spec.update({
                "target": weights_hash(m),
                "jacobian": {key: settings[f"jacobian_{key}"] for key in ("rounds", "lambda", "direction")}
                | {"max_augment": settings["max_augment"]},
                "query_detector": query, "threshold": None if threshold is None else float(f"{threshold:.6g}"),
                "detector_params": ctx.plan.params("detector_params", query) or None,
                "backend": ctx.backend if query else None})
        return spec

    # ------------------------------------------------------------------------------------------ evaluation

    def _evaluate(self, ctx: RunContext, settings: dict[str, Any], sur: Surrogate, rows: np.ndarray,
                  detectors: list[str], thresholds: dict[str, float], id_correct: np.ndarray,
                  show: bool) -> list[dict[str, Any]]:
        """Craft every attack on the surrogate (cached in the store), submit it to the target, score and rate it."""
        bs = self.batch_size or ctx.batch_size
        store = AdvStore(ctx.plan.cache / "transfer_adv", shard_size=ctx.plan.shard_size)
        data: Dataset = Subset(ctx.id_set, rows)
        sur_hash = weights_hash(sur.model)
        sets = {}
        for name in settings["attacks"]:
            sets[name] = store.generate(data, sur.model, self._attack(name, settings, ctx.model.input_size),
                                        model_hash=sur_hash, seed=ctx.seed, device=ctx.device, progress=show)
        scores = ctx.bank.score({f"{sur.label}:{n}": (lambda a=a: a.iter_batches(bs)) for n, a in sets.items()},
                                progress=show) if detectors else {}
        y, clean_pred = ctx.clean.y[rows], ctx.clean.pred[rows]
        correct = clean_correct(y, clean_pred)
        out = []
        for name, adv in sets.items():
            rec = adv.records
            adv_pred = _predict(ctx.model, adv.iter_batches(bs), ctx.device)
            undefended = defense_accuracy(y, clean_pred, adv_pred)
            base = {"surrogate": sur.mode, "data_fraction": sur.fraction, "queries": sur.queries, "attack": name,
                    "asr": transfer_asr(y, clean_pred, adv_pred), "undefended_acc": undefended,
                    "surrogate_acc": float(100.0 * np.mean(rec["clean_pred"].to_numpy()[correct] == y[correct]))
                    if correct.any() else math.nan, "n": int(correct.sum()),
                    "eps": math.nan if adv.eps is None else float(adv.eps), "seed": ctx.seed}
            if not detectors:
                out.append({**base, "detector": "", "auroc": math.nan, "fpr95": math.nan, "defense_acc": undefended,
                            "improvement": 0.0})
            for det in detectors:
                conf = scores.get(det, {}).get(f"{sur.label}:{name}")
                if conf is None:  # the detector failed while scoring (reason in ctx.bank.errors)
                    out.append({**base, "detector": det, "auroc": math.nan, "fpr95": math.nan,
                                "defense_acc": math.nan, "improvement": math.nan})
                    continue
                defended = defense_accuracy(y, clean_pred, adv_pred, conf < thresholds[det])
                out.append({**base, "detector": det,
                            **detection_metrics(ctx.scores[det]["id"], id_correct, conf, correct & (adv_pred != y)),
                            "defense_acc": defended, "improvement": defended - undefended})
        return out


def _show(value: Any) -> str:
    """A setting as the deviations column writes it."""
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return f"{value:g}" if isinstance(value, float) else str(value)
