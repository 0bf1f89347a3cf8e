"""Re-derivation of the ``smoothed`` evaluator's ``table_smoothed.csv`` from ``scores/*.npz`` and ``run.json``,
written apart from ``plugins/evaluators/smoothed/`` and :mod:`advopenood.evaluation.metrics` (nothing imported from either):
the metrics are :func:`advopenood.evaluation.oracle.ood_metrics` (OpenOOD's definitions), the
positives are the ``<set>.positive`` masks the core saved, and the attack sets' sources and parameters come from
``run.json``. Each cell's interval is re-derived as ``ood.csv``'s
(:func:`advopenood_plugins.kit.verify.rederive_bounds`, a loop over the cell's seeded resamples, key
``ood|<det>|<set>``).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from advopenood.plugin import oracle
from advopenood_plugins.kit.verify import rederive_bounds

TABLE = "table_smoothed.csv"


def _named(value: Any) -> str:
    """A set-name cell as written (an empty cell reads back as NaN)."""
    return "" if pd.isna(value) else str(value)


BOUNDED = [f"{m}{end}" for m in ("auroc", "fpr95") for end in ("", "_lo", "_hi")]


def _side(run: Any, arrays: dict[str, np.ndarray], det: str, name: str) -> tuple[dict[str, float], float]:
    """(AUROC and FPR95 with their intervals, n_ood) of ID vs set ``name``: an attack set's saved positives, a
    natural set's every row."""
    if not name:
        return {m: math.nan for m in BOUNDED}, math.nan
    conf = arrays[name]
    if name in (run.info.get("attacks") or {}):
        conf = conf[arrays[f"{name}.positive"].astype(bool)]
    got = {**oracle.ood_metrics(arrays["id"], conf), **rederive_bounds(arrays["id"], conf, run, f"ood|{det}|{name}")}
    return {m: got[m] for m in BOUNDED}, float(len(conf))


def rederive(run: Any, table: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The written rows' numbers recomputed, and one line per row whose labels contradict ``run.json``."""
    attacks = run.info.get("attacks") or {}
    rule = str(run.info.get("protocol", {}).get("ood_positives", "successful"))
    given = {str(k).lower(): v or {} for k, v in (run.config.get("detector_params") or {}).items()}
    rows, lines = [], []
    for r in table.to_dict("records"):
        det, plain, eot = str(r["detector"]), _named(r["plain_attack"]), _named(r["eot_attack"])
        if det not in run.detectors:
            lines.append(f"{TABLE}: {det}: no saved scores")
            continue
        arrays = run.scores(det)
        base, n_base = _side(run, arrays, det, _named(r["baseline"]))
        got_plain, n_plain = _side(run, arrays, det, plain)
        got_eot, n_eot = _side(run, arrays, det, eot)
        source = attacks.get(plain or eot, {}).get("source", "id")
        direction = "id->id" if source == "id" else "ood->id"
        positives = "successful" if source == "id" and rule == "successful" else "all"
        for col, want in (("direction", direction), ("positives", positives),
                          *((k, given.get(det, {})[k]) for k in ("n", "sigma", "statistic") if k in given.get(det, {}))):
            if str(r[col]).lower() != str(want).lower() and not (isinstance(want, (int, float))
                                                                 and math.isclose(float(r[col]), float(want))):
                lines.append(f"{TABLE}: {det} / {plain or eot}: {col} written {r[col]!r}, run.json gives {want!r}")
        eot_params = attacks.get(eot, {}).get("params") or {}
        samples = (eot_params.get("eot") or r["n"]) if eot else math.nan
        cells = {f"{m}_{kind}{end}": got[f"{m}{end}"] for kind, got in (("baseline", base), ("plain", got_plain),
                                                                         ("eot", got_eot))
                 for m in ("auroc", "fpr95") for end in ("", "_lo", "_hi")}
        rows.append({"detector": det, "direction": r["direction"], "eps": r["eps"], "plain_attack": plain,
                     "eot_attack": eot, **cells, "n_ood_plain": n_plain, "n_ood_eot": n_eot, "eot_samples": samples,
                     "delta_auroc": got_eot["auroc"] - got_plain["auroc"], "ci": _ci(run)})
    return pd.DataFrame(rows), lines


def _ci(run: Any) -> str:
    """The ``ci`` label of the run's interval method."""
    from advopenood_plugins.kit.verify import ci_plan

    return ci_plan(run).label


def smoothed(detector: Any) -> bool:
    """Whether a registered detector class is a smoothed one, from what it declares: generated from another detector
    (:class:`~advopenood.capabilities.Derived`, with a ``base_name``) and randomised
    (:class:`~advopenood.capabilities.Randomised`: its confidence depends on noise draws)."""
    from advopenood.plugin import is_derived, is_randomised, twin_of

    return is_derived(detector) and is_randomised(detector) and bool(twin_of(detector))


#: the attacks the table pairs: the plain detector-adaptive ones (``adaptive_``, ``adaptive_ood_``,
#: ``adaptive_apgd_<det>``) and their EOT twins (``adaptive_eot_`` ...); other attacks on a smoothed detector
#: (``robust_id_`` / ``robust_ood_<det>`` of the robust_auroc evaluator) are neither and belong in no row
PAIRED = "adaptive_"


def missing_sets(run: Any, table: pd.DataFrame) -> list[str]:
    """Plain or EOT adaptive attack sets of the run that target a smoothed detector with saved scores but appear in
    no row. A smoothed detector is re-recognised by its declared capabilities (:func:`smoothed`), not by the
    evaluator's own test."""
    from advopenood.plugin import registry
    from advopenood.plugin import is_detector_aware

    listed = {_named(v) for col in ("plain_attack", "eot_attack") for v in table[col]}
    lines = []
    for name, entry in (run.info.get("attacks") or {}).items():
        cls = registry.get("attacks", entry["attack"])
        target = cls.detector if is_detector_aware(cls) else ""
        if str(entry["attack"]).startswith(PAIRED) and target in run.detectors \
                and smoothed(registry.get("detectors", target)) and name not in listed:
            lines.append(f"{TABLE}: attack set {name!r} on {target} is in no row")
    return lines


def verify(run: Any) -> list[str]:
    """Differences between ``table_smoothed.csv`` and its re-derivation (``advopenood verify``)."""
    from advopenood.plugin import compare

    columns = ["detector", "direction", "eps", "plain_attack", "eot_attack", "baseline"]
    # the evaluator writes no table when it has no row: then every paired attack set the run made is in no row
    table = run.table(TABLE, columns) if run.has(TABLE) else pd.DataFrame(columns=columns)
    rederived, lines = rederive(run, table)
    lines += missing_sets(run, table)
    if len(rederived):
        keys = ["detector", "direction", "eps", "plain_attack", "eot_attack"]
        written = table.assign(plain_attack=table["plain_attack"].map(_named), eot_attack=table["eot_attack"].map(_named))
        cells = [f"{m}_{kind}{end}" for kind in ("baseline", "plain", "eot") for m in ("auroc", "fpr95")
                 for end in ("", "_lo", "_hi")]
        lines += compare(rederived, written[written["detector"].isin(run.detectors)], keys,
                         [*cells, "n_ood_plain", "n_ood_eot", "eot_samples", "delta_auroc", "ci"], atol=1e-6,
                         table=TABLE)
    return lines
