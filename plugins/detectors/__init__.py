"""The built-in detectors, a module per method family; the entry points of group ``advopenood.detectors`` name each
of :data:`MODULES` (``setup.py`` reads it: one list). Importing this package registers nothing.

Before the layout by kind the 16 OpenOOD detectors were this one module; reading one of their names from here fails
(removed in 0.3.0) naming their module now.
"""
from typing import Any

from advopenood.plugin import deprecated

#: the modules of this kind, in the order the entry points load them
MODULES = (
    "logits",       # output-based: MSP, ODIN, EBO, KLM, MLS, GEN
    "features",     # feature distance: MDS, RMDS, VIM, KNN, NNGuide
    "shaping",      # activation shaping: REACT, DICE, ASH, SCALE
    "gram",         # GRAM
    "gram_legacy",  # OpenOOD's original GRAM, for comparison
    "smoothed",     # smoothed_<det>, randomized smoothing of any registered detector
    "ross",         # ross_<det>, ROSS (Hekal et al. 2026): median and MAD of noisy copies, gated
)

#: The 16 built-in detectors in the paper's order (OpenOOD v1.5's post-hoc methods).
BUILTIN_DETECTORS = ("msp", "odin", "mds", "rmds", "gram", "ebo", "klm", "mls", "react", "vim", "knn", "dice", "ash",
                     "gen", "nnguide", "scale")


def __getattr__(name: str) -> Any:
    """A name the former module ``advopenood_plugins.detectors`` held fails naming its module now (removed in 0.3.0)."""
    raise deprecated.removed(__name__, name)
