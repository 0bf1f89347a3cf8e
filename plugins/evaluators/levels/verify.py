"""Re-derivation of ``levels.csv`` from ``scores/*.npz``, ``run.json`` and the re-derived robust AUROCs
(:mod:`advopenood_plugins.kit.verify_robust`), written apart from ``plugins/evaluators/levels/`` and
:mod:`advopenood.evaluation.metrics`: every AUROC and interval from the independent checker
:mod:`advopenood.evaluation.oracle`; which sets a level uses is re-derived from ``run.json`` and the registered attack
classes.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from advopenood.plugin import oracle
from advopenood_plugins.kit.verify_robust import attack_class, rederive_robust


def _strong(entry: dict[str, Any], size: int, protocol: str) -> bool:
    """Level 1's rule re-stated: a classifier-only, multi-step attack with no iteration count below its default,
    no budget below its default eps, and ``steps * step size >= eps`` where a step size is set."""
    from advopenood.plugin import DetectorAware

    cls = attack_class(entry["attack"])
    if issubclass(cls, DetectorAware) or entry["attack"] == "fgsm" or entry.get("source", "id") != "id":
        return False
    default = {**cls.defaults(size), **cls.protocol_defaults(protocol, size)}
    p = entry["params"]
    for key in ("steps", "n_iter", "n_restarts", "n_queries", "binary_search_steps"):
        if p.get(key) is not None and default.get(key) is not None and p[key] < default[key]:
            return False
    if cls.bounded and p.get("eps") is not None and default.get("eps") is not None and p["eps"] < default["eps"] * (1 - 1e-9):
        return False
    rel = p.get("rel_stepsize")
    if rel is None and p.get("abs_stepsize") is not None and p.get("eps"):
        rel = p["abs_stepsize"] / p["eps"]
    return not (rel is not None and p.get("steps") is not None and rel * p["steps"] < 1.0)


def _id_negative(entry: dict[str, Any]) -> bool:
    from advopenood.plugin import IdNegatives

    return issubclass(attack_class(entry["attack"]), IdNegatives)


#: levels.csv's criteria re-stated: (level, name, source); the paper's Sec. 4 gives every level's definition and no
#: number, so only our addition (both sides attacked) is ``ours``
_CRITERIA = ((1, "strong", "paper"), (2, "other_model_data", "paper"), (3, "bpda_adaptive", "paper"),
             (4, "adaptive_id", "paper"), (4, "ood_to_id", "paper"), (4, "robust_auroc", "ours"))


def rederive_levels(run: Any, levels: pd.DataFrame) -> pd.DataFrame:
    """levels.csv re-computed for every detector with saved scores, one row per criterion (level 2 from the run's own model and
    data and the run folders of ``evaluator_params.levels.runs``), with the interval of each criterion's worst set
    (:func:`_worst_bounds`) and whether it excludes the bar."""
    from advopenood.plugin import DetectorAware
    from advopenood_plugins.kit.verify import ci_plan

    saved = run.config
    size, protocol = int(saved["model"]["input_size"]), run.protocol
    attacks = {n: e for n, e in (run.info.get("attacks") or {}).items() if not _id_negative(e)}
    robust = rederive_robust(run)
    ci = ci_plan(run).label
    minimum = int((run.info.get("sample") or {}).get("min_conclusive", 0))  # below it no row is conclusive
    own = _beyond_baseline(str(run.info.get("model", {}).get("arch", "")), _dataset(saved))
    given = ((saved.get("evaluator_params") or {}).get("levels") or {}).get("min_auroc")
    rows = []
    for det in run.detectors:  # every detector with scores has its rows, whether the table lists it or not
        bars = levels.loc[levels["detector"] == det, "min_auroc"] if "min_auroc" in levels else []
        bar = float(given if given is not None else bars.iloc[0] if len(bars) else 50.0)
        arrays = run.scores(det)
        select = {k[:-len(".select")]: v for k, v in arrays.items() if k.endswith(".select")}
        found: dict[str, dict[str, float]] = {name: {} for _, name, _ in _CRITERIA}
        by: dict[str, float] = {}  # a randomised detector's: the AUROC of the attack-stream confidences
        for name, entry in attacks.items():
            cls = attack_class(entry["attack"])
            adapted = issubclass(cls, DetectorAware) and cls.detector == det
            kinds = ("strong",) if _strong(entry, size, protocol) else \
                (("bpda_adaptive", "adaptive_id") if entry.get("source", "id") == "id" else ("ood_to_id",)) \
                if adapted else ()
            positive = arrays[f"{name}.positive"].astype(bool)
            value = oracle.auroc(arrays["id"], arrays[name][positive])
            for kind in kinds if not math.isnan(value) else ():
                found[kind][name] = value
            if select and kinds and not math.isnan(value):
                by[name] = oracle.auroc(select["id"], select[name][positive])
        for b in robust[robust["detector"] == det].to_dict("records"):
            if not math.isnan(b["robust_auroc"]):
                pair = f"{b['id_attack']}+{b['ood_attack']}"
                found["robust_auroc"][pair] = b["robust_auroc"]
                if select:
                    by[pair] = _pair_choice(select, b)
        other = _level2_evidence(run, det)
        found["other_model_data"] = {**{k: v for k, (v, _, _) in other.items()},
                                     **({f"level1:{k}": v for k, v in found["strong"].items()} if own else {})}
        by.update({f"level1:{k}": by[k] for k in found["strong"] if own and k in by})
        at, worst, reached, evaluated = _worst_and_reached(found, by, bar)
        for level, name, source in _CRITERIA:
            lo, hi = _worst_bounds(run, det, at[name], arrays, robust, other)
            rows.append({"detector": det, "level": level, "criterion": name, "criterion_source": source,
                         "auroc": worst[name], "auroc_lo": lo, "auroc_hi": hi, "ci": ci,
                         "worst_set": at[name] or math.nan,
                         "passed": math.nan if math.isnan(worst[name]) else float(worst[name] >= bar),
                         "conclusive": math.nan if math.isnan(lo) or math.isnan(hi) else
                         float(min(len(a) for a in arrays.values()) >= minimum and not lo <= bar <= hi),
                         "reached": float(reached) if evaluated else math.nan, "min_auroc": bar,
                         "sets": ",".join(sorted(found[name]))})
    return pd.DataFrame(rows)


def _worst_and_reached(found: dict[str, dict[str, float]], by: dict[str, float], bar: float
                       ) -> tuple[dict[str, str], dict[str, float], int, list[int]]:
    """Each criterion's worst set and AUROC, and each level's worst criterion, chosen on ``by`` (a randomised
    detector's attack-stream AUROCs, where the run saved them; else the AUROCs themselves), lowest first, ties to
    the first label in sorted order; the highest level reached (every evaluated level up to it at least ``bar``) and
    the evaluated levels."""
    rank = lambda label, values: round(by.get(label, values[label]), 9)  # noqa: E731
    at = {name: min(sorted(v), key=lambda k, v=v: rank(k, v)) if v else "" for name, v in found.items()}
    worst = {name: found[name][at[name]] if at[name] else math.nan for name in found}
    per_level = {k: [n for level, n, _ in _CRITERIA if level == k and not math.isnan(worst[n])] for k in (1, 2, 3, 4)}
    reached, evaluated = 0, [k for k, v in per_level.items() if v]
    for k in evaluated:
        if worst[min(per_level[k], key=lambda n: round(by.get(at[n], worst[n]), 9))] < bar:
            break
        reached = k
    return at, worst, reached, evaluated


def _pair_choice(select: dict[str, np.ndarray], row: dict[str, Any]) -> float:
    """The AUROC a robust pair is chosen on, re-derived: its attacked sets' attack-stream confidences; an ensemble
    row's (sets joined by ``+``) the per-image lowest ID / highest OOD of them over the clean set and its sets."""
    ids, oods = str(row["id_attack"]).split("+"), str(row["ood_attack"]).split("+")
    if len(ids) + len(oods) > 2:
        ids, oods = ["id", *ids], [str(row["ood_set"]), *oods]
    if any(n not in select for n in ids + oods):
        return math.nan
    worst_id = np.array([min(select[n][i] for n in ids) for i in range(len(select[ids[0]]))])
    worst_ood = np.array([max(select[n][i] for n in oods) for i in range(len(select[oods[0]]))])
    return oracle.auroc(worst_id, worst_ood)


def _worst_bounds(run: Any, det: str, label: str, arrays: dict[str, np.ndarray], robust: pd.DataFrame,
                  other: dict[str, tuple[float, float, float]]) -> tuple[float, float]:
    """The interval of the set a criterion's worst AUROC comes from, re-derived: an attack set's as ``ood.csv``'s
    cell (:func:`advopenood_plugins.kit.verify.rederive_bounds`, key ``ood|<det>|<set>``), a robust pair's from
    :func:`rederive_robust`, another run's as its ``levels.csv`` wrote it; NaN for none."""
    from advopenood_plugins.kit.verify import rederive_bounds

    label = label.removeprefix("level1:")
    if label in other:
        return other[label][1], other[label][2]
    if "+" in label:
        row = robust[(robust["detector"] == det) & (robust["id_attack"] + "+" + robust["ood_attack"] == label)]
        return (float(row["robust_auroc_lo"].iloc[0]), float(row["robust_auroc_hi"].iloc[0])) if len(row) else \
            (math.nan, math.nan)
    if not label:
        return math.nan, math.nan
    conf = arrays[label][arrays[f"{label}.positive"].astype(bool)]
    got = rederive_bounds(arrays["id"], conf, run, f"ood|{det}|{label}")
    return got["auroc_lo"], got["auroc_hi"]


def _beyond_baseline(arch: str, dataset: str) -> bool:
    """Level 2 re-stated: the model is no ResNet-18 (any ``resnet18`` name not followed by a digit, after a
    ``timm:`` or RobustBench prefix) and the ID data is not CIFAR-10 (Sec. 4's "simple ResNet-18 trained on
    CIFAR-10")."""
    import re

    model = arch.split(":")[-1].split("/")[-1].lower()
    return re.match(r"resnet18(?![0-9])", model) is None and dataset.lower() != "cifar10"


def _level2_evidence(run: Any, det: str) -> dict[str, tuple[float, float, float]]:
    """Level 2 re-read: the run folders of ``evaluator_params.levels.runs`` beyond the baseline, each one's worst
    level-1 AUROC of ``det`` in its ``levels.csv`` with that row's interval (NaN where it has none)."""
    import json

    saved = run.config
    paths = ((saved.get("evaluator_params") or {}).get("levels") or {}).get("runs") or []
    found: dict[str, tuple[float, float, float]] = {}
    for path in [paths] if isinstance(paths, str) else paths:
        folder = Path(path).expanduser()
        info = json.loads((folder / "run.json").read_text())
        if not _beyond_baseline(str(info.get("model", {}).get("arch", "")), _dataset(info.get("config") or {})):
            continue
        t = pd.read_csv(folder / "levels.csv")
        rows = t[(t["detector"] == det) & (t["level"] == 1)].dropna(subset=["auroc"])
        rows = rows.sort_values("auroc", kind="stable")
        if len(rows):
            first = rows.iloc[0]
            found[f"{folder.name}:level1"] = (float(first["auroc"]), float(first.get("auroc_lo", math.nan)),
                                              float(first.get("auroc_hi", math.nan)))
    return found


def _dataset(saved: dict[str, Any]) -> str:
    data = saved.get("data") or {}
    return str(data.get("dataset") or (data.get("id") or {}).get("name", ""))


def _normalised_sets(text: Any) -> str:
    """The ``sets`` cell with its names sorted (the order a table lists them in is not checked)."""
    return ",".join(sorted(n.strip() for n in str("" if pd.isna(text) else text).split(", ") if n.strip()))


def verify_levels(run: Any) -> list[str]:
    """Differences between ``levels.csv`` and its re-derivation (``advopenood verify``)."""
    from advopenood.plugin import compare

    if not run.has("levels.csv"):
        return ["levels.csv: the evaluator ran but the table is missing"]
    written = run.table("levels.csv", ["detector", "level", "criterion", "sets"]).copy()
    written["sets"] = [_normalised_sets(s) for s in written["sets"]]
    return compare(rederive_levels(run, written), written, ["detector", "level", "criterion"],
                   ["criterion_source", "auroc", "auroc_lo", "auroc_hi", "ci", "worst_set", "passed", "conclusive",
                    "reached", "min_auroc", "sets"], atol=1e-6, table="levels.csv")
