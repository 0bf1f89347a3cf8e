"""The ``levels`` evaluator: the worst AUROC of every detector at each of the paper's four levels of robustness.

Lorenz et al., "Deciphering the Definition of Adversarial Robustness for Post-Hoc OOD Detectors", Sec. 4 "Levels
of Adversarial Robustness - From Detector towards Defense":

    1. Level 1: Evaluate on strong attacks [44] and avoid hyperparameters that weaken the strength of the attack's
       effect. The FGSM is not recommended because it performs a single step to find the adversarial
       perturbation, making it less effective than PGD [95]. Furthermore, the attack hyperparameter space is huge
       [96] and could mitigate the attacks' strength.
    2. Level 2: Use different models and datasets than the simple ResNet-18 trained on CIFAR-10. We suggest using
       ImageNet-1K because its resolution and objects are more closely related to real-world scenarios.
    3. Level 3: Elaborate your strategy to countermeasure the attack as demonstrated in [45]. New defense
       mechanisms have often been broken quickly again [44]. For example, a differentiable OOD detector can be
       easily fooled if the attacker approximates the gradients of the network during the backward pass in a
       differentiable manner, known as BPDA [97].
    4. Level 4: Let your method fail against sophisticated attacks, such as adaptive attacks [97, 54] or design OOD
       adversarial examples that convert OD to ID samples [3].
    "It must be noted that not all levels are required to be evaluated."

What counts, per detector ``d`` (AUROC in percent, OOD positive; an adversarial set's positives follow the run's
protocol, :meth:`advopenood.evaluation.context.RunContext.ood_positives`; a set whose AUROC is undefined, e.g. no
successful example under ``strong``, does not count):

* **Level 1**: the ID->ID sets of classifier-only attacks (not :class:`~advopenood.capabilities.DetectorAware`)
  that are not single-step (FGSM is left out, as the paper says) and whose settings are not weakened: no
  iteration count (``steps``, ``n_iter``, ``n_restarts``, ``n_queries``, ``binary_search_steps``) below the
  attack's default under the run's protocol, no budget below its default eps, and, where a step size is set,
  ``steps * step size >= eps`` (the iterates can reach the ball's surface).
* **Level 2**: a single run holds one model and one ID data set, so level 2 needs other runs: the run folders
  listed in ``evaluator_params.levels.runs`` whose ``(arch, dataset)`` differ from this run's contribute their
  ``levels.csv`` ``level1_auroc`` (strong attacks on their model and data) and their ``transfer.csv`` AUROCs
  (``plugins/transfer.py``: examples crafted on surrogate models the detector never saw); with at least one such
  value, ``level2_auroc`` is the worst of them and of this run's level 1.
* **Level 3**: the ID->ID sets of attacks adapted to ``d`` through its differentiable (BPDA) score:
  ``adaptive_<d>``, ``adaptive_apgd_<d>``.
* **Level 4**: OOD->ID sets adapted to ``d`` (``adaptive_ood_<d>``, ``robust_ood_<d>``, ``robust_apgd_ood_<d>``:
  clean ID against all their images) and the robust AUROC of ``d`` (both sides attacked,
  :mod:`advopenood_plugins.robust_auroc`).

A detector *reaches* level ``k`` when level ``k`` is evaluated, its worst AUROC there is at least ``min_auroc``
(default 50, chance: the detector still ranks attacked OOD below clean ID more often than not), and no evaluated
level below ``k`` falls short; ``reached`` is 0 when the lowest evaluated level falls short, empty when none is.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pandas as pd

from advopenood import io as aio
from advopenood import registry
from advopenood.attacks.base import attack_params
from advopenood.capabilities import Verifiable, is_detector_aware
from advopenood.evaluation.context import RunContext
from advopenood.errors import UsageError
from advopenood.evaluation.metrics import auroc
from advopenood.outputs.results import Bullets, Figure, Paragraph, Results, Section, Table, as_written, guarded
from advopenood.registry import register
from advopenood.outputs.report import join
from advopenood.outputs.report import name as label
from advopenood_plugins.ood_eval import set_groups
from advopenood_plugins.robust_auroc import robust_table
from advopenood_plugins.verify_robust import verify_levels

LEVELS = (1, 2, 3, 4)
COLUMNS = ["detector", *(f"level{k}_auroc" for k in LEVELS), "reached", "min_auroc", "sets", "protocol"]
#: attacks that take a single gradient step (Level 1: "The FGSM is not recommended because it performs a single step")
SINGLE_STEP = ("fgsm",)
#: a detector whose clean AUROC is below ``min_auroc`` plus this many points passes a level's bar without much to
#: lose (on the adversarially trained ResNet-20, MDS is 52.0 clean and 52.7 under PGD): the report says so
NEAR_BAR = 5.0
#: parameters that count iterations: a value below the attack's default weakens it
ITERATION_KEYS = ("steps", "n_iter", "n_restarts", "n_queries", "binary_search_steps")


def weakened(attack: str, params: dict[str, Any], input_size: int, protocol: str) -> str:
    """Why a set's settings weaken its attack against the attack's defaults under ``protocol`` (``""``: they do
    not): fewer iterations, a smaller budget, or steps that cannot reach the ball's surface."""
    default = attack_params(attack, input_size, protocol)
    for key in ITERATION_KEYS:
        if params.get(key) is not None and default.get(key) is not None and int(params[key]) < int(default[key]):
            return f"{key} {params[key]} < {default[key]}"
    eps = params.get("eps")
    if registry.get("attacks", attack).bounded and eps is not None and default.get("eps") is not None \
            and float(eps) < float(default["eps"]) * (1 - 1e-9):
        return f"eps {eps:.4g} < {float(default['eps']):.4g}"
    step = params.get("rel_stepsize")
    if step is None and params.get("abs_stepsize") is not None and eps:
        step = float(params["abs_stepsize"]) / float(eps)
    if step is not None and params.get("steps") is not None and float(step) * int(params["steps"]) < 1.0:
        return f"steps x step size = {float(step) * int(params['steps']):.3g} eps < eps"
    return ""


def set_auroc(ctx: RunContext, det: str, name: str) -> float:
    """AUROC (%) of clean ID against the protocol's positives of set ``name``; NaN when undefined."""
    conf = ctx.scores[det][name][ctx.ood_positives(name)]
    try:
        return 100.0 * auroc(ctx.scores[det]["id"], conf)
    except ValueError:
        return math.nan


def level_sets(ctx: RunContext) -> dict[str, dict[int, dict[str, float]]]:
    """``{detector: {level: {set label: AUROC}}}`` for levels 1, 3 and 4 of the run's scored detectors."""
    out: dict[str, dict[int, dict[str, float]]] = {det: {1: {}, 3: {}, 4: {}} for det in ctx.scores}
    size = int(ctx.model.input_size)
    for name, adv in ctx.positive_sets.items():
        cls = registry.get("attacks", adv.attack)
        aware = is_detector_aware(cls)
        for det in ctx.scores:
            if not aware and adv.source == "id" and adv.attack not in SINGLE_STEP \
                    and not weakened(adv.attack, adv.params, size, ctx.protocol):
                level = 1
            elif aware and cls.detector == det:
                level = 3 if adv.source == "id" else 4
            else:
                continue
            value = set_auroc(ctx, det, name)
            if not math.isnan(value):
                out[det][level][name] = value
    robust = robust_table(ctx)
    for r in robust.to_dict("records"):
        if not math.isnan(r["robust_auroc"]):
            out[r["detector"]][4][f"{r['id_attack']}+{r['ood_attack']}"] = float(r["robust_auroc"])
    return out


def other_runs(paths: list[str], arch: str, dataset: str) -> list[tuple[str, pd.DataFrame | None, pd.DataFrame | None]]:
    """``(label, levels.csv, transfer.csv)`` of every listed run folder on another ``(arch, dataset)`` than this run's
    (a table the folder lacks is None); a folder without ``run.json`` is a UsageError."""
    import json

    out = []
    for path in paths:
        folder = Path(path).expanduser()
        info_file = folder / "run.json"
        if not info_file.is_file():
            raise UsageError(f"evaluator levels: runs entry {path!r} is not a run folder (no run.json); valid "
                             "choices: output folders of other advopenood runs")
        info = json.loads(info_file.read_text())
        data = (info.get("config") or {}).get("data") or {}
        other = (str((info.get("model") or {}).get("arch", "")), str(data.get("dataset") or (data.get("id") or {}).get("name", "")))
        if other == (arch, dataset):
            continue
        tables = [pd.read_csv(folder / f) if (folder / f).is_file() else None for f in ("levels.csv", "transfer.csv")]
        out.append((folder.name, *tables))
    return out


def level2(det: str, runs: list[tuple[str, pd.DataFrame | None, pd.DataFrame | None]]) -> dict[str, float]:
    """Level-2 evidence of ``det`` from other runs: their level-1 AUROC and their worst transfer AUROC."""
    found: dict[str, float] = {}
    for name, levels, transfer in runs:
        if levels is not None:
            rows = levels.loc[levels["detector"] == det, "level1_auroc"].dropna()
            if len(rows):
                found[f"{name}:level1"] = float(rows.min())
        if transfer is not None:
            rows = transfer.loc[transfer["detector"] == det, "auroc"].dropna()
            if len(rows):
                found[f"{name}:transfer"] = float(rows.min())
    return found


def reached_level(worst: dict[int, float], min_auroc: float) -> float:
    """The highest evaluated level whose worst AUROC, and that of every evaluated level below it, is at least
    ``min_auroc``; 0 when the lowest evaluated level falls short; NaN when no level is evaluated."""
    evaluated = [k for k in LEVELS if not math.isnan(worst[k])]
    reached = 0
    for k in evaluated:
        if worst[k] < min_auroc:
            break
        reached = k
    return float(reached) if evaluated else math.nan


def levels_table(ctx: RunContext, min_auroc: float = 50.0, runs: list[str] | None = None) -> pd.DataFrame:
    """One row per scored detector: the worst AUROC at each level (NaN where the run has no set for it), the level
    reached and the sets used (``level<k>: a, b; ...``)."""
    evidence = other_runs(runs or [], ctx.arch, ctx.dataset) if runs else []
    rows = []
    for det, sets in level_sets(ctx).items():
        worst = {k: min(sets[k].values()) if sets.get(k) else math.nan for k in (1, 3, 4)}
        second = level2(det, evidence)
        if second:
            second.update({f"level1:{k}": v for k, v in sets[1].items()})
        worst[2] = min(second.values()) if second else math.nan
        used = {**sets, 2: second}
        rows.append({"detector": det, **{f"level{k}_auroc": worst[k] for k in LEVELS},
                     "reached": reached_level(worst, min_auroc), "min_auroc": min_auroc,
                     "sets": "; ".join(f"level{k}: {', '.join(used[k])}" for k in LEVELS if used.get(k)),
                     "protocol": ctx.protocol})
    return pd.DataFrame(rows, columns=COLUMNS)


# ------------------------------------------------------------------------------------------------- report

def clean_aurocs(ctx: RunContext) -> dict[str, float]:
    """Each scored detector's clean AUROC (%): the mean over the run's natural OOD sets (csid sets, covariate-shifted
    ID, left out as in ``table_ood``); NaN when it has none."""
    natural = [name for name, group in set_groups(ctx).items() if group != "csid"]
    out = {}
    for det, scores in ctx.scores.items():
        values = []
        for name in natural:
            try:
                values.append(100.0 * auroc(scores["id"], scores[name]))
            except (KeyError, ValueError):  # a set the detector did not score, or NaN scores: not counted
                continue
        out[det] = float(np.mean(values)) if values else math.nan
    return out


def read_levels(table: pd.DataFrame, clean: dict[str, float] | None = None) -> list[str]:
    """One sentence per detector: the level it reaches, where it falls short, which levels the run lacks; with
    ``clean`` (:func:`clean_aurocs`), a detector that reaches a level while its clean AUROC is within
    :data:`NEAR_BAR` points of ``min_auroc`` is said to detect little even unattacked (the bar is a floor)."""
    out = []
    clean = clean or {}
    for r in table.to_dict("records"):
        det, line = label(r["detector"]), float(r["min_auroc"])
        worst = {k: float(r[f"level{k}_auroc"]) for k in LEVELS}
        missing = [str(k) for k in LEVELS if math.isnan(worst[k])]
        gap = f" Levels {join(missing)} are not evaluated in this run." if len(missing) > 1 else \
            f" Level {missing[0]} is not evaluated in this run." if missing else ""
        if pd.isna(r["reached"]):
            out.append(f"{det}: no level is evaluated (the run has no strong, adaptive or OOD->ID set for it).")
            continue
        reached = int(r["reached"])
        failing = next((k for k in LEVELS if k > reached and not math.isnan(worst[k])), None)
        head = (f"{det} reaches level {reached} (worst AUROC there {worst[reached]:.1f}, at least {line:.0f})"
                if reached else f"{det} reaches no level")
        tail = (f"; at level {failing} its worst AUROC is {worst[failing]:.1f}, below {line:.0f}" if failing else "")
        base = clean.get(r["detector"], math.nan)
        weak = (f" Its clean AUROC is only {base:.1f}: it passes the bar of {line:.0f} without detecting much even "
                "unattacked." if reached and base < line + NEAR_BAR else "")
        out.append(f"{head}{tail}.{weak}{gap}")
    return out


def plot_levels(table: pd.DataFrame, path: Path, min_auroc: float) -> Path:
    """Grouped bars: the worst AUROC per level and detector, chance and the ``min_auroc`` line; unevaluated levels
    are marked ``n/a``."""
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dets = list(table["detector"])
    fig, ax = plt.subplots(figsize=(max(4.0, 1.4 * len(dets) + 1.5), 3.2))
    width = 0.8 / len(LEVELS)
    for i, k in enumerate(LEVELS):
        xs = np.arange(len(dets)) + (i - 1.5) * width
        values = table[f"level{k}_auroc"].to_numpy(float)
        ax.bar(xs, np.nan_to_num(values), width, label=f"level {k}")
        for x, v in zip(xs, values):
            ax.text(x, 1 if math.isnan(v) else v + 1, "n/a" if math.isnan(v) else f"{v:.0f}", ha="center",
                    va="bottom", fontsize=6, rotation=90)
    ax.axhline(50, color="grey", lw=0.8, ls=":", label="chance")
    if min_auroc != 50:
        ax.axhline(min_auroc, color="black", lw=0.8, ls="--", label=f"min_auroc {min_auroc:g}")
    ax.set_xticks(np.arange(len(dets)), [label(d) for d in dets])
    ax.set_ylim(0, 100)
    ax.set_ylabel("worst AUROC (%)")
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.15), frameon=False)
    aio.save_figure(fig, path)
    return path


def levels_section(table: pd.DataFrame, figure: Path, clean: dict[str, float] | None = None) -> Section:
    """``Levels of adversarial robustness``: the table, one reading per detector, the figure."""
    shown = table.drop(columns=["protocol"], errors="ignore")
    return Section("Levels of adversarial robustness", [
        Paragraph("Lorenz et al.'s four levels (Sec. 4): 1 strong attacks, 2 other models and data (other runs), 3 "
                  "attacks adapted to the detector through BPDA, 4 OOD->ID examples and the robust AUROC. Each cell is "
                  "the worst AUROC (%) of the sets named in the sets column; empty where the run has none."),
        Table(shown), Bullets(read_levels(table, clean)),
        Figure(figure, "Worst AUROC (%) of each detector at each level (bars; n/a where the run has no set of the "
                       "level), with chance (dotted) and min_auroc (dashed)")])


@register("evaluators", "levels")
class Levels(Verifiable):
    """The worst AUROC of every detector at each of Lorenz et al.'s four levels of adversarial robustness."""

    verify = staticmethod(verify_levels)

    def __init__(self, min_auroc: float = 50.0, runs: list[str] | None = None):
        """``min_auroc``: the worst AUROC a level needs to count as reached (default 50, chance); ``runs``: other
        run folders (other models or data) whose results count at level 2."""
        if not 0.0 <= float(min_auroc) <= 100.0:
            raise UsageError(f"evaluator levels: min_auroc {min_auroc!r}; valid choices: 0 <= min_auroc <= 100")
        self.min_auroc = float(min_auroc)
        self.runs = [runs] if isinstance(runs, str) else list(runs or [])

    def __call__(self, ctx: RunContext) -> Results:
        table = levels_table(ctx, self.min_auroc, self.runs)
        if not len(table):
            return Results(tables={"levels.csv": table})
        figure = plot_levels(table, ctx.plot_dir / "levels.png", self.min_auroc)
        return Results(tables={"levels.csv": table}, figures=[figure],
                       sections=guarded("Levels of adversarial robustness",
                                        lambda: [levels_section(as_written(table, ctx.protocol), figure,
                                                                        clean_aurocs(ctx))]))
