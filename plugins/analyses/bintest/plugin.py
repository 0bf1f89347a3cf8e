"""The ``bintest`` analysis and ``advopenood bintest``: the binarization test (``binarization.py``) of each attack of a
run, on its first correctly classified ID rows; its report section is ``report.py``.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from advopenood.plugin import (Attack, CommandAnalysis, DetectorAware, DetectorTestForms, ImageCount, PointCount,
                               Results, RunContext, UsageError, as_written, bind_attack, build_attack, frozen, get,
                               names as get_names, register, stack, swept, thaw)
from advopenood_plugins.analyses.bintest.binarization import (SAMPLE_COLUMNS, SUMMARY_COLUMNS, resolve_eps, run_bintest,
                                                              summary_row, threshold_at_fpr)
from advopenood_plugins.analyses.bintest.report import bintest_sections


@register("analyses", "bintest")
class BinarizationTest(CommandAnalysis):
    """Binarization test (Zimmermann et al. 2022): does each attack find adversarial examples that provably exist?

    Keyword parameters (``analysis_params.bintest``): ``n_inner`` (999), ``gap`` (0.05), ``kappa`` (0.999),
    ``n_random`` (400), ``eps`` (only for unbounded attacks such as DeepFool; default 8/255 at 32x32),
    ``limit`` (test the first ``limit`` correctly classified ID rows; the paper uses 512), ``attacks`` (names;
    default: the run's attacks on ID images), ``batch_size``, ``chunk`` (rows loaded at once), ``pass_threshold``,
    ``inconclusive_above``, ``detector_fpr`` (the detector variant's threshold: this share of clean samples is
    detected), ``progress``. Detector-adaptive attacks run the detector variant (regular and inverted tests).
    """

    command = "bintest"
    command_help = "binarization test of attacks (Zimmermann et al.): is the attack strong enough?"
    command_settings = {"analysis": "bintest", "evaluator": "", "detectors": ""}
    report_sections = staticmethod(lambda run: bintest_sections(run.table("bintest.csv")))  # verify: from the CSV
    #: the bounds of its counts, checked before it is built (docs/analyses.md, "Parameter bounds")
    param_types = {"n_inner": PointCount, "n_random": PointCount, "limit": ImageCount | None,
                   "attacks": swept(what="attacks")}

    def __init__(self, n_inner: int = 999, gap: float = 0.05, kappa: float = 0.999, n_random: int = 400,
                 eps: float | None = None, limit: int | None = None, attacks: list[str] | str | None = None,
                 batch_size: int = 500, chunk: int = 256, pass_threshold: float = 0.95,
                 inconclusive_above: float = 0.75, detector_fpr: float = 0.05, progress: bool = True):
        checks = [(int(n_inner) >= 1, f"n_inner {n_inner!r}; valid choices: an integer >= 1"),
                  (0.0 < float(gap) < 1.0, f"gap {gap!r}; valid choices: 0 < gap < 1"),
                  (0.0 < float(kappa) < 1.0, f"kappa {kappa!r}; valid choices: 0 < kappa < 1"),
                  (int(n_random) >= 1, f"n_random {n_random!r}; valid choices: an integer >= 1"),
                  (eps is None or 0.0 < float(eps) <= 1.0, f"eps {eps!r}; valid choices: 0 < eps <= 1, or null"),
                  (limit is None or int(limit) >= 1, f"limit {limit!r}; valid choices: an integer >= 1, or null"),
                  (int(batch_size) >= 1 and int(chunk) >= 1, "batch_size and chunk; valid choices: integers >= 1"),
                  (0.0 < float(pass_threshold) <= 1.0, f"pass_threshold {pass_threshold!r}; valid choices: (0, 1]"),
                  (0.0 <= float(inconclusive_above) <= 1.0,
                   f"inconclusive_above {inconclusive_above!r}; valid choices: [0, 1]"),
                  (0.0 < float(detector_fpr) < 1.0, f"detector_fpr {detector_fpr!r}; valid choices: 0 < detector_fpr < 1")]
        for ok, message in checks:
            if not ok:
                raise UsageError(f"analysis bintest: {message}")
        self.n_inner, self.gap, self.kappa, self.n_random = int(n_inner), float(gap), float(kappa), int(n_random)
        self.eps = None if eps is None else float(eps)
        self.limit = None if limit is None else int(limit)
        self.attacks = [a.strip() for a in attacks.split(",") if a.strip()] if isinstance(attacks, str) else attacks
        for name in self.attacks or []:
            get("attacks", name)
        self.batch_size, self.chunk, self.progress = int(batch_size), int(chunk), bool(progress)
        self.pass_threshold, self.inconclusive_above = float(pass_threshold), float(inconclusive_above)
        self.detector_fpr = float(detector_fpr)

    def _attack(self, ctx: RunContext, name: str) -> Attack:
        """The run's attack of set ``name`` as the run built and bound it (``ctx.attacks``); else one built here: the
        parameters its adversarial set was made with, else defaults + ``attack_params``, a detector-adaptive attack
        bound to the run's fit set and detector parameters."""
        attacks = getattr(ctx, "attacks", None) or {}
        attack_name = name if name not in ctx.adv_sets else ctx.adv_sets[name].attack
        cls = type(attacks[name]) if name in attacks else get("attacks", attack_name)
        if cls.source != "id" and not issubclass(cls, DetectorTestForms):
            raise UsageError(f"attack {name!r} perturbs OOD images; the binarization test needs an attack on ID "
                             "images (valid choices: any attack whose class declares source 'id', or one with "
                             "DetectorTestForms)")
        if name in attacks:
            return attacks[name]
        if name in ctx.adv_sets:
            attack = build_attack(attack_name, ctx.adv_sets[name].params)
        else:
            overrides = ctx.plan.params("attack_params", name)
            attack = build_attack(name, overrides, input_size=ctx.model.input_size, protocol=ctx.protocol)
        return bind_attack(attack, ctx.model, ctx.fit_set, seed=ctx.seed, batch_size=ctx.batch_size,
                           device=ctx.device, detector_params=thaw(ctx.plan.detector_params))

    def _rows(self, ctx: RunContext) -> np.ndarray:
        """Rows of ``ctx.id_set`` to consider: up to the ``limit``-th correctly classified one (all by default)."""
        rows = np.arange(len(ctx.id_set))
        if self.limit is None:
            return rows
        if len(ctx.clean.y) == len(ctx.id_set):
            correct = np.nonzero(ctx.clean.pred == ctx.clean.y)[0]
            return rows[:correct[self.limit - 1] + 1] if len(correct) >= self.limit else rows
        return rows[:self.limit]

    def _threshold(self, ctx: RunContext, detector: Callable[[torch.Tensor], torch.Tensor],
                   chunks: list[np.ndarray]) -> float:
        """The detector variant's threshold: ``detector_fpr`` of the tested rows' clean scores lie below it."""
        scores = []
        with torch.no_grad(), frozen(ctx.model):
            for part in chunks:
                x, _ = stack(ctx.id_set, part)
                scores += [detector(x[i:i + self.batch_size].to(ctx.device)).flatten().cpu()
                           for i in range(0, len(x), self.batch_size)]
        return threshold_at_fpr(torch.cat(scores), self.detector_fpr)

    def __call__(self, ctx: RunContext) -> Results:
        names = self.attacks or [n for n, a in ctx.adv_sets.items() if a.source == "id"] \
            or [s.set_name for s in ctx.plan.attack_specs]
        if not names:
            raise UsageError("the binarization test needs an attack; pass --attack NAME (valid choices: "
                             f"{', '.join(get_names('attacks'))})")
        rows = self._rows(ctx)
        if len(rows) == 0:
            raise UsageError("the binarization test needs ID samples, but the run's ID set is empty")
        summaries, tables = [], []
        for name in names:
            attack = self._attack(ctx, name)
            eps = resolve_eps(attack, None if attack.bounded else self.eps, attack.norm,
                               ctx.id_set[0][0].unsqueeze(0))
            parts, n_wrong = [], 0
            chunks = [rows[i:i + self.chunk] for i in range(0, len(rows), self.chunk)]
            detector = attack.detector_score if isinstance(attack, DetectorAware) else None
            threshold = None if detector is None else self._threshold(ctx, detector, chunks)
            quiet = not (self.progress and ctx.progress)
            for part in tqdm(chunks, desc=f"bintest {name}", unit="chunk", disable=quiet):
                x, y = stack(ctx.id_set, part)
                summary, table = run_bintest(
                    ctx.model, x, y, attack, eps=eps, n_inner=self.n_inner, gap=self.gap, kappa=self.kappa,
                    n_random=self.n_random, seed=ctx.seed, device=ctx.device, indices=part,
                    batch_size=self.batch_size, attack_name=name, detector=detector, detector_threshold=threshold)
                parts.append(table)
                n_wrong += summary["n_misclassified"]
            table = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=list(SAMPLE_COLUMNS))
            summaries.append(summary_row(table, attack=name, norm=attack.norm, eps=eps,
                                         n_misclassified=n_wrong, kappa=self.kappa, n_inner=self.n_inner,
                                         gap=self.gap, n_random=self.n_random, pass_threshold=self.pass_threshold,
                                         inconclusive_above=self.inconclusive_above, detector_threshold=threshold))
            tables.append(table.assign(attack=name)[["attack", *SAMPLE_COLUMNS]])
        extra = list(dict.fromkeys(k for row in summaries for k in row if k not in SUMMARY_COLUMNS))
        summary = pd.DataFrame(summaries, columns=[*SUMMARY_COLUMNS, *extra])
        return Results(tables={"bintest.csv": summary, "bintest_samples.csv": pd.concat(tables, ignore_index=True)},
                       sections=bintest_sections(as_written(summary, ctx.protocol)))
