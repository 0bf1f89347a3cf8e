"""Re-derivation of the ``transfer`` analysis' ``transfer.csv`` from the per-sample arrays the run saved in
``transfer_samples.npz``, written apart from ``plugins/analyses/transfer/`` and :mod:`advopenood.evaluation.metrics`.

Definitions (Mahmood et al. 2021, Sec. 3.10, and the authors'
``DefenseMultiModel.evaluateAdversarialAttackSuccessRate``): on the ``n`` attacked test images of a row, ``asr``
is the share the classifier misclassifies, ``undefended_acc`` the share it labels right, ``defense_acc`` the
share labelled right or rejected (confidence below the quantile at 1 - 0.95 of the detector's clean ID
confidences: 95 % of them accepted), ``vanilla_acc`` the ``undefended_acc`` of the row's vanilla adversary,
``improvement = defense_acc - vanilla_acc``, ``surrogate_acc`` the share the surrogate labels right when clean.
``auroc`` / ``fpr95`` (OpenOOD's, adversarial = positive, decision score ``-conf``) compare the clean-correct ID
confidences with those of the row's examples that flip a clean-correct image; computed by the independent checker
:mod:`advopenood.evaluation.oracle`. The rows each adversary attacked are checked against the protocol's rule
(:func:`check_rows`).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from advopenood.plugin import oracle, read_npz

SAMPLES = "transfer_samples.npz"
KEYS = ["surrogate", "data_fraction", "query_detector", "attack", "detector"]
COLUMNS = ["queries", "asr", "auroc", "fpr95", "defense_acc", "undefended_acc", "vanilla_acc", "improvement",
           "surrogate_acc", "n", "eps"]


def _share(hit: np.ndarray) -> float:
    """Percent of true entries, NaN for none."""
    return 100.0 * np.count_nonzero(hit) / hit.size if hit.size else math.nan


def _cut(conf_id: np.ndarray) -> float:
    """The rejection threshold: the linear-interpolation quantile at ``1 - 0.95`` of the clean ID confidences."""
    return float(np.quantile(conf_id, 1 - 0.95))


def load(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The saved arrays and the ``meta`` description."""
    arrays = read_npz(path)
    return arrays, json.loads(str(arrays.pop("meta")))


def rederive(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> pd.DataFrame:
    """transfer.csv's rows recomputed from the arrays."""
    y_all, pred_all = arrays["id.y"], arrays["id.pred"]
    correct_all = y_all == pred_all
    cut = {d: _cut(arrays[f"id.conf.{d}"]) for d in meta["detectors"]}
    right: dict[tuple[int, str], np.ndarray] = {}
    for i, adv in enumerate(meta["plan"]):
        for attack in adv["eps"]:
            right[i, attack] = arrays[f"a{i}.{attack}.adv_pred"] == y_all[arrays[f"a{i}.rows"]]
    out = []
    for i, adv in enumerate(meta["plan"]):
        rows = arrays[f"a{i}.rows"]
        y = y_all[rows]
        for attack, eps in adv["eps"].items():
            ok = right[i, attack]
            vanilla = _share(right[adv["baseline"], attack])
            flipped = correct_all[rows] & ~ok
            common = {"surrogate": adv["surrogate"], "data_fraction": float(adv["data_fraction"]),
                      "query_detector": adv["query_detector"], "attack": attack, "queries": adv["queries"],
                      "asr": _share(~ok), "undefended_acc": _share(ok), "vanilla_acc": vanilla,
                      "surrogate_acc": _share(arrays[f"a{i}.{attack}.surrogate_pred"] == y), "n": rows.size,
                      "eps": math.nan if eps is None else eps}
            for det in adv["defenses"]:
                key = f"a{i}.{attack}.conf.{det}"
                if not det:
                    auroc, fpr95, defended = math.nan, math.nan, _share(ok)
                elif key not in arrays:
                    auroc, fpr95, defended = math.nan, math.nan, math.nan
                else:
                    conf = arrays[key]
                    negatives, positives = arrays[f"id.conf.{det}"][correct_all], conf[flipped]
                    auroc, fpr95 = oracle.auroc(negatives, positives), oracle.fpr95(negatives, positives)
                    defended = _share(ok | (conf < cut[det]))
                out.append({**common, "detector": det, "auroc": auroc, "fpr95": fpr95, "defense_acc": defended,
                            "improvement": defended - vanilla})
    return pd.DataFrame(out, columns=KEYS + COLUMNS)


def check_rows(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> list[str]:
    """The test rows of every adversary follow the protocol's rule: ``shared`` adversaries attack the same
    clean-correct rows (all, or ``limit`` of them); ``per_defense`` ones the first ``limit`` rows of the test set
    (pure), of those the classifier gets right (vanilla mixed), or of those it gets right and the adversary's query
    detector accepts (mixed, per defense)."""
    y, pred = arrays["id.y"], arrays["id.pred"]
    limit = meta["limit"] if meta["limit"] is not None else y.size
    lines = []
    for i, adv in enumerate(meta["plan"]):
        rows, name = arrays[f"a{i}.rows"], f"{adv['surrogate']} {adv['data_fraction']:g} {adv['query_detector']}"
        if meta["adversaries"] == "shared":
            good = pred[rows] == y[rows]
            want_n = min(limit, int(np.sum(pred == y)))
            if not good.all() or rows.size != want_n or not np.array_equal(rows, arrays["a0.rows"]):
                lines.append(f"transfer_samples.npz: adversary {name!r} does not attack the run's {want_n} shared "
                             "clean-correct test images")
            continue
        keep = np.ones(y.size, bool) if adv["surrogate"] == "pure" else pred == y
        det = adv["query_detector"]
        if det:
            conf = arrays[f"id.conf.{det}"]
            keep &= conf >= _cut(conf)
        want = np.nonzero(keep)[0][:limit]
        if not np.array_equal(rows, want):
            lines.append(f"transfer_samples.npz: adversary {name!r} attacks {rows.size} test images, not the first "
                         f"{want.size} that its rule selects")
    return lines


def check_core_scores(path: Path, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> list[str]:
    """The saved clean ID confidences are the run's own (``scores/<det>.npz``, where the run saved them)."""
    lines = []
    for det in meta["detectors"]:
        core = path / "scores" / f"{det}.npz"
        if core.is_file():
            saved = read_npz(core)
            same = "id" in saved and np.array_equal(saved["id"], arrays[f"id.conf.{det}"])
            if not same:
                lines.append(f"transfer_samples.npz: id.conf.{det} differs from scores/{det}.npz's id confidences")
    return lines


def verify(run: Any) -> list[str]:
    """Differences between transfer.csv and its re-derivation from transfer_samples.npz (``advopenood verify``)."""
    if not run.has("transfer.csv"):
        return []
    path = Path(run.path)
    if not (path / SAMPLES).is_file():
        return [f"transfer.csv: {SAMPLES} is missing; the table cannot be re-derived"]
    from advopenood.plugin import compare

    arrays, meta = load(path / SAMPLES)
    written = run.table("transfer.csv").astype({"data_fraction": float})
    lines = check_rows(arrays, meta) + check_core_scores(path, arrays, meta)
    if written["protocol"].astype(str).ne(meta["protocol"]).any():
        lines.append(f"transfer.csv: protocol column differs from the run's {meta['protocol']!r}")
    return lines + compare(rederive(arrays, meta), written, KEYS, COLUMNS, atol=1e-4, table="transfer.csv")
