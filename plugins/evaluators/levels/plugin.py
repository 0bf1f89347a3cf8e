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
       adversarial examples that convert OD to ID samples [3]. Adversarial robustness is an iterative process,
       where defenses are proposed, evaluated, and improved upon in response to new attacks or discovered
       vulnerabilities.

    It must be noted that not all levels are required to be evaluated. This roadmap should indicate which level of
    OOD detection is robust.

The levels are quoted verbatim above (the text of Sec. 4; the reference numbers are the paper's). Sec. 4 says
what each level evaluates but gives no number a detector must reach: each level's definition below is the paper's
(``criterion_source`` ``paper``), what we add is marked ``ours``. ``levels.csv`` has one row per detector, level and
criterion: the worst AUROC (percent, OOD positive; an adversarial set's positives follow the run's protocol,
:meth:`advopenood.evaluation.context.RunContext.ood_positives`; a set whose AUROC is undefined, e.g. no
successful example under ``strong``, does not count) of the sets the criterion names, per detector ``d``:

* **Level 1**, ``strong`` (paper: "strong attacks", "FGSM is not recommended", "avoid hyperparameters that weaken"):
  the ID->ID sets of classifier-only attacks (not :class:`~advopenood.capabilities.DetectorAware`) that are not
  single-step and whose settings are not weakened: no iteration count (``steps``, ``n_iter``, ``n_restarts``,
  ``n_queries``, ``binary_search_steps``) below the attack's default under the run's protocol, no budget below its
  default eps, and, where a step size is set, ``steps * step size >= eps`` (the iterates can reach the ball's
  surface).
* **Level 2**, ``other_model_data`` (paper: "different models and datasets than the simple ResNet-18 trained on
  CIFAR-10"): level 1 on a model that is not a ResNet-18 and ID data that is not CIFAR-10 (we read "models and
  datasets" as both, so a ResNet-20 on CIFAR-10 is not level 2): this run's level-1 sets when it is such a run, and
  the level-1 rows of the ``levels.csv`` of each such run folder in ``evaluator_params.levels.runs``.
* **Level 3**, ``bpda_adaptive`` (paper: "a differentiable OOD detector can be easily fooled if the attacker
  approximates the gradients ... BPDA"): the ID->ID sets of attacks adapted to ``d`` through its differentiable
  (BPDA) score: ``adaptive_<d>``, ``adaptive_apgd_<d>`` and their EOT variants.
* **Level 4**, ``adaptive_id`` (paper: "adaptive attacks"): the same ID->ID adaptive sets; ``ood_to_id`` (paper:
  "OOD adversarial examples that convert OD to ID samples"): the OOD->ID sets adapted to ``d``
  (``adaptive_ood_<d>``, ``robust_ood_<d>``, ``robust_apgd_ood_<d>``: clean ID against all their images);
  ``robust_auroc`` (ours): the robust AUROC of ``d``, both sides attacked (the ``robust_auroc`` evaluator).

The bar is ours at every level (the paper gives none): a row *passes* when its worst AUROC is at least
``min_auroc`` (default 50, chance: the detector still ranks attacked OOD below clean ID more often than not); a
detector *reaches* level ``k`` when level ``k`` is evaluated (some criterion of it has a set), every criterion of it
passes, and no evaluated level below ``k`` falls short ("not all levels are required to be evaluated");
``reached`` is 0 when the lowest evaluated level falls short, empty when none is.

Intervals: ``auroc_lo`` / ``auroc_hi`` are the 95 % interval of the set that attains a criterion's worst AUROC
(``worst_set``; ties go to the first label in sorted order), by the run's ``ci`` plan: an attack set's is its
``ood.csv`` cell (same key and resamples), a robust pair's its paired interval in ``robust_auroc.csv``, another
run's its ``levels.csv`` row's. A simultaneous interval over the minimum of several sets is out of scope.
``conclusive`` is 1 when that interval excludes ``min_auroc`` (the row's pass or fail holds at 95 %), 0 when it
contains the bar or when the detector's fewest images on a side (over its score arrays) are below
:data:`~advopenood.evaluation.metrics.MIN_CONCLUSIVE` (``run.json``'s ``sample.min_conclusive``: too few to
conclude, whatever the interval), empty without an interval (``--ci none``; FPR95-only methods).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from advopenood.plugin import (MIN_CONCLUSIVE, PLOT_DIR, Results, RunContext, Section, Supplied, UsageError, Verifiable,
                               as_written, attack_params, auroc, cell_key, guarded, is_detector_aware, register,
                               registry, supplied)
from advopenood_plugins.kit.ood import SET_GROUPS, saved_set_groups, set_groups
from advopenood_plugins.kit.robust import ROBUST_TABLE, robust_table
from advopenood_plugins.evaluators.levels.report import levels_section, plot_levels
from advopenood_plugins.evaluators.levels.verify import verify_levels

LEVELS = (1, 2, 3, 4)


@dataclass(frozen=True)
class Criterion:
    """One criterion of a level: its name in ``levels.csv``, whose it is (``paper``: Sec. 4's definition of the level;
    ``ours``: our addition) and the sets it counts."""

    level: int
    name: str
    source: str
    rule: str


#: every level's criteria, in the table's order (the module docstring quotes the paper's words for each)
CRITERIA = (
    Criterion(1, "strong", "paper", "ID->ID sets of multi-step attacks on the classifier (no FGSM), settings not "
                                    "weakened"),
    Criterion(2, "other_model_data", "paper", "level 1 on a model other than ResNet-18 and ID data other than "
                                              "CIFAR-10"),
    Criterion(3, "bpda_adaptive", "paper", "ID->ID sets of attacks adapted to the detector through its (BPDA) score"),
    Criterion(4, "adaptive_id", "paper", "adaptive attacks: the same ID->ID sets"),
    Criterion(4, "ood_to_id", "paper", "OOD->ID sets adapted to the detector (clean ID against all their images)"),
    Criterion(4, "robust_auroc", "ours", "robust AUROC: ID and OOD sides both attacked"),
)
#: the paper's level-2 baseline: "the simple ResNet-18 trained on CIFAR-10"
BASELINE_DATASET = "cifar10"
BASELINE_MODEL = re.compile(r"resnet18(?!\d)")
COLUMNS = ["detector", "level", "criterion", "criterion_source", "auroc", "auroc_lo", "auroc_hi", "ci", "worst_set",
           "passed", "conclusive", "reached", "min_auroc", "sets", "protocol"]
#: a set label's 95 % interval ``(lo, hi)`` per detector
Bounds = dict[str, dict[str, tuple[float, float]]]
#: attacks that take a single gradient step (Level 1: "The FGSM is not recommended because it performs a single step")
SINGLE_STEP = ("fgsm",)
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


def set_auroc(ctx: RunContext, det: str, name: str, scores: dict[str, np.ndarray] | None = None) -> float:
    """AUROC (%) of clean ID against the protocol's positives of set ``name`` (of ``scores``, default the detector's
    scores); NaN when undefined."""
    scores = ctx.scores[det] if scores is None else scores
    try:
        return 100.0 * auroc(scores["id"], scores[name][ctx.ood_positives(name)])
    except ValueError:
        return math.nan


def pair_choice_auroc(choice: dict[str, np.ndarray], row: dict[str, Any]) -> float:
    """The AUROC (%) a robust pair is chosen on: that of its attacked sets' choice confidences, for an ensemble row
    (sets joined by ``+``) of the per-image worst choice over its clean set and its sets (the confidences its
    images were chosen on)."""
    ids, oods = ["id", *str(row["id_attack"]).split("+")], [row["ood_set"], *str(row["ood_attack"]).split("+")]
    if "+" not in str(row["id_attack"]) + str(row["ood_attack"]):
        ids, oods = ids[1:], oods[1:]
    try:
        return 100.0 * auroc(np.min([choice[n] for n in ids], axis=0), np.max([choice[n] for n in oods], axis=0))
    except (KeyError, ValueError):
        return math.nan


def choose_worst(values: dict[str, float], by: dict[str, float]) -> tuple[str, float]:
    """``(label, value)`` of the worst of ``values``, chosen on ``by`` (a randomised detector's attack-stream AUROCs,
    so that no evaluation draw chooses the set it then reports; for a deterministic detector ``by`` is ``values``):
    the lowest, ties (to 1e-9) to the first label in sorted order; ``("", nan)`` for none."""
    if not values:
        return "", math.nan
    at = min(sorted(values), key=lambda k: round(by.get(k, values[k]), 9))
    return at, values[at]


def set_bounds(ctx: RunContext, det: str, name: str) -> tuple[float, float]:
    """The 95 % interval of :func:`set_auroc` by the run's ``ci`` plan: ``ood.csv``'s cell of the set (same key
    ``ood|<det>|<set>``, same resamples, so the same interval)."""
    conf = ctx.scores[det][name][ctx.ood_positives(name)]
    bounds, _, _ = ctx.intervals.cell(cell_key("ood", det, name), ctx.scores[det]["id"], conf)
    return bounds["auroc_lo"], bounds["auroc_hi"]


def conclusive(lo: float, hi: float, min_auroc: float, small: bool = False) -> float:
    """1.0 when the interval excludes the bar (the pass or fail holds at 95 %), 0.0 when it contains it or the
    sample is ``small`` (below :data:`~advopenood.evaluation.metrics.MIN_CONCLUSIVE` a side), NaN without an
    interval."""
    return math.nan if math.isnan(lo) or math.isnan(hi) else float(not small and not lo <= min_auroc <= hi)


def level_sets(ctx: RunContext, bounds: Bounds | None = None, robust: pd.DataFrame | None = None,
               choose: dict[str, dict[str, float]] | None = None) -> dict[str, dict[str, dict[str, float]]]:
    """``{detector: {criterion: {set label: AUROC}}}`` for every criterion but level 2's, of the run's scored
    detectors; each label's interval goes into ``bounds[detector]`` when given (a robust pair's is its paired
    interval from ``robust_auroc.csv``'s computation: ``robust``, the run's robust table, computed here when
    None), and, for a randomised detector, the AUROC the worst set is chosen on into ``choose[detector]`` (of its
    attack-stream confidences, :meth:`RunContext.choice_scores`; :func:`pair_choice_auroc` for a robust pair)."""
    bounds = {} if bounds is None else bounds
    choose = {} if choose is None else choose
    out: dict[str, dict[str, dict[str, float]]] = {det: {c.name: {} for c in CRITERIA if c.level != 2}
                                                   for det in ctx.scores}
    size = int(ctx.model.input_size)
    for name, adv in ctx.positive_sets.items():
        cls = registry.get("attacks", adv.attack)
        aware = is_detector_aware(cls)
        for det in ctx.scores:
            if not aware and adv.source == "id" and adv.attack not in SINGLE_STEP \
                    and not weakened(adv.attack, adv.params, size, ctx.protocol):
                kinds: tuple[str, ...] = ("strong",)
            elif aware and cls.detector == det:
                kinds = ("bpda_adaptive", "adaptive_id") if adv.source == "id" else ("ood_to_id",)
            else:
                continue
            value = set_auroc(ctx, det, name)
            if not math.isnan(value):
                for kind in kinds:
                    out[det][kind][name] = value
                bounds.setdefault(det, {})[name] = set_bounds(ctx, det, name)
                if det in ctx.selection:
                    choose.setdefault(det, {})[name] = set_auroc(ctx, det, name, ctx.choice_scores(det))
    robust = robust_table(ctx) if robust is None else robust
    for r in robust.to_dict("records"):
        if not math.isnan(r["robust_auroc"]):
            pair = f"{r['id_attack']}+{r['ood_attack']}"
            out[r["detector"]]["robust_auroc"][pair] = float(r["robust_auroc"])
            bounds.setdefault(r["detector"], {})[pair] = (float(r["robust_auroc_lo"]), float(r["robust_auroc_hi"]))
            if r["detector"] in ctx.selection:
                choose.setdefault(r["detector"], {})[pair] = pair_choice_auroc(ctx.choice_scores(r["detector"]), r)
    return out


def beyond_baseline(arch: str, dataset: str) -> bool:
    """Level 2's setting: a model that is not a ResNet-18 (``resnet18``, ``resnet18_32x32``, ``timm:resnet18...``)
    and ID data that is not CIFAR-10."""
    model = arch.rsplit(":", 1)[-1].rsplit("/", 1)[-1].lower()
    return not BASELINE_MODEL.match(model) and dataset.lower() != BASELINE_DATASET


def other_runs(paths: list[str]) -> list[tuple[str, pd.DataFrame]]:
    """``(folder name, levels.csv)`` of every listed run folder beyond the paper's baseline (:func:`beyond_baseline`);
    a folder without ``run.json``, model and data names, or a ``levels.csv`` of criteria rows is a UsageError."""
    import json

    out = []
    for path in paths:
        folder = Path(path).expanduser()
        info_file, table_file = folder / "run.json", folder / "levels.csv"
        if not info_file.is_file():
            raise UsageError(f"evaluator levels: runs entry {path!r} is not a run folder (no run.json); valid "
                             "choices: output folders of other advopenood runs")
        info = json.loads(info_file.read_text())
        data = (info.get("config") or {}).get("data") or {}
        arch = str((info.get("model") or {}).get("arch") or "")
        dataset = str(data.get("dataset") or (data.get("id") or {}).get("name") or "")
        if not arch or not dataset:
            raise UsageError(f"evaluator levels: runs entry {path!r} names no model architecture or ID data set in "
                             "run.json; valid choices: output folders of other advopenood runs")
        table = pd.read_csv(table_file) if table_file.is_file() else None
        if table is None or not {"detector", "level", "auroc"} <= set(table.columns):
            raise UsageError(f"evaluator levels: runs entry {path!r} has no levels.csv with one row per detector, "
                             "level and criterion; valid choices: run folders written with --evaluator levels")
        if beyond_baseline(arch, dataset):
            out.append((folder.name, table))
    return out


def level2(det: str, runs: list[tuple[str, pd.DataFrame]], own: dict[str, float],
           bounds: dict[str, tuple[float, float]] | None = None) -> dict[str, float]:
    """Level-2 evidence of ``det``: each other run's worst level-1 AUROC and ``own``, this run's level-1 sets when
    the run itself is beyond the baseline (empty otherwise). ``bounds`` (a set label's interval) gets each other
    run's interval of that row (empty for a ``levels.csv`` written without intervals) and ``own``'s."""
    bounds = {} if bounds is None else bounds
    found: dict[str, float] = {}
    for name, levels in runs:
        rows = levels[(levels["detector"] == det) & (levels["level"] == 1)].dropna(subset=["auroc"])
        if len(rows):
            row = rows.loc[rows["auroc"].idxmin()]
            found[f"{name}:level1"] = float(row["auroc"])
            bounds[f"{name}:level1"] = (float(row.get("auroc_lo", math.nan)), float(row.get("auroc_hi", math.nan)))
    bounds.update({f"level1:{k}": bounds.get(k, (math.nan, math.nan)) for k in own})
    found.update({f"level1:{k}": v for k, v in own.items()})
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


def levels_table(ctx: RunContext, min_auroc: float = 50.0, runs: list[tuple[str, pd.DataFrame]] | None = None,
                 robust: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per scored detector and criterion (:data:`CRITERIA`): the worst AUROC of the criterion's sets (NaN
    where the run has none), whether it passes ``min_auroc``, the detector's level reached and the sets used
    (``robust``: the run's robust table, :func:`level_sets`)."""
    own = beyond_baseline(ctx.arch, ctx.dataset)
    bounds: Bounds = {}
    choose: dict[str, dict[str, float]] = {}
    ci = ctx.intervals.label
    rows = []
    for det, sets in level_sets(ctx, bounds, robust, choose).items():
        sets["other_model_data"] = level2(det, runs or [], sets["strong"] if own else {}, bounds.setdefault(det, {}))
        by = choose.get(det, {})
        by.update({f"level1:{k}": v for k, v in by.items() if f"level1:{k}" in sets["other_model_data"]})
        chosen = {c.name: choose_worst(sets[c.name], by) for c in CRITERIA}
        # a level's worst criterion is chosen on the same AUROCs as its worst sets
        picked = {c.name: by.get(chosen[c.name][0], chosen[c.name][1]) for c in CRITERIA}
        by_level = {k: choose_worst({c.name: chosen[c.name][1] for c in CRITERIA
                                     if c.level == k and not math.isnan(chosen[c.name][1])}, picked)[1]
                    for k in LEVELS}
        reached = reached_level(by_level, min_auroc)
        small = min((len(v) for v in ctx.scores[det].values()), default=0) < MIN_CONCLUSIVE
        for c in CRITERIA:
            at, value = chosen[c.name]
            lo, hi = bounds[det].get(at, (math.nan, math.nan))
            rows.append({"detector": det, "level": c.level, "criterion": c.name, "criterion_source": c.source,
                         "auroc": value, "auroc_lo": lo, "auroc_hi": hi, "ci": ci, "worst_set": at,
                         "passed": math.nan if math.isnan(value) else float(value >= min_auroc),
                         "conclusive": conclusive(lo, hi, min_auroc, small), "reached": reached, "min_auroc": min_auroc,
                         "sets": ", ".join(sets[c.name]),
                         "protocol": ctx.protocol})
    return pd.DataFrame(rows, columns=COLUMNS)


def worst_levels(table: pd.DataFrame) -> pd.DataFrame:
    """``levels.csv`` one row per detector: the worst AUROC at each level (over its criteria; NaN where none is
    evaluated) with the 95 % interval of the criterion that attains it (``level<k>_lo`` / ``level<k>_hi``, NaN
    without one), ``reached`` and ``min_auroc``."""
    rows = []
    for det, part in table.groupby("detector", sort=False):
        row = {"detector": det}
        for k in LEVELS:
            at = part[(part["level"] == k) & part["auroc"].notna()]
            worst = at.loc[at["auroc"].idxmin()] if len(at) else None
            row[f"level{k}_auroc"] = math.nan if worst is None else float(worst["auroc"])
            for end in ("lo", "hi"):
                value = math.nan if worst is None else worst.get(f"auroc_{end}", math.nan)
                row[f"level{k}_{end}"] = float(value) if pd.notna(value) else math.nan
        rows.append({**row, "reached": part["reached"].iloc[0], "min_auroc": part["min_auroc"].iloc[0]})
    columns = ["detector", *(f"level{k}_{c}" for k in LEVELS for c in ("auroc", "lo", "hi")), "reached", "min_auroc"]
    return pd.DataFrame(rows, columns=columns)


def criteria_table() -> pd.DataFrame:
    """:data:`CRITERIA` as the report shows them: level, criterion, whose it is and what counts."""
    return pd.DataFrame([{"level": c.level, "criterion": c.name, "source": c.source, "what counts": c.rule}
                         for c in CRITERIA])


def clean_aurocs(ctx: RunContext, groups: dict[str, str] | None = None) -> dict[str, float]:
    """Each scored detector's clean AUROC (%): the mean over the run's natural OOD sets (csid sets, covariate-shifted
    ID, left out as in ``table_ood``; ``groups``: the run's set groups, computed here when None); NaN when it has
    none."""
    groups = set_groups(ctx) if groups is None else groups
    return mean_clean_aurocs(ctx.scores, groups)


def mean_clean_aurocs(scores_of: Mapping[str, Mapping[str, np.ndarray]], groups: dict[str, str]) -> dict[str, float]:
    """:func:`clean_aurocs` of ``scores_of[detector][set]`` and the natural sets' ``groups``."""
    natural = [name for name, group in groups.items() if group != "csid"]
    out = {}
    for det, scores in scores_of.items():
        values = []
        for name in natural:
            try:
                values.append(100.0 * auroc(scores["id"], scores[name]))
            except (KeyError, ValueError):  # a set the detector did not score, or NaN scores: not counted
                continue
        out[det] = float(np.mean(values)) if values else math.nan
    return out


def levels_sections(table: pd.DataFrame, figure: Path, clean: dict[str, float]) -> list[Section]:
    """The report's ``Levels of adversarial robustness`` from ``levels.csv`` as written, its figure and the
    detectors' clean AUROCs; the run builds it from the table it writes, ``advopenood verify`` from the CSV and the
    saved scores (:func:`report_sections`)."""
    return guarded("Levels of adversarial robustness",
                   lambda: [levels_section(table, worst_levels(table), criteria_table(), figure, clean)])


def report_sections(run: Any) -> list[Section]:
    """:func:`levels_sections` from a run folder (:class:`advopenood.evaluation.runfiles.RunFiles`): ``levels.csv``,
    ``plots/levels.png`` and the clean AUROCs of ``scores/*.npz`` on the natural sets of ``run.json``; none where
    the table has no row (the run wrote no section)."""
    table = run.table("levels.csv")
    if not len(table):
        return []
    clean = mean_clean_aurocs({det: run.scores(det) for det in run.detectors}, saved_set_groups(run))
    return levels_sections(table, run.path / PLOT_DIR / "levels.png", clean)


@register("evaluators", "levels")
class Levels(Verifiable):
    """The worst AUROC of every detector at each of Lorenz et al.'s four levels of adversarial robustness."""

    verify = staticmethod(verify_levels)
    report_sections = staticmethod(report_sections)  # verify: the section from the CSV and the scores
    #: the shared tables it reads, computed once per run: the robust table (the robust level) and the set groups
    needs = (ROBUST_TABLE, SET_GROUPS)

    def __init__(self, min_auroc: float = 50.0, runs: list[str] | None = None):
        """``min_auroc``: the worst AUROC a level needs to count as reached (default 50, chance; our bar, the paper
        gives none); ``runs``: other run folders, read now, whose level 1 counts at level 2 when their model is not a
        ResNet-18 and their data not CIFAR-10."""
        if not 0.0 <= float(min_auroc) <= 100.0:
            raise UsageError(f"evaluator levels: min_auroc {min_auroc!r}; valid choices: 0 <= min_auroc <= 100")
        self.min_auroc = float(min_auroc)
        self.runs = other_runs([runs] if isinstance(runs, str) else list(runs or []))

    def __call__(self, ctx: RunContext, products: Supplied | None = None) -> Results:
        products = supplied(ctx, self, products)
        table = levels_table(ctx, self.min_auroc, self.runs, products[ROBUST_TABLE])
        if not len(table):
            return Results(tables={"levels.csv": table})
        figure = plot_levels(worst_levels(table), ctx.plot_dir / "levels.png", self.min_auroc)
        return Results(tables={"levels.csv": table}, figures=[figure],
                       sections=levels_sections(as_written(table, ctx.protocol), figure,
                                                clean_aurocs(ctx, products[SET_GROUPS])))
