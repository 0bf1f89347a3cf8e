"""The built-in attacks, a module per family; the entry points of group ``advopenood.attacks`` name each of
:data:`MODULES` (``setup.py`` reads it: one list). Importing this package registers nothing.

Before the layout by kind this was one module (FGSM, PGD, MIM, DeepFool, masked PGD); reading one of those names from
here fails (removed in 0.3.0) naming their module now.
"""
from typing import Any

from advopenood.plugin import deprecated

#: the modules of this kind, in the order the entry points load them
MODULES = (
    "standard",    # FGSM, PGD, MIM, DeepFool, masked PGD (foolbox)
    "mead",        # MEAD's attacks on the detector's objectives
    "adaptive",    # detector-adaptive PGD, adaptive_<det> / adaptive_ood_<det>
    "autoattack",  # AutoAttack's attacks, C&W, adaptive_apgd_<det>
    "robust",      # the robust-AUROC attacks, robust_<side>_<det>
    "eot",         # EOT twins of the adaptive attacks on randomised (smoothed) detectors
    "hekal",       # ROSS's attacks as Hekal et al. 2026 ran them, hekal_min_<det> / hekal_max_<det>
)


def __getattr__(name: str) -> Any:
    """A name the former module ``advopenood_plugins.attacks`` held fails naming its module now (removed in 0.3.0)."""
    raise deprecated.removed(__name__, name)
