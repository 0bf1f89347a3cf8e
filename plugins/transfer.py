"""Black-box transfer attacks on the detector-defended classifier (pure and mixed black-box adversaries).

Mahmood, Mahmood, Dean, van Dijk, "Beware the Black-Box: on the Robustness of Recent Defenses to Adversarial
Examples" (Entropy 2021), after Nguyen et al. 2019 and Papernot et al. 2017. The adversary never sees the
target's weights, gradients or scores; it trains a *surrogate* (synthetic) model, crafts white-box attacks
(FGSM, PGD, MIM, ...) on it, and submits them to the defended target, here the classifier plus a post-hoc OOD
detector that rejects inputs below its 95 %-TPR threshold.

Threat models (one surrogate each, architecture ``arch``, default the small ``democnn``):

* **pure** black-box (Sec. 2.1 A): the surrogate is trained on the ID training data (the run's fit set) with
  the *true* labels; no query reaches the target (``queries = 0``).
* **mixed** black-box (Sec. 2.1 C, Nguyen et al.): the adversary holds ``fraction`` percent of the training
  data (a seeded random subset; smaller fractions are prefixes of larger ones) and labels it by *querying*
  the defended target, which answers with its top-1 label; inputs the query detector rejects give no label
  and are dropped. Then ``jacobian_rounds`` rounds of Jacobian-based dataset augmentation (Papernot et al.
  2017, the paper's Algorithm 1): train the surrogate ``F`` on the current set, add
  ``clip(x + lambda * sign(d F_label(x) / dx), 0, 1)`` for up to ``max_augment`` seeded rows ``x`` of it,
  label the new points by querying the target (rejected ones dropped), and train again (warm start, as in
  cleverhans' substitute training). Every image sent to the target counts as one query; the detector sees
  the same query.

Metrics per (surrogate, attack) and per detector, on the ID test rows (percent):

* ``asr`` (transfer attack success rate): among the rows the target classifies correctly when clean, the share
  whose transferred adversarial example the target misclassifies.
* ``auroc``, ``fpr95``: the detector's clean ID test confidences (all ID rows of the run) against those of the
  transferred examples that fool the target (``adv_pred != y``, the project-wide success convention),
  OpenOOD's convention (:mod:`advopenood.metrics`; adversarial = OOD = positive); NaN when none fools it.
* ``defense_acc`` (Mahmood et al. Sec. 3.10): the share of all transferred examples the defended system
  handles correctly, i.e. the target predicts the true label *or* the detector rejects the input
  (confidence below the 5 % quantile of its clean ID test confidences: 95 % of clean ID images are accepted).
  ``undefended_acc`` is the paper's vanilla defense accuracy (the target alone predicts the true label) and
  ``improvement = defense_acc - undefended_acc`` its defense accuracy improvement, never negative here
  because a detector can only add correct decisions. Clean ID images the detector rejects are its price,
  fixed at 5 % by the threshold.

Surrogates are cached under ``<cache>/surrogates/<key16>.pt``, keyed by everything that determines them
(target weights and query detector for mixed ones, fit-set identity, fraction, hyper-parameters, seed, library
versions); the crafted examples live in an :class:`advopenood.store.AdvStore` under ``<cache>/transfer_adv``
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
from advopenood.attacks import Attack, frozen
from advopenood.config import cache_dir, parse_eps
from advopenood.context import RunContext
from advopenood.data import Subset, stack
from advopenood.demo import RECIPE, train_classifier
from advopenood.detectors import forward_outputs
from advopenood.errors import UsageError
from advopenood.metrics import id_threshold, ood_metrics
from advopenood.models import ARCHS, Classifier, build_model, weights_hash
from advopenood.registry import register
from advopenood.store import AdvStore, canonical_key, derive_seed, library_versions

CSV_COLUMNS = ["surrogate", "data_fraction", "queries", "attack", "asr", "detector", "auroc", "fpr95", "defense_acc",
               "undefended_acc", "improvement", "surrogate_acc", "n", "eps", "seed"]
DEFAULT_FRACTIONS = (1, 25, 50, 75, 100)
DEFAULT_ATTACKS = ("fgsm", "pgd", "mim")


# ------------------------------------------------------------------------------------------------ metrics


def transfer_asr(y: np.ndarray, clean_pred: np.ndarray, adv_pred: np.ndarray) -> float:
    """``100 * |{i: clean_pred_i = y_i, adv_pred_i != y_i}| / |{i: clean_pred_i = y_i}|`` (NaN without a
    correctly classified row): the target's predictions on the clean and the transferred images."""
    correct = np.asarray(clean_pred) == np.asarray(y)
    fooled = np.asarray(adv_pred) != np.asarray(y)
    return float(100.0 * fooled[correct].mean()) if correct.any() else math.nan


def defense_accuracy(y: np.ndarray, adv_pred: np.ndarray, rejected: np.ndarray | None = None) -> float:
    """``100 * mean(adv_pred = y  or  rejected)`` over all adversarial examples (Mahmood et al. Sec. 3.10):
    the defended system is right when it keeps the true label or refuses the input. Without ``rejected`` it is
    the vanilla (undefended) accuracy ``100 * mean(adv_pred = y)``."""
    right = np.asarray(adv_pred) == np.asarray(y)
    if rejected is not None:
        right = right | np.asarray(rejected, dtype=bool)
    return float(100.0 * right.mean()) if len(right) else math.nan


def detection_metrics(conf_id: np.ndarray, conf_adv: np.ndarray) -> dict[str, float]:
    """``{auroc, fpr95}`` in percent of clean ID vs adversarial confidences (:func:`advopenood.metrics.ood_metrics`);
    NaN when there is no adversarial example or a score is NaN."""
    try:
        m = ood_metrics(conf_id, conf_adv)
    except ValueError:  # empty side or NaN scores: undefined
        return {"auroc": math.nan, "fpr95": math.nan}
    return {"auroc": m["auroc"], "fpr95": m["fpr95"]}


# ------------------------------------------------------------------------------------------- the adversary


def fraction_rows(n: int, fraction: float, seed: int) -> np.ndarray:
    """Sorted rows of a seeded random ``fraction`` percent (at least one) of ``n``; the first
    ``round(n * fraction / 100)`` of one permutation, so a smaller fraction is a subset of a larger one."""
    k = max(1, int(round(n * float(fraction) / 100.0)))
    return np.sort(np.random.default_rng(seed).permutation(n)[:k])


def surrogate_seed(seed: int, mode: str, fraction: float) -> int:
    """The training seed of one surrogate, derived from the run seed, the threat model and the fraction."""
    return int(canonical_key({"seed": int(seed), "mode": mode, "fraction": float(fraction)})[:15], 16)


def jacobian_augment(model: torch.nn.Module, x: Tensor, labels: Tensor, lam: float, batch_size: int) -> Tensor:
    """Papernot et al.'s Jacobian-based augmentation: ``clip(x + lam * sign(d F_label(x) / dx), 0, 1)`` with
    ``F_label`` the surrogate's logit of each row's label (eval mode, parameters frozen), on the CPU."""
    device = next(model.parameters()).device
    out = []
    with frozen(model), torch.enable_grad():
        for i in range(0, len(x), batch_size):
            xb = x[i:i + batch_size].to(device).requires_grad_(True)
            logit = model(xb).gather(1, labels[i:i + batch_size].to(device)[:, None]).sum()
            (grad,) = torch.autograd.grad(logit, xb)
            out.append((xb.detach() + lam * grad.sign()).clamp(0.0, 1.0).cpu())
    return torch.cat(out)


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
            and cls.source == "id" and not hasattr(cls, "bind")]


def _eval_rows(n: int, limit: int | None, seed: int) -> np.ndarray:
    """All ID rows, or a sorted seeded sample of ``limit`` of them."""
    if limit is None or limit >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).permutation(n)[:limit])


@torch.no_grad()
def _predict(model: Classifier, batches: Any, device: torch.device) -> np.ndarray:
    return torch.cat([model(x.to(device)).argmax(1).cpu() for x, _ in batches]).numpy()


@register("analyses", "transfer")
class TransferAnalysis:
    """Pure and mixed black-box transfer attacks: ASR, detector AUROC/FPR95 and defense accuracy.

    Parameters: ``fractions`` (percent of the fit set held by mixed adversaries; empty = pure only),
    ``attacks`` (registered attacks crafted on each surrogate), ``eps`` (budget override, e.g. ``8/255``),
    ``arch`` (surrogate architecture), ``epochs``, ``lr``, ``train_batch`` (surrogate training, Adam with a cosine
    schedule), ``jacobian_rounds``, ``jacobian_lambda``, ``max_augment`` (rows augmented per round, default
    the fraction's row count), ``query_detector`` (detector guarding the queries, default the run's first),
    ``limit`` (seeded subset of the ID test rows attacked), ``batch_size`` (default the run's), ``progress``.
    """

    def __init__(self, fractions: Sequence[float] = DEFAULT_FRACTIONS, attacks: Sequence[str] = DEFAULT_ATTACKS,
                 eps: float | str | None = None, arch: str = "democnn", epochs: int = 5, lr: float = RECIPE["lr"],
                 train_batch: int = RECIPE["batch"], jacobian_rounds: int = 2, jacobian_lambda: float = 0.1,
                 max_augment: int | None = None, query_detector: str | None = None, limit: int | None = None,
                 batch_size: int | None = None, progress: bool = True):
        fractions = [fractions] if isinstance(fractions, Real) else list(fractions or [])
        for f in fractions:
            _check(isinstance(f, Real) and not isinstance(f, bool) and 0.0 < float(f) <= 100.0,
                   f"transfer fraction {f!r} is out of range; valid choices: percentages in (0, 100], "
                   "e.g. [1, 25, 100]")
        self.fractions = sorted({float(f) for f in fractions})
        valid = _transferable_attacks()
        attacks = [attacks] if isinstance(attacks, str) else list(attacks or [])
        _check(bool(attacks), f"transfer attacks is empty; valid choices: {', '.join(valid)}")
        for name in attacks:
            _check(str(name).strip().lower() in valid,
                   f"unknown transfer attack {name!r}; valid choices: {', '.join(valid)}")
        self.attacks = [str(a).strip().lower() for a in dict.fromkeys(attacks)]
        self.eps = None if eps is None else parse_eps(eps)
        for name in self.attacks:
            self._attack(name, 32)  # validates eps against each attack
        _check(arch in ARCHS, f"unknown transfer arch {arch!r}; valid choices: {', '.join(ARCHS)}")
        _check(int(epochs) >= 1, f"transfer epochs {epochs!r} is out of range; valid choices: an integer >= 1")
        _check(float(lr) > 0, f"transfer lr {lr!r} is out of range; valid choices: a number > 0")
        _check(int(train_batch) >= 1,
               f"transfer train_batch {train_batch!r} is out of range; valid choices: an integer >= 1")
        _check(int(jacobian_rounds) >= 0,
               f"transfer jacobian_rounds {jacobian_rounds!r} is out of range; valid choices: an integer >= 0")
        _check(0.0 < float(jacobian_lambda) <= 1.0,
               f"transfer jacobian_lambda {jacobian_lambda!r} is out of range; valid choices: 0 < lambda <= 1")
        for key, value in (("max_augment", max_augment), ("limit", limit), ("batch_size", batch_size)):
            _check(value is None or int(value) >= 1,
                   f"transfer {key} {value!r} is out of range; valid choices: a positive integer or null")
        detectors = registry.names("detectors")
        _check(query_detector is None or str(query_detector).lower() in detectors,
               f"unknown transfer query_detector {query_detector!r}; valid choices: {', '.join(detectors)}")
        self.arch, self.epochs, self.lr, self.train_batch = arch, int(epochs), float(lr), int(train_batch)
        self.jacobian_rounds, self.jacobian_lambda = int(jacobian_rounds), float(jacobian_lambda)
        self.max_augment = None if max_augment is None else int(max_augment)
        self.query_detector = None if query_detector is None else str(query_detector).lower()
        self.limit = None if limit is None else int(limit)
        self.batch_size = None if batch_size is None else int(batch_size)
        self.progress = bool(progress)

    def _attack(self, name: str, input_size: int) -> Attack:
        cls = registry.get("attacks", name)
        params = cls.defaults(input_size)
        if self.eps is not None and getattr(cls, "bounded", True):
            params["eps"] = self.eps
        return cls(**params)

    @property
    def recipe(self) -> dict[str, Any]:
        return {"epochs": self.epochs, "lr": self.lr, "batch": self.train_batch}

    # ------------------------------------------------------------------------------------------- the run

    def __call__(self, ctx: RunContext) -> dict[str, pd.DataFrame]:
        show = self.progress and ctx.progress
        detectors = list(ctx.bank.names) if ctx.bank is not None else []
        query = self._query_detector(detectors)
        thresholds = {d: id_threshold(ctx.scores[d]["id"]) for d in detectors}
        rows = _eval_rows(len(ctx.id_set), self.limit, ctx.seed)
        targets = [("pure", 100.0)] + [("mixed", f) for f in self.fractions]
        out: list[dict[str, Any]] = []
        for mode, fraction in tqdm(targets, desc="transfer", unit="surrogate", disable=not show, leave=False):
            sur = self._surrogate(ctx, mode, fraction, query, thresholds.get(query), show)
            out += self._evaluate(ctx, sur, rows, detectors, thresholds, show)
        return {"transfer.csv": pd.DataFrame(out, columns=CSV_COLUMNS)}

    def _query_detector(self, detectors: list[str]) -> str | None:
        if self.query_detector is None:
            return detectors[0] if detectors else None
        _check(self.query_detector in detectors,
               f"transfer query_detector {self.query_detector!r} is not a fitted detector of this run; "
               f"valid choices: {', '.join(detectors) or 'none (the run has no detectors)'}")
        return self.query_detector

    # ------------------------------------------------------------------------------------------ surrogates

    def _surrogate(self, ctx: RunContext, mode: str, fraction: float, query: str | None, threshold: float | None,
                   show: bool) -> Surrogate:
        """The surrogate of one threat model, from the cache or trained and saved there atomically."""
        spec = self._spec(ctx, mode, fraction, query, threshold)
        key = canonical_key(spec)
        path = cache_dir(ctx.config) / "surrogates" / f"{key[:16]}.pt"
        if path.is_file():
            queries = int(torch.load(path, map_location="cpu", weights_only=True)["queries"])
            return Surrogate(mode, fraction, self._build(ctx, path), queries)
        seed = surrogate_seed(ctx.seed, mode, fraction)
        with torch.random.fork_rng(devices=[ctx.device] if ctx.device.type == "cuda" else []):
            torch.manual_seed(seed)
            model = self._build(ctx, None)
            if mode == "pure":
                queries = 0
                train_classifier(model, ctx.fit_set, self.recipe, seed, show)
            else:
                det = ctx.bank.dets[query] if query is not None else None
                oracle = Oracle(ctx.model, det, threshold, self.batch_size or ctx.batch_size, ctx.device)
                self._train_mixed(ctx, model, oracle, fraction, seed, show)
                queries = oracle.queries
        buf = io.BytesIO()
        torch.save({"state_dict": model.backbone.state_dict(), "queries": queries}, buf)
        aio.atomic_write(path, lambda f: f.write(buf.getvalue()))
        return Surrogate(mode, fraction, self._build(ctx, path), queries)  # exactly as a re-run loads it

    def _train_mixed(self, ctx: RunContext, model: Classifier, oracle: Oracle, fraction: float, seed: int,
                     show: bool) -> None:
        """Query-label a fraction of the fit set, then Jacobian-augment and retrain ``jacobian_rounds`` times."""
        rows = fraction_rows(len(ctx.fit_set), fraction, ctx.seed)
        x, _ = stack(ctx.fit_set, rows)  # the true labels stay unused: the target labels the data
        y, accepted = oracle(x)
        x, y = x[accepted], y[accepted]
        cap = self.max_augment or len(rows)
        rng = np.random.default_rng(seed)
        bs = self.batch_size or ctx.batch_size
        _check(len(x) > 0, f"transfer: the query detector rejected all {oracle.queries} queries of the mixed "
                           f"adversary at fraction {fraction:g} %; valid choices: a larger fraction")
        for r in range(self.jacobian_rounds + 1):
            train_classifier(model, TensorDataset(x, y), self.recipe, derive_seed(seed, r), show)
            if r == self.jacobian_rounds:
                break
            pick = np.sort(rng.choice(len(x), size=min(cap, len(x)), replace=False))
            x_new = jacobian_augment(model, x[pick], y[pick], self.jacobian_lambda, bs)
            y_new, accepted = oracle(x_new)
            x, y = torch.cat([x, x_new[accepted]]), torch.cat([y, y_new[accepted]])

    def _build(self, ctx: RunContext, checkpoint: Path | None) -> Classifier:
        m = ctx.model
        return build_model(self.arch, m.num_classes, checkpoint, mean=m.mean.flatten().tolist(),
                           std=m.std.flatten().tolist(), input_size=m.input_size, in_channels=m.in_channels,
                           device=ctx.device)

    def _spec(self, ctx: RunContext, mode: str, fraction: float, query: str | None,
              threshold: float | None) -> dict[str, Any]:
        """What determines a surrogate (its cache key). A pure surrogate never meets the target, so only its
        input format enters; a mixed one depends on the target's weights and the query detector."""
        m = ctx.model
        spec: dict[str, Any] = {
            "kind": "transfer-surrogate", "mode": mode, "fraction": float(fraction), "fit": ctx.fit_set.identity(),
            "arch": {"arch": self.arch, "num_classes": m.num_classes, "in_channels": m.in_channels,
                     "input_size": m.input_size, "mean": m.mean.flatten().tolist(), "std": m.std.flatten().tolist()},
            "recipe": self.recipe, "seed": int(ctx.seed), "versions": library_versions()}
        if mode == "mixed":
            spec.update({
                "target": weights_hash(m), "jacobian": {"rounds": self.jacobian_rounds, "lambda": self.jacobian_lambda,
                                                        "max_augment": self.max_augment},
                "query_detector": query, "threshold": None if threshold is None else float(f"{threshold:.6g}"),
                "detector_params": (ctx.config.get("detector_params") or {}).get(query) if query else None,
                "backend": ctx.backend if query else None})
        return spec

    # ------------------------------------------------------------------------------------------ evaluation

    def _evaluate(self, ctx: RunContext, sur: Surrogate, rows: np.ndarray, detectors: list[str],
                  thresholds: dict[str, float], show: bool) -> list[dict[str, Any]]:
        """Craft every attack on the surrogate (cached in the store), submit it to the target, score and rate it."""
        bs = self.batch_size or ctx.batch_size
        store = AdvStore(cache_dir(ctx.config) / "transfer_adv", shard_size=int(ctx.config.get("shard_size", 256)))
        data: Dataset = Subset(ctx.id_set, rows)
        sur_hash = weights_hash(sur.model)
        sets = {}
        for name in self.attacks:
            sets[name] = store.generate(data, sur.model, self._attack(name, ctx.model.input_size), model_hash=sur_hash,
                                        seed=ctx.seed, device=ctx.device, progress=show)
        scores = ctx.bank.score({f"{sur.label}:{n}": (lambda a=a: a.iter_batches(bs)) for n, a in sets.items()},
                                progress=show) if detectors else {}
        y, clean_pred = ctx.clean.y[rows], ctx.clean.pred[rows]
        out = []
        for name, adv in sets.items():
            rec = adv.records
            adv_pred = _predict(ctx.model, adv.iter_batches(bs), ctx.device)
            undefended = defense_accuracy(y, adv_pred)
            base = {"surrogate": sur.mode, "data_fraction": sur.fraction, "queries": sur.queries, "attack": name,
                    "asr": transfer_asr(y, clean_pred, adv_pred), "undefended_acc": undefended,
                    "surrogate_acc": float(100.0 * np.mean(rec["clean_pred"].to_numpy() == y)), "n": len(rows),
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
                defended = defense_accuracy(y, adv_pred, conf < thresholds[det])
                out.append({**base, "detector": det, **detection_metrics(ctx.scores[det]["id"], conf[adv_pred != y]),
                            "defense_acc": defended, "improvement": defended - undefended})
        return out
