"""The ``robust_auroc`` evaluator's report section: ``robust_auroc.csv``'s AUROCs per detector and set with their
intervals, one reading per detector, method and eps, and the paired differences' readings; the ensemble's section
(``robust_ensemble.csv``: the robust AUROC after each attack added, plotted) and the gradient-masking readings."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from advopenood.plugin import (PLOT_DIR, Bullets, Figure, Paragraph, Section, Table, eps_label, guarded, io as aio,
                               join, name as label)

from advopenood_plugins.evaluators.robust_auroc.paired import read_robust_paired


def read_robust(table: pd.DataFrame) -> list[str]:
    """Per detector, method and eps: the clean AUROC against the robust one, averaged over the natural OOD sets,
    with both one-sided AUROCs."""
    out = []
    for (det, method, family, eps), part in table.groupby(["detector", "method", "attack_family", "eps"], sort=False):
        mean = part[["clean_auroc", "id_attacked_auroc", "ood_attacked_auroc", "robust_auroc"]].mean()
        verb = "falls to" if mean.robust_auroc < mean.clean_auroc else "stays at"
        how = method.upper() + (" with EOT gradients" if family == "eot" else "")
        out.append(f"{label(det)} ({how}, eps {eps_label(eps)}, mean over {len(part)} OOD set"
                   f"{'s' if len(part) > 1 else ''}): AUROC {verb} {mean.robust_auroc:.1f} from {mean.clean_auroc:.1f} "
                   f"when both sides are attacked (ID side alone {mean.id_attacked_auroc:.1f}, OOD side alone "
                   f"{mean.ood_attacked_auroc:.1f}).")
    below = sorted({label(d) for d in table.loc[table["robust_auroc"] < 50, "detector"]})
    if below:
        out.append(f"{join(below)} {'falls' if len(below) == 1 else 'fall'} below chance (robust AUROC < 50) on at "
                   "least one set: attacked OOD images look more in-distribution than attacked ID images.")
    return out


def robust_section(table: pd.DataFrame, paired: pd.DataFrame | None = None) -> Section:
    """``Robust AUROC``: the table's AUROCs per detector and set, and their readings, with the paired differences'
    (``robust_paired.csv``) when given."""
    bounds = [c for c in table.columns if c.endswith(("_lo", "_hi"))]
    shown = table.drop(columns=["id_attack", "ood_attack", "n_id", "n_ood", "protocol", "error", *bounds],
                       errors="ignore").copy()
    shown["eps"] = [eps_label(e) for e in shown["eps"]]
    if {"robust_auroc_lo", "robust_auroc_hi"} <= set(table.columns):
        shown.insert(shown.columns.get_loc("robust_auroc") + 1, "robust 95 % interval",
                     ["" if pd.isna(lo) else f"[{lo:.1f}, {hi:.1f}]"
                      for lo, hi in zip(table["robust_auroc_lo"], table["robust_auroc_hi"])])
    return Section("Robust AUROC (ID and OOD attacked)", [
        Paragraph("AUROC (%) with ID images attacked to look OOD and OOD images attacked to look in-distribution "
                  "inside the same Linf ball (ATD's and AROS's robust AUROC): clean, one side attacked, both sides "
                  "attacked (robust). Every image of both sets counts. A randomised detector (e.g. a smoothed one) "
                  "is attacked with EOT gradients (attack family eot) unless the evaluator is told otherwise, and "
                  "scored with evaluation noise independent of every noise draw its attacks saw."),
        Table(shown), Bullets(read_robust(table) + ([] if paired is None else read_robust_paired(paired))
                              + read_masking(table))])


def read_masking(table: pd.DataFrame) -> list[str]:
    """Per detector, OOD set and eps with ``masking_suspected`` True: that its gradient attacks are unreliable; one
    line when Square ran and no cell is flagged."""
    if "masking_suspected" not in table.columns:
        return []
    flags = table.drop_duplicates(["detector", "ood_set", "eps"])
    out = []
    for r in flags[flags["masking_suspected"].eq(True).fillna(False)].to_dict("records"):
        part = table[(table["detector"] == r["detector"]) & (table["ood_set"] == r["ood_set"])
                     & np.isclose(table["eps"].astype(float), float(r["eps"]))]
        square = part.loc[part["method"] == "square", "robust_auroc"].min()
        gradient = part.loc[part["method"].isin(["pgd", "apgd"]), "robust_auroc"].min()
        out.append(f"Gradient masking suspected on {label(r['detector'])} ({label(r['ood_set'])}, eps "
                   f"{eps_label(r['eps'])}): the gradient-free Square attack reaches a robust AUROC of {square:.1f}, "
                   f"below every attack on its score's gradient (PGD, APGD; lowest {gradient:.1f}) beyond their "
                   "paired 95 % intervals, so those gradient attacks are unreliable for it (Carlini et al. 2019); "
                   "read its ensemble row.")
    if not out and flags["masking_suspected"].notna().any():
        out.append("No detector's gradient attacks are beaten by Square beyond the paired 95 % interval: no "
                   "sign of gradient masking (Carlini et al. 2019's gradient-free check).")
    return out


def plot_ensemble(steps: pd.DataFrame, plot_dir: Path) -> Path | None:
    """``robust_ensemble.png``: the robust AUROC after each attack added (``robust_ensemble.csv``), one line per
    detector, OOD set and eps, with its 95 % interval as error bars; None for an empty table."""
    from matplotlib.figure import Figure as MplFigure

    if not len(steps):
        return None
    fig = MplFigure(figsize=(6.4, 3.6))
    ax = fig.subplots()
    for (det, ood_set, eps), part in steps.groupby(["detector", "ood_set", "eps"], sort=False):
        values = part["robust_auroc"].to_numpy(float)
        err = np.nan_to_num(np.stack([values - part["robust_auroc_lo"].to_numpy(float),
                                      part["robust_auroc_hi"].to_numpy(float) - values]))
        ax.errorbar(part["step"], values, yerr=err, marker="o", markersize=3, capsize=2, linewidth=1,
                    label=f"{label(det)}, {label(ood_set)}, {eps_label(eps)}")
    orders = {tuple(part["attack"]) for _, part in steps.groupby(["detector", "ood_set", "eps"], sort=False)}
    longest = max(orders, key=len)
    ax.set_xticks(range(len(longest)), list(longest) if len(orders) == 1 else [str(k) for k in range(len(longest))],
                  fontsize=7)
    ax.axhline(50, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel("attack added (step)" if len(orders) == 1 else "step (robust_ensemble.csv names the attack)")
    ax.set_ylabel("robust AUROC (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    path = plot_dir / "robust_ensemble.png"
    aio.save_figure(fig, path)
    return path


def ensemble_section(steps: pd.DataFrame, figure: Path | None) -> Section:
    """``Robust AUROC of the attack ensemble``: the robust AUROC after each attack added and its reading."""
    shown = steps.drop(columns=["id_attack", "ood_attack", "n_id", "n_ood", "protocol", "error", "ci",
                                "robust_auroc_lo", "robust_auroc_hi"], errors="ignore").copy()
    shown["eps"] = [eps_label(e) for e in shown["eps"]]
    shown.insert(shown.columns.get_loc("robust_auroc") + 1, "95 % interval",
                 ["" if pd.isna(lo) else f"[{lo:.1f}, {hi:.1f}]"
                  for lo, hi in zip(steps["robust_auroc_lo"], steps["robust_auroc_hi"])])
    lines = []
    for (det, ood_set, eps), part in steps.groupby(["detector", "ood_set", "eps"], sort=False):
        last, first = part.iloc[-1], part.iloc[0]
        top = part.iloc[1:].sort_values(["id_images_set", "ood_images_set"], ascending=False).iloc[0]
        interval = "" if math.isnan(last["robust_auroc_lo"]) else \
            f" [{last['robust_auroc_lo']:.1f}, {last['robust_auroc_hi']:.1f}]"
        lines.append(f"{label(det)} ({label(ood_set)}, eps {eps_label(eps)}): the worst case per image over "
                     f"{len(part) - 1} attacks gives a robust AUROC of {last['robust_auroc']:.1f}{interval} (clean "
                     f"{first['robust_auroc']:.1f}); {top['attack']} set the most images' worst case "
                     f"({top['id_images_set']} ID, {top['ood_images_set']} OOD).")
    items = [Paragraph("The worst case per image over every robust attack of a detector (AutoAttack's rule, Croce & "
                       "Hein 2020, on the detector's score): each ID image at its lowest confidence over its clean "
                       "self and every ID-side attack, each OOD image at its highest. Step 0 is clean; each step adds "
                       "one attack in a fixed order (APGD, APGD on the second objective, PGD, plain before EOT, "
                       "Square last); the images columns count the images whose worst case that attack set. The "
                       "last step is the ensemble row of robust_auroc.csv."), Table(shown), Bullets(lines)]
    if figure is not None:
        items.append(Figure(figure, "Robust AUROC (%) after each attack added to the ensemble, with 95 % "
                                    "intervals; chance dotted"))
    return Section("Robust AUROC of the attack ensemble", items)


#: the title of the evaluator's headline section (its declared :class:`~advopenood.capabilities.Headline`)
HEADLINE = "Robust AUROC per detector and OOD set"
#: an attack's budget parameters as the headline's ``budget`` column names them
BUDGET_PARAMS = (("steps", "{} steps"), ("n_iter", "{} iterations"), ("n_restarts", "{} restarts"),
                 ("n_queries", "{} queries"), ("eot", "EOT {} draws"))


def budget_text(params: dict) -> str:
    """An attack's budget from its parameters: ``100 iterations, 1 restarts`` (its steps, iterations, restarts,
    queries and EOT draws, where it has them)."""
    return ", ".join(form.format(params[key]) for key, form in BUDGET_PARAMS if params.get(key) is not None)


def _with_interval(row: dict, metric: str) -> str:
    """``52.0 [41.6, 62.7]``: the value to one decimal and its 95 % interval (the value alone without one)."""
    value, lo, hi = row.get(metric), row.get(f"{metric}_lo"), row.get(f"{metric}_hi")
    if value is None or pd.isna(value):
        return "n/a"
    return f"{value:.1f}" + ("" if lo is None or pd.isna(lo) or pd.isna(hi) else f" [{lo:.1f}, {hi:.1f}]")


def headline_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The rows the headline shows: per detector, OOD set and eps, its ensemble row where it has one (the worst
    case over every attack), else each single-attack row."""
    keys = ["detector", "ood_set", "eps"]
    ensemble = table[table["method"] == "ensemble"]
    covered = set(map(tuple, ensemble[keys].astype(str).to_numpy()))
    uncovered = np.array([tuple(k) not in covered for k in table[keys].astype(str).to_numpy()], dtype=bool)
    single = table[(table["method"] != "ensemble").to_numpy() & uncovered]
    return pd.concat([ensemble, single]).sort_values(keys, kind="stable") if len(ensemble) else single


def robust_headline(table: pd.DataFrame, budgets: dict[tuple[str, ...], str]) -> Section:
    """The evaluator's headline (:data:`HEADLINE`): per detector and OOD set, the robust AUROC with both sides
    attacked, the ID side only, the OOD side only and the clean AUROC, each with its 95 % interval,
    ``masking_suspected`` and the attacks' budget (``budgets``: ``(detector, OOD set, method, attack family)`` ->
    text)."""
    rows = headline_rows(table)
    method = str(rows["ci"].dropna().iloc[0]) if "ci" in rows and rows["ci"].notna().any() else "none"
    cells = []
    for r in rows.to_dict("records"):
        masking = r.get("masking_suspected")
        attacks = "ensemble" if r["method"] == "ensemble" else \
            r["method"].upper() + (" with EOT gradients" if r["attack_family"] == "eot" else "")
        cells.append({"detector": label(r["detector"]), "OOD set": label(r["ood_set"]),
                      "eps (Linf)": eps_label(r["eps"]),
                      "attacks": attacks, "robust (both sides)": _with_interval(r, "robust_auroc"),
                      "ID side attacked": _with_interval(r, "id_attacked_auroc"),
                      "OOD side attacked": _with_interval(r, "ood_attacked_auroc"),
                      "clean": _with_interval(r, "clean_auroc"),
                      "masking suspected": "" if masking is None or pd.isna(masking) else
                      ("yes" if bool(masking) else "no"),
                      "budget": budgets.get((str(r["detector"]), str(r["ood_set"]), str(r["method"]),
                                             str(r["attack_family"])), "")})
    return Section(HEADLINE, [
        Paragraph(f"The answer to the robust evaluation: AUROC (%) of each detector on each natural OOD set when ID "
                  "images are attacked to look OOD and OOD images to look in-distribution inside the same Linf ball "
                  "(both sides), with one side attacked, and clean; each with its 95 % interval "
                  f"({method}) in brackets. Where the run has an attack ensemble the row is its worst case per "
                  "image over every attack (AutoAttack's rule on the detector's score), else one row per attack. "
                  "masking suspected: Square, which uses no gradient, beats every attack on the score's gradient "
                  "(Carlini et al. 2019); budget: each attack's iterations, queries and draws."),
        Table(pd.DataFrame(cells), "Robust AUROC (%) [95 % interval]")])

def budgets(params: dict[str, dict], table: pd.DataFrame) -> dict[tuple[str, ...], str]:
    """``(detector, OOD set, method, attack family)`` -> the budget of its attacks as the headline states it: a
    single attack's iterations, queries or draws (its ID-side set's parameters, ``params``: set name ->
    parameters, :func:`budget_text`); an ensemble's (family ``all``), each member's (the single-attack rows of its
    detector and OOD set) in turn."""
    out: dict[tuple[str, ...], str] = {}
    members: dict[tuple[str, str], list[str]] = {}
    for r in table[table["method"] != "ensemble"].to_dict("records"):
        key = (str(r["detector"]), str(r["ood_set"]), str(r["method"]), str(r["attack_family"]))
        out[key] = budget_text(params.get(str(r["id_attack"])) or {})
        how = str(r["method"]).upper() + (" (EOT)" if r["attack_family"] == "eot" else "")
        part = f"{how}: {out[key]}" if out[key] else how
        if part not in members.setdefault(key[:2], []):
            members[key[:2]].append(part)
    return {**out, **{(*k, "ensemble", "all"): "; ".join(v) for k, v in members.items()}}


def robust_sections(table: pd.DataFrame, paired: pd.DataFrame, steps: pd.DataFrame | None,
                    figure: Path | None, params: dict[str, dict]) -> list[Section]:
    """The evaluator's report sections from its tables as written: its headline (:func:`robust_headline`, the
    budgets from each set's parameters, ``params``: set name -> parameters), ``Robust AUROC`` (``robust_auroc.csv``,
    ``robust_paired.csv``) and, with ``robust_ensemble.csv`` (``steps``), the ensemble's with its ``figure``. The
    run builds them from the tables it writes, ``advopenood verify`` from the CSVs and ``run.json``'s attacks
    (:func:`report_sections`)."""
    sections = guarded(HEADLINE, lambda: [robust_headline(table, budgets(params, table))])
    sections += guarded("Robust AUROC (ID and OOD attacked)", lambda: [robust_section(table, paired)])
    if steps is not None:
        sections += guarded("Robust AUROC of the attack ensemble", lambda: [ensemble_section(steps, figure)])
    return sections


def report_sections(run: Any) -> list[Section]:
    """:func:`robust_sections` from a run folder (:class:`advopenood.evaluation.runfiles.RunFiles`, for
    ``advopenood verify``): ``robust_auroc.csv`` and ``robust_paired.csv``, ``robust_ensemble.csv`` and its plot
    where the folder has them; none where the table has no row (the run wrote no section)."""
    table = run.table("robust_auroc.csv")
    if not len(table):
        return []
    steps = run.table("robust_ensemble.csv") if run.has("robust_ensemble.csv") else None
    plot = f"{PLOT_DIR}/robust_ensemble.png"
    params = {str(name): dict((entry or {}).get("params") or {}) if isinstance(entry, dict) else {}
              for name, entry in (run.info.get("attacks") or {}).items()}
    return robust_sections(table, run.table("robust_paired.csv"), steps,
                           run.path / plot if run.has(plot) else None, params)
