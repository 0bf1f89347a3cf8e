"""MEAD's worst-case evaluation of post-hoc OOD detectors on adversarial inputs (evaluator ``mead``).

Granese et al., "MEAD: A Multi-Armed Approach for Evaluation of Adversarial Examples Detectors"
(ECML-PKDD 2022), Sec. 4, Eqs. 7-10, with OpenOOD's conventions: a detector gives ``conf`` (higher =
more in-distribution), adversarial examples are the positive (OOD) class, the decision score is ``-conf``.

Attacks are grouped by (norm, eps) ("a large collection of attacks grouped w.r.t. the Lp-norm and the maximal
perturbation eps they consider", Sec. 4). Within a group, for each clean sample ``x_i``:

* only attacks that succeed count ("a perturbed example is considered adversarial if and only if it fools the
  classifier. Otherwise, it is discarded", Sec. 4); success is that of the image the detectors score
  (:meth:`RunContext.success`: after the protocol's 8-bit truncation under ``lorenz2024``), whatever the
  protocol's rule for OOD positives, since MEAD's sifter is part of its definition; a sample with no
  successful attack is not a positive;
* the sample is detected at threshold ``t`` iff *every* successful attack on it is detected
  (``conf < t`` for all of them), i.e. iff ``max_j conf_ij < t`` over its successful attacks ``j``.
  The per-sample worst case ``w_i = max_j conf_ij`` (the least OOD-looking score) therefore gives the
  exact MEAD true-positive rate at every threshold, and the MEAD ROC is the ordinary ROC of the clean
  scores (negatives, every clean sample) against the ``w_i`` (positives): no threshold grid.

Settings: ``mead`` (all attacks of the group) and one per objective (``ce``, ``kl``, ``gini``, ``fr``, and
``adaptive`` for the detector-adaptive attacks of ``plugins/attacks/adaptive.py``, advopenood's addition), each itself a
worst case over that objective's attacks (e.g. FGSM, BIM and PGD in Linf), so ``ce`` (classifier-only) and
``adaptive`` sit side by side. Only sets made from the ID test images count (OOD->ID sets have no clean ID
sample to attach to). An attack's norm and objective come from its registry class (``norm`` and ``objective``
attributes); attacks without an ``objective`` (the built-in ``fgsm``, ``pgd``, ``mpgd``) count as
cross-entropy. Attacks whose objective is none of the single-armed ones (DeepFool and CW, which have none;
Square, APGD-DLR, FAB, AutoAttack) enter every objective setting of their group, as in MEAD's Tables 4-15, where
DeepFool, CW2, HOP, SA, CWinf and STA appear in every objective column (Table 4: Linf eps 0.3125 with CWinf,
"9.88 / 13" attacks in MEAD and "3.79 / 4" in ACE). An objective setting is reported when the run has an attack
of that objective, for every group holding one, and for every group holding only such shared attacks (there it
repeats the ``mead`` row, as MEAD's DeepFool row does). Unbounded attacks (DeepFool, CW) form the "no eps" group
of their norm (eps empty), as MEAD's "DeepFool, No eps" row; two unbounded attacks of one norm share it (MEAD
labels its CW2 row "eps = 0.01"; our CW has no eps).

Outputs: ``mead.csv`` (one row per detector, norm, eps and setting: AUROC and FPR95 in percent, ``n_pos``,
``n_neg``, ``mean_successes`` = mean number of successful attacks per clean sample) and ``mead_summary.csv``
(:func:`mead_summary`, MEAD's Tables 1-3: per detector, group and setting the mean over *every* row of the
group, unbounded ones included, and ``norm = all``, the mean of the per-group averages). Both carry the run's
``protocol``. Report: the ``MEAD worst case`` section, AUROC per detector and group with one reading per (norm,
eps) group. ``verify`` (:func:`advopenood_plugins.evaluators.mead.verify.verify_mead`) re-derives both tables from a
run's saved scores, masks and ``run.json``.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd

from advopenood.plugin import (Results, RunContext, Section, UsageError, Verifiable, as_written, bound_columns,
                               cell_key, guarded, registry)
from advopenood_plugins.evaluators.mead.report import mead_section
from advopenood_plugins.kit.worstcase import (NO_CI, NORM_ORDER, PATCH, CIPlan, SetInfo, attack_kind,  # noqa: F401
                                              backend_for, detector_groups, group_sets, set_info, stacked,
                                              threat_group, worst_case_metrics, worst_case_scores)
from advopenood_plugins.evaluators.mead.verify import verify_mead

SETTINGS = ("mead", "ce", "kl", "gini", "fr", "adaptive")
#: The single-armed settings: one objective each (MEAD's ACE, KL, Gini, FR columns; ``adaptive`` is ours).
OBJECTIVES = SETTINGS[1:]
#: AUROC and FPR95 each followed by its 95 % interval, then the interval's method; ``error``: why a row has none
MEAD_COLUMNS = ["detector", "backend", "norm", "eps", "setting", *bound_columns(["auroc", "fpr95"]), "ci", "n_pos",
                "n_neg", "mean_successes", "protocol", "error"]
SUMMARY_COLUMNS = ["detector", "backend", "norm", "setting", "auroc", "fpr95", "n_groups", "protocol"]


def mead_key(detector: str, norm: str, eps: float | None, setting: str) -> str:
    """The cell key of a ``mead.csv`` row (eps to 6 significant digits, ``none`` when unbounded)."""
    return cell_key("mead", detector, norm, "none" if eps is None else f"{eps:.6g}", setting)


def setting_members(members: list[SetInfo], setting: str) -> list[SetInfo]:
    """The sets of one (norm, eps) group that ``setting``'s worst case runs over.

    ``mead``: all of them. An objective: the group's attacks of that objective plus its *shared* attacks (objective
    none of :data:`OBJECTIVES`: DeepFool, CW, Square, ...), which MEAD puts in every objective column (Tables 4-15);
    a group of shared attacks only gives all of them (MEAD's DeepFool row repeats across the columns); a group
    with attacks of other objectives but none of this one gives none (no row).
    """
    if setting == "mead":
        return list(members)
    shared = [m for m in members if m.objective not in OBJECTIVES]
    own = [m for m in members if m.objective == setting]
    return own + shared if own or len(shared) == len(members) else []


def mead_table(scores: Mapping[str, Mapping[str, np.ndarray]], sets: Iterable[SetInfo],
               backend: str | Mapping[str, str] = "", settings: Iterable[str] = SETTINGS,
               protocol: str = "strong", ci: CIPlan = NO_CI,
               choice: Mapping[str, Mapping[str, np.ndarray]] | None = None) -> pd.DataFrame:
    """One row per (detector, norm, eps group, setting): the ``mead.csv`` table, intervals by ``ci``
    (:func:`worst_case_metrics`, cell key :func:`mead_key`). ``choice[detector]``: the confidences each sample's
    worst attack is chosen on, by set (:meth:`RunContext.choice_scores`: a randomised detector's attack-stream
    ones); default the scores themselves.

    ``backend``: :func:`backend_for`. ``scores[detector]`` maps ``"id"`` to the clean confidences and each set name
    to the set's confidences (same row order); a detector without scores for a set skips the groups holding it. An objective setting is
    reported only when some set of the run has that objective; its members per group are
    :func:`setting_members`.
    """
    settings = list(settings)
    bad = [s for s in settings if s not in SETTINGS]
    if bad:
        raise UsageError(f"unknown MEAD setting {bad[0]!r}; valid choices: {', '.join(SETTINGS)}")
    sets = list(sets)
    present = {s.objective for s in sets}
    settings = [s for s in settings if s == "mead" or s in present]
    rows: list[dict[str, Any]] = []
    for detector, by_set, conf_id, norm, eps, members in detector_groups(scores, sets):
        if any(m.name not in by_set for m in members):
            continue
        for setting in settings:
            chosen = setting_members(members, setting)
            if not chosen:
                continue
            success = np.stack([m.positive for m in chosen], axis=1)
            by = stacked((choice or {}).get(detector, by_set), chosen)
            rows.append({"detector": detector, "backend": backend_for(backend, detector), "norm": norm, "eps": eps,
                         "setting": setting,
                         **worst_case_metrics(conf_id, stacked(by_set, chosen), success, ci,
                                              mead_key(detector, norm, eps, setting), by),
                         "protocol": protocol})
    return pd.DataFrame(rows, columns=MEAD_COLUMNS)


def mead_summary(table: pd.DataFrame) -> pd.DataFrame:
    """MEAD's summaries (their Tables 1-3) of ``mead.csv`` rows, per detector, norm and setting.

    * Per group (``l1``, ``l2``, ``linf``, ``patch``): AUROC and FPR95 averaged over *every* row of the group,
      the unbounded ("no eps") one included. MEAD's "L2 Average" is the mean of all its L2 rows, PGD-L2 at seven
      eps, DeepFool (no eps), CW2 and HOP (Sec. 5.1.2; Table 5, NSS on CIFAR-10: 64.0 / 82.0, where the PGD rows
      alone give 65.8 / 78.6); rows without positives (AUROC NaN) are left out of the mean, ``n_groups`` counts
      the rows.
    * ``norm = all``: the mean of the per-group averages, every group with equal weight, the non-Lp group
      included: MEAD's Table 3 averages L1, L2, Linf *and* "No norm" (STA), e.g. NSS on CIFAR-10
      (62.9 + 64.0 + 71.9 + 88.5) / 4 = 71.8 and (81.6 + 82.0 + 62.0 + 38.8) / 4 = 66.1 (Tables 1 and 3). Here
      the non-Lp group is ``patch`` (masked PGD: unbounded inside its patch, like STA not bounded by an Lp norm).
    """
    if table.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    keys = ["detector", "backend", "norm", "setting", "protocol"]
    per_norm = (table.groupby(keys, sort=False, dropna=False)
                .agg(auroc=("auroc", "mean"), fpr95=("fpr95", "mean"), n_groups=("setting", "size")).reset_index())
    overall = (per_norm.groupby(["detector", "backend", "setting", "protocol"], sort=False, dropna=False)
               .agg(auroc=("auroc", "mean"), fpr95=("fpr95", "mean"), n_groups=("n_groups", "sum")).reset_index())
    overall["norm"] = "all"
    return pd.concat([per_norm, overall[SUMMARY_COLUMNS]], ignore_index=True)[SUMMARY_COLUMNS]


def mead_sections(table: pd.DataFrame) -> list[Section]:
    """The report's ``MEAD worst case`` section from ``mead.csv`` as written (none without a row); the run builds it
    from the table it writes, ``advopenood verify`` from the CSV (``report_sections``)."""
    return guarded("MEAD worst case", lambda: [mead_section(table)]) if len(table) else []


@registry.register("evaluators", "mead")
class MeadEvaluator(Verifiable):
    """MEAD worst-case AUROC/FPR95 per (norm, eps) group and objective (Granese et al. 2022): mead.csv."""

    def __init__(self, settings: list[str] | None = None, detectors: list[str] | None = None):
        """``settings``: subset of ``mead, ce, kl, gini, fr, adaptive`` (default all); ``detectors``: subset of the run's
        detectors (default all scored)."""
        self.settings = list(settings) if settings is not None else list(SETTINGS)
        bad = [s for s in self.settings if s not in SETTINGS]
        if bad:
            raise UsageError(f"unknown MEAD setting {bad[0]!r}; valid choices: {', '.join(SETTINGS)}")
        self.detectors = [d.lower() for d in detectors] if detectors is not None else None

    verify = staticmethod(verify_mead)
    report_sections = staticmethod(lambda run: mead_sections(run.table("mead.csv")))  # verify: from the CSV

    def __call__(self, ctx: RunContext) -> Results:
        scores = {d: s for d, s in ctx.scores.items() if self.detectors is None or d in self.detectors}
        success = {name: ctx.success(name) for name in ctx.id_adv_sets}
        table = self.table(scores, ctx.id_adv_sets, {d: ctx.backend_of(d) for d in scores}, ctx.protocol, success,
                           ctx.intervals, {d: ctx.choice_scores(d) for d in ctx.selection if d in scores})
        return Results(tables={"mead.csv": table, "mead_summary.csv": mead_summary(table)},
                       sections=mead_sections(as_written(table, ctx.protocol)))

    def table(self, scores: Mapping[str, Mapping[str, np.ndarray]], adv_sets: Mapping[str, AdvSet],
              backend: str | Mapping[str, str] = "", protocol: str = "strong",
              success: Mapping[str, np.ndarray] | None = None, ci: CIPlan = NO_CI,
              choice: Mapping[str, Mapping[str, np.ndarray]] | None = None) -> pd.DataFrame:
        """``mead.csv`` of ``scores[detector][set]`` (``"id"`` the clean confidences, one entry per set of
        ``adv_sets``, same row order) with this evaluator's settings; what the OpenOOD bridge calls through the
        registry. ``success[set]``: success of the images the detectors scored (default ``AdvSet.seen_success``);
        ``ci``: the interval policy (:class:`~advopenood.evaluation.intervals.IntervalPolicy`; default none);
        ``choice``: as :func:`mead_table`."""
        success = success or {}
        infos = [set_info(name, adv, success.get(name)) for name, adv in adv_sets.items()]
        return mead_table(scores, infos, backend, self.settings, protocol, ci, choice)
