"""The ``ood`` evaluator's report: the ``OOD detection`` section (AUROC and FPR95 matrices, readings generated from
them, the AUROC heatmap and one detector's ROC curves), the leaderboard's and the detector-adaptive attacks'
sections (``plugin.py`` computes the tables).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from advopenood.plugin import (ADVERSARIAL, CHANCE, MIN_CONCLUSIVE, Z95, Bullets, Figure, Paragraph, RunContext,
                               Section, Table, chance_mask, hanley_mcneil_se, io as aio, join, name as label,
                               ood_matrix, plot_auroc_heatmap, plot_roc, roc_sets)

def compare_natural_adversarial(nat: float, adv: float) -> str:
    """The sentence comparing mean AUROC on natural OOD sets (``nat``) with that under attack (``adv``); its verb
    follows the sign of the difference (as shown, to one decimal). It states the two means, no conclusion: they
    are means of point estimates over detectors and sets, and their difference is not tested."""
    nat_s, adv_s = f"{nat:.1f}", f"{adv:.1f}"
    untested = "(means of the point estimates over detectors and sets; their difference is not tested)."
    if nat_s == adv_s:
        return f"Averaged over detectors, AUROC is {nat_s} both on natural OOD sets and under attack {untested}"
    verb = "falls" if adv < nat else "rises"
    return f"Averaged over detectors, AUROC {verb} from {nat_s} on natural OOD sets to {adv_s} under attack {untested}"


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
    """Natural sets: a lone detector's mean AUROC, and any below chance; per attack: which detectors fall below
    chance (AUROC < 50 with the upper end of its 95 % interval below 50 too). No detector is called the best or the
    worst: the ranks the paired tests support are the headline's (:mod:`.headline`). Last, the mean AUROC from
    natural OOD sets to adversarial sets (:func:`compare_natural_adversarial`). A set with fewer than
    :data:`MIN_CONCLUSIVE` images on a side gets its range and "too few to conclude" instead (:func:`_too_few`)."""
    table = ood_matrix(ood, "auroc")
    if table.empty:
        return []
    n_nat = table.attrs["n_natural"]
    natural, attacks = table.iloc[:, :n_nat], table.iloc[:, n_nat:]
    out, small = _read_natural(ood, natural) if natural.shape[1] else ([], False)
    for col in attacks.columns:
        lines, few = _read_attack(ood, col, attacks[col].dropna())
        out += lines
        small |= few
    if natural.shape[1] and attacks.shape[1]:
        nat, adv = natural.stack().mean(), attacks.stack().mean()
        if not (math.isnan(nat) or math.isnan(adv)):
            line = compare_natural_adversarial(float(nat), float(adv))
            out.append(f"{line[:-1]} (in this sample only: too few images to conclude)." if small else line)
    return out


def _read_natural(ood: pd.DataFrame, natural: pd.DataFrame) -> tuple[list[str], bool]:
    """:func:`read_ood`'s lines on the natural OOD sets (detector x set AUROCs), and whether a set was too small."""
    out = []
    mean = natural.mean(axis=1, skipna=False).dropna()
    sets = ", ".join(map(str, natural.columns))
    sizes = _sizes(ood, list(natural.columns))
    few = _too_few(f"On natural OOD sets ({sets})", sizes, mean, "mean AUROC") if len(mean) else None
    if few:
        out.append(few)
    elif len(mean) == 1:
        out.append(f"On natural OOD sets ({sets}), {label(mean.index[0])} reaches a mean AUROC of {mean.iloc[0]:.1f}.")
    below = [] if few else _below_chance(mean, sizes)
    if below:
        verb = "scores" if len(below) == 1 else "score"
        out.append(f"{join(below)} {verb} below chance on natural OOD (mean AUROC < 50): OOD images look more "
                   "in-distribution to them than ID images.")
    return out, few is not None


def _read_attack(ood: pd.DataFrame, col: str, scores: pd.Series) -> tuple[list[str], bool]:
    """:func:`read_ood`'s line on one attack set (each detector's AUROC), and whether the set was too small."""
    if not len(scores):
        return [], False
    sizes = _sizes(ood, [col])
    few = _too_few(f"On {label(col)}", sizes, scores)
    if few:
        return [few], True
    below = _below_chance(scores, sizes)
    near = [label(d) for d in scores.index if scores[d] < CHANCE and label(d) not in below]
    within = (f"; {join(near)} {'is' if len(near) == 1 else 'are'} below 50 but within the 95 % interval of "
              "chance") if near else ""
    if len(below) == len(scores):
        return [f"On {label(col)} every detector falls below chance (AUROC < 50): adversarial examples look "
                "more in-distribution than clean images."], False
    if below:
        verb = "falls" if len(below) == 1 else "fall"
        return [f"{join(below)} {verb} below chance (AUROC < 50) on {label(col)}{within}."], False
    return [f"No detector falls below chance on {label(col)}{within}."], False


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
                  "next to the mean over the adversarial sets (leaderboard.csv); each mean's interval draws every "
                  "image its sets share (ID and OOD) once per resample. Each mean's rank is a range by the headline's "
                  "rule, from <metric>_rank, 1 + the number of detectors whose mean a paired bootstrap test (the "
                  "shared images resampled alike for every detector), Holm-adjusted over the metric's pairs, shows "
                  "better (p_holm < 0.05), to <metric>_rank_worst, the number ranked less the number it shows worse; "
                  "overlapping intervals are not a test. Without "
                  f"bootstrap replicates the ranks follow the point estimates; with fewer than {MIN_CONCLUSIVE} ID "
                  "images there is no rank."),
        Table(board), *([Bullets(gaps, "empty columns")] if gaps else [])])
