"""Paired comparisons of robust AUROCs (``robust_paired.csv``), for the ``robust_auroc`` evaluator.

**Pairs.** Within one natural OOD set, eps and method, every detector's robust AUROC (both sides attacked) rests on
the same clean images: image ``i`` of ``robust_id_<a>`` and of ``robust_id_<b>`` is image ``i`` of the ID test set
(likewise on the OOD side), each attacked against its own detector. Each detector enters with one row of
``robust_auroc.csv``: its EOT row when it has one (a randomised detector's default), else its plain row. Pairs as
in ``paired.csv`` (:func:`~advopenood_plugins.kit.paired.detector_pairs`): every pair with at most 20 detectors,
else each against the best; a declared twin (``smoothed_<det>`` and ``<det>``) always, the derived one as ``detector_a``.
The ensemble (``method`` ``ensemble``) is compared the same way, each detector by its per-image worst case over its
own attacks: does a defence still beat its base when every attack of the run is taken into account?

**Interval** on ``delta_robust_auroc = robust_auroc_a - robust_auroc_b`` (points), by the run's ``ci`` plan:
``bootstrap``: one draw of ID and one of OOD indices per (set, eps, method), seeded by the run seed and
``robust_paired|<set>|<eps>|<method>`` (:meth:`advopenood.evaluation.intervals.IntervalPolicy.paired`), applied to both
detectors' attacked arrays (a paired, stratified bootstrap; Efron & Tibshirani 1993, ch. 13), percentile interval
of the replicates' differences; ``delong``: DeLong's test for correlated AUROCs
(:func:`advopenood.evaluation.metrics.auroc_difference_interval`: two detectors on the same images); ``none``: empty.
``significant`` is True when the interval excludes 0.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from advopenood.plugin import Claim, RunContext, bound_label, eps_label, name as label, pair_claim, too_few
from advopenood_plugins.kit.paired import detector_pairs, significant

ROBUST_PAIRED_COLUMNS = ["ood_set", "eps", "method", "detector_a", "family_a", "detector_b", "family_b", "twin",
                         "robust_auroc_a", "robust_auroc_b", "delta_robust_auroc", "delta_robust_auroc_lo",
                         "delta_robust_auroc_hi", "ci", "significant", "n_id", "n_ood", "error", "protocol"]


def paired_key(ood_set: str, eps: float, method: str) -> str:
    """The cell key of one (set, eps, method) group's draws: ``robust_paired|<set>|<eps as %.6g>|<method>``."""
    return f"robust_paired|{ood_set}|{float(eps):.6g}|{method}"


def chosen_rows(group: pd.DataFrame) -> pd.DataFrame:
    """One row per detector: its EOT row when it has one, else its plain row."""
    ordered = group.assign(_eot=group["attack_family"].eq("eot")).sort_values("_eot", ascending=False, kind="stable")
    return ordered.drop_duplicates("detector").drop(columns="_eot")


def robust_paired_table(ctx: RunContext, table: pd.DataFrame,
                        worst: dict[tuple[str, str, float], tuple[np.ndarray, np.ndarray]] | None = None
                        ) -> pd.DataFrame:
    """``robust_paired.csv`` from ``robust_auroc.csv``'s rows (``table``) and the run's scores (module docstring);
    an ensemble row's arrays are its per-image worst case, ``worst[(detector, OOD set, eps)]``."""
    policy, worst = ctx.intervals, worst or {}

    def arrays(det: str, r: pd.Series) -> tuple[np.ndarray, np.ndarray]:
        if r["method"] == "ensemble":
            return worst[det, r["ood_set"], r["eps"]]
        return np.asarray(ctx.scores[det][r["id_attack"]], float), np.asarray(ctx.scores[det][r["ood_attack"]], float)

    rows: list[dict[str, Any]] = []
    for (ood_set, eps, attack), group in table.groupby(["ood_set", "eps", "method"], sort=False):
        chosen = chosen_rows(group).set_index("detector")
        cells = {d: arrays(d, r) for d, r in chosen.iterrows()}
        aurocs = dict(zip(chosen.index, chosen["robust_auroc"].astype(float)))
        reps: dict[str, np.ndarray] = {}
        sizes = {(len(i), len(o)) for i, o in cells.values()}
        if policy.bootstrap and len(sizes) == 1 and not too_few(*next(iter(sizes))):
            kept = [d for d in cells if not np.isnan(aurocs[d])]
            got = policy.paired(paired_key(ood_set, eps, attack), [cells[d] for d in kept], ("auroc",))
            reps = {d: r["auroc"] for d, r in zip(kept, got)}
        for a, b, twin in detector_pairs(aurocs, aurocs):
            lo, hi, error, how = policy.bounded_difference(cells[a], cells[b], reps.get(a), reps.get(b))
            rows.append({"ood_set": ood_set, "eps": eps, "method": attack, "detector_a": a,
                         "family_a": chosen.loc[a, "attack_family"], "detector_b": b,
                         "family_b": chosen.loc[b, "attack_family"], "twin": twin, "robust_auroc_a": aurocs[a],
                         "robust_auroc_b": aurocs[b], "delta_robust_auroc": aurocs[a] - aurocs[b],
                         "delta_robust_auroc_lo": lo, "delta_robust_auroc_hi": hi,
                         "ci": bound_label(policy.label, {"delta_robust_auroc": how}),
                         "significant": significant(lo, hi),
                         "n_id": len(cells[a][0]), "n_ood": len(cells[a][1]), "error": error,
                         "protocol": ctx.protocol})
    return pd.DataFrame(rows, columns=ROBUST_PAIRED_COLUMNS).astype({"significant": "boolean", "twin": bool})


#: the columns that pick one row of ``robust_paired.csv``, and the row's ``(a, b, delta, lo, hi)`` for its claim
ROBUST_PAIRED_KEYS = ("ood_set", "eps", "method", "detector_a", "detector_b")
ROBUST_CLAIM_COLUMNS = ("detector_a", "detector_b", "delta_robust_auroc", "delta_robust_auroc_lo",
                        "delta_robust_auroc_hi")


def read_robust_paired(table: pd.DataFrame) -> list[Claim | str]:
    """Per (set, eps, method): a claim for every pair whose paired interval excludes 0 (which robust AUROC is
    higher, with the interval of the difference stated) and for every twin pair; the other pairs are counted as
    ties. No detector is called the highest: a ranking is only what the paired intervals show."""
    out: list[Claim | str] = []
    for (ood_set, eps, method), part in table.groupby(["ood_set", "eps", "method"], sort=False):
        where = f"{label(ood_set)}, {method.upper()}, eps {eps_label(eps)}"
        rows = [r for r in part.to_dict("records") if not pd.isna(r["delta_robust_auroc"])]
        shown = [r for r in rows if bool(r["twin"]) or r["significant"] is True or r["significant"] == True]  # noqa: E712
        out += [pair_claim(r, "robust_paired.csv", ROBUST_PAIRED_KEYS, ROBUST_CLAIM_COLUMNS) for r in shown]
        tied = len(rows) - len(shown)
        if tied:
            out.append(f"{where}: {tied} of {len(rows)} pair(s) of detectors tie (no difference shown; the paired "
                       "interval contains 0 or there is none).")
    return out
