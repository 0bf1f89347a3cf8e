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


def _attack_class(name: str) -> Any:
    from advopenood import registry

    return registry.get("attacks", name)


def robust_sets(run: Any) -> list[dict[str, Any]]:
    """Every robust-AUROC set of the run (attack class with ``objective == "robust"``): name, detector, method, side,
    eps and the OOD set it perturbed."""
    out = []
    for name, entry in (run.info.get("attacks") or {}).items():
        cls = _attack_class(entry["attack"])
        if getattr(cls, "objective", "") != "robust":
            continue
        side = "id" if entry.get("source", "id") == "id" else "ood"
        out.append({"set": name, "detector": cls.detector, "method": cls.method, "side": side,
                    "eps": float(entry["params"]["eps"]), "source": entry.get("source", "id")})
    return out


def rederive_robust(run: Any) -> pd.DataFrame:
    """robust_auroc.csv re-computed: one row per ID-side and OOD-side set of a detector with saved scores, with the
    same method and eps (relative tolerance 1e-6)."""
    sets = robust_sets(run)
    rows = []
    for a in (s for s in sets if s["side"] == "id"):
        if a["detector"] not in run.detectors:
            continue
        arrays = run.scores(a["detector"])
        for b in sets:
            if b["side"] != "ood" or b["detector"] != a["detector"] or b["method"] != a["method"] \
                    or not math.isclose(a["eps"], b["eps"], rel_tol=1e-6):
                continue
            clean_id, clean_ood = arrays["id"], arrays[b["source"]]
            adv_id, adv_ood = arrays[a["set"]], arrays[b["set"]]
            rows.append({"detector": a["detector"], "id_attack": a["set"], "ood_attack": b["set"],
                         "ood_set": b["source"], "eps": a["eps"], "method": a["method"],
                         "clean_auroc": mann_whitney_auroc(clean_id, clean_ood),
                         "id_attacked_auroc": mann_whitney_auroc(adv_id, clean_ood),
                         "ood_attacked_auroc": mann_whitney_auroc(clean_id, adv_ood),
                         "robust_auroc": mann_whitney_auroc(adv_id, adv_ood), "robust_fpr95": fpr95(adv_id, adv_ood),
                         "n_id": len(adv_id), "n_ood": len(adv_ood)})
    return pd.DataFrame(rows, columns=["detector", "id_attack", "ood_attack", "ood_set", "eps", "method",
                                       *ROBUST_METRICS, "n_id", "n_ood"])


def verify_robust(run: Any) -> list[str]:
    """Differences between ``robust_auroc.csv`` and its re-derivation (``advopenood verify``)."""
    from advopenood.evaluation.verify import compare

    if not run.has("robust_auroc.csv"):
        return ["robust_auroc.csv: the evaluator ran but the table is missing"]
    written = run.table("robust_auroc.csv")
    rederived = rederive_robust(run)
    return compare(rederived, written, ["detector", "id_attack", "ood_attack"],
                   ["ood_set", "eps", "method", *ROBUST_METRICS, "n_id", "n_ood"], atol=1e-6,
                   table="robust_auroc.csv") + verify_entries(run, rederived)


def verify_entries(run: Any, robust: pd.DataFrame) -> list[str]:
    """The robust fields of ``leaderboard_openood.json``: per detector, the mean ``robust_auroc`` / ``robust_fpr95``
    over the near and the far sets (groups from ``ood.csv``'s natural rows) at the largest eps, PGD rows when there
    are any, to two decimals; ``/`` for a detector without robust rows."""
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


def rederive_levels(run: Any, levels: pd.DataFrame) -> pd.DataFrame:
    """levels.csv re-computed for the detectors it lists (level 2 from the run folders its ``sets`` name)."""
    from advopenood.capabilities import DetectorAware

    saved = run.config
    size, protocol = int(saved["model"]["input_size"]), run.protocol
    attacks = {n: e for n, e in (run.info.get("attacks") or {}).items() if not _id_negative(e)}
    robust = rederive_robust(run)
    rows = []
    for r in levels.to_dict("records"):
        det = r["detector"]
        arrays = run.scores(det)
        found: dict[int, dict[str, float]] = {1: {}, 2: {}, 3: {}, 4: {}}
        for name, entry in attacks.items():
            cls = _attack_class(entry["attack"])
            adapted = issubclass(cls, DetectorAware) and cls.detector == det
            level = 1 if _strong(entry, size, protocol) else \
                (3 if entry.get("source", "id") == "id" else 4) if adapted else None
            if level is None:
                continue
            value = mann_whitney_auroc(arrays["id"], arrays[name][arrays[f"{name}.positive"].astype(bool)])
            if not math.isnan(value):
                found[level][name] = value
        for b in robust[robust["detector"] == det].to_dict("records"):
            if not math.isnan(b["robust_auroc"]):
                found[4][f"{b['id_attack']}+{b['ood_attack']}"] = b["robust_auroc"]
        found[2] = _level2_evidence(run, det)
        if found[2]:
            found[2].update({f"level1:{k}": v for k, v in found[1].items()})
        worst = {k: min(v.values()) if v else math.nan for k, v in found.items()}
        reached, evaluated = 0, [k for k in (1, 2, 3, 4) if not math.isnan(worst[k])]
        for k in evaluated:
            if worst[k] < float(r["min_auroc"]):
                break
            reached = k
        rows.append({"detector": det, **{f"level{k}_auroc": worst[k] for k in (1, 2, 3, 4)},
                     "reached": float(reached) if evaluated else math.nan,
                     "sets": " | ".join(f"level{k}: {','.join(sorted(found[k]))}" for k in (1, 2, 3, 4) if found[k])})
    return pd.DataFrame(rows)


def _level2_evidence(run: Any, det: str) -> dict[str, float]:
    """Level 2 re-read: the run folders of ``evaluator_params.levels.runs`` whose model architecture or ID data set
    differ from this run's, their ``levels.csv`` level-1 and ``transfer.csv`` AUROCs of ``det`` (worst of each)."""
    import json

    saved = run.config
    paths = ((saved.get("evaluator_params") or {}).get("levels") or {}).get("runs") or []
    mine = (str(run.info.get("model", {}).get("arch", "")), _dataset(saved))
    found: dict[str, float] = {}
    for path in [paths] if isinstance(paths, str) else paths:
        folder = Path(path).expanduser()
        info = json.loads((folder / "run.json").read_text())
        if (str(info.get("model", {}).get("arch", "")), _dataset(info.get("config") or {})) == mine:
            continue
        for table, column, tag in (("levels.csv", "level1_auroc", "level1"), ("transfer.csv", "auroc", "transfer")):
            if (folder / table).is_file():
                t = pd.read_csv(folder / table)
                values = t.loc[t["detector"] == det, column].dropna()
                if len(values):
                    found[f"{folder.name}:{tag}"] = float(values.min())
    return found


def _dataset(saved: dict[str, Any]) -> str:
    data = saved.get("data") or {}
    return str(data.get("dataset") or (data.get("id") or {}).get("name", ""))


def _normalised_sets(text: Any) -> str:
    """The ``sets`` cell with each level's names sorted (the order a table lists them in is not checked)."""
    parts = []
    for part in str("" if pd.isna(text) else text).split("; "):
        level, _, names = part.partition(": ")
        if level:
            parts.append(f"{level}: {','.join(sorted(n.strip() for n in names.split(', ')))}")
    return " | ".join(parts)


def verify_levels(run: Any) -> list[str]:
    """Differences between ``levels.csv`` and its re-derivation (``advopenood verify``)."""
    from advopenood.evaluation.verify import compare

    if not run.has("levels.csv"):
        return ["levels.csv: the evaluator ran but the table is missing"]
    written = run.table("levels.csv")
    written = written[written["detector"].isin(run.detectors)].copy()
    written["sets"] = [_normalised_sets(s) for s in written["sets"]]
    return compare(rederive_levels(run, written), written, ["detector"],
                   [*(f"level{k}_auroc" for k in (1, 2, 3, 4)), "reached", "sets"], atol=1e-6, table="levels.csv")
