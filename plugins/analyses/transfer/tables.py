"""The ``transfer`` analysis's metrics (ASR, defense accuracy, improvement, AUROC/FPR95 of the transferred examples),
its adversaries' plan, the table's rows and the per-sample arrays it saves (``transfer_samples.npz``); the analysis
is ``plugin.py`` (whose docstring defines every metric), its report section ``report.py``.
"""
from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from advopenood.plugin import io as aio, ood_metrics, seeded_prefix

# ------------------------------------------------------------------------------------------------ metrics


def clean_correct(y: np.ndarray, clean_pred: np.ndarray) -> np.ndarray:
    """Mask of the rows the target classifies correctly when clean (``clean_pred_i = y_i``)."""
    return np.asarray(clean_pred) == np.asarray(y)


def transfer_asr(y: np.ndarray, adv_pred: np.ndarray) -> float:
    """``100 * |{i: adv_pred_i != y_i}| / n`` over the ``n`` attacked rows (NaN without rows): the untargeted
    attack "is considered successful as long as" the target's label differs from the true one (Sec. 2)."""
    wrong = np.asarray(adv_pred) != np.asarray(y)
    return float(100.0 * wrong.mean()) if len(wrong) else math.nan


def defense_accuracy(y: np.ndarray, adv_pred: np.ndarray, rejected: np.ndarray | None = None) -> float:
    """``100 * mean_i(adv_pred_i = y_i or rejected_i)`` over the attacked rows (NaN without rows).

    Sec. 3.10: "The vanilla defense accuracy is the percent of adversarial examples the vanilla network
    correctly identifies"; the authors' ``evaluateAdversarialAttackSuccessRate`` (DefenseMultiModel.py L45-54)
    counts an untargeted attack as won "only if we don't correctly label the sample AND the sample isn't given
    the noise class label", and defense accuracy is one minus that (AttackWrappersBlackBox.py L86). Without
    ``rejected`` (the vanilla network) it is ``100 - transfer_asr`` exactly."""
    right = np.asarray(adv_pred) == np.asarray(y)
    if rejected is not None:
        right = right | np.asarray(rejected, dtype=bool)
    return float(100.0 * right.mean()) if len(right) else math.nan


def improvement(defense_acc: float, vanilla_acc: float) -> float:
    """``defense_acc - vanilla_acc``, Sec. 3.10: "Defense accuracy improvement is the percent increase in
    correctly recognized adversarial examples gained when implementing the defense as compared to having no
    defense. We compute this value by first conducting a specific black-box attack on a vanilla network (no
    defense). [...] We run the same attack on a given defense." Each run has its own adversary, so the value
    is negative when the defense does worse than the vanilla network (Fig. 1)."""
    return float(defense_acc) - float(vanilla_acc)


def detection_metrics(conf_id: np.ndarray, id_correct: np.ndarray, conf_adv: np.ndarray,
                      adv_fooled: np.ndarray) -> dict[str, float]:
    """``{auroc, fpr95}`` in percent (:func:`advopenood.evaluation.metrics.ood_metrics`, adversarial = positive) of the
    clean-correct ID confidences ``conf_id[id_correct]`` against the confidences of the transferred examples
    that flip a clean-correct image, ``conf_adv[adv_fooled]``; NaN when a side is empty or a score is NaN."""
    try:
        m = ood_metrics(np.asarray(conf_id)[np.asarray(id_correct, bool)],
                        np.asarray(conf_adv)[np.asarray(adv_fooled, bool)])
    except ValueError:  # empty side or NaN scores: undefined
        return {"auroc": math.nan, "fpr95": math.nan}
    return {"auroc": m["auroc"], "fpr95": m["fpr95"]}


# ------------------------------------------------------------------------------------------- the adversaries


@dataclass
class Adversary:
    """One black-box adversary: threat model, data fraction (percent), the detector guarding its queries (None:
    the classifier alone, or no query), the ID test rows it attacks, the table rows its examples give
    (``defenses``; ``""`` is the vanilla network's row), and the index of the adversary whose undefended accuracy
    is the vanilla defense accuracy of those rows."""

    mode: str
    fraction: float
    oracle: str | None
    rows: np.ndarray
    defenses: list[str]
    baseline: int

    @property
    def label(self) -> str:
        if self.mode == "pure":
            return "pure"
        return f"mixed{self.fraction:g}" + ("" if self.oracle is None else f"@{self.oracle}")


def eval_rows(correct: np.ndarray, limit: int | None, seed: int) -> np.ndarray:
    """The clean-correct ID rows (``correct`` is :func:`clean_correct` of the ID test set), or a sorted seeded
    sample of ``limit`` of them (``strong``)."""
    rows = np.flatnonzero(correct)
    if limit is None or limit >= len(rows):
        return rows
    return rows[seeded_prefix(len(rows), limit, seed)]


def first_where(mask: np.ndarray, limit: int | None) -> np.ndarray:
    """The first ``limit`` rows where ``mask`` holds (all of them when None), in test-set order."""
    return np.flatnonzero(np.asarray(mask, bool))[:limit]


def plan(settings: dict[str, Any], detectors: list[str], id_correct: np.ndarray, accepted: dict[str, np.ndarray],
         query: str | None, seed: int) -> list[Adversary]:
    """The adversaries of a run and the test rows each attacks.

    ``adversaries="shared"`` (``strong``): the pure adversary and one mixed adversary per fraction (queries
    guarded by ``query``), all on :func:`eval_rows`; each one's examples give a row per detector.
    ``adversaries="per_defense"`` (``mahmood2021``): the pure adversary on the first ``limit`` test rows,
    unfiltered (AttackWrappersBlackBox.py L274-275), giving the vanilla row and a row per detector; per
    fraction, a vanilla mixed adversary on the first ``limit`` rows the classifier gets right, and per detector
    ``d`` a mixed adversary that queries the classifier guarded by ``d`` and attacks the first ``limit`` rows the
    defended classifier gets right (``id_correct & accepted[d]``; L41, L229-247), compared with the vanilla one."""
    limit = settings["limit"]
    if settings["adversaries"] == "shared":
        rows, defenses = eval_rows(id_correct, limit, seed), detectors or [""]
        out = [Adversary("pure", 100.0, None, rows, defenses, 0)]
        return out + [Adversary("mixed", float(f), query, rows, defenses, i + 1)
                      for i, f in enumerate(settings["fractions"])]
    out = [Adversary("pure", 100.0, None, first_where(np.ones(len(id_correct), bool), limit), ["", *detectors], 0)]
    for f in settings["fractions"]:
        base = len(out)
        out.append(Adversary("mixed", float(f), None, first_where(id_correct, limit), [""], base))
        out += [Adversary("mixed", float(f), d, first_where(id_correct & accepted[d], limit), [d], base)
                for d in detectors]
    return out


@dataclass
class Outcome:
    """One attack of one adversary, on its rows: labels, the target's clean and adversarial predictions, the
    surrogate's clean predictions, and per detector the confidences on the transferred images (None: failed)."""

    y: np.ndarray
    clean_pred: np.ndarray
    adv_pred: np.ndarray
    surrogate_pred: np.ndarray
    eps: float
    conf: dict[str, np.ndarray | None] = field(default_factory=dict)


def table_rows(adversaries: list[Adversary], outcomes: list[dict[str, Outcome]], queries: list[int],
               thresholds: dict[str, float], conf_id: dict[str, np.ndarray], id_correct: np.ndarray
               ) -> list[dict[str, Any]]:
    """One row per adversary, attack and defense (see the module docstring for the columns)."""
    out = []
    for adv, results, spent in zip(adversaries, outcomes, queries):
        for attack, o in results.items():
            undefended = defense_accuracy(o.y, o.adv_pred)
            base = outcomes[adv.baseline][attack]
            vanilla = defense_accuracy(base.y, base.adv_pred)
            common = {"surrogate": adv.mode, "data_fraction": adv.fraction, "query_detector": adv.oracle or "",
                      "queries": spent, "attack": attack, "asr": transfer_asr(o.y, o.adv_pred),
                      "undefended_acc": undefended, "vanilla_acc": vanilla,
                      "surrogate_acc": float(100.0 * np.mean(o.surrogate_pred == o.y)) if len(o.y) else math.nan,
                      "n": len(o.y), "eps": o.eps}
            fooled = clean_correct(o.y, o.clean_pred) & (o.adv_pred != o.y)
            for det in adv.defenses:
                conf = o.conf.get(det)
                if not det:
                    row = {"auroc": math.nan, "fpr95": math.nan, "defense_acc": undefended}
                elif conf is None:  # the detector failed while scoring (reason in ctx.bank.errors)
                    row = {"auroc": math.nan, "fpr95": math.nan, "defense_acc": math.nan}
                else:
                    row = {**detection_metrics(conf_id[det], id_correct, conf, fooled),
                           "defense_acc": defense_accuracy(o.y, o.adv_pred, conf < thresholds[det])}
                out.append({**common, "detector": det, **row,
                            "improvement": improvement(row["defense_acc"], vanilla)})
    return out


def save_samples(path: Path, meta: dict[str, Any], adversaries: list[Adversary], outcomes: list[dict[str, Outcome]],
                 id_y: np.ndarray, id_pred: np.ndarray, conf_id: dict[str, np.ndarray]) -> None:
    """Write, atomically, every per-sample array the table is computed from (one ``.npz``): ``id.y``,
    ``id.pred`` and ``id.conf.<det>`` over all ID test images; per adversary ``a<i>``: ``a<i>.rows`` (ID rows
    attacked) and per attack ``a<i>.<attack>.adv_pred``, ``.surrogate_pred`` and ``.conf.<det>``; ``meta`` (JSON)
    describes the adversaries."""
    arrays: dict[str, np.ndarray] = {"meta": np.array(json.dumps(meta)), "id.y": np.asarray(id_y),
                                     "id.pred": np.asarray(id_pred)}
    arrays |= {f"id.conf.{d}": np.asarray(c, np.float64) for d, c in conf_id.items()}
    for i, (adv, results) in enumerate(zip(adversaries, outcomes)):
        arrays[f"a{i}.rows"] = np.asarray(adv.rows, np.int64)
        for attack, o in results.items():
            arrays[f"a{i}.{attack}.adv_pred"] = np.asarray(o.adv_pred)
            arrays[f"a{i}.{attack}.surrogate_pred"] = np.asarray(o.surrogate_pred)
            arrays |= {f"a{i}.{attack}.conf.{d}": np.asarray(c, np.float64) for d, c in o.conf.items() if c is not None}
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    aio.atomic_write(path, lambda f: f.write(buf.getvalue()))
