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
pointing at the README's OpenOOD installation section.
"""
from __future__ import annotations

import argparse
import collections.abc
import importlib.util
import os
import pickle
from collections.abc import Iterator, Sequence
from functools import lru_cache
from glob import glob
from importlib import resources
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset, IterableDataset

from advopenood import io as aio
from advopenood import registry
from advopenood.attacks import build_attack
from advopenood.capabilities import bind_attack, is_detector_aware
from advopenood.data import file_sha256, limit_dataset
from advopenood.detectors import OPENOOD_INSTALL, create_detector, cuda_redirect, openood_importable
from advopenood.errors import UsageError
from advopenood.models import weights_hash
from advopenood.pipeline import asr_row
from advopenood.store import AdvSet, AdvStore

ADAPTER_PREFIX = "advopenood_"
ID_DATA = ("cifar10", "cifar100", "imagenet200")
NUM_CLASSES = {"cifar10": 10, "cifar100": 100, "imagenet200": 200}
#: Postprocessors whose OpenOOD script builds a special network; eval-ood runs only plain classifiers.
SPECIAL_NETS = ("conf_branch", "godin", "rotpred", "cider", "reweightood", "npos", "palm", "t2fnorm")
#: Where the README explains installing OpenOOD, and the imgaug patch it needs under NumPy 2.
README_SECTION = "README.md, section 'Installing OpenOOD (and the imgaug patch for NumPy 2)'"
#: The protocol every eval-ood output is labelled with unless another is passed.
DEFAULT_PROTOCOL = "strong"


def openood_installed() -> bool:
    """Whether an ``openood`` package is installed at all (importable or not)."""
    return importlib.util.find_spec("openood") is not None


def require_openood() -> None:
    """Raise a UsageError when OpenOOD does not import: how to install it when it is missing, else the import
    problem and the README section that fixes it (the imgaug patch under NumPy 2)."""
    ok, why = openood_importable()
    if ok:
        return
    if not openood_installed():
        raise UsageError(f"this needs OpenOOD, which is not installed; install it with: {OPENOOD_INSTALL} "
                         f"(see {README_SECTION})")
    raise UsageError(f"OpenOOD is installed but does not import ({why}); see {README_SECTION}")


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


@lru_cache(maxsize=1)
def adv_evaluator_class() -> type:
    """OpenOOD's ``Evaluator`` with an ``adv`` OOD split (see the module docstring)."""
    from openood.evaluation_api import Evaluator

    class AdvEvaluator(Evaluator):
        """OpenOOD's Evaluator that also scores adversarial sets (the ``adv`` split) next to near/far OOD."""

        def add_adv_split(self, name: str, loader: Any, adv: AdvSet | None = None) -> None:
            """Inject one adversarial set (a loader of ``{'data', 'label'}`` batches of its successful examples in
            sample order, normalised as the ID data); ``adv`` (its store entry) gives the row's ``asr`` and
            enables :meth:`eval_mead`."""
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

        def eval_mead(self, protocol: str = DEFAULT_PROTOCOL) -> pd.DataFrame:
            """advopenood's ``mead`` evaluator (through the registry) on the adversarial splits, after
            :meth:`eval_ood`: the worst case over every successful attack per (norm, eps) group and objective,
            clean ID test images as negatives; a ``protocol`` column labels the table."""
            mead = registry.create("evaluators", "mead")
            adv_sets = self.__dict__.get("adv_sets", {})
            scored = self.scores["ood"].get("adv", {})
            if not adv_sets or any(scored.get(n) is None for n in adv_sets):
                raise UsageError("eval_mead needs adversarial splits added with their AdvSet (add_adv_split) and "
                                 "scored by eval_ood; valid order: add_adv_split, eval_ood, eval_mead")
            conf = {"id": self.scores["id"]["test"][1]}
            conf.update({n: per_sample(scored[n][1], a, n) for n, a in adv_sets.items()})
            return mead.table({type(self.postprocessor).__name__: conf}, adv_sets, backend="openood", protocol=protocol)

        def _id_scores(self, fsood: bool) -> list[np.ndarray]:
            """The ID (plus covariate-shifted ID under ``fsood``) predictions, confidences and labels."""
            parts = [self.scores["id"]["test"]]
            if fsood:
                parts += [self.scores["csid"][k] for k in self.scores["csid"]]
            return [np.concatenate([p[i] for p in parts]) for i in range(3)]

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


def _update(d: dict, u: dict) -> dict:
    """Recursive dict update (OpenOOD's script merges pre-computed scores this way)."""
    for k, v in u.items():
        d[k] = _update(d.get(k, {}), v) if isinstance(v, collections.abc.Mapping) else v
    return d


def build_parser() -> argparse.ArgumentParser:
    from advopenood.cli import OneLineParser

    p = OneLineParser(prog="advopenood eval-ood",
                description="OpenOOD's scripts/eval_ood.py with adversarial splits (--attack, --eps).")
    p.add_argument("--root", required=True, help="folder of training runs s*/best.ckpt (as OpenOOD's script)")
    p.add_argument("--postprocessor", default="msp",
                   help="an OpenOOD postprocessor, or advopenood_<detector> for advopenood's pytorch-ood detectors")
    p.add_argument("--id-data", default="cifar10", choices=list(ID_DATA))
    p.add_argument("--batch-size", type=int, default=200)
    p.add_argument("--save-csv", action="store_true")
    p.add_argument("--save-score", action="store_true")
    p.add_argument("--fsood", action="store_true")
    p.add_argument("--mead", action="store_true",
                   help="also print and save MEAD's worst case over the adversarial splits (OUT: <root>/ood/<pp>_mead_<s>.csv)")
    p.add_argument("--attack", help="comma-separated attacks whose adversarial test sets become OOD splits, e.g. pgd,fgsm")
    p.add_argument("--eps", help="attack budget, e.g. 8/255 (default: the paper's for the input size)")
    p.add_argument("--data-root", help="OpenOOD's data folder (default <OpenOOD checkout>/data, as the script)")
    p.add_argument("--config-root", help="OpenOOD's configs folder (default <OpenOOD checkout>/configs)")
    p.add_argument("--limit", type=int, help="attack only the first N images of a seeded permutation of the ID test set")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--num-workers", type=int, default=min(8, os.cpu_count() or 1),
                   help="data-loading workers (default: OpenOOD's 8, at most the number of cores)")
    p.add_argument("--cache-dir", help="attack store (default $ADVOPENOOD_CACHE or ~/.cache/advopenood)")
    return p


def _attacks(spec: str | None, eps: str | None, input_size: int, postprocessor: str) -> dict[str, Any]:
    """Attack objects for ``--attack`` / ``--eps``, by registered name; a family (``adaptive``) stands for its
    member for the evaluated postprocessor (``adaptive_<postprocessor>``)."""
    from advopenood.config import attack_entries, parse_eps

    requested = [s.strip().lower() for s in (spec or "").split(",") if s.strip()]
    entries = attack_entries({"attacks": requested, "detectors": [postprocessor.removeprefix(ADAPTER_PREFIX)]})
    budget = None if eps is None else parse_eps(eps)
    return {entry["name"]: build_attack(entry["name"], input_size=input_size, protocol=None, eps=budget)
            for entry, _ in entries}


def _network(id_data: str, checkpoint: Path, device: torch.device) -> nn.Module:
    from openood.networks import ResNet18_32x32, ResNet18_224x224

    arch = ResNet18_224x224 if id_data == "imagenet200" else ResNet18_32x32
    net = arch(num_classes=NUM_CLASSES[id_data])
    net.load_state_dict(torch.load(checkpoint, map_location="cpu"))
    return net.to(device).eval()


def _postprocessor(name: str, subfolder: Path):
    """The pickled postprocessor of this run, else None (the Evaluator then looks ``name`` up, our configs first
    where ``--config-root`` has none: :func:`config_lookup`)."""
    saved = subfolder / "postprocessors" / f"{name}.pkl"
    if not saved.is_file():
        return None
    with open(saved, "rb") as f:
        return pickle.load(f)


def _adv_sets(evaluator, args: argparse.Namespace, net: nn.Module, attacks: dict[str, Any], data_root: Path,
              device: torch.device) -> dict[str, AdvSet]:
    """Adversarial versions of OpenOOD's ID test set, one per attack, from (or into) the attack store.
    Detector-adaptive attacks fit their detector on OpenOOD's ID train split."""
    from openood.evaluation_api.datasets import DATA_INFO
    from openood.evaluation_api.preprocessor import default_preprocessing_dict

    from advopenood.config import cache_dir

    mean, std = default_preprocessing_dict[args.id_data]["normalization"]
    imglist = data_root / DATA_INFO[args.id_data]["id"]["test"]["imglist_path"]
    size = default_preprocessing_dict[args.id_data]["img_size"]
    pixels = OpenOODPixels(evaluator.dataloader_dict["id"]["test"].dataset, mean, std, f"openood_{args.id_data}_test",
                           f"{file_sha256(imglist)}:resize{default_preprocessing_dict[args.id_data]['pre_size']}"
                           f":crop{size}")
    data = limit_dataset(pixels, args.limit, args.seed)
    model = PixelNet(net, mean, std, NUM_CLASSES[args.id_data]).to(device).eval()
    store = AdvStore(cache_dir({"cache_dir": args.cache_dir}) / "adv")
    sets = {}
    for name, attack in attacks.items():
        if attack.source != "id":
            raise UsageError(f"attack {name!r} perturbs OOD images, which eval-ood does not support; valid choices: "
                             "attacks on ID images (names not starting with adaptive_ood_)")
        if is_detector_aware(attack):
            train = DATA_INFO[args.id_data]["id"]["train"]["imglist_path"]
            fit = OpenOODPixels(evaluator.dataloader_dict["id"]["train"].dataset, mean, std,
                                f"openood_{args.id_data}_train", f"{file_sha256(data_root / train)}:crop{size}")
            bind_attack(attack, model, fit, seed=args.seed, batch_size=args.batch_size, device=device)
        sets[name] = store.generate(data, model, attack, model_hash=weights_hash(model), seed=args.seed, device=device)
        evaluator.add_adv_split(name, DataLoader(AdvSplit(sets[name], mean, std, args.batch_size), batch_size=None),
                                sets[name])
    return sets


def eval_ood_main(argv: list[str]) -> int:
    """``advopenood eval-ood``: OpenOOD's ``scripts/eval_ood.py`` plus adversarial splits; returns the exit code."""
    args = build_parser().parse_args(argv)
    require_openood()
    register_with_openood()
    root = Path(args.root)
    subfolders = sorted(glob(os.path.join(root, "s*")))
    if not subfolders:
        raise UsageError(f"no training runs s*/best.ckpt found in --root {str(root)!r} (as OpenOOD's eval_ood.py expects)")
    if args.postprocessor in SPECIAL_NETS:
        raise UsageError(f"postprocessor {args.postprocessor!r} needs a special network; run OpenOOD's scripts/eval_ood.py "
                         f"for it; valid choices here: plain-classifier postprocessors such as msp, odin, mds, knn")
    size = 224 if args.id_data == "imagenet200" else 32
    attacks = _attacks(args.attack, args.eps, size, args.postprocessor)
    device = torch.device(args.device)
    data_root = Path(args.data_root) if args.data_root else openood_root() / "data"
    config_root = Path(args.config_root) if args.config_root else openood_root() / "configs"
    name = args.postprocessor
    from openood.evaluation_api.postprocessor import postprocessors

    if name not in postprocessors:
        raise UsageError(f"unknown postprocessor {name!r}; valid choices: {', '.join(sorted(postprocessors))}")
    all_metrics, metrics = [], None
    with cuda_redirect(device):
        for sub in map(Path, subfolders):
            net = _network(args.id_data, sub / "best.ckpt", device)
            postprocessor = _postprocessor(name, sub)
            evaluator = adv_evaluator_class()(
                net, id_name=args.id_data, data_root=str(data_root), config_root=str(config_root), preprocessor=None,
                postprocessor_name=name, postprocessor=postprocessor, batch_size=args.batch_size, shuffle=False,
                num_workers=args.num_workers)
            _adv_sets(evaluator, args, net, attacks, data_root, device)
            scores_file = sub / "scores" / f"{name}.pkl"
            if scores_file.is_file():
                with open(scores_file, "rb") as f:
                    saved = pickle.load(f)
                saved.get("ood", {}).pop("adv", None)  # adversarial splits are always scored afresh
                _update(evaluator.scores, saved)
                print("Loaded pre-computed scores from file.")
            pp = evaluator.postprocessor
            pp_file = sub / "postprocessors" / f"{name}.pkl"
            if (hasattr(pp, "setup_flag") or pp.hyperparam_search_done is True) and not pp_file.is_file():
                pp_file.parent.mkdir(parents=True, exist_ok=True)
                with open(pp_file, "wb") as f:
                    pickle.dump(pp, f, pickle.HIGHEST_PROTOCOL)
            metrics = evaluator.eval_ood(fsood=args.fsood)
            all_metrics.append(metrics.to_numpy())
            if args.mead:
                mead = evaluator.eval_mead(protocol=DEFAULT_PROTOCOL)
                print(mead.to_string(index=False))
                aio.write_csv(root / ("fsood" if args.fsood else "ood") / f"{name}_mead_{sub.name}.csv", mead)
            if args.save_score:
                scores_file.parent.mkdir(parents=True, exist_ok=True)
                with open(scores_file, "wb") as f:
                    pickle.dump(evaluator.scores, f, pickle.HIGHEST_PROTOCOL)
    df = summary_table(all_metrics, metrics.index, metrics.columns, DEFAULT_PROTOCOL)
    if args.save_csv:
        aio.write_text(root / ("fsood" if args.fsood else "ood") / f"{name}.csv", df.to_csv())
    else:
        print(df)
    return 0


def summary_table(runs: list[np.ndarray], index: Sequence[str], columns: Sequence[str], protocol: str) -> pd.DataFrame:
    """OpenOOD's ``mean \u00b1 std`` over training runs, a blank cell where a column does not apply (``n`` and
    ``asr`` outside the adversarial rows, metrics of a split without successful examples), and ``protocol``."""
    stacked = np.stack(runs).astype(float)
    mean, std = stacked.mean(0), stacked.std(0)
    df = pd.DataFrame([["" if np.isnan(m) else f"{m:.2f} \u00b1 {s:.2f}" for m, s in zip(mr, sr)]
                       for mr, sr in zip(mean, std)], index=index, columns=columns)
    df["protocol"] = protocol
    return df
