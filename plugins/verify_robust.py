"""Re-derivation of ``robust_auroc.csv`` and ``levels.csv`` from ``scores/*.npz`` and ``run.json``, written apart
from ``plugins/robust_auroc.py``, ``plugins/levels.py`` and :mod:`advopenood.evaluation.metrics`.

AUROC is computed as the Mann-Whitney statistic (Hanley & McNeil 1982): with OOD positive and score ``-conf``,
``AUROC = P(conf_ood < conf_id) + P(conf_ood = conf_id) / 2 = (R_id - n_id (n_id + 1) / 2) / (n_id n_ood)``, ``R_id``
the sum of the ID confidences' average ranks in the pooled sample; it equals the trapezoidal area under the ROC
curve that OpenOOD computes. FPR95 is OpenOOD's (``openood/evaluators/metrics.py``): the false positive rate at
the first point of ``sklearn.metrics.roc_curve(is_ood, -conf)`` whose true positive rate reaches 95 %, here on
dense ranks. Which sets a row or a level uses is re-derived from ``run.json`` (each set's attack, parameters and
source) and the registered attack classes.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import rankdata
from sklearn.metrics import roc_curve

ROBUST_METRICS = ("clean_auroc", "id_attacked_auroc", "ood_attacked_auroc", "robust_auroc", "robust_fpr95")
ROBUST_BOUNDS = [f"{m}_{end}" for m in ROBUST_METRICS for end in ("lo", "hi")]
#: the AUROCs of a robust row: (ID array, OOD array) among (clean ID, clean OOD, attacked ID, attacked OOD)
_PAIRS = {"clean_auroc": (0, 1), "id_attacked_auroc": (2, 1), "ood_attacked_auroc": (0, 3), "robust_auroc": (2, 3)}


def mann_whitney_auroc(conf_id: np.ndarray, conf_ood: np.ndarray) -> float:
    """AUROC in percent, OOD positive (score ``-conf``), from average ranks; NaN for an empty side or NaN scores."""
    conf_id, conf_ood = np.asarray(conf_id, float).ravel(), np.asarray(conf_ood, float).ravel()
    if not len(conf_id) or not len(conf_ood) or np.isnan(conf_id).any() or np.isnan(conf_ood).any():
        return math.nan
    ranks = rankdata(np.concatenate([conf_id, conf_ood]))
    u_id = ranks[:len(conf_id)].sum() - len(conf_id) * (len(conf_id) + 1) / 2.0
    return 100.0 * u_id / (len(conf_id) * len(conf_ood))


def fpr95(conf_id: np.ndarray, conf_ood: np.ndarray) -> float:
    """FPR (%) at the first ROC point with TPR >= 95 %, OOD positive, on dense ranks; NaN when undefined."""
    conf_id, conf_ood = np.asarray(conf_id, float).ravel(), np.asarray(conf_ood, float).ravel()
    if not len(conf_id) or not len(conf_ood) or np.isnan(conf_id).any() or np.isnan(conf_ood).any():
        return math.nan
    rank = rankdata(np.concatenate([conf_id, conf_ood]), method="dense")
    fpr, tpr, _ = roc_curve(np.r_[np.zeros(len(conf_id)), np.ones(len(conf_ood))], -rank)
    return 100.0 * float(fpr[np.flatnonzero(tpr >= 0.95)[0]])


def robust_bounds(arrays: tuple[np.ndarray, ...], run: Any, key: str) -> dict[str, Any]:
    """A robust row's ``<m>_lo`` / ``<m>_hi``, ``ci`` and ``error`` re-derived by the run's ``ci`` plan from
    ``arrays`` = (clean ID, clean OOD, attacked ID, attacked OOD): the bootstrap as a loop over the cell's seeded
    resamples (the same ID indices for both ID arrays, the same OOD indices for both OOD arrays), each resample's
    AUROC from ranks (:func:`mann_whitney_auroc`) and FPR95 from its ROC points
    (:func:`advopenood_plugins.verify_ood.resample_metrics`); DeLong's interval per AUROC as ``ood.csv``'s."""
    from advopenood.evaluation.intervals import draw, generator
    from advopenood_plugins.verify_ood import ci_plan, rederive_bounds, resample_metrics

    method, resamples, seed = ci_plan(run)
    out: dict[str, Any] = {c: math.nan for c in ROBUST_BOUNDS}
    out.update(ci=f"bootstrap-{resamples}" if method == "bootstrap" else method, error=math.nan)  # empty = NaN
    clean_id, clean_ood, adv_id, adv_ood = (np.asarray(a, float).ravel() for a in arrays)
    n, m = len(adv_id), len(adv_ood)
    if method == "none":
        return out
    if (len(clean_id), len(clean_ood)) != (n, m):
        out["error"] = (f"no interval: the attacked sets ({n} ID, {m} OOD images) are not paired with the clean "
                        f"ones ({len(clean_id)}, {len(clean_ood)})")
        return out
    if min(n, m) < 2:
        out["error"] = f"no interval: {n} ID and {m} OOD images (an interval needs at least 2 per side)"
        return out
    if any(np.isnan(a).any() for a in (clean_id, clean_ood, adv_id, adv_ood)):
        out["error"] = "no interval: NaN scores"
        return out
    sides = (clean_id, clean_ood, adv_id, adv_ood)
    if method == "delong":
        for metric, (i, j) in _PAIRS.items():
            got = rederive_bounds(sides[i], sides[j], run, key)
            out[f"{metric}_lo"], out[f"{metric}_hi"] = got["auroc_lo"], got["auroc_hi"]
        return out
    idx_id, idx_ood = draw(generator(seed, key), n, m, resamples)
    reps: dict[str, list[float]] = {metric: [] for metric in ROBUST_METRICS}
    for i, j in zip(idx_id, idx_ood):
        for metric, (a, b) in _PAIRS.items():
            reps[metric].append(mann_whitney_auroc(sides[a][i], sides[b][j]))
        rank = rankdata(np.r_[adv_id[i], adv_ood[j]], method="dense")
        reps["robust_fpr95"].append(resample_metrics(rank[:n], rank[n:])["fpr95"])
    for metric, values in reps.items():
        out[f"{metric}_lo"], out[f"{metric}_hi"] = np.percentile(values, [2.5, 97.5])
    return out


def _attack_class(name: str) -> Any:
    from advopenood import registry

    return registry.get("attacks", name)


def robust_sets(run: Any) -> list[dict[str, Any]]:
    """Every robust-AUROC set of the run (attack class with ``objective == "robust"``): name, detector, method, attack
    family (``eot`` for a class that names the plain attack it averages the gradient of, ``plain`` otherwise), side,
    eps and the OOD set it perturbed."""
    out = []
    for name, entry in (run.info.get("attacks") or {}).items():
        cls = _attack_class(entry["attack"])
        if getattr(cls, "objective", "") != "robust":
            continue
        side = "id" if entry.get("source", "id") == "id" else "ood"
        family = "plain" if getattr(cls, "plain_attack", entry["attack"]) in ("", entry["attack"]) else "eot"
        out.append({"set": name, "detector": cls.detector, "method": cls.method, "family": family, "side": side,
                    "eps": float(entry["params"]["eps"]), "source": entry.get("source", "id")})
    return out


def rederive_robust(run: Any) -> pd.DataFrame:
    """robust_auroc.csv re-computed: one row per ID-side and OOD-side set of a detector with saved scores, with the
    same method, attack family and eps (relative tolerance 1e-6)."""
    sets = robust_sets(run)
    rows = []
    for a in (s for s in sets if s["side"] == "id"):
        if a["detector"] not in run.detectors:
            continue
        arrays = run.scores(a["detector"])
        for b in sets:
            if b["side"] != "ood" or b["detector"] != a["detector"] or b["method"] != a["method"] \
                    or b["family"] != a["family"] or not math.isclose(a["eps"], b["eps"], rel_tol=1e-6):
                continue
            clean_id, clean_ood = arrays["id"], arrays[b["source"]]
            adv_id, adv_ood = arrays[a["set"]], arrays[b["set"]]
            key = f"robust|{a['detector']}|{a['set']}|{b['set']}"
            rows.append({"detector": a["detector"], "id_attack": a["set"], "ood_attack": b["set"],
                         "ood_set": b["source"], "eps": a["eps"], "method": a["method"], "attack_family": a["family"],
                         "clean_auroc": mann_whitney_auroc(clean_id, clean_ood),
                         "id_attacked_auroc": mann_whitney_auroc(adv_id, clean_ood),
                         "ood_attacked_auroc": mann_whitney_auroc(clean_id, adv_ood),
                         "robust_auroc": mann_whitney_auroc(adv_id, adv_ood), "robust_fpr95": fpr95(adv_id, adv_ood),
                         "n_id": len(adv_id), "n_ood": len(adv_ood),
                         **robust_bounds((clean_id, clean_ood, adv_id, adv_ood), run, key)})
    return pd.DataFrame(rows, columns=["detector", "id_attack", "ood_attack", "ood_set", "eps", "method",
                                       "attack_family", *ROBUST_METRICS, *ROBUST_BOUNDS, "ci", "error", "n_id",
                                       "n_ood"])


def verify_robust(run: Any) -> list[str]:
    """Differences between ``robust_auroc.csv`` and its re-derivation (``advopenood verify``)."""
    from advopenood.evaluation.verify import compare

    if not run.has("robust_auroc.csv"):
        return ["robust_auroc.csv: the evaluator ran but the table is missing"]
    from advopenood_plugins.verify_robust_paired import verify_robust_paired

    written = run.table("robust_auroc.csv")
    rederived = rederive_robust(run)
    return compare(rederived, written, ["detector", "id_attack", "ood_attack"],
                   ["ood_set", "eps", "method", "attack_family", *ROBUST_METRICS, *ROBUST_BOUNDS, "ci", "error",
                    "n_id", "n_ood"], atol=1e-6,
                   table="robust_auroc.csv") + verify_entries(run, rederived) + verify_robust_paired(run, rederived)


def verify_entries(run: Any, robust: pd.DataFrame) -> list[str]:
    """The robust fields of ``leaderboard_openood.json``: per detector, the mean ``robust_auroc`` / ``robust_fpr95``
    over the near and the far sets (groups from ``ood.csv``'s natural rows) at the largest eps, PGD rows when there
    are any, EOT rows when there are any, to two decimals; ``/`` for a detector without robust rows."""
    import json

    if not run.has("leaderboard_openood.json") or not run.has("ood.csv"):
        return []
    ood = run.table("ood.csv")
    groups = dict(zip(ood.loc[ood["attack"] == "none", "ood_set"], ood.loc[ood["attack"] == "none", "group"]))
    lines = []
    for entry in json.loads((run.path / "leaderboard_openood.json").read_text()):
        det = entry["advopenood"]["detector"]
        rows = robust[robust["detector"] == det]
        if len(rows):
            rows = rows[np.isclose(rows["eps"], rows["eps"].max())]
            rows = rows[rows["method"] == ("pgd" if (rows["method"] == "pgd").any() else rows["method"].iloc[0])]
            rows = rows[rows["attack_family"] == ("eot" if (rows["attack_family"] == "eot").any() else "plain")]
        for group, title in (("near", "Near-OOD"), ("far", "Far-OOD")):
            sub = rows[rows["ood_set"].map(groups) == group] if len(rows) else rows
            for metric, name in (("robust_auroc", "AUROC"), ("robust_fpr95", "FPR95")):
                want = "/" if not len(sub) else f"{sub[metric].to_numpy(float).sum() / len(sub):.2f}"
                if entry.get(f"{title}_Robust_{name}") != want:
                    lines.append(f"leaderboard_openood.json: {det} {title}_Robust_{name}: written "
                                 f"{entry.get(f'{title}_Robust_{name}')!r}, re-derived {want!r}")
    return lines


# ------------------------------------------------------------------------------------------------- levels

def _strong(entry: dict[str, Any], size: int, protocol: str) -> bool:
    """Level 1's rule re-stated: a classifier-only, multi-step attack with no iteration count below its default,
    no budget below its default eps, and ``steps * step size >= eps`` where a step size is set."""
    from advopenood.capabilities import DetectorAware

    cls = _attack_class(entry["attack"])
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
    from advopenood.capabilities import IdNegatives

    return issubclass(_attack_class(entry["attack"]), IdNegatives)


#: levels.csv's criteria re-stated: (level, name, source); the paper's Sec. 4 gives every level's definition and no
#: number, so only our addition (both sides attacked) is ``ours``
_CRITERIA = ((1, "strong", "paper"), (2, "other_model_data", "paper"), (3, "bpda_adaptive", "paper"),
             (4, "adaptive_id", "paper"), (4, "ood_to_id", "paper"), (4, "robust_auroc", "ours"))


def rederive_levels(run: Any, levels: pd.DataFrame) -> pd.DataFrame:
    """levels.csv re-computed for the detectors it lists, one row per criterion (level 2 from the run's own model and
    data and the run folders of ``evaluator_params.levels.runs``), with the interval of each criterion's worst set
    (:func:`_worst_bounds`) and whether it excludes the bar."""
    from advopenood.capabilities import DetectorAware
    from advopenood_plugins.verify_ood import ci_plan

    saved = run.config
    size, protocol = int(saved["model"]["input_size"]), run.protocol
    attacks = {n: e for n, e in (run.info.get("attacks") or {}).items() if not _id_negative(e)}
    robust = rederive_robust(run)
    method, resamples, _ = ci_plan(run)
    ci = f"bootstrap-{resamples}" if method == "bootstrap" else method
    own = _beyond_baseline(str(run.info.get("model", {}).get("arch", "")), _dataset(saved))
    rows = []
    for det in dict.fromkeys(levels["detector"]):
        bar = float(levels.loc[levels["detector"] == det, "min_auroc"].iloc[0])
        arrays = run.scores(det)
        found: dict[str, dict[str, float]] = {name: {} for _, name, _ in _CRITERIA}
        for name, entry in attacks.items():
            cls = _attack_class(entry["attack"])
            adapted = issubclass(cls, DetectorAware) and cls.detector == det
            kinds = ("strong",) if _strong(entry, size, protocol) else \
                (("bpda_adaptive", "adaptive_id") if entry.get("source", "id") == "id" else ("ood_to_id",)) \
                if adapted else ()
            value = mann_whitney_auroc(arrays["id"], arrays[name][arrays[f"{name}.positive"].astype(bool)])
            for kind in kinds if not math.isnan(value) else ():
                found[kind][name] = value
        for b in robust[robust["detector"] == det].to_dict("records"):
            if not math.isnan(b["robust_auroc"]):
                found["robust_auroc"][f"{b['id_attack']}+{b['ood_attack']}"] = b["robust_auroc"]
        other = _level2_evidence(run, det)
        found["other_model_data"] = {**{k: v for k, (v, _, _) in other.items()},
                                     **({f"level1:{k}": v for k, v in found["strong"].items()} if own else {})}
        worst = {name: min(v.values()) if v else math.nan for name, v in found.items()}
        at = {name: min(sorted(v), key=lambda k, v=v: round(v[k], 9)) if v else "" for name, v in found.items()}
        per_level = {k: [worst[n] for level, n, _ in _CRITERIA if level == k and not math.isnan(worst[n])]
                     for k in (1, 2, 3, 4)}
        reached, evaluated = 0, [k for k, v in per_level.items() if v]
        for k in evaluated:
            if min(per_level[k]) < bar:
                break
            reached = k
        for level, name, source in _CRITERIA:
            lo, hi = _worst_bounds(run, det, at[name], arrays, robust, other)
            rows.append({"detector": det, "level": level, "criterion": name, "criterion_source": source,
                         "auroc": worst[name], "auroc_lo": lo, "auroc_hi": hi, "ci": ci,
                         "worst_set": at[name] or math.nan,
                         "passed": math.nan if math.isnan(worst[name]) else float(worst[name] >= bar),
                         "conclusive": math.nan if math.isnan(lo) or math.isnan(hi) else float(not lo <= bar <= hi),
                         "reached": float(reached) if evaluated else math.nan, "sets": ",".join(sorted(found[name]))})
    return pd.DataFrame(rows)


def _worst_bounds(run: Any, det: str, label: str, arrays: dict[str, np.ndarray], robust: pd.DataFrame,
                  other: dict[str, tuple[float, float, float]]) -> tuple[float, float]:
    """The interval of the set a criterion's worst AUROC comes from, re-derived: an attack set's as ``ood.csv``'s
    cell (:func:`advopenood_plugins.verify_ood.rederive_bounds`, key ``ood|<det>|<set>``), a robust pair's from
    :func:`rederive_robust`, another run's as its ``levels.csv`` wrote it; NaN for none."""
    from advopenood_plugins.verify_ood import rederive_bounds

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
    from advopenood.evaluation.verify import compare

    if not run.has("levels.csv"):
        return ["levels.csv: the evaluator ran but the table is missing"]
    written = run.table("levels.csv")
    written = written[written["detector"].isin(run.detectors)].copy()
    written["sets"] = [_normalised_sets(s) for s in written["sets"]]
    return compare(rederive_levels(run, written), written, ["detector", "level", "criterion"],
                   ["criterion_source", "auroc", "auroc_lo", "auroc_hi", "ci", "worst_set", "passed", "conclusive",
                    "reached", "sets"], atol=1e-6, table="levels.csv")
