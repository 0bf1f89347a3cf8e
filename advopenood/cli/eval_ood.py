"""``advopenood eval-ood``: OpenOOD's ``scripts/eval_ood.py`` with adversarial splits (:mod:`advopenood.cli.openood_evaluator`)."""
from __future__ import annotations

import argparse
import collections.abc
import os
import pickle
from collections.abc import Sequence
from glob import glob
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from advopenood import io as aio
from advopenood import registry
from advopenood.attacks.base import build_attack
from advopenood.attacks.store import AdvSet, AdvStore
from advopenood.capabilities import bind_attack, is_detector_aware
from advopenood.cli.openood_evaluator import (
    ADAPTER_PREFIX,
    DEFAULT_PROTOCOL,
    ID_DATA,
    NUM_CLASSES,
    SPECIAL_NETS,
    AdvSplit,
    OpenOODPixels,
    PixelNet,
    adv_evaluator_class,
    openood_root,
    register_with_openood,
    require_openood,
)
from advopenood.cli.parsing import OneLineParser
from advopenood.data.datasets import file_sha256, limit_dataset
from advopenood.detection.openood_backend import cuda_redirect
from advopenood.errors import UsageError
from advopenood.models.classifier import weights_hash


def _update(d: dict, u: dict) -> dict:
    """Recursive dict update (OpenOOD's script merges pre-computed scores this way)."""
    for k, v in u.items():
        d[k] = _update(d.get(k, {}), v) if isinstance(v, collections.abc.Mapping) else v
    return d


def build_parser() -> argparse.ArgumentParser:
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
    p.add_argument("--evaluator", help="comma-separated registered evaluators run on the adversarial splits, e.g. mead "
                                       "(OUT: <root>/ood/<pp>_<table>_<s>.csv for each table, e.g. msp_mead_s0.csv)")
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
    from advopenood.config.plan import attack_entries
    from advopenood.config.schema import parse_eps

    requested = [s.strip().lower() for s in (spec or "").split(",") if s.strip()]
    selection = SimpleNamespace(attacks=tuple(requested), detectors=(postprocessor.removeprefix(ADAPTER_PREFIX),))
    entries = attack_entries(selection)
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

    from advopenood.config.plan import cache_dir

    mean, std = default_preprocessing_dict[args.id_data]["normalization"]
    imglist = data_root / DATA_INFO[args.id_data]["id"]["test"]["imglist_path"]
    size = default_preprocessing_dict[args.id_data]["img_size"]
    pixels = OpenOODPixels(evaluator.dataloader_dict["id"]["test"].dataset, mean, std, f"openood_{args.id_data}_test",
                           f"{file_sha256(imglist)}:resize{default_preprocessing_dict[args.id_data]['pre_size']}"
                           f":crop{size}")
    data = limit_dataset(pixels, args.limit, args.seed)
    model = PixelNet(net, mean, std, NUM_CLASSES[args.id_data]).to(device).eval()
    store = AdvStore(cache_dir(SimpleNamespace(cache_dir=args.cache_dir)) / "adv")
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
    evaluators = registry.parse_names("evaluators", args.evaluator, [])
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
            for chosen in evaluators:
                task = root / ("fsood" if args.fsood else "ood")
                result = evaluator.evaluate(chosen, protocol=DEFAULT_PROTOCOL, out=task / f"{name}_{chosen}_{sub.name}")
                for fname, table in result.tables.items():
                    if fname.endswith(".csv"):
                        print(table.to_string(index=False))
                        aio.write_csv(task / f"{name}_{Path(fname).stem}_{sub.name}.csv", table)
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
