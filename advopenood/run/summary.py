"""What a finished run prints on stdout: where its report is and up to three headline numbers, each with its 95 %
interval: the classifier's clean accuracy and the strongest attack's success rate (Wilson intervals), and the most
robust detector's worst AUROC (DeLong interval, :func:`advopenood.evaluation.metrics.auroc_interval`)."""
from __future__ import annotations

import numpy as np

from advopenood.evaluation.context import RunContext
from advopenood.evaluation.intervals import wilson
from advopenood.evaluation.metrics import auroc, auroc_interval
from advopenood.outputs.report import eps_label


def _pct(value: float, lo: float, hi: float) -> str:
    return f"{value:.1f} % (95 % interval {lo:.1f} to {hi:.1f})"


def strongest_attack(ctx: RunContext) -> tuple[list[str], int, int] | None:
    """``(sets, successes, correctly classified images)`` of the ID->ID sets with the highest ASR (asr.csv's ``asr``;
    every set that ties for it, in run order, the counts of the first) among the bounded ones (a minimal-perturbation
    attack succeeds almost always, at any distance), among all when none is bounded; None when the run has no ID->ID
    set."""
    sets = ctx.id_adv_sets
    bounded = {name: adv for name, adv in sets.items() if adv.eps is not None}
    rates = {}
    for name, adv in (bounded or sets).items():
        r = adv.records
        correct = (r.clean_pred == r.y).to_numpy()
        k, n = int(r.success.to_numpy().astype(bool)[correct].sum()), int(correct.sum())
        if n:
            rates[name] = (k, n)
    if not rates:
        return None
    top = max(k / n for k, n in rates.values())
    names = [name for name, (k, n) in rates.items() if k / n == top]
    return (names, *rates[names[0]])


def most_robust_detector(ctx: RunContext) -> tuple[str, str, float, tuple[float, float]] | None:
    """``(detector, set, AUROC in %, its DeLong interval)``: the detector whose lowest AUROC over the adversarial
    sets (their protocol positives; the natural OOD sets when the run has no adversarial set) is highest. None
    without scores or with fewer than 2 images a side."""
    sets = list(ctx.positive_sets) or list(ctx.ood_sets)
    best = None
    for det, by_set in sorted(ctx.scores.items()):
        worst = None
        for name in (s for s in sets if s in by_set and "id" in by_set):
            conf = np.asarray(by_set[name])
            if name in ctx.adv_sets:
                mask = ctx.ood_positives(name)
                conf = conf[mask] if len(mask) == len(conf) else conf[:0]
            if len(conf) < 2 or len(by_set["id"]) < 2:
                continue
            try:
                value = auroc(by_set["id"], conf)
            except ValueError:  # NaN scores: the evaluators report them
                continue
            if worst is None or value < worst[0]:
                worst = (value, name, conf)
        if worst is not None and (best is None or worst[0] > best[1][0]):
            best = (det, worst)
    if best is None:
        return None
    det, (value, name, conf) = best
    lo, hi = auroc_interval(ctx.scores[det]["id"], conf)
    return det, name, 100 * value, (100 * lo, 100 * hi)


def summary(ctx: RunContext) -> list[str]:
    """The run's closing lines: the report's path and the headline numbers with their 95 % intervals."""
    report = ctx.out / "report.html"
    lines = [f"report: {report}" if report.is_file() else f"outputs: {ctx.out}"]
    n = len(ctx.clean.y)
    if n:
        k = int((ctx.clean.pred == ctx.clean.y).sum())
        lines.append(f"clean accuracy: {_pct(100 * k / n, *wilson(k, n))} on {n} ID images")
    attack = strongest_attack(ctx)
    if attack is not None:
        names, k, n = attack
        budgets = sorted({eps_label(ctx.adv_sets[name].eps) or "no budget" for name in names})
        budget = ", ".join(f"eps {b}" if b != "no budget" else b for b in budgets)
        which = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        lines.append(f"strongest attack: {which} ({budget}), ASR {_pct(100 * k / n, *wilson(k, n))} of {n} correctly "
                     "classified images")
    robust = most_robust_detector(ctx)
    if robust is not None:
        det, name, value, (lo, hi) = robust
        side = "adversarial" if name in ctx.adv_sets else "OOD"
        lines.append(f"most robust detector: {det}, worst AUROC over the {side} sets {_pct(value, lo, hi)} "
                     f"on {name}")
    return lines
