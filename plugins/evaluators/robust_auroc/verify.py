"""Re-derivation of ``robust_auroc.csv`` from ``scores/*.npz`` and ``run.json`` (``levels.csv``:
``plugins/evaluators/levels/verify.py``), written apart from ``plugins/evaluators/robust_auroc/`` and
:mod:`advopenood.evaluation.metrics`. The single-attack rows are re-derived by the kit's shared checker
(:mod:`advopenood_plugins.kit.verify_robust`, from :mod:`advopenood.evaluation.oracle`); the ensemble rows, the
paired table and the leaderboard's robust fields here.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from advopenood_plugins.kit.verify_robust import (ROBUST_BOUNDS, ROBUST_METRICS, attack_class,  # noqa: F401
                                                  rederive_robust, robust_bounds, robust_sets)


def verify_robust(run: Any) -> list[str]:
    """Differences between ``robust_auroc.csv`` and its re-derivation (``advopenood verify``)."""
    from advopenood.plugin import compare

    if not run.has("robust_auroc.csv"):
        return ["robust_auroc.csv: the evaluator ran but the table is missing"]
    from advopenood_plugins.evaluators.robust_auroc.verify_ensemble import rederive_ensemble, verify_ensemble
    from advopenood_plugins.evaluators.robust_auroc.verify_paired import verify_robust_paired

    written = run.table("robust_auroc.csv")
    if "method" in written.columns:
        written = written[written["method"] != "ensemble"]
    rederived = rederive_robust(run)
    rows, steps, worst = rederive_ensemble(run)
    every = pd.concat([rederived, rows], ignore_index=True) if len(rows) else rederived
    return verify_ensemble(run, rederived, rows, steps) + compare(
        rederived, written, ["detector", "id_attack", "ood_attack"],
        ["ood_set", "eps", "method", "attack_family", *ROBUST_METRICS, *ROBUST_BOUNDS, "ci", "error", "n_id", "n_ood"],
        atol=1e-6, table="robust_auroc.csv") + verify_entries(run, every) + verify_robust_paired(run, every, worst)


def leaderboard_rows(robust: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The leaderboard's rule re-stated (docs/evaluators.md): per detector, at its largest eps, its ``ensemble`` rows
    where it has any, else those of the first of PGD, APGD, APGD-aux and Square it has (else its first method in
    sorted order), the EOT rows of that method where there are any."""
    out: dict[str, pd.DataFrame] = {}
    for det in dict.fromkeys(robust["detector"]):
        part = robust[robust["detector"] == det]
        part = part[np.isclose(part["eps"].astype(float), part["eps"].astype(float).max())]
        have = list(part["method"])
        method = next((m for m in ("ensemble", "pgd", "apgd", "apgd_aux", "square") if m in have), min(have))
        part = part[part["method"] == method]
        eot = part[part["attack_family"] == "eot"]
        out[str(det)] = eot if len(eot) else part
    return out


def verify_entries(run: Any, robust: pd.DataFrame) -> list[str]:
    """The robust fields of ``leaderboard_openood.json``: per detector, the mean ``robust_auroc`` / ``robust_fpr95``
    over the near and the far sets (groups from ``ood.csv``'s natural rows) of the re-derived rows ``robust`` (the
    single-attack rows and the ensemble rows) that the leaderboard's one rule chooses
    (:func:`leaderboard_rows`, the rule re-stated apart from the writer's: the ensemble where there is one), to two
    decimals, and its eps and method; ``/`` for a detector without robust rows."""
    import json

    from advopenood.plugin import eps_label

    if not run.has("leaderboard_openood.json") or not run.has("ood.csv"):
        return []
    ood = run.table("ood.csv")
    groups = dict(zip(ood.loc[ood["attack"] == "none", "ood_set"], ood.loc[ood["attack"] == "none", "group"]))
    chosen = leaderboard_rows(robust) if len(robust) else {}
    lines = []
    for entry in json.loads((run.path / "leaderboard_openood.json").read_text()):
        det = entry["advopenood"]["detector"]
        rows = chosen.get(det, robust.iloc[:0])
        want = (eps_label(rows["eps"].iloc[0]), str(rows["method"].iloc[0])) if len(rows) else ("/", "/")
        if (entry.get("Robust_Eps"), entry.get("Robust_Method")) != want:
            lines.append(f"leaderboard_openood.json: {det} Robust_Eps, Robust_Method: written "
                         f"{(entry.get('Robust_Eps'), entry.get('Robust_Method'))!r}, re-derived {want!r}")
        for group, title in (("near", "Near-OOD"), ("far", "Far-OOD")):
            sub = rows[rows["ood_set"].map(groups) == group] if len(rows) else rows
            for metric, name in (("robust_auroc", "AUROC"), ("robust_fpr95", "FPR95")):
                want = "/" if not len(sub) else f"{sub[metric].to_numpy(float).sum() / len(sub):.2f}"
                if entry.get(f"{title}_Robust_{name}") != want:
                    lines.append(f"leaderboard_openood.json: {det} {title}_Robust_{name}: written "
                                 f"{entry.get(f'{title}_Robust_{name}')!r}, re-derived {want!r}")
    return lines
