"""The ``smoothed`` evaluator (``--evaluator ood,smoothed``): ``table_smoothed.{csv,md}``, per smoothed detector
(``plugins/detectors/smoothed.py``), budget and direction, its AUROC/FPR95 under the classifier-only baseline, the
plain attack and the EOT attack (``plugins/attacks/eot.py``) side by side; its report section is ``report.py``,
and ``advopenood verify`` re-derives it (``verify.py``). Each AUROC / FPR95 has its 95 % interval
(``<m>_lo``, ``<m>_hi``, method in ``ci``): the interval of the same cell in ``ood.csv`` (ID vs the set's positives,
key ``ood|<det>|<set>``). ``delta_auroc`` is a difference of two cells on different attacked images, with no
resampling unit they share: it has no interval (the report shows it bare).
"""
from __future__ import annotations

import math
from typing import Any

import pandas as pd

from advopenood.plugin import (Results, RunContext, Section, Verifiable, as_written, bound_columns, cell_key, guarded,
                               is_detector_aware, registry)
from advopenood_plugins.attacks.adaptive import EOTAttack
from advopenood_plugins.attacks.eot import EOT_PREFIXES
from advopenood_plugins.detectors.smoothed import PREFIX, SMOOTHING_DEFAULTS, is_smoothed
from advopenood_plugins.kit.ood import metric_row
from advopenood_plugins.evaluators.smoothed.report import smoothed_section
from advopenood_plugins.evaluators.smoothed.verify import verify as verify_smoothed

#: each AUROC / FPR95 followed by its 95 % interval (``<m>_lo``, ``<m>_hi``; ``ood.csv``'s cell of the same set)
COLUMNS = ["detector", "inner", "n", "sigma", "statistic", "eps", "direction", "baseline",
           *bound_columns(["auroc_baseline", "fpr95_baseline"]), "plain_attack",
           *bound_columns(["auroc_plain", "fpr95_plain"]), "n_ood_plain", "eot_attack", "eot_samples",
           *bound_columns(["auroc_eot", "fpr95_eot"]), "n_ood_eot", "delta_auroc", "positives", "ci"]


def detector_settings(ctx: RunContext, det: str) -> dict[str, Any]:
    """``n``, ``sigma``, ``statistic`` of a smoothed detector in this run (its defaults under the run's
    ``detector_params``)."""
    given = ctx.plan.params("detector_params", det)
    merged = {**SMOOTHING_DEFAULTS, **{k: v for k, v in given.items() if k in SMOOTHING_DEFAULTS}}
    return {"n": int(merged["n"]), "sigma": float(merged["sigma"]), "statistic": str(merged["statistic"]).lower()}


def _metrics(ctx: RunContext, det: str, set_name: str) -> dict[str, Any]:
    """AUROC / FPR95 (%) with their intervals and n_ood of ``det`` on ID vs a set: an adversarial set's rows the
    protocol counts as OOD (:meth:`RunContext.ood_positives`), a natural set's every row (as the ``ood`` evaluator
    computes them, with the same cell key ``ood|<det>|<set>``, hence the same interval)."""
    conf = ctx.scores[det][set_name]
    if set_name in ctx.adv_sets:
        conf = conf[ctx.ood_positives(set_name)]
    row = metric_row(ctx.scores[det]["id"], conf, ctx, cell_key("ood", det, set_name))
    return {k: row[k] for k in ("auroc", "auroc_lo", "auroc_hi", "fpr95", "fpr95_lo", "fpr95_hi", "n_ood")}


def _baseline(ctx: RunContext, source: str, eps: float | None) -> str:
    """The classifier-only counterpart: the natural OOD set an OOD->ID attack perturbed, else the ``pgd`` set with
    the same eps (as ``table_adaptive``); ``""`` when the run has none."""
    if source != "id":
        return source
    return next((name for name, adv in ctx.id_adv_sets.items() if adv.attack == "pgd" and adv.eps is not None
                 and eps is not None and math.isclose(float(adv.eps), eps, rel_tol=1e-6)), "")


def smoothed_table(ctx: RunContext) -> pd.DataFrame:
    """One row per smoothed detector, attack, budget and direction: its AUROC / FPR95 under the baseline, the plain
    attack and the EOT attack side by side (an attack the run lacks leaves its columns empty)."""
    pairs: dict[tuple[str, str, float | None, str], dict[str, str]] = {}
    for set_name, adv in ctx.adv_sets.items():
        cls = registry.get("attacks", adv.attack)
        det = cls.detector if is_detector_aware(cls) else ""
        if det not in ctx.scores or not is_smoothed(registry.get("detectors", det)):
            continue
        eot = issubclass(cls, EOTAttack)
        plain = cls.plain_attack if eot else adv.attack
        if not plain.startswith(tuple(EOT_PREFIXES.values())):
            continue  # another attack on the smoothed detector (the robust-AUROC ones, plain or EOT): not a pair here
        key = (det, plain, None if adv.eps is None else round(float(adv.eps), 8), adv.source)
        pairs.setdefault(key, {}).setdefault("eot" if eot else "plain", set_name)
    rows, nan = [], math.nan
    for (det, plain, eps, source), found in pairs.items():
        settings = detector_settings(ctx, det)
        base = _baseline(ctx, source, eps)
        row: dict[str, Any] = {"detector": det, "inner": det[len(PREFIX):], **settings,
                               "eps": nan if eps is None else eps,
                               "direction": "id->id" if source == "id" else "ood->id", "baseline": base}
        empty = {m: nan for m in bound_columns(["auroc", "fpr95"])}
        ref = _metrics(ctx, det, base) if base else empty
        row.update({f"{m}_baseline{end}": ref[f"{m}{end}"] for m in ("auroc", "fpr95") for end in ("", "_lo", "_hi")})
        for kind in ("plain", "eot"):
            name = found.get(kind, "")
            got = _metrics(ctx, det, name) if name else {**empty, "n_ood": pd.NA}
            row.update({f"{kind}_attack": name, f"n_ood_{kind}": got["n_ood"]})
            row.update({f"{m}_{kind}{end}": got[f"{m}{end}"] for m in ("auroc", "fpr95") for end in ("", "_lo", "_hi")})
        eot_set = found.get("eot")
        row["eot_samples"] = (ctx.adv_sets[eot_set].params.get("eot") or settings["n"]) if eot_set else pd.NA
        row["delta_auroc"] = row["auroc_eot"] - row["auroc_plain"]
        row["positives"] = "successful" if source == "id" and ctx.positives_rule == "successful" else "all"
        row["ci"] = ctx.intervals.label
        rows.append(row)
    table = pd.DataFrame(rows, columns=COLUMNS)
    for col in ("n_ood_plain", "n_ood_eot", "eot_samples"):
        table[col] = table[col].astype("Int64")
    return table



def smoothed_sections(table: pd.DataFrame) -> list[Section]:
    """The report's section from ``table_smoothed.csv`` as written; the run builds it from the table it writes,
    ``advopenood verify`` from the CSV (``report_sections``)."""
    return guarded("Smoothed detectors: plain vs EOT attacks", lambda: [smoothed_section(table)])


@registry.register("evaluators", "smoothed")
class SmoothedEvaluator(Verifiable):
    """AUROC/FPR95 of every smoothed detector under its plain and its EOT adaptive attack, side by side."""

    verify = staticmethod(verify_smoothed)
    report_sections = staticmethod(lambda run: smoothed_sections(run.table("table_smoothed.csv")))  # verify: the CSV

    def __call__(self, ctx: RunContext) -> Results:
        table = smoothed_table(ctx)
        out = Results()
        if len(table):
            out.tables = {"table_smoothed.csv": table, "table_smoothed.md": table}
            out.sections = smoothed_sections(as_written(table, ctx.protocol))
        else:
            out.empty_reason = needed_attacks(ctx)
        return out


def needed_attacks(ctx: RunContext) -> str:
    """Why ``table_smoothed`` is empty: the smoothed detectors and the attacks on them it needs."""
    dets = [det for det in ctx.scores if is_smoothed(registry.get("detectors", det))]
    if not dets:
        return ("it needs a smoothed detector and its plain and EOT adaptive attacks, e.g. the detector smoothed_msp "
                "with the attacks adaptive_smoothed_msp and adaptive_eot_smoothed_msp")
    wanted = " or ".join(f"{plain}{det} and {eot}{det}" for det in dets for eot, plain in EOT_PREFIXES.items())
    return f"no plain or EOT adaptive attack on {', '.join(dets)} in this run; it needs the attacks {wanted}"
