"""A run's leaderboard as entries of OpenOOD's leaderboard: ``leaderboard_openood.json``.

Schema: OpenOOD's leaderboard branch (github.com/Jingkang50/OpenOOD, branch ``leaderboard``, commit f969dfa),
``model_info/<benchmark>/<Training>_<Postprocessor>_<Arch>_<Additional_Description>.json``, one JSON object per
(training, postprocessor, architecture) written by ``utils/convert.csv.to.json.py`` from ``results/<benchmark>.csv``:
``Training``, ``Postprocessor`` (the alias as an HTML link to its paper, from ``utils/papers.csv``),
``Near-OOD_AUROC``, ``Far-OOD_AUROC``, ``ID_Accuracy`` (strings, "mean ± std" over OpenOOD's three training runs,
or one value), ``Outlier_Data``, ``Arch``, ``Additional_Description``, ``ID_Accuracy_Mean``,
``Near-OOD_AUROC_Mean``, ``Far-OOD_AUROC_Mean`` (``'{:.2f}'``, ``/`` when unavailable) and ``Rank`` (there: by
near-OOD AUROC, ``rank(ascending=False, method='first')``, a point-estimate ordering).

Each detector of the run gives one such object, filled from ``leaderboard.csv`` (near/far AUROC: the mean over the
group's sets, as OpenOOD's ``nearood``/``farood`` rows; one run, so one value and no "± std"). ``Rank`` ranks the
run's detectors only, by the rule of the headline and ``leaderboard.csv``: it is the best end of the near-OOD
AUROC's rank range (``leaderboard.csv``'s ``near_auroc_rank``: Holm-adjusted paired bootstrap tests,
:func:`~advopenood_plugins.kit.paired.holm_rank_ranges`; the point estimates without a bootstrap), ``Rank_Worst``
its worst end (an integer each, so that OpenOOD's readers still sort by ``Rank``), ``Rank_Rule`` the rule; ``/`` in
both, and the reason in ``Rank_Rule``, below :data:`~advopenood.evaluation.metrics.MIN_CONCLUSIVE` ID images (no
rank). ``Training`` is ``CrossEntropy`` for a model the run trained (``model.train``,
``advopenood.models.training``: cross-entropy, with mixup when set) and ``/`` (unknown) for a checkpoint, whose file stem is
named in ``Additional_Description`` (and ``unknown`` in the file name); ``Outlier_Data`` is ``No`` (post-hoc detectors fit on ID data only).

Fields of ours, beside OpenOOD's: ``Adversarial_AUROC`` / ``Adversarial_FPR95`` (leaderboard.csv's mean over the
adversarial sets), 95 % intervals on these two and on the near/far AUROC (``<field>_Lo`` / ``<field>_Hi``: the
leaderboard's ``<column>_lo`` / ``_hi``; ``CI`` names the method, :mod:`advopenood.evaluation.intervals`), the robust
AUROC (:mod:`advopenood_plugins.evaluators.robust_auroc.plugin`; the group means over near / far sets of
``robust_auroc`` and ``robust_fpr95`` of the rows :func:`~advopenood_plugins.kit.ensemble.robust_rows` chooses, by its
one rule, which ``advopenood verify`` applies to the re-derived tables: the ensemble row where there is one):
``Near-OOD_Robust_AUROC``,
``Far-OOD_Robust_AUROC``, ``Near-OOD_Robust_FPR95``, ``Far-OOD_Robust_FPR95``, ``Robust_Eps``, ``Robust_Method``;
``/`` without robust sets) and ``advopenood``: provenance (version, protocol, seed, dataset, backend, model weights'
SHA-256, every attack set's registry name, cache key, eps and source, and the entry's ``model_info`` path).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from advopenood.plugin import MIN_CONCLUSIVE, RunContext, __version__, eps_label, weights_hash
from advopenood_plugins.kit.ensemble import robust_rows

#: our detector names -> OpenOOD's postprocessor aliases and ``utils/papers.csv`` links (leaderboard f969dfa)
POSTPROCESSORS = {
    "msp": ("MSP", "https://openreview.net/forum?id=Hkg4TI9xl"),
    "odin": ("ODIN", "https://openreview.net/forum?id=H1VGkIxRZ"),
    "mds": ("MDS", "https://papers.nips.cc/paper/2018/hash/abdeb6f575ac5c6676b747bca8d09cc2-Abstract.html"),
    "rmds": ("RMDS", "https://arxiv.org/abs/2106.09022"),
    "gram": ("Gram", "https://proceedings.mlr.press/v119/sastry20a.html"),
    "ebo": ("EBO", "https://papers.nips.cc/paper/2020/hash/f5496252609c43eb8a3d147ab9b9c006-Abstract.html"),
    "klm": ("KLM", "https://proceedings.mlr.press/v162/hendrycks22a.html"),
    "mls": ("MLS", "https://proceedings.mlr.press/v162/hendrycks22a.html"),
    "react": ("ReAct", "https://papers.nips.cc/paper/2021/hash/01894d6f048493d2cacde3c579c315a3-Abstract.html"),
    "vim": ("VIM", "https://openaccess.thecvf.com/content/CVPR2022/html/"
                   "Wang_ViM_Out-of-Distribution_With_Virtual-Logit_Matching_CVPR_2022_paper.html"),
    "knn": ("KNN", "https://proceedings.mlr.press/v162/sun22d.html"),
    "dice": ("DICE", "https://www.ecva.net/papers/eccv_2022/papers_ECCV/html/4405_ECCV_2022_paper.php"),
    "ash": ("ASH", "https://openreview.net/forum?id=ndYXTEL6cZz"),
    "gen": ("GEN", "https://openaccess.thecvf.com/content/CVPR2023/papers/"
                   "Liu_GEN_Pushing_the_Limits_of_Softmax-Based_Out-of-Distribution_Detection_CVPR_2023_paper.pdf"),
    "nnguide": ("NNGuide", "https://arxiv.org/abs/2309.14888"),
    "scale": ("SCALE", "https://openreview.net/forum?id=RDSTjtnqCg"),
}
#: our architectures -> OpenOOD's ``Arch`` spelling
ARCHS = {"resnet18_32x32": "ResNet18", "resnet18": "ResNet18", "resnet50": "ResNet50", "resnet20": "ResNet20",
         "vit_b_16": "ViT-B-16", "swin_t": "Swin-T"}
#: ``data.dataset`` -> the leaderboard's benchmark folder
BENCHMARKS = {"cifar10": "cifar10", "cifar100": "cifar100", "imagenet200": "imagenet200_ood",
              "imagenet": "imagenet1k_ood"}
MISSING = "/"
#: our interval fields (``<field>_Lo`` / ``<field>_Hi``) -> the leaderboard.csv column they bound
INTERVAL_FIELDS = {"Near-OOD_AUROC": "near_auroc", "Far-OOD_AUROC": "far_auroc", "Adversarial_AUROC": "adv_auroc",
                   "Adversarial_FPR95": "adv_fpr95"}


def cell(value: Any) -> str:
    """A number as the leaderboard writes it (``'{:.2f}'``), ``/`` when unavailable."""
    return MISSING if value is None or (isinstance(value, float) and math.isnan(value)) else f"{float(value):.2f}"


def postprocessor(detector: str) -> str:
    """OpenOOD's ``Postprocessor`` cell: the alias linked to its paper (as ``convert.csv.to.json.py`` writes it)."""
    alias, link = POSTPROCESSORS.get(detector, (detector.upper(), ""))
    return f"<a href={link}>{alias}</a>" if link else alias


def training(model: Any) -> str:
    """``CrossEntropy`` (+ ``Mixup``) for a model the run trained, ``/`` for a checkpoint of unknown training
    (``model``: the plan's model section)."""
    if model.train is None or model.checkpoint:
        return MISSING
    return "CrossEntropy + Mixup" if float(model.train.mixup or 0) > 0 else "CrossEntropy"


def rank_end(value: Any) -> Any:
    """One end of a rank range as an integer (OpenOOD's ``Rank`` is a number), ``/`` without a rank."""
    return MISSING if value is None or pd.isna(value) else int(value)


def rank_rule(board: pd.DataFrame, n_id: int) -> str:
    """``Rank_Rule``: how ``Rank`` .. ``Rank_Worst`` were decided (``leaderboard.csv``'s ``near_auroc_rank`` and
    ``near_auroc_rank_worst``, :func:`~advopenood_plugins.kit.paired.holm_rank_ranges`), or why there is no rank."""
    if n_id < MIN_CONCLUSIVE:
        return f"no rank: {n_id} ID images, fewer than min_conclusive ({MIN_CONCLUSIVE})"
    ci = str(board["ci"].iloc[0]) if "ci" in board and len(board) else "none"
    if ci.startswith("bootstrap"):
        return f"near-OOD AUROC, Holm-adjusted paired {ci} tests over the run's detectors (Rank..Rank_Worst)"
    return "near-OOD AUROC point estimates (no paired test)"


def robust_means(robust: pd.DataFrame | None, groups: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Per detector, our robust fields: near / far means of ``robust_auroc`` and ``robust_fpr95`` of the rows
    :func:`~advopenood_plugins.kit.ensemble.robust_rows` chooses, their eps and method."""
    if robust is None or not len(robust):
        return {}
    out = {}
    for det, part in robust_rows(robust).items():
        fields: dict[str, Any] = {"Robust_Eps": eps_label(part["eps"].iloc[0]),
                                  "Robust_Method": str(part["method"].iloc[0])}
        for group, title in (("near", "Near-OOD"), ("far", "Far-OOD")):
            sub = part[part["ood_set"].map(groups) == group]
            for metric, name in (("robust_auroc", "AUROC"), ("robust_fpr95", "FPR95")):
                fields[f"{title}_Robust_{name}"] = cell(sub[metric].mean() if len(sub) else math.nan)
        out[det] = fields
    return out


def openood_entries(board: pd.DataFrame, ctx: RunContext, groups: dict[str, str],
                    robust: pd.DataFrame | None = None) -> pd.DataFrame:
    """One leaderboard entry per row of ``board`` (``leaderboard.csv``), OpenOOD's fields first, then ours
    (``robust``: ``robust_auroc.csv``'s rows, single-attack and ensemble)."""
    model = ctx.plan.model
    dataset = str(ctx.plan.data.dataset or ctx.dataset)
    arch = ARCHS.get(ctx.arch, ctx.arch)
    train = training(model)
    checkpoint = Path(str(model.checkpoint or "")).stem
    description = f"advopenood {ctx.protocol}" + (f" {checkpoint}" if checkpoint else "")
    rule = rank_rule(board, len(ctx.clean.y))
    robust_fields = robust_means(robust, groups)
    provenance = {"version": __version__, "protocol": ctx.protocol, "seed": ctx.seed, "dataset": dataset,
                  "model_weights_sha256": weights_hash(ctx.model),
                  "attacks": {name: {"attack": adv.attack, "key": adv.key, "eps": adv.eps, "source": adv.source}
                              for name, adv in ctx.adv_sets.items()}}
    rows = []
    for r in board.to_dict("records"):
        pp = POSTPROCESSORS.get(r["detector"], (str(r["detector"]).upper(), ""))[0]
        stem = f"{train if train != MISSING else 'unknown'}_{pp}_{arch.replace('/', '-')}_{description}"
        path = f"model_info/{BENCHMARKS.get(dataset, dataset)}/{stem.replace(' ', '_')}.json"
        row = {"Training": train, "Postprocessor": postprocessor(r["detector"]),
               "Near-OOD_AUROC": cell(r["near_auroc"]), "Far-OOD_AUROC": cell(r["far_auroc"]),
               "ID_Accuracy": cell(r["id_acc"]), "Outlier_Data": "No", "Arch": arch,
               "Additional_Description": description, "ID_Accuracy_Mean": cell(r["id_acc"]),
               "Near-OOD_AUROC_Mean": cell(r["near_auroc"]), "Far-OOD_AUROC_Mean": cell(r["far_auroc"]),
               "Rank": rank_end(r.get("near_auroc_rank")), "Rank_Worst": rank_end(r.get("near_auroc_rank_worst")),
               "Rank_Rule": rule if not pd.isna(r.get("near_auroc_rank")) or rule.startswith("no rank") else
               "no rank: no near-OOD AUROC", "Adversarial_AUROC": cell(r["adv_auroc"]), "Adversarial_FPR95": cell(r["adv_fpr95"]),
               **{f"{field}_{end.capitalize()}": cell(r.get(f"{col}_{end}")) for field, col in INTERVAL_FIELDS.items()
                  for end in ("lo", "hi")}, "CI": str(r.get("ci", "none")),
               **robust_fields.get(str(r["detector"]), {
                   "Robust_Eps": MISSING, "Robust_Method": MISSING, **{f"{g}_Robust_{m}": MISSING for g in
                                                                       ("Near-OOD", "Far-OOD") for m in ("AUROC", "FPR95")}}),
               "advopenood": {**provenance, "detector": r["detector"], "backend": r["backend"],
                              "model_info_path": path}}
        rows.append(row)
    return pd.DataFrame(rows)
