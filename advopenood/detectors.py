"""The detector plugin interface, where third-party detectors import it from (``from advopenood.detectors import
Postprocessor, Outputs``). The machinery lives in :mod:`advopenood.detection`."""
from typing import Any

from advopenood.detection.bank import create_detector, fit_subset
from advopenood.detection.openood_backend import cuda_redirect
from advopenood.detection.outputs import (
           Batches,
           Outputs,
           Taps,
           fc_layer,
           forward_outputs,
           grad_outputs,
)
from advopenood.detection.postprocessor import Postprocessor
from advopenood.detection.scoring import fit_detectors, score_all
from advopenood.deprecated import removed

__all__ = ["Batches", "cuda_redirect", "Outputs", "Postprocessor", "Taps", "create_detector", "fc_layer", "fit_detectors",
           "fit_subset", "forward_outputs", "grad_outputs", "score_all"]


def __getattr__(name: str) -> Any:
    """A name this module held before the split fails naming where it lives now (removed in 0.3.0)."""
    raise removed(__name__, name)
