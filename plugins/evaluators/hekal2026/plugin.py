"""The ``hekal2026`` evaluator: ROSS's Table 2 (Hekal, Lomuscio & Stoica, CVPR Findings 2026, arXiv 2605.08191) from
the ``hekal_min`` / ``hekal_max`` sets of a run (:mod:`advopenood_plugins.attacks.hekal`).

Their table (Abdu-Hekal/ROSS f8f030d, ``scripts/ross/run_experiments.py`` ``generate_table2``): per detector, a
``No Attack`` column and one column per eps (2, 4, 8, 16 "/255") and objective (``min`` -> PGD-Min, ``max`` ->
PGD-Max), each cell ``FPR@95/AUROC``. ``table_hekal2026.csv`` has one row per detector, natural OOD set and
objective (and eps, for the attacked ones):

* ``No Attack``: clean ID test images against the clean OOD set;
* ``PGD-Min``: the ``hekal_min_<det>`` set (ID images, confidence lowered) against the clean OOD set;
* ``PGD-Max``: the clean ID images against the ``hekal_max_<det>`` set of that OOD set (confidence raised).

Every row of every set counts (their script scores every attacked image). Columns: ``eps`` in the attack's
``eps_units`` (``normalised``: the network's normalised input units, theirs; ``pixel``: [0, 1] pixels),
``eps_pixel`` (the ball's Linf radius in pixels: ``eps * max_c std_c`` for normalised units), ``through``
(``base``: a ROSS detector attacked through its base detector, their ``--attack-base-pp``; ``self``), ``clip``,
``left_range`` (the share of attacked images with a pixel outside [0, 1], from the stored images), ``auroc`` /
``fpr95`` in percent with 95 % intervals by the run's ``ci`` plan. Scores are the run's (``scores/<det>.npz``), so
a ``ross_<det>`` row is scored with the evaluation noise, never the attack's. Intervals: a row whose ID side is clean
has ``ood.csv``'s cell (key ``ood|<det>|<OOD side>``: the same interval as ``ood.csv``'s row of that set), a
``PGD-Min`` row the key ``hekal2026|<det>|<ID set>|<OOD set>``.

Their Table 2 averages over six OOD sets and three checkpoints (mean +- std over checkpoints); a run reports each
OOD set of its data with 95 % intervals instead. ``table_hekal2026.md`` lays the rows out as theirs (cells
``FPR@95/AUROC``). ``advopenood verify`` re-derives the table (``verify.py``).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from advopenood.plugin import (AdvSet, Bullets, Paragraph, Results, RunContext, Section, Table, Verifiable, as_written,
                               auroc, cell_key, eps_label, fpr_at_tpr95, get_protocol, guarded, is_composite, register)
from advopenood_plugins.attacks.hekal import PROTOCOL, hekal_class
from advopenood_plugins.evaluators.hekal2026.verify import verify_hekal

TABLE = "table_hekal2026.csv"
COLUMNS = ["detector", "ood_set", "eps", "eps_units", "eps_pixel", "objective", "attack", "through", "clip",
           "left_range", "n_id", "n_ood", "auroc", "auroc_lo", "auroc_hi", "fpr95", "fpr95_lo", "fpr95_hi", "ci",
           "protocol"]
#: the objective column, as their table names it
OBJECTIVES = {"none": "No Attack", "min": "PGD-Min", "max": "PGD-Max"}


def left_range(adv: AdvSet) -> float:
    """The share of a set's stored images with any pixel outside [0, 1] (read from its shards, as stored)."""
    out = total = 0
    for shard in adv.shards:
        with np.load(shard) as d:
            flat = d["x_adv"].reshape(len(d["x_adv"]), -1)
        out += int(((flat < 0) | (flat > 1)).any(1).sum())
        total += len(flat)
    return out / total if total else math.nan


def pixel_std(ctx: RunContext) -> float:
    """The largest per-channel std of the network's normalisation (1 for a network that declares none)."""
    std = getattr(ctx.model, "std", None)
    return float(std.max()) if std is not None else 1.0


def _row(ctx: RunContext, det: str, ood_set: str, objective: str, conf_id: np.ndarray, conf_ood: np.ndarray,
         key: str, adv: AdvSet | None) -> dict[str, Any]:
    ci = ctx.intervals
    bounds, _, _, label = ci.labelled_cell(key, conf_id, conf_ood)
    row: dict[str, Any] = {"detector": det, "ood_set": ood_set, "eps": math.nan, "eps_units": "", "eps_pixel": math.nan,
                           "objective": OBJECTIVES[objective], "attack": "none", "through": "", "clip": "",
                           "left_range": math.nan}
    if adv is not None:
        p = adv.params
        eps = float(p["eps"])
        row.update(eps=eps, eps_units=p["units"], attack=adv.set_name, clip=bool(p["clip"]), left_range=left_range(adv),
                   eps_pixel=eps * pixel_std(ctx) if p["units"] == "normalised" else eps,
                   through="base" if p["through"] == "base" and is_composite(_detector(det)) else "self")
    both = len(conf_id) and len(conf_ood)
    row.update(n_id=len(conf_id), n_ood=len(conf_ood),
               auroc=100.0 * auroc(conf_id, conf_ood) if both else math.nan, auroc_lo=bounds["auroc_lo"],
               auroc_hi=bounds["auroc_hi"], fpr95=100.0 * fpr_at_tpr95(conf_id, conf_ood) if both else math.nan,
               fpr95_lo=bounds["fpr95_lo"], fpr95_hi=bounds["fpr95_hi"], ci=label,
               protocol=ctx.protocol)
    return row


def _detector(name: str) -> Any:
    from advopenood.plugin import registry

    return registry.get("detectors", name)


def hekal_table(ctx: RunContext) -> pd.DataFrame:
    """One row per detector with scores, natural OOD set and objective (and hekal set, for the attacked ones)."""
    sets: dict[str, list[tuple[str, AdvSet, str]]] = {}
    for name, adv in ctx.adv_sets.items():
        cls = hekal_class(adv.attack)
        if cls is not None:
            sets.setdefault(cls.detector, []).append((name, adv, cls.side))
    rows = []
    for det, scores in ctx.scores.items():
        if det not in sets:
            continue
        for ood_set in ctx.ood_sets:
            if ood_set not in scores:
                continue
            clean_id, clean_ood = scores["id"], scores[ood_set]
            rows.append(_row(ctx, det, ood_set, "none", clean_id, clean_ood, cell_key("ood", det, ood_set), None))
            for name, adv, side in sorted(sets[det], key=lambda s: (s[2] != "min", float(s[1].eps), s[0])):
                if name not in scores or (side == "max" and adv.source != ood_set):
                    continue
                if side == "min":
                    rows.append(_row(ctx, det, ood_set, side, scores[name], clean_ood,
                                     cell_key("hekal2026", det, name, ood_set), adv))
                else:
                    rows.append(_row(ctx, det, ood_set, side, clean_id, scores[name], cell_key("ood", det, name), adv))
    return pd.DataFrame(rows, columns=COLUMNS)


def as_their_table(table: pd.DataFrame) -> pd.DataFrame:
    """Their layout: per detector and OOD set, ``No Attack`` then one column per objective and eps, cells
    ``FPR@95/AUROC`` (one decimal), eps as the attack's (in its units)."""
    rows: dict[tuple[str, str], dict[str, str]] = {}
    for r in table.to_dict("records"):
        column = r["objective"] if r["attack"] == "none" else f"{r['objective']} {eps_label(r['eps'])}"
        cell = rows.setdefault((r["detector"], r["ood_set"]), {"detector": r["detector"], "ood_set": r["ood_set"]})
        cell[column] = f"{r['fpr95']:.1f}/{r['auroc']:.1f}"
    return pd.DataFrame(list(rows.values())).fillna("")


def hekal_section(table: pd.DataFrame) -> Section:
    """``Hekal et al. 2026 (ROSS), Table 2``: their layout and what the numbers are."""
    units = sorted(set(table["eps_units"].dropna()) - {""})
    notes = [f"eps in {', '.join(units)} units; eps_pixel is the ball's Linf radius in [0, 1] pixels."] if units else []
    left = table.dropna(subset=["left_range"])
    if len(left) and (left["left_range"] > 0).any():
        notes.append(f"Up to {100 * left['left_range'].max():.0f} % of the attacked images of a set leave the [0, 1] "
                     "pixel range (clip false, as their unbounded foolbox model).")
    return Section("Hekal et al. 2026 (ROSS), Table 2", [
        Paragraph("FPR@95 / AUROC (%) per detector and OOD set, clean and under ROSS's attacks as their code runs "
                  "them: PGD-Min lowers the confidence of the ID images, PGD-Max raises that of the OOD images (Linf "
                  "PGD, last iterate). Their Table 2 averages six OOD sets and three checkpoints; this run reports "
                  "each OOD set with 95 % intervals (table_hekal2026.csv)."),
        Table(as_their_table(table)), Bullets(notes)])


def missing(ctx: RunContext) -> str:
    """Why a run has no row for Table 2 (a ``hekal_min`` / ``hekal_max`` set, its detector's scores, a natural OOD
    set), with the command that runs their protocol."""
    attacked = {name: cls.detector for name, cls in ((n, hekal_class(a.attack)) for n, a in ctx.adv_sets.items())
                if cls is not None}
    if not attacked:
        what = "no hekal_min or hekal_max attack ran in this run"
    elif not set(attacked.values()) & set(ctx.scores):
        sets = ", ".join(f"{name} on {det}" for name, det in sorted(attacked.items()))
        what = (f"the detectors its attacks attack are not scored in this run ({sets}); add them to --detectors "
                f"(scored: {', '.join(ctx.scores) or 'none'})")
    else:
        what = "no natural OOD set is scored in this run (data.ood)"
    return f"{what}; ROSS's Table 2 runs as: {get_protocol(PROTOCOL).command}"


def hekal_sections(table: pd.DataFrame) -> list[Section]:
    """The report's section from ``table_hekal2026.csv`` as written; the run builds it from the table it writes,
    ``advopenood verify`` from the CSV (``report_sections``)."""
    return guarded("Hekal et al. 2026 (ROSS), Table 2", lambda: [hekal_section(table)])


@register("evaluators", "hekal2026")
class Hekal2026(Verifiable):
    """ROSS's Table 2 (Hekal et al. 2026): FPR@95 / AUROC clean, under PGD-Min and under PGD-Max."""

    verify = staticmethod(verify_hekal)
    report_sections = staticmethod(lambda run: hekal_sections(run.table(TABLE)))  # verify: from the CSV

    def __call__(self, ctx: RunContext) -> Results:
        table = hekal_table(ctx)
        if not len(table):
            return Results(empty_reason=missing(ctx))
        return Results(tables={TABLE: table, "table_hekal2026.md": as_their_table(table)},
                       sections=hekal_sections(as_written(table, ctx.protocol)))
