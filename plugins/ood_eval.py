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

With detector-adaptive attacks in the run (``plugins/adaptive.py``), ``table_adaptive.{csv,md}`` puts each
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
robust AUROCs and the run's provenance as fields of ours (:mod:`advopenood_plugins.leaderboard_json`).

Report: the ``OOD detection`` section (AUROC and FPR95 matrices, readings generated from them, the AUROC heatmap
and one detector's ROC curves, ``plots/auroc_heatmap.png`` and ``plots/roc_<detector>.png``: ``msp`` if scored,
else the first detector by name) and, with adaptive sets, ``Detector-adaptive attacks``.

Writes ``scores/<detector>.npz`` (atomically) with one float64 array of confidences per set (``id``, each
natural OOD set, each attack, in sample order) and, per attack, the boolean ``<attack>.success`` mask, so
every metric can be recomputed with :func:`advopenood.evaluation.metrics.ood_metrics`.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from advopenood import io as aio
from advopenood.capabilities import Verifiable, is_detector_aware
from advopenood import registry
from advopenood.evaluation.context import RunContext
from advopenood.data.datasets import dataset_name, make_loader
from advopenood.evaluation.intervals import bound_columns, cell_key, ci_label, mean_interval, metric_intervals
from advopenood.evaluation.metrics import MIN_CONCLUSIVE, Z95, hanley_mcneil_se, ood_metrics
from advopenood.data.benchmarks import ADVERSARIAL, natural_group
from advopenood.outputs.results import Bullets, Figure, Paragraph, Results, Section, Table, as_written, guarded
from advopenood.outputs.plots import chance_mask, ood_matrix, plot_auroc_heatmap, plot_roc, roc_sets
from advopenood.registry import register
from advopenood_plugins.leaderboard_json import openood_entries
from advopenood_plugins.paired import FSOOD_RANKED, RANKED, add_ranks, paired_section, paired_table
from advopenood_plugins.robust_auroc import robust_table
from advopenood_plugins.verify_ood import verify as verify_ood
from advopenood.outputs.report import CHANCE, join
from advopenood.outputs.report import name as label

ADAPTIVE_COLUMNS = ["detector", "attack", "eps", "baseline", "auroc_baseline", "auroc_adaptive", "delta_auroc",
                    "fpr95_baseline", "fpr95_adaptive", "n_ood"]
METRICS = ("fpr95", "auroc", "aupr_in", "aupr_out")
#: each metric followed by its 95 % interval (``<m>_lo``, ``<m>_hi``), then the interval's method
METRIC_COLUMNS = [*bound_columns(METRICS), "ci"]
COLUMNS = ["dataset", "arch", "attack", "eps", "detector", "backend", "ood_set", "group", *METRIC_COLUMNS,
           "n_id", "n_ood", "positives", "protocol", "error"]
FSOOD_COLUMNS = ["dataset", "arch", "detector", "backend", "ood_set", "group", *METRIC_COLUMNS,
                 "n_id", "n_ood", "csid_sets", "protocol", "error"]
LEADERBOARD_COLUMNS = ["dataset", "arch", "detector", "backend", "id_acc",
                       *bound_columns(["near_fpr95", "near_auroc", "far_fpr95", "far_auroc", "adv_fpr95", "adv_auroc"]),
                       "n_near", "n_far", "n_adv", "ci", *[f"{m}_rank" for m in RANKED]]
FSOOD_LEADERBOARD_COLUMNS = ["csid_acc", *bound_columns(["fsood_near_fpr95", "fsood_near_auroc", "fsood_far_fpr95",
                                                         "fsood_far_auroc"]), *[f"{m}_rank" for m in FSOOD_RANKED]]
NAN_METRICS = {m: math.nan for m in METRICS}
#: bootstrap replicates per cell key (:func:`advopenood.evaluation.intervals.cell_key`), for the group means
Replicates = dict[str, dict[str, np.ndarray]]


def metric_row(conf_id: np.ndarray, conf_ood: np.ndarray, ctx: RunContext | None = None, key: str = "",
               replicates: Replicates | None = None) -> dict[str, Any]:
    """Metrics in percent, each with its 95 % interval (``<m>_lo``, ``<m>_hi``: the run's ``ci`` plan, seeded by
    the run seed and ``key``; none without ``ctx``), ``ci``, ``n_id``, ``n_ood`` and ``error`` (NaN metrics and the
    reason when undefined; empty bounds and the reason when a side has fewer than 2 images). The cell's bootstrap
    replicates go into ``replicates[key]`` when given."""
    method = ctx.plan.ci.method if ctx is not None else "none"
    resamples = ctx.plan.ci.resamples if ctx is not None else 0
    base = {"n_id": len(conf_id), "n_ood": len(conf_ood), "error": "", "ci": ci_label(method, resamples)}
    try:
        values = ood_metrics(conf_id, conf_ood)
    except ValueError as exc:  # NaN scores or an empty side: reported in the row, never averaged away
        values, base["error"] = NAN_METRICS, str(exc)
    bounds, reps, reason = metric_intervals(conf_id, conf_ood, method, ctx.seed if ctx is not None else 0, key,
                                            resamples)
    if replicates is not None:
        replicates[key] = reps
    base["error"] = base["error"] or reason
    return {**values, **bounds, **base}


def pivot_table(df: pd.DataFrame) -> pd.DataFrame:
    """Paper-style table (Table 4): one row per detector, columns ``<dataset> <attack> FPR95`` / ``AUROC``.

    Attack ``none`` is the mean over the natural OOD sets; a NaN in any of them stays NaN.
    """
    if df.empty:
        return pd.DataFrame({"detector": []})
    detectors = list(dict.fromkeys(df["detector"]))
    cells: dict[str, dict[str, float]] = {}
    for (dataset, attack), part in df.groupby(["dataset", "attack"], sort=False):
        for metric, title in (("fpr95", "FPR95"), ("auroc", "AUROC")):
            means = part.groupby("detector", sort=False)[metric].agg(lambda s: s.mean(skipna=False))
            cells[f"{dataset} {attack} {title}"] = {d: float(means.get(d, math.nan)) for d in detectors}
    order = sorted(cells, key=lambda c: (c.split(" ")[0], c.split(" ")[1] != "none"))
    return pd.DataFrame({"detector": detectors, **{col: [cells[col][d] for d in detectors] for col in order}})


def set_groups(ctx: RunContext) -> dict[str, str]:
    """Group of every natural set of the run: the data entry's ``group``, else OpenOOD v1.5's for
    ``data.dataset`` (:func:`advopenood.data.benchmarks.natural_group`)."""
    data = ctx.plan.data
    declared = {dataset_name(spec): spec.group for spec in data.ood}
    return {name: declared.get(name) or natural_group(data.dataset or ctx.dataset, name) for name in ctx.ood_sets}


def _group_mean(part: pd.DataFrame, metric: str) -> float:
    """OpenOOD's group row: the mean over the group's sets (NaN when a set's metric is NaN or there is none)."""
    return float(part[metric].mean(skipna=False)) if len(part) else math.nan


def _group_cells(part: pd.DataFrame, prefix: str, keys: list[str], replicates: Replicates) -> dict[str, float]:
    """``<prefix>_fpr95`` / ``<prefix>_auroc`` group means with their intervals: the mean of the sets' bootstrap
    replicates (:func:`advopenood.evaluation.intervals.mean_interval`; empty without replicates, e.g. under
    ``delong``). ``keys``: each row's cell key."""
    out: dict[str, float] = {}
    for metric in ("fpr95", "auroc"):
        parts = [replicates.get(k, {}).get(metric, np.empty(0)) for k in keys]
        lo, hi = mean_interval(parts) if len(part) else (math.nan, math.nan)
        out.update({f"{prefix}_{metric}": _group_mean(part, metric), f"{prefix}_{metric}_lo": lo,
                    f"{prefix}_{metric}_hi": hi})
    return out


def leaderboard(df: pd.DataFrame, id_acc: float, fsood: pd.DataFrame | None = None,
                csid_acc: float = math.nan, replicates: Replicates | None = None) -> pd.DataFrame:
    """One row per detector: near/far-OOD FPR95 and AUROC means and ID accuracy (OpenOOD's columns) next to the
    mean over the adversarial sets; with ``fsood`` rows, their near/far means and the csid accuracy. Each mean's
    interval comes from the cells' ``replicates`` (keys ``cell_key("ood"|"fsood", detector, ood_set)``)."""
    reps = replicates or {}
    method = str(df["ci"].iloc[0]) if "ci" in df and len(df) else "none"
    rows = []
    for (dataset, arch, det, backend), part in df.groupby(["dataset", "arch", "detector", "backend"], sort=False):
        row: dict[str, Any] = {"dataset": dataset, "arch": arch, "detector": det, "backend": backend, "id_acc": id_acc}
        for group, prefix in (("near", "near"), ("far", "far"), (ADVERSARIAL, "adv")):
            sub = part[part["group"] == group]
            row.update(_group_cells(sub, prefix, [cell_key("ood", det, s) for s in sub["ood_set"]], reps))
            row[f"n_{prefix}"] = len(sub)
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
    """One row per detector-adaptive set and its own detector: AUROC/FPR95 next to the classifier-only baseline."""
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
        rows.append({"detector": target, "attack": name, "eps": got["eps"], "baseline": base or "",
                     "auroc_baseline": nan if ref is None else ref["auroc"], "auroc_adaptive": got["auroc"],
                     "delta_auroc": nan if ref is None else got["auroc"] - ref["auroc"],
                     "fpr95_baseline": nan if ref is None else ref["fpr95"], "fpr95_adaptive": got["fpr95"],
                     "n_ood": got["n_ood"]})
    return pd.DataFrame(rows, columns=ADAPTIVE_COLUMNS)


# ------------------------------------------------------------------------------------------------- report

def compare_natural_adversarial(nat: float, adv: float) -> str:
    """The sentence comparing mean AUROC on natural OOD sets (``nat``) with that under attack (``adv``); its
    verb and reading follow the sign of the difference (as shown, to one decimal)."""
    nat_s, adv_s = f"{nat:.1f}", f"{adv:.1f}"
    if nat_s == adv_s:
        return (f"Averaged over detectors, AUROC is {nat_s} both on natural OOD sets and under attack: the attacks "
                "are as hard to detect as natural OOD.")
    if adv < nat:
        return (f"Averaged over detectors, AUROC falls from {nat_s} on natural OOD sets to {adv_s} under attack: "
                "adversarial examples evade the detectors more than natural OOD does.")
    return (f"Averaged over detectors, AUROC rises from {nat_s} on natural OOD sets to {adv_s} under attack: here "
            "the detectors flag adversarial examples more readily than natural OOD.")


def _sizes(ood: pd.DataFrame, sets: list[str]) -> tuple[int, int] | None:
    """The fewest ID and OOD images behind the cells of ``sets`` (None when the table has no ``n_id``/``n_ood``)."""
    if not {"n_id", "n_ood"} <= set(ood.columns):
        return None
    part = ood[ood["ood_set"].isin(sets)][["n_id", "n_ood"]].dropna()
    return (int(part["n_id"].min()), int(part["n_ood"].min())) if len(part) else None


def _too_few(where: str, sizes: tuple[int, int] | None, scores: pd.Series, what: str = "AUROC") -> str | None:
    """The reading for a set whose sample is below :data:`MIN_CONCLUSIVE` per side: the range only, and that the
    sample is too small to conclude (None when the sample is large enough or its size unknown)."""
    if sizes is None or min(sizes) >= MIN_CONCLUSIVE:
        return None
    n_id, n_ood = sizes
    half = 100 * Z95 * hanley_mcneil_se(0.5, n_id, n_ood)
    lo, hi = scores.idxmin(), scores.idxmax()
    spread = (f"{what} {scores[hi]:.1f} ({label(hi)})" if lo == hi else
              f"{what} ranges from {scores[lo]:.1f} ({label(lo)}) to {scores[hi]:.1f} ({label(hi)})")
    return (f"{where}, {n_id} ID and {n_ood} OOD images are too few to conclude (fewer than {MIN_CONCLUSIVE} per "
            f"side; a 95 % interval on an AUROC near chance spans about +-{half:.0f} points): {spread}.")


def _below_chance(scores: pd.Series, sizes: tuple[int, int] | None) -> list[str]:
    """Detectors below chance: AUROC < 50 and, when the sample sizes are known, the upper end of its 95 %
    interval (Hanley-McNeil) below 50 too."""
    def below(auc: float) -> bool:
        if sizes is None:
            return auc < CHANCE
        return auc + 100 * Z95 * hanley_mcneil_se(auc / 100, *sizes) < CHANCE

    return [label(d) for d in scores.index if below(float(scores[d]))]


def read_ood(ood: pd.DataFrame) -> list[str]:
    """Natural sets: the best and worst detector by mean AUROC and any below chance; per attack: which
    detectors fall below chance (AUROC < 50 with the upper end of its 95 % interval below 50 too), or the best and
    worst; and the mean AUROC from natural OOD sets to adversarial sets (:func:`compare_natural_adversarial`).
    A set with fewer than :data:`MIN_CONCLUSIVE` images on a side gets its range and "too few to conclude"
    instead (:func:`_too_few`)."""
    table = ood_matrix(ood, "auroc")
    if table.empty:
        return []
    n_nat = table.attrs["n_natural"]
    natural, attacks = table.iloc[:, :n_nat], table.iloc[:, n_nat:]
    out, small = [], False
    if natural.shape[1]:
        mean = natural.mean(axis=1, skipna=False).dropna()
        sets = ", ".join(map(str, natural.columns))
        sizes = _sizes(ood, list(natural.columns))
        few = _too_few(f"On natural OOD sets ({sets})", sizes, mean, "mean AUROC") if len(mean) else None
        small |= few is not None
        if few:
            out.append(few)
        elif len(mean) == 1:
            out.append(f"On natural OOD sets ({sets}), {label(mean.index[0])} reaches a mean AUROC of {mean.iloc[0]:.1f}.")
        elif len(mean):
            best, worst = mean.idxmax(), mean.idxmin()
            out.append(f"On natural OOD sets ({sets}), {label(best)} is the best detector (mean AUROC {mean[best]:.1f}) "
                       f"and {label(worst)} the worst ({mean[worst]:.1f}).")
        below = [] if few else _below_chance(mean, sizes)
        if below:
            verb = "scores" if len(below) == 1 else "score"
            out.append(f"{join(below)} {verb} below chance on natural OOD (mean AUROC < 50): OOD images look more "
                       "in-distribution to them than ID images.")
    for col in attacks.columns:
        scores = attacks[col].dropna()
        if not len(scores):
            continue
        sizes = _sizes(ood, [col])
        few = _too_few(f"On {label(col)}", sizes, scores)
        small |= few is not None
        if few:
            out.append(few)
            continue
        below = _below_chance(scores, sizes)
        near = [label(d) for d in scores.index if scores[d] < CHANCE and label(d) not in below]
        within = (f"; {join(near)} {'is' if len(near) == 1 else 'are'} below 50 but within the 95 % interval of "
                  "chance") if near else ""
        best = scores.idxmax()
        if len(below) == len(scores):
            out.append(f"On {label(col)} every detector falls below chance (AUROC < 50): adversarial examples look "
                       f"more in-distribution than clean images; the best is {label(best)} ({scores[best]:.1f}).")
        elif below:
            verb = "falls" if len(below) == 1 else "fall"
            out.append(f"{join(below)} {verb} below chance (AUROC < 50) on {label(col)}; the best is {label(best)} "
                       f"(AUROC {scores[best]:.1f}){within}.")
        else:
            worst = scores.idxmin()
            out.append(f"No detector falls below chance on {label(col)}; the best is {label(best)} (AUROC "
                       f"{scores[best]:.1f}) and the worst {label(worst)} ({scores[worst]:.1f}){within}.")
    if natural.shape[1] and attacks.shape[1]:
        nat, adv = natural.stack().mean(), attacks.stack().mean()
        if not (math.isnan(nat) or math.isnan(adv)):
            line = compare_natural_adversarial(float(nat), float(adv))
            out.append(f"{line[:-1]} (in this sample only: too few images to conclude)." if small else line)
    return out


def read_adaptive(table: pd.DataFrame) -> list[str]:
    """One reading per detector-adaptive set: its detector's AUROC against the classifier-only baseline."""
    out = []
    for r in table.to_dict("records"):
        if pd.isna(r["auroc_baseline"]):
            out.append(f"{r['attack']}: {label(r['detector'])} reaches AUROC {r['auroc_adaptive']:.1f} "
                       "(no classifier-only baseline in this run).")
        else:
            out.append(f"{r['attack']}: {label(r['detector'])}'s AUROC goes from {r['auroc_baseline']:.1f} "
                       f"({label(r['baseline'])}) to {r['auroc_adaptive']:.1f} when the attack adapts to it "
                       f"({r['delta_auroc']:+.1f} points).")
    return out


def positives_phrase(ood: pd.DataFrame) -> str:
    """Which adversarial images were the positives, from the table's ``positives`` column."""
    rules = set(ood.loc[ood["group"] == ADVERSARIAL, "positives"]) if len(ood) else set()
    phrases = {"successful": "the successful adversarial examples", "all": "every attacked image, successful or not"}
    said = [phrases[r] for r in ("successful", "all") if r in rules]
    return "the positives are " + (" or ".join(said) + ", per the positives column" if len(said) > 1 else
                                   said[0] if said else "the adversarial examples")


def interval_matrix(ood: pd.DataFrame, metric: str) -> pd.DataFrame:
    """:func:`ood_matrix` of ``metric`` for the report, each cell with its 95 % interval as ``85.2 [80.1, 89.9]``
    (one decimal; the value alone when the interval is empty; the CSVs keep separate columns)."""
    table = ood_matrix(ood, metric)
    if table.empty or f"{metric}_lo" not in ood:
        return table
    lo, hi = ood_matrix(ood, f"{metric}_lo"), ood_matrix(ood, f"{metric}_hi")

    def cell(value: float, low: float, high: float) -> float | str:
        if math.isnan(value):
            return math.nan
        return f"{value:.1f}" if math.isnan(low) or math.isnan(high) else f"{value:.1f} [{low:.1f}, {high:.1f}]"

    out = pd.DataFrame({c: [cell(*v) for v in zip(table[c], lo[c], hi[c])] for c in table.columns}, index=table.index)
    out.attrs = table.attrs
    return out


def ood_section(ood: pd.DataFrame, figures: list[Path]) -> Section:
    """``OOD detection``: AUROC and FPR95 per detector and set, their readings, rows left empty, ``figures``."""
    items: list[Any] = [Paragraph(f"Adversarial examples count as OOD ({positives_phrase(ood)}); AUROC "
                                  "and FPR95 in percent, OpenOOD's conventions, each with its 95 % interval in "
                                  "brackets where the run computed one. AUROC below 50 means the detector rates "
                                  "adversarial examples as more in-distribution than clean images.")]
    if not ood.empty:
        items += [Table(interval_matrix(ood, "auroc"), "AUROC (%)"), Table(interval_matrix(ood, "fpr95"), "FPR95 (%)"),
                  Bullets(read_ood(ood))]
        errors = ood[ood["error"].astype("string").fillna("") != ""] if "error" in ood else ood.iloc[:0]
        if len(errors):
            items.append(Bullets([f"{label(r['detector'])} on {label(r['ood_set'])}: {r['error']}"
                                  for r in errors.to_dict("records")], "metrics left empty"))
    return Section("OOD detection", items + [Figure(p, ood_figure_caption(Path(p))) for p in figures])


def ood_figure_caption(path: Path) -> str:
    """What a figure of :func:`ood_plots` shows, from its file name."""
    if path.stem == "auroc_heatmap":
        return ("AUROC (%) of each detector (rows) against each natural OOD and adversarial set (columns): white is "
                "chance (50), red below, green above; grey cells have no value; hatched cells marked ~ have a 95 % "
                "interval that contains 50 (not shown to differ from chance)")
    detector = path.stem.removeprefix("roc_")
    return (f"ROC curves of {label(detector)}: ID test images against each set (OOD positive; adversarial sets solid, "
            "natural OOD sets dashed), each set's AUROC (%) in the legend")


def adaptive_section(table: pd.DataFrame) -> Section:
    """``Detector-adaptive attacks``: each adaptive set's AUROC/FPR95 next to its classifier-only baseline."""
    return Section("Detector-adaptive attacks", [
        Paragraph("Each adaptive set attacks one detector through its differentiable score (BPDA where needed); its "
                  "AUROC/FPR95 (%) sit next to the classifier-only baseline: PGD at the same eps for ID->ID evasion, "
                  "the clean natural OOD set for OOD->ID."),
        Table(table), Bullets(read_adaptive(table))])


def with_positives(ctx: RunContext) -> dict[str, dict[str, np.ndarray]]:
    """Each detector's confidences with every adversarial set's ``<set>.positive`` mask, as ``scores/*.npz``
    holds them, without the sets whose images are no OOD positives (:attr:`RunContext.positive_sets`)."""
    masks = {f"{name}.positive": ctx.ood_positives(name) for name in ctx.positive_sets}
    negatives = set(ctx.adv_sets) - set(ctx.positive_sets)
    return {det: {**{k: v for k, v in by_set.items() if k not in negatives}, **masks} for det, by_set in ctx.scores.items()}


def ood_plots(ood: pd.DataFrame, scores: dict[str, dict[str, np.ndarray]], plot_dir: Path,
              detector: str = "msp") -> list[Path]:
    """The AUROC heatmap (when ``ood`` holds an AUROC) and the ROC curves of ``detector`` (else the first
    scored detector by name) from its ``scores/<detector>.npz`` arrays; returns the paths written."""
    written: list[Path] = []
    if not ood.empty and ood["auroc"].notna().any():
        path = Path(plot_dir) / "auroc_heatmap.png"
        aio.save_figure(plot_auroc_heatmap(ood, chance_mask(ood)), path)
        written.append(path)
    chosen = detector if detector in scores else next(iter(sorted(scores)), None)
    if chosen is not None and "id" in scores[chosen]:
        conf_id, conf_ood, adversarial = roc_sets(scores[chosen])
        if conf_ood:
            path = Path(plot_dir) / f"roc_{chosen}.png"
            aio.save_figure(plot_roc(conf_id, conf_ood, chosen, adversarial), path)
            written.append(path)
    return written


#: the leaderboard's column prefixes -> the group they average, its count column and how a run gets a set of it
LEADERBOARD_GROUPS = {"near": ("near-OOD", "n_near", "a data.ood entry with group: near"),
                      "far": ("far-OOD", "n_far", "a data.ood entry with group: far"),
                      "adv": ("adversarial", "n_adv", "an attack"),
                      "fsood_near": ("full-spectrum near-OOD", "n_near", "a data.ood entry with group: near"),
                      "fsood_far": ("full-spectrum far-OOD", "n_far", "a data.ood entry with group: far")}


def leaderboard_gaps(board: pd.DataFrame) -> list[str]:
    """Why each column of the leaderboard that is empty for every detector is empty: the run has no set of its
    group, or a metric of one of the group's sets is undefined (a group mean is NaN when one of its sets is)."""
    out = []
    for prefix, (words, count, how) in LEADERBOARD_GROUPS.items():
        cols = [c for c in (f"{prefix}_fpr95", f"{prefix}_auroc") if c in board and board[c].isna().all()]
        if not cols or board.empty:
            continue
        if count in board and (board[count] == 0).all():
            out.append(f"{join(cols)}: the run has no {words} set (add {how}).")
        else:
            out.append(f"{join(cols)}: a metric of one of the {words} sets is undefined for every detector (see "
                       "'metrics left empty' under OOD detection).")
    return out


def leaderboard_section(board: pd.DataFrame) -> Section:
    """The leaderboard as a report section: OpenOOD's near/far columns next to the adversarial means, and why any
    column is empty (:func:`leaderboard_gaps`)."""
    gaps = leaderboard_gaps(board)
    return Section("Natural and adversarial robustness side by side", [
        Paragraph("Per detector: OpenOOD v1.5's near-OOD and far-OOD means (AUROC, FPR95) and the ID accuracy, "
                  "next to the mean over the adversarial sets (leaderboard.csv). Each mean's <metric>_rank ranks the "
                  "detectors best first with ties: a detector shares the rank of the best of its tie group when their "
                  "95 % intervals overlap (competition ranking, 1, 1, 3)."),
        Table(board), *([Bullets(gaps, "empty columns")] if gaps else [])])


@register("evaluators", "ood")
class OODEvaluator(Verifiable):
    """OOD metrics (FPR95, AUROC, AUPR-In/Out) of every detector vs natural OOD and adversarial sets."""

    verify = staticmethod(verify_ood)

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

    def __call__(self, ctx: RunContext) -> Results:
        rows: list[dict[str, Any]] = []
        replicates: Replicates = {}
        detectors = list(ctx.scores) + [d for d in ctx.detector_errors if d not in ctx.scores]
        for det in detectors:
            rows += self._rows(ctx, det, replicates)
        df = pd.DataFrame(rows, columns=COLUMNS)
        df["n_id"] = df["n_id"].astype("Int64")
        df["n_ood"] = df["n_ood"].astype("Int64")
        table = pivot_table(df[df["group"] != "csid"])  # "none" = the mean over natural OOD sets, not csid
        out = Results(tables={"ood.csv": df, "table_ood.csv": table, "table_ood.md": table})
        groups = set_groups(ctx)
        csid = [name for name, group in groups.items() if group == "csid"]
        fsood = self._fsood(ctx, groups, csid, replicates) if csid else None
        board = leaderboard(df, ctx.clean.accuracy, fsood, accuracy_with(ctx, csid) if csid else math.nan, replicates)
        out.tables.update({"leaderboard.csv": board, "leaderboard.md": board,
                           "leaderboard_openood.json": openood_entries(board, ctx, groups, robust_table(ctx))})
        if fsood is not None:
            out.tables["fsood.csv"] = fsood
        paired = paired_table(ctx, df, {ood_set: mask for _, _, ood_set, mask in self._targets(ctx)})
        out.tables["paired.csv"] = paired
        out.figures = ood_plots(df, with_positives(ctx), ctx.plot_dir)
        out.sections = guarded("OOD detection", lambda: [ood_section(as_written(df, ctx.protocol), out.figures)])
        out.sections += guarded("Natural and adversarial robustness side by side",
                                lambda: [leaderboard_section(as_written(board, ctx.protocol))])
        if len(paired):
            out.sections += guarded("Paired comparisons", lambda: [paired_section(as_written(paired, ctx.protocol))])
        adaptive = adaptive_table(df, ctx)
        if len(adaptive):
            out.tables.update({"table_adaptive.csv": adaptive, "table_adaptive.md": adaptive})
            out.sections += guarded("Detector-adaptive attacks",
                                    lambda: [adaptive_section(as_written(adaptive, ctx.protocol))])
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

    def _rows(self, ctx: RunContext, det: str, replicates: Replicates) -> list[dict[str, Any]]:
        head = {"dataset": ctx.dataset, "arch": ctx.arch, "detector": det, "backend": ctx.backend_of(det)}
        scores = ctx.scores.get(det)
        groups = set_groups(ctx)
        rows = []
        for attack, eps, ood_set, mask in self._targets(ctx):
            positives = "natural" if attack == "none" else ("all" if mask is None else "successful")
            row = {**head, "attack": attack, "eps": eps, "ood_set": ood_set,
                   "group": groups[ood_set] if attack == "none" else ADVERSARIAL, "positives": positives,
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


import advopenood_plugins.levels  # noqa: E402,F401  (registers the levels evaluator beside these)
