"""Black-box transfer attacks on the detector-defended classifier (pure and mixed black-box adversaries).

Mahmood, Gurevin, van Dijk, Nguyen, "Beware the Black-Box: on the Robustness of Recent Defenses to Adversarial
Examples" (Entropy 2021), after Nguyen et al. 2019 and Papernot et al. 2017, and the authors' code
(MetaMain/BewareAdvML, commit ``52d489b565b0df36cb588b5709c29c2e8e4d3f49``; files below are under
``AdversarialSampleGeneratorV11/AdversarialSampleGeneratorV11/``). The adversary never sees the target's
weights, gradients or scores; it trains a *surrogate* ("synthetic") model, crafts white-box attacks on it, and
submits them to the defended target, here the classifier plus a post-hoc OOD detector that rejects inputs below
its 95 %-TPR threshold (a rejection is the defense's "noise class" label, DefenseMultiModel.py L12-31).

Threat models:

* **pure** black-box (Sec. 2.1 A, "The synthetic model is built using only the original training dataset"):
  the surrogate is trained on the ID training data (the run's fit set) with the *true* labels; no query
  reaches the target (``queries = 0``).
* **mixed** black-box (Sec. 2.1 C, Nguyen et al.): the adversary holds ``fraction`` percent of the training
  data and "can label both synthetic and original training data by querying the defense", which answers with
  its top-1 label; inputs the query detector rejects get no label and are dropped (App. B.4: "we do not use
  data which has an null class label"). Then Jacobian-based dataset augmentation rounds
  (:func:`advopenood_plugins.analyses.transfer.adversary.train_mixed`). Every image sent to the
  target counts as one query.

The adversary comes from ``ctx.protocol`` (:data:`PROTOCOL_SETTINGS`); a parameter set in
``analysis_params.transfer`` wins over the protocol's value.

* ``mahmood2021``: the authors' CIFAR-10 adversary as their code runs it (``PapernotAttackCIFAR10``,
  DefaultMethodsVanilla.py L37-72, and AttackWrappersBlackBox.py), and their comparison (Sec. 3.10): every
  defense is attacked by **its own** adversary and compared with the vanilla network attacked by its own. The
  mixed adversary of a defense queries that defense, and attacks the first ``limit`` (1000) test images that
  the *defended* oracle classifies correctly (``GetCleanCorrectlyIdentifiedSamples(oracleModel, ...)``,
  AttackWrappersBlackBox.py L41, L229-247); the vanilla mixed adversary queries the classifier alone and
  attacks the first 1000 it classifies correctly. The pure adversary attacks the first 1000 test images,
  unfiltered (L274-275), and its examples are submitted to every defense and to the vanilla network
  (``RunPureBlackBoxAttack``, L369-404). The ``deviations`` column lists every remaining difference.
* ``strong`` (the default, and every other protocol): **ours**, much cheaper and not comparable with the
  paper: one adversary per threat model (mixed ones query the run's first detector, or ``query_detector``),
  whose examples of a seeded sample of the clean-correct test images are scored for every detector.

Metrics per (surrogate, attack, detector) row, in percent, on the ``n`` test images the row's adversary attacked:

* ``asr`` (``tables.transfer_asr``): the target alone misclassifies the transferred image; ``undefended_acc =
  100 - asr``; ``defense_acc`` (``tables.defense_accuracy``): the defended system keeps the true label or rejects
  the input; ``vanilla_acc``: the vanilla defense accuracy, i.e. ``undefended_acc`` of the vanilla adversary's
  run (``mahmood2021``: its own run; ``strong``: the same examples); ``improvement`` (``tables.improvement``)
  ``= defense_acc - vanilla_acc``, negative when the defense does worse than no defense (Fig. 1). Under
  ``strong`` it cannot be negative, since a detector only adds correct decisions on the same examples. Rows with
  an empty ``detector`` are the vanilla network's. The detector rejects inputs whose confidence is below the 5 %
  quantile of its confidences on *all* clean ID test images (:func:`advopenood.evaluation.metrics.id_threshold`).
* ``auroc``, ``fpr95`` (``tables.detection_metrics``, ours): negatives are the detector's confidences on the
  clean-correct ID test images, positives those of the row's transferred examples that flip a clean-correct
  image; OpenOOD's convention (adversarial = OOD = positive).

The run saves every per-sample array the table is computed from in ``transfer_samples.npz``
(``tables.save_samples``); :func:`advopenood_plugins.analyses.transfer.verify.verify` re-derives the table from it.
Surrogates are cached under ``<cache>/surrogates/<key16>.pt``, keyed by everything that determines them; the
crafted examples live in an :class:`advopenood.attacks.store.AdvStore` under ``<cache>/transfer_adv``, so a re-run
trains and attacks nothing.
"""
from __future__ import annotations

import io
import math
from numbers import Real
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from advopenood.plugin import (ARCHS, RECIPE, AdvStore, Attack, Classifier, EpochCount, ImageCount, IterationCount,
                               Results, RunContext, Subset, UsageError, Verifiable, as_written, bounded, build_attack,
                               build_model, canonical_key, id_threshold, io as aio, is_detector_aware, library_versions,
                               parse_eps, register, registry, seeded, stack, swept, weights_hash)
from advopenood_plugins.analyses.transfer.adversary import (CW_CNN_MEAN, CW_CNN_STD, CWCNN, Oracle, first_rows,
                                                   fraction_rows, jacobian_lambdas, surrogate_seed, train_mixed,
                                                   train_pure)
from advopenood_plugins.analyses.transfer.report import transfer_sections
from advopenood_plugins.analyses.transfer.tables import (Adversary, Outcome, clean_correct, plan, save_samples,
                                                         table_rows)
from advopenood_plugins.analyses.transfer.verify import verify as verify_transfer

CSV_COLUMNS = ["protocol", "surrogate", "data_fraction", "query_detector", "queries", "attack", "asr", "detector",
               "auroc", "fpr95", "defense_acc", "undefended_acc", "vanilla_acc", "improvement", "surrogate_acc", "n",
               "eps", "seed", "deviations"]
SAMPLES_FILE = "transfer_samples.npz"
#: the most Jacobian augmentation rounds (``jacobian_rounds``; each trains the surrogate again; Papernot et al. 2017 use 6)
MAX_ROUNDS = 1000
AUTHORS_TRAIN_SIZE = 50_000  # the CIFAR-10 training set (Table 3; xTrain of DataManager.LoadCleanDataCIFAR10)
#: Attacks the analysis builds from a registered one with fixed parameters: BIM is PGD without a random start
#: (the authors call ``PGDNotTargeted`` with ``rStart = 0``, AttackWrappersBlackBox.py L92).
ALIASES: dict[str, tuple[str, dict[str, Any]]] = {"bim": ("pgd", {"random_start": False})}
#: The adversary of each protocol (the constructor's adversary parameters override the keys they name).
#: ``mahmood2021`` (DefaultMethodsVanilla.py ``PapernotAttackCIFAR10`` unless noted): ``eps`` 0.05 (L39 epsFGSM,
#: L42 maxChangeEpsBIM); ``steps`` 10 of eps/10 (L44 maxIterationsBIM, L41 epsForBIM 0.005) for BIM, MIM and PGD
#: (PGD's random start uniform in the eps-ball: ``rand_init`` makes CleverHans v.3.0.1 set ``rand_minmax = eps``,
#: attacks/__init__.py L681); MIM decay 1.0 (L45); C&W 1000 iterations (L48; 9 binary-search steps, lr 0.01,
#: initial constant 0.001, confidence 0: l2_attack.py's defaults); ``limit`` 1000 (L51 attackSampleNumber);
#: ``train_batch`` 128 (L52), ``epochs`` 10 per round (L54), ``jacobian_rounds`` 3: ``data_aug = 4`` trainings,
#: augmenting after all but the last (L56; AttackWrappersBlackBox.py L173-189); ``jacobian_lambda`` 0.1 (L57)
#: with CleverHans' sign schedule, unclipped, every row augmented and the whole set re-queried;
#: fractions (L64); the ``cw_cnn`` surrogate with Adam lr 1e-4 (NetworkConstructors.py L19-45). Table 2 of the
#: paper gives 100 epochs and batch 64 instead; the code is what ran. ``pure_epochs`` 100: the pure surrogate's
#: training is not in the authors' code (DebugMethods.py L25 loads "SyntheticModelNoDataAug300Epochs.h5"); we
#: take Table 2's 100 epochs. ``strong``: ours (``eps``/``steps`` ``None``: each attack's default).
PROTOCOL_SETTINGS: dict[str, dict[str, Any]] = {
    "strong": {"fractions": (1, 25, 50, 75, 100), "attacks": ("fgsm", "pgd", "mim"), "eps": None, "steps": None,
               "cw_steps": None, "arch": "democnn", "epochs": 5, "pure_epochs": None, "lr": RECIPE["lr"],
               "train_batch": RECIPE["batch"], "optimizer": "cosine", "data_rows": "seeded", "jacobian_rounds": 2,
               "jacobian_lambda": 0.1, "jacobian_schedule": "constant", "jacobian_clip": True, "requery": False,
               "max_augment": "fraction", "limit": None, "adversaries": "shared"},
    "mahmood2021": {"fractions": (1, 25, 50, 75, 100), "attacks": ("fgsm", "bim", "mim", "pgd", "cw"), "eps": 0.05,
                    "steps": 10, "cw_steps": 1000, "arch": "cw_cnn", "epochs": 10, "pure_epochs": 100, "lr": 1e-4,
                    "train_batch": 128, "optimizer": "adam", "data_rows": "first", "jacobian_rounds": 3,
                    "jacobian_lambda": 0.1, "jacobian_schedule": "cleverhans", "jacobian_clip": False,
                    "requery": True, "max_augment": None, "limit": 1000, "adversaries": "per_defense"},
}
SURROGATE_ARCHS = ("cw_cnn", *ARCHS)
#: What the ``mahmood2021`` adversary still does differently from the authors' code, whatever the parameters.
FIXED_DEVIATIONS = (
    "untargeted attacks only (the authors also run each attack targeted at a random other label, "
    "AttackWrappersBlackBox.py L42, L49-80)",
    "no EAD (the authors' sixth attack, ElasticNetMethod with beta 0.01, L131-150)",
)


# --------------------------------------------------------------------------------------------- the analysis


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise UsageError(message)


def _transferable_attacks() -> list[str]:
    """Registered attacks (not families) that perturb ID images without binding to the target or a detector,
    and the :data:`ALIASES`."""
    classes = {n: registry.get("attacks", n) for n in registry.names("attacks")}
    return sorted([n for n, cls in classes.items() if isinstance(cls, type) and issubclass(cls, Attack)
                   and cls.source == "id" and not is_detector_aware(cls)] + list(ALIASES))


@torch.no_grad()
def _predict(model: Classifier, batches: Any, device: torch.device) -> np.ndarray:
    return torch.cat([model(x.to(device)).argmax(1).cpu() for x, _ in batches]).numpy()


@register("analyses", "transfer")
class TransferAnalysis(Verifiable):
    """Pure and mixed black-box transfer attacks: ASR, detector AUROC/FPR95, defense accuracy and its improvement.

    Adversary parameters (``None``: the value of the run's protocol, :data:`PROTOCOL_SETTINGS`): ``fractions``
    (percent of the fit set held by mixed adversaries; empty = pure only), ``attacks`` (registered attacks, or
    ``bim``, crafted on each surrogate), ``eps`` (budget, e.g. ``8/255``), ``steps`` (iterations of the iterative
    Linf attacks, each of ``eps / steps``), ``arch`` (surrogate architecture: ``cw_cnn`` or one of
    :data:`advopenood.models.ARCHS`), ``epochs`` (per training round), ``pure_epochs`` (the pure surrogate's),
    ``lr``, ``train_batch``, ``jacobian_rounds`` (augmentations; one more training follows the last),
    ``jacobian_lambda`` (its magnitude), ``max_augment`` (rows augmented per round), ``limit`` (test images
    attacked per adversary). Run parameters: ``query_detector`` (``strong`` only: the detector guarding the
    shared mixed adversaries' queries, default the run's first), ``batch_size`` (default the run's), ``progress``.
    """

    verify = staticmethod(verify_transfer)
    report_sections = staticmethod(lambda run: transfer_sections(run.table("transfer.csv")))  # verify: the CSV
    #: the bounds of its counts, checked before it is built (docs/analyses.md, "Parameter bounds")
    param_types = {"fractions": swept(what="surrogate data fractions"), "attacks": swept(what="attacks"),
                   "steps": IterationCount | None, "epochs": EpochCount | None, "pure_epochs": EpochCount | None,
                   "jacobian_rounds": bounded(int, 0, MAX_ROUNDS, "Jacobian rounds") | None,
                   "max_augment": ImageCount | None, "limit": ImageCount | None}

    def __init__(self, fractions: Sequence[float] | float | None = None, attacks: Sequence[str] | str | None = None,
                 eps: float | str | None = None, steps: int | None = None, arch: str | None = None,
                 epochs: int | None = None, pure_epochs: int | None = None, lr: float | None = None,
                 train_batch: int | None = None, jacobian_rounds: int | None = None,
                 jacobian_lambda: float | None = None, max_augment: int | None = None, limit: int | None = None,
                 query_detector: str | None = None, batch_size: int | None = None, progress: bool = True):
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
        for key, value in (("steps", steps), ("epochs", epochs), ("pure_epochs", pure_epochs),
                           ("train_batch", train_batch), ("max_augment", max_augment), ("limit", limit),
                           ("batch_size", batch_size)):
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
                                 ("pure_epochs", pure_epochs, int), ("lr", lr, float),
                                 ("train_batch", train_batch, int),
                                 ("jacobian_rounds", jacobian_rounds, int), ("jacobian_lambda", jacobian_lambda, float),
                                 ("max_augment", max_augment, int), ("limit", limit, int)):
            if value is not None:
                explicit[key] = cast(value)
        self.explicit = explicit
        self.query_detector = None if query_detector is None else str(query_detector).lower()
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
        """The attack ``name`` (or alias) with the settings' budget, ``steps`` for the iterative Linf attacks
        (those with a ``rel_stepsize``: steps of ``eps / steps``) and ``cw_steps`` for C&W."""
        base, params = ALIASES.get(name, (name, {}))
        params = dict(params)
        defaults = registry.get("attacks", base).defaults(input_size)
        if settings["steps"] is not None and "rel_stepsize" in defaults:
            params |= {"steps": settings["steps"], "rel_stepsize": 1.0 / settings["steps"]}
        if base == "cw" and settings["cw_steps"] is not None:
            params["steps"] = settings["cw_steps"]
        return build_attack(base, params, input_size=input_size, protocol=None, eps=settings["eps"])

    def deviations(self, ctx: RunContext, settings: dict[str, Any]) -> list[str]:
        """Under ``mahmood2021``, where this run's adversary differs from the authors' code (every row's); empty
        under any other protocol, whose adversary is ours and claims nothing of the paper."""
        if ctx.protocol != "mahmood2021":
            return []
        authors = PROTOCOL_SETTINGS["mahmood2021"]
        out = [f"{key}={_show(settings[key])} (authors {_show(authors[key])})" for key in self.explicit
               if settings[key] != authors[key]]
        if ctx.dataset.lower() != "cifar10":
            out.append(f"dataset {ctx.dataset} (authors CIFAR-10)")
        if len(ctx.fit_set) != AUTHORS_TRAIN_SIZE:
            out.append(f"adversary data: {len(ctx.fit_set)} training images (authors {AUTHORS_TRAIN_SIZE})")
        if "indices" in ctx.id_set.identity():
            out.append(f"test images: a seeded subset of {len(ctx.id_set)}, in test-set order (authors: the whole "
                       "test set in order)")
        out += FIXED_DEVIATIONS
        if "cw" in settings["attacks"]:
            out.append("cw: foolbox's L2CarliniWagnerAttack with the parameters of the authors' l2_attack.py "
                       "(Carlini's code)")
        return out

    # ------------------------------------------------------------------------------------------- the run

    def __call__(self, ctx: RunContext) -> Results:
        settings = self.settings(ctx.protocol)
        show = self.progress and ctx.progress
        detectors = [d for d in (ctx.bank.names if ctx.bank is not None else []) if "id" in ctx.scores.get(d, {})]
        _check(self.query_detector is None or settings["adversaries"] == "shared",
               f"transfer query_detector {self.query_detector!r} applies to protocol strong's shared adversary; under "
               f"{ctx.protocol} each defense is queried by its own adversary; valid choices: null")
        query = self._query_detector(detectors) if settings["adversaries"] == "shared" else None
        conf_id = {d: np.asarray(ctx.scores[d]["id"], np.float64) for d in detectors}
        thresholds = {d: id_threshold(c) for d, c in conf_id.items()}
        id_correct = clean_correct(ctx.clean.y, ctx.clean.pred)
        adversaries = plan(settings, detectors, id_correct, {d: c >= thresholds[d] for d, c in conf_id.items()},
                           query, ctx.seed)
        outcomes, queries = [], []
        for adv in tqdm(adversaries, desc="transfer", unit="adversary", disable=not show, leave=False):
            model, spent = self._surrogate(ctx, settings, adv, thresholds, show)
            outcomes.append(self._evaluate(ctx, settings, adv, model, show))
            queries.append(spent)
        rows = table_rows(adversaries, outcomes, queries, thresholds, conf_id, id_correct)
        shared = self.deviations(ctx, settings)
        for row in rows:
            row.update(protocol=ctx.protocol, seed=ctx.seed,
                       deviations="; ".join(shared + self._row_deviations(ctx, settings, row)))
        table = pd.DataFrame(rows, columns=CSV_COLUMNS)
        meta = {"protocol": ctx.protocol, "seed": ctx.seed, "adversaries": settings["adversaries"],
                "limit": settings["limit"], "detectors": detectors,
                "plan": [{"surrogate": a.mode, "data_fraction": a.fraction, "query_detector": a.oracle or "",
                          "queries": q, "defenses": a.defenses, "baseline": a.baseline,
                          "eps": {k: o.eps for k, o in res.items()}}
                         for a, q, res in zip(adversaries, queries, outcomes)]}
        save_samples(ctx.out / SAMPLES_FILE, meta, adversaries, outcomes, ctx.clean.y, ctx.clean.pred, conf_id)
        return Results(tables={"transfer.csv": table}, sections=transfer_sections(as_written(table)))

    @staticmethod
    def _row_deviations(ctx: RunContext, settings: dict[str, Any], row: dict[str, Any]) -> list[str]:
        if ctx.protocol != "mahmood2021":
            return []
        out = []
        if row["surrogate"] == "pure":
            out.append(f"pure surrogate: {settings['pure_epochs']} epochs with the mixed rounds' optimiser (its "
                       "training is not in the authors' code)")
        if settings["limit"] is not None and row["n"] < settings["limit"]:
            out.append(f"{row['n']} test images qualify (authors {settings['limit']})")
        return out

    def _query_detector(self, detectors: list[str]) -> str | None:
        if self.query_detector is None:
            return detectors[0] if detectors else None
        _check(self.query_detector in detectors,
               f"transfer query_detector {self.query_detector!r} is not a fitted detector of this run; "
               f"valid choices: {', '.join(detectors) or 'none (the run has no detectors)'}")
        return self.query_detector

    # ------------------------------------------------------------------------------------------ surrogates

    def _surrogate(self, ctx: RunContext, settings: dict[str, Any], adv: Adversary, thresholds: dict[str, float],
                   show: bool) -> tuple[Classifier, int]:
        """The surrogate of one adversary and the queries it spent, from the cache or trained and saved there
        atomically."""
        threshold = thresholds.get(adv.oracle) if adv.oracle is not None else None
        spec = self._spec(ctx, settings, adv, threshold)
        path = ctx.plan.cache / "surrogates" / f"{canonical_key(spec)[:16]}.pt"
        if path.is_file():
            queries = int(torch.load(path, map_location="cpu", weights_only=True)["queries"])
            return self._build(ctx, settings["arch"], path), queries
        seed = surrogate_seed(ctx.seed, adv.mode, adv.fraction)
        bs = self.batch_size or ctx.batch_size
        with seeded(seed, ctx.device):
            model = self._build(ctx, settings["arch"], None)
            if adv.mode == "pure":
                queries = 0
                train_pure(model, *stack(ctx.fit_set), settings, seed, show)
            else:
                n = len(ctx.fit_set)
                rows = (first_rows(n, adv.fraction) if settings["data_rows"] == "first"
                        else fraction_rows(n, adv.fraction, ctx.seed))
                x, _ = stack(ctx.fit_set, rows)  # the true labels stay unused: the target labels the data
                oracle = Oracle(ctx.model, self._detector(ctx, adv.oracle), threshold, bs, ctx.device)
                train_mixed(model, oracle, x, settings, seed, bs, show)
                queries = oracle.queries
        buf = io.BytesIO()
        torch.save({"state_dict": model.backbone.state_dict(), "queries": queries}, buf)
        aio.atomic_write(path, lambda f: f.write(buf.getvalue()))
        return self._build(ctx, settings["arch"], path), queries  # as a re-run loads it

    @staticmethod
    def _detector(ctx: RunContext, name: str | None) -> Any:
        """The fitted detector ``name`` (None for none); a lazily fitted bank fits it now."""
        if name is None:
            return None
        if hasattr(ctx.bank, "fit"):
            ctx.bank.fit([name])
        _check(name in ctx.bank.dets, f"transfer: query detector {name!r} is not available "
                                      f"({ctx.bank.errors.get(name, 'not fitted')}); valid choices: a working detector")
        return ctx.bank.dets[name]

    @staticmethod
    def _build(ctx: RunContext, arch: str, checkpoint: Path | None) -> Classifier:
        m = ctx.model
        if arch != "cw_cnn":
            return build_model(arch, m.num_classes, checkpoint, mean=m.mean.flatten().tolist(),
                               std=m.std.flatten().tolist(), input_size=m.input_size, in_channels=m.in_channels,
                               device=ctx.device)
        _check(m.input_size >= 16, f"transfer arch 'cw_cnn' needs inputs of at least 16 x 16, not {m.input_size}; "
                                   f"valid choices: {', '.join(ARCHS)}")
        backbone = CWCNN(m.num_classes, m.in_channels, m.input_size)
        if checkpoint is not None:
            backbone.load_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"])
        return Classifier(backbone, (CW_CNN_MEAN,) * m.in_channels, (CW_CNN_STD,) * m.in_channels, arch,
                          m.input_size, m.in_channels).to(ctx.device).eval()

    @staticmethod
    def _spec(ctx: RunContext, settings: dict[str, Any], adv: Adversary, threshold: float | None) -> dict[str, Any]:
        """What determines a surrogate (its cache key). A pure surrogate never meets the target, so only its
        input format enters; a mixed one depends on the target's weights and the query detector."""
        m = ctx.model
        spec: dict[str, Any] = {
            "kind": "transfer-surrogate", "mode": adv.mode, "fraction": float(adv.fraction),
            "fit": ctx.fit_set.identity(),
            "arch": {"arch": settings["arch"], "num_classes": m.num_classes, "in_channels": m.in_channels,
                     "input_size": m.input_size, "mean": m.mean.flatten().tolist(), "std": m.std.flatten().tolist(),
                     "cw_cnn": "keras-init, dropout 0.5, inputs - 0.5" if settings["arch"] == "cw_cnn" else None},
            "training": {k: settings[k] for k in ("lr", "train_batch", "optimizer")}
            | {"epochs": settings["pure_epochs"] or settings["epochs"] if adv.mode == "pure" else settings["epochs"]},
            "seed": int(ctx.seed), "versions": library_versions()}
        if adv.mode == "mixed":
            spec.update({
                "target": weights_hash(m), "data_rows": settings["data_rows"],
                "jacobian": {"lambdas": jacobian_lambdas(settings["jacobian_rounds"], settings["jacobian_lambda"],
                                                         settings["jacobian_schedule"]),
                             **{k: settings[k] for k in ("jacobian_clip", "requery", "max_augment")}},
                "query_detector": adv.oracle,
                "threshold": None if threshold is None else float(f"{threshold:.6g}"),
                "detector_params": ctx.plan.params("detector_params", adv.oracle) or None,
                "backend": ctx.backend if adv.oracle else None})
        return spec

    # ------------------------------------------------------------------------------------------ evaluation

    def _evaluate(self, ctx: RunContext, settings: dict[str, Any], adv: Adversary, model: Classifier,
                  show: bool) -> dict[str, Outcome]:
        """Craft every attack on the surrogate (cached in the store), submit it to the target, score it by the
        detectors of the adversary's rows; an adversary without rows attacks nothing."""
        bs = self.batch_size or ctx.batch_size
        y, clean_pred = ctx.clean.y[adv.rows], ctx.clean.pred[adv.rows]
        if not len(adv.rows):
            empty = np.zeros(0, np.int64)
            return {a: Outcome(y, clean_pred, empty, empty,
                               _eps(self._attack(a, settings, ctx.model.input_size).params.get("eps")),
                               {d: np.zeros(0) for d in adv.defenses if d}) for a in settings["attacks"]}
        store = AdvStore(ctx.plan.cache / "transfer_adv", shard_size=ctx.plan.shard_size)
        data: Dataset = Subset(ctx.id_set, adv.rows)
        sur_hash = weights_hash(model)
        sets = {name: store.generate(data, model, self._attack(name, settings, ctx.model.input_size),
                                     model_hash=sur_hash, seed=ctx.seed, device=ctx.device, progress=show)
                for name in settings["attacks"]}
        scored = [d for d in adv.defenses if d]
        scores = ctx.bank.score({f"{adv.label}:{n}": (lambda a=a: a.iter_batches(bs)) for n, a in sets.items()},
                                progress=show, only=scored) if scored else {}
        return {name: Outcome(y, clean_pred, _predict(ctx.model, a.iter_batches(bs), ctx.device),
                              a.records["clean_pred"].to_numpy(), _eps(a.eps),
                              {d: scores.get(d, {}).get(f"{adv.label}:{name}") for d in scored})
                for name, a in sets.items()}


def _eps(eps: float | None) -> float:
    """A budget as the table writes it, NaN for an unbounded attack."""
    return math.nan if eps is None else float(eps)


def _show(value: Any) -> str:
    """A setting as the deviations column writes it."""
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return f"{value:g}" if isinstance(value, float) else str(value)
