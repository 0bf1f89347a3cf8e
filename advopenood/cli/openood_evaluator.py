"""OpenOOD bridge: advopenood's detectors and adversarial sets inside OpenOOD's evaluation API.

* :func:`register_with_openood` adds every registered advopenood detector to OpenOOD's postprocessor map
  (``openood.evaluation_api.postprocessor.postprocessors``) as ``advopenood_<name>`` (an OpenOOD
  ``BasePostprocessor`` running the pytorch-ood backend), :class:`AdvEvaluator` to ``openood.evaluation_api``,
  and our configs to OpenOOD's config lookup (``get_postprocessor``), so ``Evaluator(postprocessor_name=...)``
  works by name for ``advopenood_<name>`` and for OpenOOD's 16 post-hoc detectors without a download.
* ``AdvEvaluator`` is OpenOOD's ``Evaluator`` with an ``adv`` OOD split injected into its data-loader and
  score tables, so ``eval_ood()`` scores adversarial sets next to near- and far-OOD (rows per attack and an
  ``advood`` mean, as ``nearood`` / ``farood``; each attack row also has ``n``, its successful adversarial
  examples, and ``asr``). Adversarial images stay float-exact (no PNG round trip).
* :func:`eval_ood_main` is ``advopenood eval-ood``: the flags and behaviour of OpenOOD's
  ``scripts/eval_ood.py`` (``--root`` with ``s*/best.ckpt`` runs, ``--postprocessor``, ``--id-data``,
  ``--batch-size``, ``--save-csv``, ``--save-score``, ``--fsood``) plus ``--attack`` and ``--eps``, which add
  one adversarial split per attack, made from OpenOOD's own ID test loader by advopenood's attack store
  (``<cache>/adv/``, the layout of ``run`` and ``attack``). As everywhere in advopenood, an attack's OOD
  samples are its successful adversarial examples. Every CSV it writes has a ``protocol`` column.

OpenOOD is imported lazily; when it is missing or does not import, every entry point raises a UsageError
pointing at the manual's OpenOOD installation section.
"""
from __future__ import annotations

import importlib.util
from collections.abc import Iterator, Sequence
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch
import torch.nn as nn
from torch.utils.data import Dataset, IterableDataset

from advopenood import registry
from advopenood.attacks.store import AdvSet
from advopenood.detection.bank import create_detector
from advopenood.detection.openood_backend import INSTALL_SECTION, OPENOOD_INSTALL, openood_importable
from advopenood.errors import UsageError
from advopenood.config.loading import validate
from advopenood.evaluation.context import CleanRecord, RunContext, plan_with
from advopenood.outputs.results import Results, as_results
from advopenood.run.attack import asr_row
from advopenood.run.preflight import SET_NAME

ADAPTER_PREFIX = "advopenood_"
ID_DATA = ("cifar10", "cifar100", "imagenet200")
NUM_CLASSES = {"cifar10": 10, "cifar100": 100, "imagenet200": 200}
#: Postprocessors whose OpenOOD script builds a special network; eval-ood runs only plain classifiers.
SPECIAL_NETS = ("conf_branch", "godin", "rotpred", "cider", "reweightood", "npos", "palm", "t2fnorm")
#: Where the manual explains installing OpenOOD, and the imgaug patch it needs under NumPy 2.
#: The protocol every eval-ood output is labelled with unless another is passed.
DEFAULT_PROTOCOL = "strong"


def openood_installed() -> bool:
    """Whether an ``openood`` package is installed at all (importable or not)."""
    return importlib.util.find_spec("openood") is not None


def require_openood() -> None:
    """Raise a UsageError when OpenOOD does not import: how to install it when it is missing, else the import
    problem and the manual's section that fixes it (the imgaug patch under NumPy 2)."""
    ok, why = openood_importable()
    if ok:
        return
    if not openood_installed():
        raise UsageError(f"this needs OpenOOD, which is not installed; install it with: {OPENOOD_INSTALL}")
    raise UsageError(f"OpenOOD is installed but does not import ({why}); see {INSTALL_SECTION}")


def openood_root() -> Path:
    """The OpenOOD checkout (its ``scripts/eval_ood.py`` reads ``<checkout>/data`` and ``<checkout>/configs``)."""
    import openood

    return Path(openood.__file__).resolve().parents[1]


def input_std(dataset: str | None) -> list[float]:
    """OpenOOD's normalisation std for ``dataset`` (0.5 per channel otherwise), as its ODIN uses."""
    from openood.preprocessors.transform import normalization_dict

    return list(normalization_dict.get(dataset or "", [[0.5] * 3, [0.5] * 3])[1])


def openood_adapter(name: str) -> type:
    """An OpenOOD ``BasePostprocessor`` subclass running advopenood's detector ``name`` (pytorch-ood backend).

    Built from an OpenOOD ``Config``: ``postprocessor.postprocessor_args`` are the detector's parameters
    (OpenOOD's names), ``dataset.name`` sets ODIN's gradient scaling for OpenOOD's normalised inputs.
    """
    from openood.postprocessors import BasePostprocessor

    registry.get("detectors", name)

    class Adapter(BasePostprocessor):
        def __init__(self, config):
            super().__init__(config)
            pp = config.postprocessor or {}
            self.detector = create_detector(name, "pytorch-ood", dict(pp.get("postprocessor_args") or {}))
            self.detector.input_std = tuple(input_std((config.dataset or {}).get("name")))
            self.APS_mode = False
            self.hyperparam_search_done = False

        def setup(self, net: nn.Module, id_loader_dict, ood_loader_dict) -> None:
            self.detector.setup(net, id_loader_dict, ood_loader_dict)

        def postprocess(self, net: nn.Module, data: torch.Tensor):
            return self.detector.postprocess(net, data)

    Adapter.__name__ = Adapter.__qualname__ = f"AdvOpenOOD{name.upper()}Postprocessor"
    Adapter.__doc__ = f"advopenood's {name!r} detector as an OpenOOD postprocessor."
    return Adapter


def adapter_instance(name: str, dataset: str, args: dict[str, Any] | None = None):
    """A ready ``advopenood_<name>`` postprocessor for OpenOOD's ``Evaluator(postprocessor=...)``."""
    from openood.utils.config import Config

    cls = openood_adapter(name)
    return cls(Config({"postprocessor": {"name": ADAPTER_PREFIX + name, "APS_mode": False,
                                         "postprocessor_args": dict(args or {})}, "dataset": {"name": dataset}}))


def shipped_config(name: str) -> Path | None:
    """Our copy of OpenOOD's ``configs/postprocessors/<name>.yml`` (one of the 16 post-hoc detectors), else None."""
    path = Path(str(resources.files("advopenood.configs") / "openood" / f"{name}.yml"))
    return path if path.is_file() else None


def config_lookup(original: Callable[[str, str, str], Any]) -> Callable[[str, str, str], Any]:
    """OpenOOD's ``get_postprocessor(config_root, postprocessor_name, id_data_name)`` that knows our configs.

    A YAML in ``<config_root>/postprocessors/`` wins, as in OpenOOD; otherwise ``advopenood_<name>`` is our
    adapter and one of OpenOOD's 16 post-hoc detectors is built from our copy of its YAML, exactly as OpenOOD
    builds it from the downloaded one. Any other name goes to OpenOOD's own lookup (which downloads).
    """
    from openood.evaluation_api.postprocessor import postprocessors
    from openood.utils.config import Config, merge_configs

    def get_postprocessor(config_root: str, postprocessor_name: str, id_data_name: str):
        """OpenOOD's lookup, our configs where ``config_root`` has none (see :func:`config_lookup`)."""
        if (Path(config_root) / "postprocessors" / f"{postprocessor_name}.yml").is_file():
            return original(config_root, postprocessor_name, id_data_name)
        if postprocessor_name.startswith(ADAPTER_PREFIX):
            return adapter_instance(postprocessor_name[len(ADAPTER_PREFIX):], id_data_name)
        path = shipped_config(postprocessor_name)
        if path is None:
            return original(config_root, postprocessor_name, id_data_name)
        config = merge_configs(Config(str(path)), Config(**{"dataset": {"name": id_data_name}}))
        postprocessor = postprocessors[postprocessor_name](config)
        postprocessor.APS_mode = config.postprocessor.APS_mode
        postprocessor.hyperparam_search_done = False
        return postprocessor

    get_postprocessor.advopenood_original = original
    return get_postprocessor


class AdvSplits:
    """The ``adv`` split of :func:`adv_evaluator_class`'s ``AdvEvaluator``: mixed into OpenOOD's ``Evaluator``
    (imported only when OpenOOD is installed), so that it also scores adversarial sets next to near/far OOD."""

    def add_adv_split(self, name: str, loader: Any, adv: AdvSet | None = None) -> None:
        """Inject one adversarial set (a loader of ``{'data', 'label'}`` batches of its successful examples in
        sample order, normalised as the ID data); ``adv`` (its store entry) gives the row's ``asr`` and
        enables :meth:`evaluate`. ``name`` becomes a row of OpenOOD's table and a key of ours, so it is a safe
        set name (:data:`advopenood.run.preflight.SET_NAME`) that names no ID or OOD split already there."""
        taken = {"id", "advood", "nearood", "farood", *self.dataloader_dict["ood"].get("adv", {})}
        for group in ("near", "far", "csid"):
            taken |= set(self.dataloader_dict["ood"].get(group) or self.dataloader_dict.get(group) or {})
        if not isinstance(name, str) or not SET_NAME.fullmatch(name) or name.lower() in {t.lower() for t in taken}:
            raise UsageError(f"adversarial split {name!r} is not a safe, unused split name; valid choices: letters, "
                             f"digits and . _ + @ - starting with a letter or digit, not one of {sorted(taken)}")
        self.dataloader_dict["ood"].setdefault("adv", {})[name] = loader
        if adv is not None:
            self.__dict__.setdefault("adv_sets", {})[name] = adv
        self.scores["ood"].setdefault("adv", {})[name] = None
        self.metrics["ood"] = self.metrics["fsood"] = None

    def eval_ood(self, fsood: bool = False, progress: bool = True):
        """OpenOOD's table plus one row per adversarial split and their ``advood`` mean; columns ``n`` (the
        split's successful adversarial examples, its OOD samples) and ``asr`` (as asr.csv: percent of the
        clean-correct attacked images misclassified) are filled for the adversarial splits."""
        task = "fsood" if fsood else "ood"
        fresh = self.metrics[task] is None
        metrics = super().eval_ood(fsood=fsood, progress=progress)
        adv = self.dataloader_dict["ood"].get("adv")
        if not fresh or not adv:
            return metrics
        id_list = self._id_scores(fsood)
        rows = pd.DataFrame([self._adv_row(id_list, name, progress) for name in adv], index=list(adv),
                            columns=[*metrics.columns, "n", "asr"])
        rows.loc["advood"] = rows[metrics.columns].mean()  # NaN rows (no successful example) left out
        rows["ACC"] = self.metrics["csid_acc" if fsood else "id_acc"]
        self.metrics[task] = pd.concat([metrics, rows])
        with pd.option_context("display.max_rows", None, "display.max_columns", None,
                               "display.float_format", "{:,.2f}".format):
            print(rows)
        return self.metrics[task]

    def _adv_row(self, id_list: list[np.ndarray], name: str, progress: bool) -> list[float]:
        """FPR@95, AUROC, AUPR_IN, AUPR_OUT (percent), ACC (filled by the caller), n and asr of one split;
        the metrics are NaN for a split without successful adversarial examples."""
        from openood.evaluators.metrics import compute_all_metrics

        adv = self.__dict__.get("adv_sets", {}).get(name)
        scores = self.scores["ood"]["adv"]
        if scores[name] is None:
            if adv is not None and not adv.records["success"].any():
                scores[name] = [np.zeros(0, dtype=int), np.zeros(0, dtype=np.float32), np.zeros(0, dtype=int)]
            else:
                scores[name] = list(self.postprocessor.inference(
                    self.net, self.dataloader_dict["ood"]["adv"][name], progress))
        pred, conf, _ = scores[name]
        nan = float("nan")
        asr = asr_row(adv, self.id_name, "", 0, nan, DEFAULT_PROTOCOL)["asr"] if adv is not None else nan
        if not len(conf):
            return [np.nan] * 5 + [0.0, asr]
        label = np.concatenate([id_list[2], -np.ones(len(conf), dtype=int)])
        metrics = compute_all_metrics(np.concatenate([id_list[1], conf]), label, np.concatenate([id_list[0], pred]))
        return [100.0 * m for m in metrics[:4]] + [np.nan, float(len(conf)), asr]

    def evaluate(self, name: str, params: dict[str, Any] | None = None, protocol: str = DEFAULT_PROTOCOL,
                 out: Path | None = None) -> Results:
        """Any registered evaluator (``eval-ood --evaluator NAME``) on the adversarial splits, after
        :meth:`eval_ood`: its ``RunContext`` holds the postprocessor's confidences on the ID test set and on each
        split (NaN where the attack failed: a split holds its successful examples only), the splits' store
        entries, the clean predictions and a plan naming this evaluation; the model and data sets are OpenOOD's
        and not in the context. Figures go under ``out``."""
        import tempfile

        adv_sets = self.__dict__.get("adv_sets", {})
        scored = self.scores["ood"].get("adv", {})
        if not adv_sets or any(scored.get(n) is None for n in adv_sets):
            raise UsageError(f"evaluator {name!r} needs adversarial splits added with their AdvSet (add_adv_split) "
                             "and scored by eval_ood; valid order: add_adv_split, eval_ood, evaluate")
        plugin = registry.create("evaluators", name, **(params or {}))
        pp = type(self.postprocessor).__name__
        conf = {"id": self.scores["id"]["test"][1]}
        conf.update({n: per_sample(scored[n][1], a, n) for n, a in adv_sets.items()})
        pred, _, label = self.scores["id"]["test"]
        plan = validate({"name": f"eval-ood {pp}", "protocol": protocol, "model": {"arch": "resnet18_32x32"},
                         "data": {"dataset": self.id_name, "id": {"kind": "demo"}}, "attacks": [],
                         "detectors": "", "evaluators": [name], "evaluator_params": {name: params or {}}})
        # the plan carries the settings: the network's device and class name (not an advopenood architecture)
        plan = plan_with(plan, device=next(self.net.parameters()).device, arch=type(self.net).__name__)
        ctx = RunContext(plan, Path(out or tempfile.mkdtemp()), self.net, None, None, {}, dict(adv_sets),
                         CleanRecord(np.asarray(label), np.asarray(pred)), backend="openood", scores={pp: conf})
        return as_results(plugin(ctx))

    def _id_scores(self, fsood: bool) -> list[np.ndarray]:
        """The ID (plus covariate-shifted ID under ``fsood``) predictions, confidences and labels."""
        parts = [self.scores["id"]["test"]]
        if fsood:
            parts += [self.scores["csid"][k] for k in self.scores["csid"]]
        return [np.concatenate([p[i] for p in parts]) for i in range(3)]


@lru_cache(maxsize=1)
def adv_evaluator_class() -> type:
    """OpenOOD's ``Evaluator`` with an ``adv`` OOD split (:class:`AdvSplits`; see the module docstring)."""
    from openood.evaluation_api import Evaluator

    class AdvEvaluator(AdvSplits, Evaluator):
        """OpenOOD's Evaluator that also scores adversarial sets (the ``adv`` split) next to near/far OOD."""

    return AdvEvaluator


def per_sample(conf: np.ndarray, adv: AdvSet, name: str) -> np.ndarray:
    """Confidences of a split's successful examples (sample order) spread over all its samples, NaN where the
    attack failed: the row layout MEAD's success masks use."""
    success = adv.records["success"].to_numpy().astype(bool)
    if len(conf) != success.sum():
        raise UsageError(f"adversarial split {name!r} has {len(conf)} scores but {int(success.sum())} successful "
                         "examples; valid: a loader of exactly its successful examples in sample order (AdvSplit)")
    full = np.full(len(success), np.nan)
    full[success] = conf
    return full


def register_with_openood() -> list[str]:
    """Put advopenood's detectors into OpenOOD's postprocessor map, ``AdvEvaluator`` into its evaluation API and
    our configs into its config lookup (:func:`config_lookup`; calling this again does not stack lookups).

    Returns the added postprocessor keys (``advopenood_<name>``).
    """
    require_openood()
    import openood.evaluation_api as api
    import openood.evaluation_api.evaluator as evaluator_module
    import openood.evaluation_api.postprocessor as postprocessor_module

    added = []
    for name in registry.names("detectors"):
        postprocessor_module.postprocessors[ADAPTER_PREFIX + name] = openood_adapter(name)
        added.append(ADAPTER_PREFIX + name)
    api.AdvEvaluator = adv_evaluator_class()
    original = getattr(postprocessor_module.get_postprocessor, "advopenood_original",
                       postprocessor_module.get_postprocessor)
    evaluator_module.get_postprocessor = postprocessor_module.get_postprocessor = config_lookup(original)
    return added


class PixelNet(nn.Module):
    """An OpenOOD network (normalised input) seen as a [0, 1]-pixel classifier, for the attacks."""

    def __init__(self, net: nn.Module, mean: Sequence[float], std: Sequence[float], num_classes: int):
        super().__init__()
        self.net = net
        self.num_classes = num_classes
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))

    def forward(self, x: torch.Tensor, **kwargs: Any):
        """OpenOOD's forward (``return_feature`` etc. pass through) on [0, 1] pixels."""
        return self.net((x - self.mean) / self.std, **kwargs)

    def get_fc_layer(self) -> nn.Linear:
        return self.net.get_fc_layer()


class OpenOODPixels(Dataset):
    """An OpenOOD ID split through its own preprocessing, with the normalisation undone ([0, 1] pixels)."""

    def __init__(self, dataset: Dataset, mean: Sequence[float], std: Sequence[float], name: str, fingerprint: str):
        self.dataset, self.name, self.fingerprint = dataset, name, fingerprint
        self.mean = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        sample = self.dataset[i]
        return (sample["data"] * self.std + self.mean).clamp(0.0, 1.0), int(sample["label"])

    def identity(self) -> dict[str, Any]:
        return {"name": self.name, "source": self.fingerprint, "n": len(self)}


class AdvSplit(IterableDataset):
    """The successful adversarial examples of a set, normalised like OpenOOD's ID data, as ``{'data', 'label'}``."""

    def __init__(self, adv: AdvSet, mean: Sequence[float], std: Sequence[float], batch_size: int):
        self.adv, self.batch_size = adv, batch_size
        self.mask = np.array(adv.records["success"], dtype=bool)
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for x, y in self.adv.iter_batches(self.batch_size, mask=self.mask):
            yield {"data": (x - self.mean) / self.std, "label": y}
