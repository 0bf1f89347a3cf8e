"""The built-in evaluators, a package each: ``<name>/plugin.py`` (the evaluator), ``<name>/report.py`` (its report
section, where it has one of its own) and its ``verify`` hook. The entry points of group ``advopenood.evaluators``
name each ``<name>.plugin`` of :data:`MODULES` (``setup.py`` reads it: one list). Importing
this package registers nothing.
"""

#: the evaluators' packages, in the order the entry points load them
MODULES = ("ood", "robust_auroc", "levels", "smoothed", "mead", "multiattack", "hekal2026")
