"""The ``ood`` evaluator: FPR95 / AUROC / AUPR of every detector on natural OOD sets and adversarial sets.

Follows OpenOOD's convention (:mod:`advopenood.metrics`): OOD is the positive class, scores are
confidences (higher = more ID), and adversarial examples count as OOD. Which adversarial examples are the
positives is the protocol's choice (:mod:`advopenood.protocols`), written in the ``positives`` column:
``successful`` (protocol ``strong``: the examples whose attack succeeded, ``advset.records.success``, i.e.
``adv_pred != y``) or ``all`` (protocol ``lorenz2024``: "all attacked test images", as the paper's Table 4 is
computed). ``n_ood`` records how many there were. The perturbed images of an OOD->ID attack
(``adaptive_ood_<det>``) are all OOD, so all of them are positives.

With detector-adaptive attacks in the run (``plugins/adaptive.py``), ``table_adaptive.{csv,md}`` puts each
detector's AUROC/FPR95 under its own adaptive attack next to the classifier-only attack: ``pgd`` at the same
eps for ``adaptive_<det>``, the clean natural OOD set for ``adaptive_ood_<det>``.

Writes ``scores/<detector>.npz`` (atomically) with one float64 array of confidences per set (``id``, each
natural OOD set, each attack, in sample order) and, per attack, the boolean ``<attack>.success`` mask, so
every metric can be recomputed with :func:`advopenood.metrics.ood_metrics`.
"""
from __future__ import annotations

import io
import math
from typing import Any

import numpy as np
import pandas as pd

from advopenood import io as aio
from advopenood.capabilities import is_detector_aware
from advopenood.context import RunContext
from advopenood.metrics import ood_metrics
from advopenood import protocols, registry
from advopenood.registry import register

ADAPTIVE_COLUMNS = ["detector", "attack", "eps", "baseline", "auroc_baseline", "auroc_adaptive", "delta_auroc",
                    "fpr95_baseline", "fpr95_adaptive", "n_ood"]
COLUMNS = ["dataset", "arch", "attack", "eps", "detector", "backend", "ood_set", "fpr95", "auroc", "aupr_in",
           "aupr_out", "n_id", "n_ood", "positives", "protocol", "error"]
METRICS = ("fpr95", "auroc", "aupr_in", "aupr_out")
NAN_METRICS = {m: math.nan for m in METRICS}


def metric_row(conf_id: np.ndarray, conf_ood: np.ndarray) -> dict[str, Any]:
    """Metrics in percent plus ``n_id``, ``n_ood`` and ``error`` (NaN metrics and the reason when undefined)."""
    base = {"n_id": len(conf_id), "n_ood": len(conf_ood), "error": ""}
    try:
        return {**ood_metrics(conf_id, conf_ood), **base}
    except ValueError as exc:  # NaN scores or an empty side: reported in the row, never averaged away
        return {**NAN_METRICS, **base, "error": str(exc)}


def pivot_table(df: pd.DataFrame) -> pd.DataFrame:
    """Paper-style table (Table 4): one row per detector, columns ``<dataset> <attack> FPR95`` / ``AUROC``.

    Attack ``none`` is the mean over the natural OOD sets; a NaN in any of them stays NaN.
    """
    if df.empty:
        return pd.DataFrame({"detector": []})
    detectors = list(dict.fromkeys(df["detector"]))
    cells: dict[str, dict[str, float]] = {}
    for (dataset, attack), part in df.groupby(["dataset", "attack"], sort=False):
        for metric, label in (("fpr95", "FPR95"), ("auroc", "AUROC")):
            means = part.groupby("detector", sort=False)[metric].agg(lambda s: s.mean(skipna=False))
            cells[f"{dataset} {attack} {label}"] = {d: float(means.get(d, math.nan)) for d in detectors}
    order = sorted(cells, key=lambda c: (c.split(" ")[0], c.split(" ")[1] != "none"))
    table = pd.DataFrame({"detector": detectors})
    for col in order:
        table[col] = [cells[col][d] for d in detectors]
    return table


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
    for name, adv in ctx.adv_sets.items():
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


def _save_scores(path, arrays: dict[str, np.ndarray]) -> None:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    data = buf.getvalue()
    aio.atomic_write(path, lambda f: f.write(data))


@register("evaluators", "ood")
class OODEvaluator:
    """OOD metrics (FPR95, AUROC, AUPR-In/Out) of every detector vs natural OOD and adversarial sets."""

    def __init__(self, success_only: bool | None = None):
        """``success_only``: True = successful adversarial examples are the positives, False = all attacked
        images; None (default) = the run's protocol decides (``ood_positives``)."""
        self.success_only = None if success_only is None else bool(success_only)

    def _success_only(self, ctx: RunContext) -> bool:
        if self.success_only is not None:
            return self.success_only
        return protocols.get(ctx.protocol).ood_positives == "successful"

    def __call__(self, ctx: RunContext) -> dict[str, pd.DataFrame]:
        rows: list[dict[str, Any]] = []
        detectors = list(ctx.scores) + [d for d in ctx.detector_errors if d not in ctx.scores]
        for det in detectors:
            rows += self._rows(ctx, det)
            if det in ctx.scores:
                self._write_scores(ctx, det)
        df = pd.DataFrame(rows, columns=COLUMNS)
        df["n_id"] = df["n_id"].astype("Int64")
        df["n_ood"] = df["n_ood"].astype("Int64")
        table = pivot_table(df)
        out = {"ood.csv": df, "table_ood.csv": table, "table_ood.md": table}
        adaptive = adaptive_table(df, ctx)
        if len(adaptive):
            out.update({"table_adaptive.csv": adaptive, "table_adaptive.md": adaptive})
        return out

    def _targets(self, ctx: RunContext) -> list[tuple[str, float, str, np.ndarray | None]]:
        """``(attack, eps, ood_set, positive mask)`` for every natural OOD set and adversarial set."""
        out: list[tuple[str, float, str, np.ndarray | None]] = [("none", math.nan, name, None) for name in ctx.ood_sets]
        success_only = self._success_only(ctx)
        for attack, adv in ctx.adv_sets.items():
            mask = adv.records["success"].to_numpy(dtype=bool) if success_only and adv.source == "id" else None
            out.append((attack, math.nan if adv.eps is None else float(adv.eps), attack, mask))
        return out

    def _rows(self, ctx: RunContext, det: str) -> list[dict[str, Any]]:
        head = {"dataset": ctx.dataset, "arch": ctx.arch, "detector": det, "backend": ctx.backend}
        scores = ctx.scores.get(det)
        rows = []
        for attack, eps, ood_set, mask in self._targets(ctx):
            positives = "natural" if attack == "none" else ("all" if mask is None else "successful")
            row = {**head, "attack": attack, "eps": eps, "ood_set": ood_set, "positives": positives,
                   "protocol": ctx.protocol}
            if scores is None:
                n_ood = int(mask.sum()) if mask is not None else len(ctx.ood_sets[ood_set])
                rows.append({**row, **NAN_METRICS, "n_id": len(ctx.id_set), "n_ood": n_ood,
                             "error": ctx.detector_errors[det]})
                continue
            conf_ood = scores[ood_set]
            if mask is not None:
                if len(mask) != len(conf_ood):
                    rows.append({**row, **NAN_METRICS, "n_id": len(scores["id"]), "n_ood": len(conf_ood),
                                 "error": f"{len(conf_ood)} scores for {len(mask)} adversarial examples"})
                    continue
                conf_ood = conf_ood[mask]
            rows.append({**row, **metric_row(scores["id"], conf_ood)})
        return rows

    def _write_scores(self, ctx: RunContext, det: str) -> None:
        arrays = {name: np.asarray(conf, dtype=np.float64) for name, conf in ctx.scores[det].items()}
        for attack, adv in ctx.adv_sets.items():
            arrays[f"{attack}.success"] = adv.records["success"].to_numpy(dtype=bool)
        _save_scores(ctx.out / "scores" / f"{det}.npz", arrays)
