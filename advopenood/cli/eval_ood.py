"""``advopenood eval-ood``: OpenOOD's ``scripts/eval_ood.py`` with adversarial splits (:mod:`advopenood.cli.openood_evaluator`)."""
from __future__ import annotations

import argparse
import collections.abc
import hashlib
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
from advopenood.config.schema import SEED_MAX
from advopenood.data.datasets import limit_dataset
from advopenood.detection.openood_backend import cuda_redirect
from advopenood.detection.scorecache import ScoreCache
from advopenood.detection.scoring import build_bank
from advopenood.errors import UsageError
from advopenood.io import sha256_file
from advopenood.models.classifier import weights_hash
from advopenood.run.resolved import ATTACK_BACKEND


def _update(d: dict, u: dict) -> dict:
    """Recursive dict update (OpenOOD's script merges pre-computed scores this way)."""
    for k, v in u.items():
        d[k] = _update(d.get(k, {}), v) if isinstance(v, collections.abc.Mapping) else v
    return d


def _seed(text: str) -> int:
    """A ``--seed`` as the run config takes it: a whole number in ``0..2**63 - 1``."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; valid choices: 0..{SEED_MAX}") from None
    if not 0 <= value <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"{value} is out of range; valid choices: 0..{SEED_MAX}")
    return value


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
    p.add_argument("--seed", type=_seed, default=0, help=f"seed, 0..{SEED_MAX}")
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
    net.load_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=True))
    return net.to(device).eval()


#: The folder of the cache where eval-ood records the SHA-256 of every pickle it writes under ``--root`` (one file
#: per digest): it unpickles only those, since loading a pickle runs whatever code the pickle names.
TRUSTED_PICKLES = "eval-ood-pickles"


def _pickle_files(subfolders: Sequence[Path], name: str) -> list[Path]:
    """The saved postprocessors and scores of ``name`` under the training runs (OpenOOD's script's layout)."""
    return [path for sub in subfolders for path in (sub / "postprocessors" / f"{name}.pkl",
                                                    sub / "scores" / f"{name}.pkl") if path.exists()]


def trusted_bytes(path: Path, trusted: Path) -> bytes:
    """The bytes of the pickle ``path`` when eval-ood wrote them (their SHA-256 is recorded under ``trusted``); else a
    UsageError: a pickle we did not write (OpenOOD's own script's, or a crafted one) may run code when loaded."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"{str(path)!r} cannot be read ({exc}); valid choices: a readable file, or remove it") \
            from None
    if not (trusted / hashlib.sha256(data).hexdigest()).is_file():
        raise UsageError(f"{str(path)!r} is a pickle eval-ood did not write (its SHA-256 is not recorded under "
                         f"{str(trusted)!r}), and loading a pickle can run code; valid choices: remove it (eval-ood "
                         "computes it again and saves it with --save-score), or the --cache-dir of the run that "
                         "wrote it")
    return data


def read_pickle(path: Path, trusted: Path) -> Any:
    """The object pickled in ``path``, unpickled only when eval-ood wrote it (:func:`trusted_bytes`)."""
    return pickle.loads(trusted_bytes(path, trusted))


def write_pickle(obj: Any, path: Path, trusted: Path) -> None:
    """Pickle ``obj`` to ``path`` atomically, its SHA-256 recorded under ``trusted`` first (:func:`read_pickle`)."""
    data = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
    aio.write_text(trusted / hashlib.sha256(data).hexdigest(), f"{path.resolve()}\n")
    aio.atomic_write(path, lambda f: f.write(data))


def _postprocessor(name: str, subfolder: Path, trusted: Path):
    """The pickled postprocessor of this run (:func:`read_pickle`), else None (the Evaluator then looks ``name`` up,
    our configs first where ``--config-root`` has none: :func:`config_lookup`)."""
    saved = subfolder / "postprocessors" / f"{name}.pkl"
    return read_pickle(saved, trusted) if saved.is_file() else None


def _adv_sets(evaluator, args: argparse.Namespace, net: nn.Module, attacks: dict[str, Any], data_root: Path,
              device: torch.device) -> dict[str, AdvSet]:
    """Adversarial versions of OpenOOD's ID test set, one per attack, from (or into) the attack store.
    Detector-aware attacks attack one fitted detector per attacked detector, as a run's do
    (:func:`~advopenood.detection.scoring.build_bank`, the handle of :meth:`RunBank.handle
    <advopenood.detection.scoring.RunBank.handle>`): the pytorch-ood implementation (differentiable, on [0, 1]
    pixels), constructed once, fitted once on OpenOOD's ID train split on its first need (its fitted state read back
    from ``<cache>/scores`` where a former call stored it). OpenOOD's own postprocessor, which the Evaluator fits,
    cannot be that detector: it scores OpenOOD's normalised inputs and is not differentiable through advopenood's
    interface (a run that scores with an OpenOOD postprocessor attacks its pytorch-ood twin the same way)."""
    from openood.evaluation_api.datasets import DATA_INFO
    from openood.evaluation_api.preprocessor import default_preprocessing_dict

    from advopenood.config.plan import cache_dir

    mean, std = default_preprocessing_dict[args.id_data]["normalization"]
    imglist = data_root / DATA_INFO[args.id_data]["id"]["test"]["imglist_path"]
    size = default_preprocessing_dict[args.id_data]["img_size"]
    pixels = OpenOODPixels(evaluator.dataloader_dict["id"]["test"].dataset, mean, std, f"openood_{args.id_data}_test",
                           f"{sha256_file(imglist)}:resize{default_preprocessing_dict[args.id_data]['pre_size']}"
                           f":crop{size}")
    data = limit_dataset(pixels, args.limit, args.seed)
    model = PixelNet(net, mean, std, NUM_CLASSES[args.id_data]).to(device).eval()
    cache = cache_dir(SimpleNamespace(cache_dir=args.cache_dir))
    store = AdvStore(cache / "adv")
    for name, attack in attacks.items():
        if attack.source != "id":
            raise UsageError(f"attack {name!r} perturbs OOD images, which eval-ood does not support; valid choices: "
                             "attacks on ID images (names not starting with adaptive_ood_)")
    aware = list(dict.fromkeys(a.detector for a in attacks.values() if is_detector_aware(a)))
    if aware:
        train = DATA_INFO[args.id_data]["id"]["train"]["imglist_path"]
        fit = OpenOODPixels(evaluator.dataloader_dict["id"]["train"].dataset, mean, std,
                            f"openood_{args.id_data}_train", f"{sha256_file(data_root / train)}:crop{size}")
        bank = build_bank(aware, ATTACK_BACKEND, None, num_classes=NUM_CLASSES[args.id_data], device=device,
                          seed=args.seed, batch_size=args.batch_size, progress=False,
                          cache=ScoreCache(cache / "scores"))
        bank.bind(model, fit, model_hash=weights_hash(model))
    sets = {}
    for name, attack in attacks.items():
        if is_detector_aware(attack):
            bind_attack(attack, model, fit, seed=args.seed, batch_size=args.batch_size, device=device,
                        fitted=bank.handle(attack.detector))
        sets[name] = store.generate(data, model, attack, model_hash=weights_hash(model), seed=args.seed, device=device)
        evaluator.add_adv_split(name, DataLoader(AdvSplit(sets[name], mean, std, args.batch_size), batch_size=None),
                                sets[name])
    return sets


def _eval_one(args: argparse.Namespace, sub: Path, trusted: Path, attacks: dict[str, Any], evaluators: list[str],
              device: torch.device, *, data_root: Path, config_root: Path) -> pd.DataFrame:
    """One training run ``sub`` (``s*/``) of ``eval-ood``: its network and postprocessor, the adversarial splits,
    OpenOOD's metrics (returned), the chosen evaluators' tables, and the stored scores and postprocessor."""
    name, root = args.postprocessor, Path(args.root)
    net = _network(args.id_data, sub / "best.ckpt", device)
    postprocessor = _postprocessor(name, sub, trusted)
    evaluator = adv_evaluator_class()(
        net, id_name=args.id_data, data_root=str(data_root), config_root=str(config_root), preprocessor=None,
        postprocessor_name=name, postprocessor=postprocessor, batch_size=args.batch_size, shuffle=False,
        num_workers=args.num_workers)
    _adv_sets(evaluator, args, net, attacks, data_root, device)
    scores_file = sub / "scores" / f"{name}.pkl"
    if scores_file.is_file():
        saved = read_pickle(scores_file, trusted)
        saved.get("ood", {}).pop("adv", None)  # adversarial splits are always scored afresh
        _update(evaluator.scores, saved)
        print("Loaded pre-computed scores from file.")
    pp = evaluator.postprocessor
    pp_file = sub / "postprocessors" / f"{name}.pkl"
    if (hasattr(pp, "setup_flag") or pp.hyperparam_search_done is True) and not pp_file.is_file():
        write_pickle(pp, pp_file, trusted)
    metrics = evaluator.eval_ood(fsood=args.fsood)
    for chosen in evaluators:
        task = root / ("fsood" if args.fsood else "ood")
        result = evaluator.evaluate(chosen, protocol=DEFAULT_PROTOCOL, out=task / f"{name}_{chosen}_{sub.name}")
        for fname, table in result.tables.items():
            if fname.endswith(".csv"):
                print(table.to_string(index=False))
                aio.write_csv(task / f"{name}_{Path(fname).stem}_{sub.name}.csv", table)
    if args.save_score:
        write_pickle(evaluator.scores, scores_file, trusted)
    return metrics


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
    from advopenood.config.plan import cache_dir

    trusted = cache_dir(SimpleNamespace(cache_dir=args.cache_dir)) / TRUSTED_PICKLES
    for path in _pickle_files(list(map(Path, subfolders)), name):  # refused before any work, not midway
        trusted_bytes(path, trusted)
    all_metrics, metrics = [], None
    with cuda_redirect(device):
        for sub in map(Path, subfolders):
            metrics = _eval_one(args, sub, trusted, attacks, evaluators, device, data_root=data_root,
                                config_root=config_root)
            all_metrics.append(metrics.to_numpy())
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
