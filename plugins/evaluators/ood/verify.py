"""Re-derivation of the ``ood`` evaluator's tables (``ood.csv``, ``leaderboard.csv``, ``fsood.csv``; ``paired.csv``
and the leaderboard's ranks in :mod:`advopenood_plugins.evaluators.ood.verify_paired`) from
``scores/*.npz`` and ``run.json``, written apart from :mod:`advopenood.evaluation.metrics` and ``plugins/evaluators/ood/plugin.py``.

Every metric and interval comes from the independent checker :mod:`advopenood.evaluation.oracle` (OpenOOD v1.5's
definitions: OOD positive, decision score ``-conf``; AUROC as the Mann-Whitney statistic, FPR95 at the first kept
ROC point with TPR >= 95 %, trapezoidal AUPR-In / AUPR-Out): the bootstrap by a plain loop over the cell's seeded
resamples (key ``ood|<detector>|<set>``), not on the vectorised grid that wrote them; DeLong's interval from the
pairwise comparison matrix; a group mean's from the mean of its cells' re-derived replicates.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from advopenood.evaluation import oracle
from advopenood_plugins.evaluators.ood.verify_paired import verify_paired
from advopenood_plugins.kit.verify import BOUNDS, METRICS, Draws, rederive_bounds

#: the numbers of ``table_adaptive.csv`` that verify re-derives
ADAPTIVE_VALUES = ["auroc_baseline", "auroc_adaptive", "delta_auroc", "fpr95_baseline", "fpr95_adaptive"]


def _positives(arrays: dict[str, np.ndarray], name: str, positives: str) -> np.ndarray:
    """Rows of a set that a row with this ``positives`` label scores as OOD."""
    if positives == "successful":
        return arrays[f"{name}.success"].astype(bool)
    return np.ones(len(arrays[name]), dtype=bool)


def expected_positives(run: Any, ood: pd.DataFrame) -> list[str]:
    """The ``positives`` label of every adversarial row follows the protocol (or the evaluator's ``success_only``)."""
    override = ((run.config.get("evaluator_params") or {}).get("ood") or {}).get("success_only")
    rule = run.info.get("protocol", {}).get("ood_positives", "successful")
    successful = rule == "successful" if override is None else bool(override)
    lines = []
    for r in ood[ood["attack"] != "none"].to_dict("records"):
        source = (run.info.get("attacks") or {}).get(r["attack"], {}).get("source", "id")
        want = "successful" if successful and source == "id" else "all"
        if r["positives"] != want:
            lines.append(f"ood.csv: {r['detector']} on {r['ood_set']}: positives {r['positives']!r}, the run's rule "
                         f"gives {want!r}")
    return lines


def rederive_ood(run: Any, ood: pd.DataFrame, draws: Draws | None = None) -> pd.DataFrame:
    """ood.csv's metric rows and intervals re-computed from the saved scores (rows of detectors without scores keep
    NaN); each cell's bootstrap replicates go into ``draws``."""
    rows = []
    for det in ood["detector"].unique():
        if det not in run.detectors:
            continue
        arrays = run.scores(det)
        for r in ood[ood["detector"] == det].to_dict("records"):
            conf = arrays[r["ood_set"]]
            conf = conf[_positives(arrays, r["ood_set"], r["positives"])] if r["attack"] != "none" else conf
            rows.append({"detector": det, "attack": r["attack"], "ood_set": r["ood_set"], "group": r["group"],
                         "dataset": r["dataset"], **oracle.ood_metrics(arrays["id"], conf), "n_id": len(arrays["id"]),
                         "n_ood": len(conf),
                         **rederive_bounds(arrays["id"], conf, run, f"ood|{det}|{r['ood_set']}", draws)})
    return pd.DataFrame(rows)


def rederive_table_ood(rederived: pd.DataFrame, draws: Draws | None = None) -> pd.DataFrame:
    """``table_ood.csv`` in long form (``detector``, ``column``, ``value``) from the re-derived ``ood.csv`` rows:
    per detector, dataset and attack the plain mean of FPR95 and of AUROC over its sets (a NaN in any stays NaN),
    sets of group ``csid`` left out; column ``<dataset> <attack> FPR95`` / ``AUROC``, NaN where a detector has no
    row; each with ``... lo`` / ``... hi``: one set's re-derived bounds, or the percentiles of the mean of its sets'
    re-derived replicates (NaN without them)."""
    if not len(rederived):
        return pd.DataFrame(columns=["detector", "column", "value"])
    draws = draws or {}
    kept = rederived[rederived["group"] != "csid"]
    cells: dict[tuple[str, str], float] = {}
    for (det, dataset, attack), part in kept.groupby(["detector", "dataset", "attack"], sort=False):
        for metric, title in (("fpr95", "FPR95"), ("auroc", "AUROC")):
            values = part[metric].to_numpy(float)
            col = f"{dataset} {attack} {title}"
            cells[det, col] = math.nan if np.isnan(values).any() else float(values.sum() / len(values))
            if len(part) == 1:
                lo, hi = float(part[f"{metric}_lo"].iloc[0]), float(part[f"{metric}_hi"].iloc[0])
            else:
                reps = [draws.get(f"ood|{det}|{s}", {}).get(metric) for s in part["ood_set"]]
                ok = all(r is not None for r in reps)
                lo, hi = oracle.percentile_interval(sum(reps) / len(reps)) if ok else (math.nan, math.nan)
            cells[det, f"{col} lo"], cells[det, f"{col} hi"] = lo, hi
    columns = sorted({c for _, c in cells})
    return pd.DataFrame([{"detector": d, "column": c, "value": cells.get((d, c), math.nan)}
                         for d in rederived["detector"].unique() for c in columns])


def written_long(table: pd.DataFrame, detectors: list[str]) -> pd.DataFrame:
    """``table_ood.csv``'s metric columns (``... FPR95`` / ``... AUROC`` and their ``... lo`` / ``... hi``; not the
    ``protocol`` the core adds) as
    (``detector``, ``column``, ``value``) rows, for ``detectors``."""
    metrics = [c for c in table.columns if str(c).endswith((" FPR95", " AUROC", " lo", " hi"))]
    mine = table[table["detector"].isin(detectors)]
    return mine.melt(id_vars="detector", value_vars=metrics, var_name="column", value_name="value")


def _baseline_set(run: Any, name: str) -> str:
    """The classifier-only set an adaptive set is read against: the natural OOD set an OOD->ID set perturbed, else
    the first ``pgd`` set of the run with the same eps; ``""`` when there is none (an empty cell)."""
    attacks = run.info.get("attacks") or {}
    entry = attacks[name]
    if entry.get("source", "id") != "id":
        return str(entry["source"])
    eps = (entry.get("params") or {}).get("eps")
    for other, e in attacks.items():
        other_eps = (e.get("params") or {}).get("eps")
        if e.get("attack") == "pgd" and e.get("source", "id") == "id" and eps is not None and other_eps is not None \
                and abs(float(other_eps) - float(eps)) <= 1e-6 * max(abs(float(eps)), abs(float(other_eps))):
            return other
    return ""


def rederive_table_adaptive(run: Any, rederived: pd.DataFrame) -> pd.DataFrame:
    """``table_adaptive.csv`` from the re-derived ``ood.csv`` rows: one row per attack set made against a detector
    (its registered class names the detector it adapts to) that the detector was scored on, with that set's
    AUROC / FPR95 beside the baseline set's (:func:`_baseline_set`) and the AUROC's change."""
    from advopenood import registry

    cell = rederived.set_index(["detector", "ood_set"])
    rows = []
    for name, entry in (run.info.get("attacks") or {}).items():
        target = getattr(registry.get("attacks", entry["attack"]), "detector", None)
        if not target or (target, name) not in cell.index:
            continue
        got, base = cell.loc[(target, name)], _baseline_set(run, name)
        ref = cell.loc[(target, base)] if (target, base) in cell.index else None
        nan = math.nan
        rows.append({"detector": target, "attack": name, "baseline": base or nan,
                     "auroc_baseline": nan if ref is None else ref["auroc"], "auroc_adaptive": got["auroc"],
                     "delta_auroc": nan if ref is None else got["auroc"] - ref["auroc"],
                     "fpr95_baseline": nan if ref is None else ref["fpr95"], "fpr95_adaptive": got["fpr95"],
                     "n_ood": got["n_ood"]})
    return pd.DataFrame(rows, columns=["detector", "attack", "baseline", *ADAPTIVE_VALUES, "n_ood"])


def rederive_leaderboard(ood: pd.DataFrame, draws: Draws | None = None) -> pd.DataFrame:
    """Per detector, the plain means of the (re-derived) ood rows of each group, near / far / adversarial (NaN if
    any member is NaN), as OpenOOD's ``nearood`` / ``farood`` rows; each mean's interval the percentiles of the
    mean of its cells' replicates (NaN without them)."""
    draws = draws or {}
    rows = []
    for det, part in ood.groupby("detector", sort=False):
        row: dict[str, Any] = {"detector": det}
        for group, prefix in (("near", "near"), ("far", "far"), ("adversarial", "adv")):
            sub = part[part["group"] == group]
            for m in ("fpr95", "auroc"):
                vals = sub[m].to_numpy(float)
                row[f"{prefix}_{m}"] = math.nan if not len(vals) or np.isnan(vals).any() else float(vals.sum() / len(vals))
                reps = [draws.get(f"ood|{det}|{s}", {}).get(m) for s in sub["ood_set"]]
                ok = bool(reps) and all(r is not None for r in reps)
                lo, hi = oracle.percentile_interval(sum(reps) / len(reps)) if ok else (math.nan, math.nan)
                row[f"{prefix}_{m}_lo"], row[f"{prefix}_{m}_hi"] = lo, hi
            row[f"n_{prefix}"] = len(sub)
        rows.append(row)
    return pd.DataFrame(rows)


def rederive_fsood(run: Any, fsood: pd.DataFrame) -> pd.DataFrame:
    """fsood.csv re-computed: ID = the ID test set and every csid set concatenated."""
    rows = []
    for r in fsood.to_dict("records"):
        if r["detector"] not in run.detectors:
            continue
        arrays = run.scores(r["detector"])
        csid = [s for s in str(r["csid_sets"]).split(",") if s]
        conf_id = np.concatenate([arrays["id"]] + [arrays[s] for s in csid])
        rows.append({"detector": r["detector"], "ood_set": r["ood_set"],
                     **oracle.ood_metrics(conf_id, arrays[r["ood_set"]]),
                     **rederive_bounds(conf_id, arrays[r["ood_set"]], run, f"fsood|{r['detector']}|{r['ood_set']}")})
    return pd.DataFrame(rows)


def verify(run: Any) -> list[str]:
    """Differences between the ``ood`` evaluator's tables and their re-derivation (``advopenood verify``)."""
    from advopenood.evaluation.verify import compare

    ood = run.table("ood.csv")
    lines = expected_positives(run, ood)
    draws: Draws = {}
    rederived = rederive_ood(run, ood, draws)
    lines += compare(rederived, ood[ood["detector"].isin(run.detectors)], ["detector", "attack", "ood_set"],
                     [*METRICS, *BOUNDS, "ci", "n_id", "n_ood"], atol=1e-6, table="ood.csv")
    board = rederived_board = None
    if run.has("leaderboard.csv") and len(rederived):
        board, rederived_board = run.table("leaderboard.csv"), rederive_leaderboard(rederived, draws)
        means = [f"{g}_{m}" for g in ("near", "far", "adv") for m in ("fpr95", "auroc")]
        lines += compare(rederived_board, board[board["detector"].isin(run.detectors)],
                         ["detector"], [*means, *[f"{c}_{end}" for c in means for end in ("lo", "hi")], "n_near",
                                        "n_far", "n_adv"], atol=1e-6, table="leaderboard.csv")
    lines += verify_paired(run, ood, board, rederived_board)
    if run.has("table_ood.csv"):
        lines += compare(rederive_table_ood(rederived, draws), written_long(run.table("table_ood.csv"), run.detectors),
                         ["detector", "column"], ["value"], atol=1e-6, table="table_ood.csv")
    if run.has("table_adaptive.csv"):
        adaptive = run.table("table_adaptive.csv")
        lines += compare(rederive_table_adaptive(run, rederived), adaptive[adaptive["detector"].isin(run.detectors)],
                         ["detector", "attack"], ["baseline", *ADAPTIVE_VALUES, "n_ood"], atol=1e-6,
                         table="table_adaptive.csv")
    if run.has("fsood.csv"):
        fsood = run.table("fsood.csv")
        lines += compare(rederive_fsood(run, fsood), fsood, ["detector", "ood_set"], [*METRICS, *BOUNDS, "ci"],
                         atol=1e-6, table="fsood.csv")
    return lines
