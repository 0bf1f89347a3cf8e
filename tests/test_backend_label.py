"""The ``backend`` column: what computed a detector's scores is read off the installed distribution that ships its
module (the core's own: a built-in), never off a module name that a third party can copy."""
from __future__ import annotations

import pytest

from advopenood import registry
from advopenood.detection.bank import backend_label
from advopenood.detection.postprocessor import Postprocessor
from advopenood.provenance import ships_with_core


def lookalike(module: str, openood_name: str | None) -> type[Postprocessor]:
    """A third party's detector class defined in ``module`` (no installed distribution ships it)."""
    return type("Lookalike", (Postprocessor,), {"__module__": module, "openood_name": openood_name})


@pytest.mark.parametrize("module", ["advopenood_plugins_extra.detectors", "advopenood_pluginsx", "mypkg.detectors"])
@pytest.mark.parametrize("resolved, openood_name", [("pytorch-ood", None), ("openood", "msp")])
def test_a_third_party_detector_is_labelled_a_plugin_whatever_its_module_is_called(module, resolved, openood_name):
    registry.register("detectors", "lookalike_det")(lookalike(module, openood_name))
    try:
        assert not ships_with_core(registry.get("detectors", "lookalike_det"))
        assert backend_label("lookalike_det", resolved) == f"plugin:{module}"
    finally:
        registry.unregister("detectors", "lookalike_det")


@pytest.mark.parametrize("name, resolved, expected", [("msp", "pytorch-ood", "pytorch-ood"),
                                                      ("msp", "openood", "openood"),
                                                      ("knn", "pytorch-ood", "pytorch-ood")])
def test_a_built_in_detector_is_labelled_by_its_backend(name, resolved, expected):
    assert ships_with_core(registry.get("detectors", name))
    assert backend_label(name, resolved) == expected
