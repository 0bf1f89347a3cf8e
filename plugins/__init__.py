"""advopenood's built-in plugins, registered through the same entry points a third party uses (``setup.py``).

One place per plugin: ``attacks/`` (a module per attack family), ``detectors/`` (a module per method family),
``evaluators/<name>/`` and ``analyses/<name>/`` (the plugin, its report section and its ``verify`` in separate
modules), and ``kit/``, the helpers that several plugins share. Each kind's ``__init__`` lists its modules
(``MODULES``), the entry points name them, and no plugin registers by importing another.

The flat modules of the versions before 0.2.0 (``advopenood_plugins.ood_eval``, ``advopenood_plugins.smoothed``,
...) were removed in 0.3.0: importing one fails in one line naming the modules that hold its names now (:data:`MOVED`,
the table of removed paths :mod:`advopenood.deprecated`).
"""
from advopenood.plugin import deprecated

_A, _D, _E, _N, _K = (f"advopenood_plugins.{kind}"
                      for kind in ("attacks", "detectors", "evaluators", "analyses", "kit"))

#: removed flat module -> the modules that hold its names now, searched in order
MOVED: dict[str, tuple[str, ...]] = {
    "advopenood_plugins.mead_attacks": (f"{_A}.mead",),
    "advopenood_plugins.adaptive": (f"{_A}.adaptive", f"{_K}.attacks"),
    "advopenood_plugins.autoattack": (f"{_A}.autoattack", f"{_K}.attacks"),
    "advopenood_plugins.robust_attacks": (f"{_A}.robust",),
    "advopenood_plugins.gram_legacy": (f"{_D}.gram_legacy",),
    "advopenood_plugins.smoothed": (f"{_D}.smoothed", f"{_A}.eot", f"{_E}.smoothed.plugin", f"{_E}.smoothed.report"),
    "advopenood_plugins.ood_eval": (f"{_E}.ood.plugin", f"{_E}.ood.report"),
    "advopenood_plugins.leaderboard_json": (f"{_E}.ood.leaderboard",),
    "advopenood_plugins.paired": (f"{_K}.paired",),
    "advopenood_plugins.levels": (f"{_E}.levels.plugin", f"{_E}.levels.report"),
    "advopenood_plugins.robust_auroc": (f"{_E}.robust_auroc.plugin", f"{_E}.robust_auroc.report"),
    "advopenood_plugins.robust_paired": (f"{_E}.robust_auroc.paired",),
    "advopenood_plugins.mead": (f"{_E}.mead.plugin", f"{_E}.mead.report"),
    "advopenood_plugins.multiattack": (f"{_E}.multiattack.plugin", f"{_E}.multiattack.report"),
    "advopenood_plugins.bintest": (f"{_N}.bintest.plugin", f"{_N}.bintest.binarization", f"{_N}.bintest.report"),
    "advopenood_plugins.gradcam": (f"{_N}.gradcam.plugin", f"{_N}.gradcam.regimes", f"{_N}.gradcam.report"),
    "advopenood_plugins.transfer": (f"{_N}.transfer.plugin", f"{_N}.transfer.tables", f"{_N}.transfer.report"),
    "advopenood_plugins.transfer_adversary": (f"{_N}.transfer.adversary",),
    "advopenood_plugins.verify_ood": (f"{_E}.ood.verify", f"{_K}.verify"),
    "advopenood_plugins.verify_paired": (f"{_E}.ood.verify_paired", f"{_K}.verify"),
    "advopenood_plugins.verify_mead": (f"{_E}.mead.verify",),
    "advopenood_plugins.verify_multiattack": (f"{_E}.multiattack.verify",),
    "advopenood_plugins.verify_robust": (f"{_E}.robust_auroc.verify", f"{_E}.levels.verify", f"{_K}.verify"),
    "advopenood_plugins.verify_robust_paired": (f"{_E}.robust_auroc.verify_paired",),
    "advopenood_plugins.verify_smoothed": (f"{_E}.smoothed.verify",),
    "advopenood_plugins.verify_transfer": (f"{_N}.transfer.verify",),
}
#: removed flat module that is now a kind's package -> the modules that hold the names it held
FORMER: dict[str, tuple[str, ...]] = {
    _A: (f"{_A}.standard", f"{_K}.attacks"),
    _D: (f"{_D}.logits", f"{_D}.features", f"{_D}.shaping", f"{_D}.gram", f"{_K}.detectors"),
}

deprecated.add(MOVED, FORMER)
