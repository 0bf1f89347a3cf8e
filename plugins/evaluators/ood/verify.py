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
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from advopenood.plugin import oracle
from advopenood_plugins.evaluators.ood.verify_paired import verify_paired
from advopenood_plugins.kit.verify import (BOUNDS, METRICS, Draws, aimed, ci_plan, rederive_bounds, shared_sources,
                                           transfer)

#: the numbers of ``table_adaptive.csv`` that verify re-derives
ADAPTIVE_VALUES = ["auroc_baseline", "auroc_adaptive", "delta_auroc", "fpr95_baseline", "fpr95_adaptive",
                   *[f"{m}_{side}_{end}" for m in ("auroc", "fpr95") for side in ("baseline", "adaptive")
                     for end in ("lo", "hi")]]


#: the columns that name an ``ood.csv`` row
KEYS = ["detector", "attack", "ood_set"]


def positives_rule(run: Any, name: str) -> str:
    """The ``positives`` label of adversarial set ``name``'s rows: ``successful`` for an ID->ID set when the
    protocol's rule (or the evaluator's ``success_only``) says so, else ``all``."""
    override = ((run.config.get("evaluator_params") or {}).get("ood") or {}).get("success_only")
    rule = run.info.get("protocol", {}).get("ood_positives", "successful")
    successful = rule == "successful" if override is None else bool(override)
    source = (run.info.get("attacks") or {}).get(name, {}).get("source", "id")
    return "successful" if successful and source == "id" else "all"


def expected_targets(run: Any) -> list[tuple[str, str]]:
    """``(attack, ood_set)`` of every row a detector has in ``ood.csv``, from ``run.json``: each natural OOD set
    (attack ``none``), then each adversarial set whose images count as OOD (not one of an attack that declares
    :class:`~advopenood.capabilities.IdNegatives`)."""
    from advopenood.plugin import registry
    from advopenood.plugin import is_id_negative

    natural = [("none", str(name)) for name in (run.info.get("data") or {}).get("ood") or {}]
    attacks = run.info.get("attacks") or {}
    return natural + [(name, name) for name, entry in attacks.items()
                      if not is_id_negative(registry.get("attacks", entry["attack"]))]


def natural_groups(run: Any) -> dict[str, str]:
    """The group of each natural OOD set: its data entry's ``group``, else OpenOOD v1.5's for the run's dataset."""
    from advopenood.plugin import natural_group
    from advopenood.plugin import dataset_name

    data = run.config.get("data") or {}
    dataset = data.get("dataset") or ((run.info.get("data") or {}).get("id") or {}).get("name")
    declared = {}
    for entry in data.get("ood") or []:
        try:
            declared[dataset_name(entry)] = entry.get("group")
        except (ValueError, TypeError, KeyError):  # an entry this version cannot read: its sets take OpenOOD's group
            continue
    return {name: declared.get(name) or natural_group(dataset, name) for _, name in expected_targets(run)}


def expected_positives(run: Any, ood: pd.DataFrame) -> list[str]:
    """The ``positives`` label of every adversarial row follows the protocol (or the evaluator's ``success_only``)."""
    lines = []
    for r in ood[ood["attack"] != "none"].to_dict("records"):
        want = positives_rule(run, r["attack"])
        if r["positives"] != want:
            lines.append(f"ood.csv: {r['detector']} on {r['ood_set']}: positives {r['positives']!r}, the run's rule "
                         f"gives {want!r}")
    return lines


def rederive_ood(run: Any, ood: pd.DataFrame, draws: Draws | None = None) -> pd.DataFrame:
    """Every ``ood.csv`` row of the detectors with saved scores, re-computed from the scores: one per target of
    :func:`expected_targets` (the written table decides none of them; its ``group`` and ``dataset`` are kept where
    the row is there); each cell's bootstrap replicates go into ``draws``."""
    groups = natural_groups(run)
    written = {(r["detector"], r["attack"], r["ood_set"]): r for r in ood.to_dict("records")}
    dataset = (run.config.get("data") or {}).get("dataset") or ((run.info.get("data") or {}).get("id") or {}).get("name")
    entries = run.info.get("attacks") or {}
    targets = {name: aimed(str(entries[name]["attack"])) if attack != "none" else ""
               for attack, name in expected_targets(run)}
    rows = []
    for det in run.detectors:
        arrays = run.scores(det)
        for attack, name in expected_targets(run):
            positives = "natural" if attack == "none" else positives_rule(run, name)
            conf = arrays[name]
            conf = conf[arrays[f"{name}.success"].astype(bool)] if positives == "successful" else conf
            have = written.get((det, attack, name), {})
            group = have.get("group", groups.get(name) if attack == "none" else "adversarial")
            rows.append({"detector": det, "attack": attack, "ood_set": name, "group": group,
                         "dataset": have.get("dataset", dataset), "positives": positives, "aimed_at": targets[name],
                         **oracle.ood_metrics(arrays["id"], conf), "n_id": len(arrays["id"]), "n_ood": len(conf),
                         **rederive_bounds(arrays["id"], conf, run, f"ood|{det}|{name}", draws)})
    return pd.DataFrame(rows, columns=[*KEYS, "group", "dataset", "positives", "aimed_at", *METRICS, "n_id", "n_ood",
                                       *BOUNDS, "ci"])


def unscored_rows(run: Any, keys: list[str]) -> pd.DataFrame:
    """The rows (``keys`` columns) that the detectors without saved scores must have: every target of
    :func:`expected_targets` for ``detector, attack, ood_set``, one row per detector for ``detector``. A detector that
    failed has its rows (empty numbers, an ``error``); one whose score file is gone is also a file finding."""
    others = [d for d in [*run.scored, *run.errored] if d not in run.detectors]
    if keys == ["detector"]:
        return pd.DataFrame({"detector": others})
    return pd.DataFrame([(d, a, s) for d in others for a, s in expected_targets(run)], columns=KEYS)


def rederive_table_ood(rederived: pd.DataFrame, draws: Draws | None = None, run: Any = None,
                       means: Means | None = None) -> pd.DataFrame:
    """``table_ood.csv`` in long form (``detector``, ``column``, ``value``) from the re-derived ``ood.csv`` rows:
    per detector, dataset and attack the plain mean of FPR95 and of AUROC over its sets (a NaN in any stays NaN),
    sets of group ``csid`` left out; column ``<dataset> <attack> FPR95`` / ``AUROC``, NaN where a detector has no
    row; each with ``... lo`` / ``... hi``: one set's re-derived bounds; a mean's, with ``run``, the leaderboard's rule
    (the shared ID images resampled once, :func:`_shared_bounds`), else the percentiles of the mean of its sets'
    re-derived replicates (NaN without them)."""
    if not len(rederived):
        return pd.DataFrame(columns=["detector", "column", "value"])
    draws, means = draws or {}, {} if means is None else means
    plan = ci_plan(run) if run is not None else None
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
                if plan is not None:
                    lo, hi = _shared_bounds(run, plan, det, part, means)[metric]
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
    from advopenood.plugin import registry

    cell = rederived.set_index(["detector", "ood_set"])
    rows = []
    for name, entry in (run.info.get("attacks") or {}).items():
        target = getattr(registry.get("attacks", entry["attack"]), "detector", None)
        if not target or (target, name) not in cell.index:
            continue
        got, base = cell.loc[(target, name)], _baseline_set(run, name)
        ref = cell.loc[(target, base)] if (target, base) in cell.index else None
        nan = math.nan
        row = {"detector": target, "attack": name, "baseline": base or nan,
               "delta_auroc": nan if ref is None else got["auroc"] - ref["auroc"], "n_ood": got["n_ood"]}
        for m in ("auroc", "fpr95"):  # the two sets' re-derived cells, bounds included
            for end in ("", "_lo", "_hi"):
                row[f"{m}_adaptive{end}"], row[f"{m}_baseline{end}"] = got[f"{m}{end}"], \
                    nan if ref is None else ref[f"{m}{end}"]
        rows.append(row)
    return pd.DataFrame(rows, columns=["detector", "attack", "baseline", *ADAPTIVE_VALUES, "n_ood"])


def rederive_leaderboard(ood: pd.DataFrame, draws: Draws | None = None, run: Any = None,
                         means: Means | None = None) -> pd.DataFrame:
    """Per detector, the plain means of the (re-derived) ood rows of each group, near / far / adversarial (NaN if
    any member is NaN; a set aimed at another detector left out, :func:`~advopenood_plugins.kit.verify.transfer`),
    as OpenOOD's ``nearood`` / ``farood`` rows, and the sets each averages (``<group>_sets``).
    Each mean's interval: with ``run`` (its scores), the checker's mean over sets that share the ID images and,
    by :func:`shared_sources`, OOD images
    (:func:`advopenood.evaluation.oracle.shared_mean_interval`, key ``mean|<det>|<set>|<set>...``, sorted; NaN
    unless the run's method is the bootstrap and every set has at least 2 images); without, the percentiles of the
    mean of its cells' replicates (NaN without them)."""
    draws, means = draws or {}, {} if means is None else means
    plan = ci_plan(run) if run is not None else None
    rows = []
    for det, part in ood.groupby("detector", sort=False):
        row: dict[str, Any] = {"detector": det}
        part = part[~transfer(part)]  # a set aimed at another detector is no part of this one's means
        for group, prefix in (("near", "near"), ("far", "far"), ("adversarial", "adv")):
            sub = part[part["group"] == group]
            shared = _shared_bounds(run, plan, det, sub, means) if plan is not None else None
            for m in ("fpr95", "auroc"):
                vals = sub[m].to_numpy(float)
                row[f"{prefix}_{m}"] = math.nan if not len(vals) or np.isnan(vals).any() else float(vals.sum() / len(vals))
                reps = [draws.get(f"ood|{det}|{s}", {}).get(m) for s in sub["ood_set"]]
                ok = bool(reps) and all(r is not None for r in reps)
                lo, hi = oracle.percentile_interval(sum(reps) / len(reps)) if ok else (math.nan, math.nan)
                row[f"{prefix}_{m}_lo"], row[f"{prefix}_{m}_hi"] = (lo, hi) if shared is None else shared[m]
            row[f"n_{prefix}"] = len(sub)
            row[f"{prefix}_sets"] = ",".join(sorted(map(str, sub["ood_set"]))) or math.nan
        rows.append(row)
    return pd.DataFrame(rows)


Means = dict[tuple[str, ...], dict[str, tuple[float, float]]]


def _shared_bounds(run: Any, plan: Any, det: str, sub: pd.DataFrame, means: Means) -> dict[str, tuple[float, float]]:
    """A mean's ``{metric: (lo, hi)}`` over the ood rows ``sub`` (each set's positives as its row says) with the ID
    images resampled once for all its sets; NaN where there is none. ``means``: the ones this check computed, by
    detector and sets (each once)."""
    nan = {m: (math.nan, math.nan) for m in ("fpr95", "auroc")}
    if not plan.bootstrap or not len(sub):
        return nan
    key = (det, *sorted(map(str, sub["ood_set"])))
    if key not in means:
        means[key] = _shared_mean(run, plan, det, sub)
    return means[key]


def _shared_mean(run: Any, plan: Any, det: str, sub: pd.DataFrame) -> dict[str, tuple[float, float]]:
    """:func:`_shared_bounds` computed."""
    nan = {m: (math.nan, math.nan) for m in ("fpr95", "auroc")}
    arrays = run.scores(det)
    oods, masks = {}, {}
    for r in sub.to_dict("records"):
        conf = arrays[r["ood_set"]].astype(float)
        masks[r["ood_set"]] = arrays[f"{r['ood_set']}.success"].astype(bool) if r["positives"] == "successful" \
            else None
        oods[r["ood_set"]] = conf if masks[r["ood_set"]] is None else conf[masks[r["ood_set"]]]
    conf_id = arrays["id"].astype(float)
    if min(len(conf_id), *(len(o) for o in oods.values())) < 2 or \
            any(np.isnan(a).any() for a in (conf_id, *oods.values())):
        return nan
    return oracle.shared_mean_interval(conf_id, oods, plan.seed, "|".join(["mean", det, *sorted(oods)]), plan.resamples,
                                       sources=shared_sources(run, arrays, masks))



def rederive_fsood(run: Any, rederived: pd.DataFrame) -> pd.DataFrame:
    """fsood.csv re-computed (no row when the run has no csid set): per detector with scores and near / far set,
    ID = the ID test set and every csid set (in the run's order) concatenated."""
    natural = rederived[rederived["attack"] == "none"].drop_duplicates("ood_set")
    groups = dict(zip(natural["ood_set"], natural["group"]))
    csid = [name for name, group in groups.items() if group == "csid"]
    rows = []
    for det in run.detectors if csid else []:
        arrays = run.scores(det)
        conf_id = np.concatenate([arrays["id"]] + [arrays[s] for s in csid])
        for name in [s for s, g in groups.items() if g in ("near", "far")]:
            rows.append({"detector": det, "ood_set": name, **oracle.ood_metrics(conf_id, arrays[name]),
                         "csid_sets": ",".join(csid),
                         **rederive_bounds(conf_id, arrays[name], run, f"fsood|{det}|{name}")})
    return pd.DataFrame(rows, columns=["detector", "ood_set", *METRICS, "csid_sets", *BOUNDS, "ci"])


def _checked(run: Any, name: str, check: Callable[[pd.DataFrame], list[str]], needs: Sequence[str] = ()) -> list[str]:
    """``check`` of the written table ``name``; a table that is missing or lacks a column is one finding."""
    from advopenood.plugin import Unreadable

    try:
        return check(run.table(name, needs))
    except Unreadable as exc:
        return [str(exc)]


def verify(run: Any) -> list[str]:
    """Differences between the ``ood`` evaluator's tables and their re-derivation (``advopenood verify``): every row
    ``run.json`` and the scores imply, so a missing or extra row is a difference, as a changed number is."""
    from advopenood.plugin import compare

    ood = run.table("ood.csv", [*KEYS, "positives"])
    lines = expected_positives(run, ood)
    draws: Draws = {}
    rederived = rederive_ood(run, ood, draws)
    scored = ood["detector"].isin(run.detectors)
    aim = ["aimed_at"] if "aimed_at" in ood else []  # a run written before the column: not compared
    if aim:
        ood = ood.assign(aimed_at=ood["aimed_at"].map(lambda v: "" if pd.isna(v) else str(v)))
    lines += compare(rederived, ood[scored], KEYS, [*METRICS, *BOUNDS, "ci", "n_id", "n_ood", *aim], atol=1e-6,
                     table="ood.csv")
    lines += compare(unscored_rows(run, KEYS), ood[~scored], KEYS, [], table="ood.csv")
    means: Means = {}
    board_of = rederive_leaderboard(rederived[rederived["detector"].isin(run.detectors)], draws, run, means)
    boards: list[pd.DataFrame] = []

    def check_board(board: pd.DataFrame) -> list[str]:
        boards.append(board)
        if "id_acc_lo" in board:  # the ID accuracy's Wilson interval, from its value and the ID images
            acc = board[["detector", "id_acc", "id_acc_lo", "id_acc_hi"]].copy()
            n = int(rederived["n_id"].max()) if len(rederived) else 0
            got = [ci_plan(run).wilson(int(round(float(a) * n / 100)), n) if not pd.isna(a) else (math.nan,) * 2
                   for a in acc["id_acc"]]
            acc["id_acc_lo"], acc["id_acc_hi"] = [g[0] for g in got], [g[1] for g in got]
            own = compare(acc, board, ["detector"], ["id_acc_lo", "id_acc_hi"], atol=1e-6, table="leaderboard.csv")
        else:
            own = []
        means = [f"{g}_{m}" for g in ("near", "far", "adv") for m in ("fpr95", "auroc")]
        mine = board["detector"].isin(run.detectors)
        return compare(board_of, board[mine], ["detector"], [*means, *[f"{c}_{end}" for c in means for end in
                                                                        ("lo", "hi")], "n_near", "n_far", "n_adv",
                                                                        "near_sets", "far_sets", "adv_sets"],
                       atol=1e-6, table="leaderboard.csv") + own + \
            compare(unscored_rows(run, ["detector"]), board[~mine], ["detector"], [], table="leaderboard.csv")

    lines += _checked(run, "leaderboard.csv", check_board, ["detector"])
    lines += verify_paired(run, rederived, boards[0] if boards else None, board_of if boards else None)
    lines += _checked(run, "table_ood.csv", lambda t: compare(rederive_table_ood(rederived, draws, run, means),
                                                              written_long(t, run.detectors), ["detector", "column"],
                                                              ["value"], atol=1e-6, table="table_ood.csv"), ["detector"])
    adaptive = rederive_table_adaptive(run, rederived)
    if len(adaptive) or run.has("table_adaptive.csv"):
        lines += _checked(run, "table_adaptive.csv", lambda t: compare(
            adaptive, t[t["detector"].isin(run.detectors)], ["detector", "attack"], ["baseline", *ADAPTIVE_VALUES,
                                                                                     "n_ood"], atol=1e-6,
            table="table_adaptive.csv"), ["detector"])
    fsood = rederive_fsood(run, rederived)
    if len(fsood) or run.has("fsood.csv"):
        lines += _checked(run, "fsood.csv", lambda t: compare(fsood, t, ["detector", "ood_set"],
                                                              [*METRICS, *BOUNDS, "ci", "csid_sets"], atol=1e-6,
                                                              table="fsood.csv"))
    return lines
