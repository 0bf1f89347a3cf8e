"""The ``ood`` evaluator: FPR95 / AUROC / AUPR of every detector on natural OOD sets and adversarial sets.

Follows OpenOOD's convention (:mod:`advopenood.evaluation.metrics`): OOD is the positive class, scores are
confidences (higher = more ID), and adversarial examples count as OOD. Which adversarial examples are the
positives is the protocol's choice (:mod:`advopenood.config.protocols`), written in the ``positives`` column:
``successful`` (protocol ``strong``: the examples whose attack succeeded, ``advset.records.success``, i.e.
``adv_pred != y``) or ``all`` (protocol ``lorenz2024``: "all attacked test images", as the paper's Table 4 is
computed). ``n_ood`` records how many there were. The perturbed images of an OOD->ID attack
(``adaptive_ood_<det>``) are all OOD, so all of them are positives. The ID side of a robust AUROC
(``robust_id_<det>``, :class:`~advopenood.capabilities.IdNegatives`) perturbs ID images that stay ID: it has no
rows here (``robust_auroc.csv`` has them).

With detector-adaptive attacks in the run (``plugins/attacks/adaptive.py``), ``table_adaptive.{csv,md}`` puts each
detector's AUROC/FPR95 under its own adaptive attack next to the classifier-only attack: ``pgd`` at the same
eps for ``adaptive_<det>``, the clean natural OOD set for ``adaptive_ood_<det>``.

Every row carries its ``group`` (OpenOOD v1.5's, :mod:`advopenood.data.benchmarks`): ``near`` / ``far`` for
near- and far-OOD sets, ``csid`` for covariate-shifted ID sets (their row is ID vs the shifted set, a number
OpenOOD does not report: how strongly a detector flags covariate shift), ``adversarial`` for adversarial sets
and ``other`` for a natural set outside OpenOOD's benchmark for the run's ID set (e.g. Fashion-MNIST for
CIFAR-10). A data entry's ``group`` key wins; otherwise the set's name is looked up for ``data.dataset``.

``leaderboard.{csv,md}`` puts, per detector, OpenOOD's columns (near-OOD and far-OOD FPR95/AUROC, each the mean
over the group's sets as OpenOOD's ``nearood``/``farood`` rows, and ID accuracy) next to the adversarial ones
(the mean over the adversarial sets). With csid sets in the run, ``fsood.csv`` gives OpenOOD's full-spectrum
rows (``Evaluator.eval_ood(fsood=True)``: the ID side is the ID test set and every csid set concatenated, the
OOD side each near/far set) and the leaderboard adds their group means and ``csid_acc`` (accuracy over the ID
test set and the csid sets together, ``eval_acc('csid')``). ``leaderboard_openood.json`` holds the same rows as
entries of OpenOOD's leaderboard (``model_info/*.json`` of its ``leaderboard`` branch) with the adversarial and
robust AUROCs and the run's provenance as fields of ours (:mod:`advopenood_plugins.evaluators.ood.leaderboard`).

Report: the ``OOD detection`` section (AUROC and FPR95 matrices, readings generated from them, the AUROC heatmap
and one detector's ROC curves, ``plots/auroc_heatmap.png`` and ``plots/roc_<detector>.png``: ``msp`` if scored,
else the first detector by name) and, with adaptive sets, ``Detector-adaptive attacks`` (``report.py``).

Writes ``scores/<detector>.npz`` (atomically) with one float64 array of confidences per set (``id``, each
natural OOD set, each attack, in sample order) and, per attack, the boolean ``<attack>.success`` mask, so
every metric can be recomputed with :func:`advopenood.evaluation.metrics.ood_metrics`.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch

from advopenood.plugin import (ADVERSARIAL, PLOT_DIR, Headline, Results, RunContext, Section, Supplied, Verifiable,
                               as_written, bound_columns, cell_key, guarded, is_detector_aware, make_loader,
                               mean_interval, register, registry, supplied)
from advopenood_plugins.evaluators.ood.headline import HEADLINE, headline_section, transfer_section
from advopenood_plugins.evaluators.ood.leaderboard import openood_entries
from advopenood_plugins.evaluators.ood.report import (adaptive_section, leaderboard_section, ood_plots, ood_section,
                                                      with_positives)
from advopenood_plugins.kit.ood import (METRICS, NAN_METRICS, SET_GROUPS, Replicates, metric_row,  # noqa: F401
                                        aimed_at, mean_sources, set_groups, transfer_rows)
from advopenood_plugins.kit.ensemble import ENSEMBLE
from advopenood_plugins.kit.robust import ROBUST_TABLE
from advopenood_plugins.kit.paired import (FSOOD_RANKED, RANKED, add_ranks, paired_section, paired_table,
                                           rank_replicates)
from advopenood_plugins.evaluators.ood.verify import verify as verify_ood

ADAPTIVE_COLUMNS = ["detector", "attack", "eps", "baseline", *bound_columns(["auroc_baseline", "auroc_adaptive"]),
                    "delta_auroc", *bound_columns(["fpr95_baseline", "fpr95_adaptive"]), "n_ood", "ci"]
#: ``table_adaptive.csv``'s ``ci``: each metric's interval is its ``ood.csv`` cell's; the difference has none
ADAPTIVE_CI = "as ood.csv's cells; delta_auroc: no interval (the two sets' cells are resampled apart, not paired)"
#: each metric followed by its 95 % interval (``<m>_lo``, ``<m>_hi``), then the interval's method
METRIC_COLUMNS = [*bound_columns(METRICS), "ci"]
COLUMNS = ["dataset", "arch", "attack", "eps", "detector", "backend", "ood_set", "group", *METRIC_COLUMNS,
           "n_id", "n_ood", "positives", "aimed_at", "protocol", "error"]
FSOOD_COLUMNS = ["dataset", "arch", "detector", "backend", "ood_set", "group", *METRIC_COLUMNS,
                 "n_id", "n_ood", "csid_sets", "protocol", "error"]
LEADERBOARD_COLUMNS = ["dataset", "arch", "detector", "backend", *bound_columns(["id_acc"]),
                       *bound_columns(["near_fpr95", "near_auroc", "far_fpr95", "far_auroc", "adv_fpr95", "adv_auroc"]),
                       "n_near", "n_far", "n_adv", "near_sets", "far_sets", "adv_sets", "ci",
                       *[c for m in RANKED for c in (f"{m}_rank", f"{m}_rank_worst")]]
FSOOD_LEADERBOARD_COLUMNS = ["csid_acc", *bound_columns(["fsood_near_fpr95", "fsood_near_auroc", "fsood_far_fpr95",
                                                         "fsood_far_auroc"]),
                             *[c for m in FSOOD_RANKED for c in (f"{m}_rank", f"{m}_rank_worst")]]


def pivot_table(df: pd.DataFrame, replicates: Replicates | None = None,
                shared: Callable[[str, list[str]], dict[str, tuple[float, float]]] | None = None) -> pd.DataFrame:
    """Paper-style table (Table 4): one row per detector, columns ``<dataset> <attack> FPR95`` / ``AUROC``, each
    followed by its 95 % interval, ``... lo`` / ``... hi``.

    Attack ``none`` is the mean over the natural OOD sets; a NaN in any of them stays NaN. A cell of one set has
    that set's ``ood.csv`` interval; a mean of several, ``shared(detector, sets)`` where given (the sets' shared ID
    images resampled once per replicate, :func:`mean_bounds`, as the leaderboard's means), else the interval of the
    mean of their bootstrap replicates (:func:`advopenood.evaluation.intervals.mean_interval`; empty without them).
    """
    if df.empty:
        return pd.DataFrame({"detector": []})
    detectors = list(dict.fromkeys(df["detector"]))
    cells: dict[str, dict[str, float]] = {}
    for (dataset, attack), part in df.groupby(["dataset", "attack"], sort=False):
        for metric, title in (("fpr95", "FPR95"), ("auroc", "AUROC")):
            col = f"{dataset} {attack} {title}"
            cells[col], cells[f"{col} lo"], cells[f"{col} hi"] = {}, {}, {}
            for det in detectors:
                rows = part[part["detector"] == det]
                cells[col][det] = float(rows[metric].mean(skipna=False)) if len(rows) else math.nan
                lo, hi = _cell_bounds(rows, det, metric, replicates or {})
                if shared is not None and len(rows) > 1:
                    lo, hi = shared(det, list(rows["ood_set"])).get(metric, (math.nan, math.nan))
                cells[f"{col} lo"][det], cells[f"{col} hi"][det] = lo, hi
    order = sorted(cells, key=lambda c: (c.split(" ")[0], c.split(" ")[1] != "none"))
    return pd.DataFrame({"detector": detectors, **{col: [cells[col][d] for d in detectors] for col in order}})


def _cell_bounds(rows: pd.DataFrame, det: str, metric: str, replicates: Replicates) -> tuple[float, float]:
    """A table_ood cell's interval (:func:`pivot_table`): one row's own bounds, a mean's from its replicates."""
    if len(rows) == 1:
        return float(rows[f"{metric}_lo"].iloc[0]), float(rows[f"{metric}_hi"].iloc[0])
    if not len(rows):
        return math.nan, math.nan
    return mean_interval([replicates.get(cell_key("ood", det, s), {}).get(metric, np.empty(0))
                          for s in rows["ood_set"]])


def _group_mean(part: pd.DataFrame, metric: str) -> float:
    """OpenOOD's group row: the mean over the group's sets (NaN when a set's metric is NaN or there is none)."""
    return float(part[metric].mean(skipna=False)) if len(part) else math.nan


def _group_cells(part: pd.DataFrame, prefix: str, keys: list[str], replicates: Replicates,
                 shared: dict[str, tuple[float, float]] | None = None) -> dict[str, float]:
    """``<prefix>_fpr95`` / ``<prefix>_auroc`` group means with their intervals: ``shared``'s where given (the
    sets' ID images resampled once for all of them,
    :meth:`~advopenood.evaluation.intervals.IntervalPolicy.shared_mean`),
    else the mean of the sets' own bootstrap replicates (:func:`advopenood.evaluation.intervals.mean_interval`;
    empty without replicates, e.g. under ``delong``). ``keys``: each row's cell key."""
    out: dict[str, float] = {}
    for metric in ("fpr95", "auroc"):
        parts = [replicates.get(k, {}).get(metric, np.empty(0)) for k in keys]
        lo, hi = mean_interval(parts) if len(part) else (math.nan, math.nan)
        if shared is not None:
            lo, hi = shared.get(metric, (math.nan, math.nan)) if len(part) else (math.nan, math.nan)
        out.update({f"{prefix}_{metric}": _group_mean(part, metric), f"{prefix}_{metric}_lo": lo,
                    f"{prefix}_{metric}_hi": hi})
    return out


def mean_bounds(ctx: RunContext, masks: dict[str, np.ndarray | None]
                ) -> Callable[[str, list[str]], dict[str, tuple[float, float]]]:
    """``bounds(detector, sets)``: the interval of a scored detector's mean over ``sets`` with every image its sets
    share, the ID images and each natural OOD set's images under all its attacked forms (:func:`mean_sources`),
    resampled once per replicate for all of them (:meth:`~advopenood.evaluation.intervals.IntervalPolicy.shared_mean`,
    cell key ``mean|<det>|<set>|<set>...``, the sets sorted: one mean, one interval in the leaderboard and in
    ``table_ood.csv``); ``masks``: each set's positive rows, as ``ood.csv`` used them. NaN for a detector without
    scores. Each mean is resampled once, however many tables ask for it."""
    done: dict[tuple[str, ...], dict[str, tuple[float, float]]] = {}

    def bounds(det: str, sets: list[str]) -> dict[str, tuple[float, float]]:
        scores, key = ctx.scores.get(det), (det, *sorted(sets))
        if scores is None or not sets:
            return {}
        if key not in done:
            oods = {s: scores[s] if masks.get(s) is None else scores[s][masks[s]] for s in key[1:]}
            done[key] = ctx.intervals.shared_mean(cell_key("mean", *key), scores["id"], oods,
                                                  sources=mean_sources(ctx, scores, key[1:], masks))
        return done[key]

    return bounds


def leaderboard(df: pd.DataFrame, id_acc: float, fsood: pd.DataFrame | None = None,
                csid_acc: float = math.nan, replicates: Replicates | None = None,
                shared: Callable[[str, list[str]], dict[str, tuple[float, float]]] | None = None,
                id_acc_bounds: tuple[float, float] = (math.nan, math.nan)) -> pd.DataFrame:
    """One row per detector: near/far-OOD FPR95 and AUROC means and ID accuracy (OpenOOD's columns) next to the
    mean over the adversarial sets, ``<group>_sets`` naming the sets each mean averages; with ``fsood`` rows, their
    near/far means and the csid accuracy. A mean's interval is ``shared(detector, sets)`` where given (its sets'
    shared ID images resampled once per replicate: :func:`mean_bounds`), else it comes from the cells'
    ``replicates`` (keys ``cell_key("ood"|"fsood", detector, ood_set)``). ``id_acc_bounds``: the ID accuracy's
    Wilson interval (``id_acc_lo`` / ``id_acc_hi``)."""
    reps = replicates or {}
    method = str(df["ci"].iloc[0]) if "ci" in df and len(df) else "none"
    rows = []
    for (dataset, arch, det, backend), part in df.groupby(["dataset", "arch", "detector", "backend"], sort=False):
        row: dict[str, Any] = {"dataset": dataset, "arch": arch, "detector": det, "backend": backend, "id_acc": id_acc,
                               "id_acc_lo": id_acc_bounds[0], "id_acc_hi": id_acc_bounds[1]}
        own = part[~transfer_rows(part)]  # a set aimed at another detector is a transfer result, not X's mean
        for group, prefix in (("near", "near"), ("far", "far"), (ADVERSARIAL, "adv")):
            sub = own[own["group"] == group]
            row.update(_group_cells(sub, prefix, [cell_key("ood", det, s) for s in sub["ood_set"]], reps,
                                    None if shared is None else shared(det, list(sub["ood_set"]))))
            row[f"n_{prefix}"] = len(sub)
            row[f"{prefix}_sets"] = ",".join(sorted(map(str, sub["ood_set"])))
        row["ci"] = method if method.startswith("bootstrap") else "none"
        if fsood is not None:
            fs = fsood[fsood["detector"] == det]
            row["csid_acc"] = csid_acc
            for group in ("near", "far"):
                sub = fs[fs["group"] == group]
                row.update(_group_cells(sub, f"fsood_{group}", [cell_key("fsood", det, s) for s in sub["ood_set"]],
                                        reps))
        rows.append(row)
    columns = LEADERBOARD_COLUMNS + (FSOOD_LEADERBOARD_COLUMNS if fsood is not None else [])
    return add_ranks(pd.DataFrame(rows, columns=columns), {**RANKED, **FSOOD_RANKED})


@torch.no_grad()
def accuracy_with(ctx: RunContext, names: list[str]) -> float:
    """Top-1 accuracy in percent over the ID test set and the natural sets ``names`` together (OpenOOD's
    ``eval_acc('csid')``); the ID predictions are the run's clean pass."""
    correct, total = int((ctx.clean.pred == ctx.clean.y).sum()), len(ctx.clean.y)
    for name in names:
        for x, y in make_loader(ctx.ood_sets[name], ctx.batch_size):
            correct += int((ctx.model(x.to(ctx.device)).argmax(1).cpu() == y).sum())
            total += len(y)
    return 100.0 * correct / total if total else math.nan


def _baseline(ctx: RunContext, adv, attacks: dict[str, str]) -> str | None:
    """The classifier-only counterpart of an adaptive set: the natural OOD set it perturbed (OOD->ID), else the
    ``pgd`` set with the same eps (ID->ID); None when the run has none."""
    if adv.source != "id":
        return adv.source
    for name, other in ctx.id_adv_sets.items():
        if attacks[name] == "pgd" and other.eps is not None and adv.eps is not None \
                and math.isclose(float(other.eps), float(adv.eps), rel_tol=1e-6):
            return name
    return None


def adaptive_table(df: pd.DataFrame, ctx: RunContext) -> pd.DataFrame:
    """One row per detector-adaptive set and its own detector: AUROC/FPR95 next to the classifier-only baseline,
    each with its ``ood.csv`` interval; ``ci`` (:data:`ADAPTIVE_CI`) says why their difference has none."""
    attacks = {name: adv.attack for name, adv in ctx.adv_sets.items()}
    rows = []
    for name, adv in ctx.positive_sets.items():
        cls = registry.get("attacks", adv.attack)
        target = cls.detector if is_detector_aware(cls) else None
        if not target or target not in set(df["detector"]):
            continue
        part = df[df["detector"] == target].set_index("ood_set")
        base = _baseline(ctx, adv, attacks)
        got = part.loc[name]
        ref = part.loc[base] if base is not None and base in part.index else None
        nan = math.nan
        row = {"detector": target, "attack": name, "eps": got["eps"], "baseline": base or "",
               "delta_auroc": nan if ref is None else got["auroc"] - ref["auroc"], "n_ood": got["n_ood"],
               "ci": ADAPTIVE_CI}
        for m in ("auroc", "fpr95"):  # each cell with its ood.csv interval
            for end in ("", "_lo", "_hi"):
                row[f"{m}_adaptive{end}"] = got[f"{m}{end}"]
                row[f"{m}_baseline{end}"] = nan if ref is None else ref[f"{m}{end}"]
        rows.append(row)
    return pd.DataFrame(rows, columns=ADAPTIVE_COLUMNS)


def ood_sections(ood: pd.DataFrame, paired: pd.DataFrame, board: pd.DataFrame, adaptive: pd.DataFrame,
                 figures: list[Path]) -> list[Section]:
    """The evaluator's report sections from its tables as written (``paired`` and ``adaptive`` empty where there
    are none) and its figures: the headline, OOD detection, the leaderboard, the paired comparisons and the
    detector-adaptive sets. The run builds them from the tables it writes, ``advopenood verify`` from the CSVs
    (:func:`report_sections`)."""
    sections = guarded(HEADLINE, lambda: [headline_section(ood, paired if len(paired) else None)])
    sections += guarded("Transfer: sets attacked to break another detector", lambda: transfer_section(ood))
    sections += guarded("OOD detection", lambda: [ood_section(ood, figures)])
    sections += guarded("Natural and adversarial robustness side by side", lambda: [leaderboard_section(board)])
    if len(paired):
        sections += guarded("Paired comparisons", lambda: [paired_section(paired)])
    if len(adaptive):
        sections += guarded("Detector-adaptive attacks", lambda: [adaptive_section(adaptive)])
    return sections


def report_sections(run: Any) -> list[Section]:
    """:func:`ood_sections` from a run folder (:class:`advopenood.evaluation.runfiles.RunFiles`, for ``advopenood
    verify``): ``ood.csv``, ``leaderboard.csv``, ``paired.csv`` and ``table_adaptive.csv`` (the last two where the
    folder has them) and the plots of :func:`ood_plots` that the folder holds."""
    tables = [run.table(n) if n in ("ood.csv", "leaderboard.csv") or run.has(n) else pd.DataFrame()
              for n in ("ood.csv", "paired.csv", "leaderboard.csv", "table_adaptive.csv")]
    detector = "msp" if "msp" in run.detectors else next(iter(run.detectors), "")
    figures = [run.path / PLOT_DIR / f for f in ("auroc_heatmap.png", f"roc_{detector}.png")
               if run.has(f"{PLOT_DIR}/{f}")]
    return ood_sections(*tables, figures)


@register("evaluators", "ood")
class OODEvaluator(Verifiable):
    """OOD metrics (FPR95, AUROC, AUPR-In/Out) of every detector vs natural OOD and adversarial sets."""

    verify = staticmethod(verify_ood)
    report_sections = staticmethod(report_sections)
    #: its headline: the AUROC of every detector on every set, general (it leads only a run whose other evaluators
    #: declare no headline)
    headline = Headline(HEADLINE, general=True)
    #: the shared tables it reads, computed once per run: the natural sets' groups, the robust table and the
    #: ensemble rows (the leaderboard's robust fields, :func:`~advopenood_plugins.kit.ensemble.robust_rows`)
    needs = (SET_GROUPS, ROBUST_TABLE, ENSEMBLE)

    def __init__(self, success_only: bool | None = None):
        """``success_only``: True = successful adversarial examples are the positives, False = all attacked
        images; None (default) = the run's protocol decides (``ood_positives``)."""
        self.success_only = None if success_only is None else bool(success_only)

    def _positives(self, ctx: RunContext, attack: str) -> np.ndarray | None:
        """The positive rows of an adversarial set (None = every row): the protocol's rule
        (:meth:`RunContext.ood_positives`), or successful / all rows when ``success_only`` says so."""
        adv = ctx.adv_sets[attack]
        successful = ctx.positives_rule == "successful" if self.success_only is None else self.success_only
        if adv.source != "id" or not successful:
            return None
        return ctx.ood_positives(attack) if self.success_only is None else ctx.success(attack)

    def __call__(self, ctx: RunContext, products: Supplied | None = None) -> Results:
        products = supplied(ctx, self, products)
        groups = products[SET_GROUPS]
        rows: list[dict[str, Any]] = []
        replicates: Replicates = {}
        detectors = list(ctx.scores) + [d for d in ctx.detector_errors if d not in ctx.scores]
        for det in detectors:
            rows += self._rows(ctx, det, replicates, groups)
        df = pd.DataFrame(rows, columns=COLUMNS)
        df["n_id"] = df["n_id"].astype("Int64")
        df["n_ood"] = df["n_ood"].astype("Int64")
        means = mean_bounds(ctx, {s: m for _, _, s, m in self._targets(ctx)})
        table = pivot_table(df[df["group"] != "csid"], replicates, means)  # "none": the natural sets' mean, not csid
        out = Results(tables={"ood.csv": df, "table_ood.csv": table, "table_ood.md": table})
        csid = [name for name, group in groups.items() if group == "csid"]
        fsood = self._fsood(ctx, groups, csid, replicates) if csid else None
        board = leaderboard(df, ctx.clean.accuracy, fsood, accuracy_with(ctx, csid) if csid else math.nan, replicates,
                            means,
                            ctx.intervals.wilson(int((ctx.clean.pred == ctx.clean.y).sum()), len(ctx.clean.y)))
        masks = {s: m for _, _, s, m in self._targets(ctx)}
        board = add_ranks(board, {**RANKED, **FSOOD_RANKED}, rank_replicates(ctx, masks, board), len(ctx.clean.y))
        robust, ensemble = products[ROBUST_TABLE], products[ENSEMBLE].rows
        robust = pd.concat([robust, ensemble], ignore_index=True) if len(robust) and len(ensemble) else robust
        out.tables.update({"leaderboard.csv": board, "leaderboard.md": board,
                           "leaderboard_openood.json": openood_entries(board, ctx, groups, robust)})
        if fsood is not None:
            out.tables["fsood.csv"] = fsood
        paired = paired_table(ctx, df, {ood_set: mask for _, _, ood_set, mask in self._targets(ctx)})
        out.tables["paired.csv"] = paired
        out.figures = ood_plots(df, with_positives(ctx), ctx.plot_dir)
        adaptive = adaptive_table(df, ctx)
        if len(adaptive):
            out.tables.update({"table_adaptive.csv": adaptive, "table_adaptive.md": adaptive})
        out.sections = ood_sections(*(as_written(t, ctx.protocol) for t in (df, paired, board, adaptive)), out.figures)
        return out

    def _fsood(self, ctx: RunContext, groups: dict[str, str], csid: list[str],
               replicates: Replicates) -> pd.DataFrame:
        """OpenOOD's full-spectrum rows: ID = the ID test set and every csid set, OOD = each near/far set."""
        rows = []
        for det, scores in ctx.scores.items():
            conf_id = np.concatenate([scores["id"]] + [scores[name] for name in csid])
            for name, group in groups.items():
                if group in ("near", "far"):
                    rows.append({"dataset": ctx.dataset, "arch": ctx.arch, "detector": det, "backend": ctx.backend_of(det),
                                 "ood_set": name, "group": group,
                                 **metric_row(conf_id, scores[name], ctx, cell_key("fsood", det, name), replicates),
                                 "csid_sets": ",".join(csid), "protocol": ctx.protocol})
        return pd.DataFrame(rows, columns=FSOOD_COLUMNS)

    def _targets(self, ctx: RunContext) -> list[tuple[str, float, str, np.ndarray | None]]:
        """``(attack, eps, ood_set, positive mask)`` for every natural OOD set and every adversarial set whose images
        count as OOD (:attr:`RunContext.positive_sets`: the ID side of a robust AUROC stays out)."""
        out: list[tuple[str, float, str, np.ndarray | None]] = [("none", math.nan, name, None) for name in ctx.ood_sets]
        for attack, adv in ctx.positive_sets.items():
            mask = self._positives(ctx, attack)
            out.append((attack, math.nan if adv.eps is None else float(adv.eps), attack, mask))
        return out

    def _rows(self, ctx: RunContext, det: str, replicates: Replicates, groups: dict[str, str]
              ) -> list[dict[str, Any]]:
        head = {"dataset": ctx.dataset, "arch": ctx.arch, "detector": det, "backend": ctx.backend_of(det)}
        scores = ctx.scores.get(det)
        rows = []
        for attack, eps, ood_set, mask in self._targets(ctx):
            positives = "natural" if attack == "none" else ("all" if mask is None else "successful")
            row = {**head, "attack": attack, "eps": eps, "ood_set": ood_set,
                   "group": groups[ood_set] if attack == "none" else ADVERSARIAL, "positives": positives,
                   "aimed_at": "" if attack == "none" else aimed_at(ctx.adv_sets[attack].attack),
                   "protocol": ctx.protocol}
            if scores is None:
                n_ood = int(mask.sum()) if mask is not None else len(ctx.ood_sets[ood_set])
                rows.append({**row, **NAN_METRICS, "n_id": len(ctx.id_set), "n_ood": n_ood, "ci": "none",
                             "error": ctx.detector_errors[det]})
                continue
            conf_ood = scores[ood_set]
            if mask is not None:
                if len(mask) != len(conf_ood):
                    rows.append({**row, **NAN_METRICS, "n_id": len(scores["id"]), "n_ood": len(conf_ood), "ci": "none",
                                 "error": f"{len(conf_ood)} scores for {len(mask)} adversarial examples"})
                    continue
                conf_ood = conf_ood[mask]
            key = cell_key("ood", det, ood_set)
            rows.append({**row, **metric_row(scores["id"], conf_ood, ctx, key, replicates)})
        return rows
