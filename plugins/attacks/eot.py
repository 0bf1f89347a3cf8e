"""EOT attacks on randomised detectors (``adaptive_eot_<det>``, ``adaptive_ood_eot_<det>``,
``adaptive_apgd_eot_<det>``) and their families: the expectation-over-transformation twins of the adaptive attacks,
for every randomised detector with a differentiable score (the smoothed detectors, ``plugins/detectors/smoothed.py``,
whose docstring describes the plain and the EOT attack).
"""
from __future__ import annotations

from advopenood import registry
from advopenood.capabilities import is_differentiable, is_randomised
from advopenood_plugins.attacks.adaptive import AdaptiveAttack, AdaptiveFamily, EOTAttack
from advopenood_plugins.attacks.autoattack import AdaptiveAPGD

#: EOT attack name prefix -> the plain attack's prefix (the adaptive providers' names)
EOT_PREFIXES = {"adaptive_eot_": "adaptive_", "adaptive_ood_eot_": "adaptive_ood_",
                "adaptive_apgd_eot_": "adaptive_apgd_"}


def eot_name(plain_attack: str) -> str:
    """The EOT twin's name of a plain attack on a smoothed detector (``adaptive_smoothed_msp`` ->
    ``adaptive_eot_smoothed_msp``)."""
    for eot, plain in sorted(EOT_PREFIXES.items(), key=lambda kv: -len(kv[1])):
        if plain_attack.startswith(plain):
            return eot + plain_attack[len(plain):]
    raise ValueError(f"{plain_attack!r} is not a plain adaptive attack")


def eot_attack(detector: str, prefix: str) -> type:
    """Register the EOT attack ``<prefix><detector>`` (``prefix`` in :data:`EOT_PREFIXES`) for a randomised detector
    with a differentiable score, and return the class."""
    base = AdaptiveAPGD if prefix == "adaptive_apgd_eot_" else AdaptiveAttack
    source = "ood" if prefix == "adaptive_ood_eot_" else "id"
    what = {"adaptive_eot_": "Linf PGD, misclassify an ID image while it keeps it in-distribution",
            "adaptive_ood_eot_": "Linf PGD, make a natural OOD image look in-distribution to it",
            "adaptive_apgd_eot_": "APGD-Linf, misclassify an ID image while it keeps it in-distribution"}[prefix]
    name = prefix + detector
    cls = type(name, (EOTAttack, base), {
        "__doc__": f"EOT detector-adaptive attack against {detector.upper()}: {what}, its gradient averaged over "
                   "the detector's noise draws (lambda swept per sample).",
        "__module__": __name__, "detector": detector, "source": source,
        "plain_attack": EOT_PREFIXES[prefix] + detector})
    return registry.register("attacks", name, family=prefix + "<detector>")(cls)


@registry.provide("attacks")
def _eot_attacks() -> None:
    """The EOT attacks of every randomised detector with a differentiable score (and no others), and their families
    (``adaptive_eot``, ``adaptive_ood_eot``, ``adaptive_apgd_eot``: one per selected detector, as ``adaptive``)."""
    for prefix in EOT_PREFIXES:
        family = prefix.rstrip("_")
        if not registry.generated("attacks", family):
            registry.register("attacks", family, family=family)(type(family, (AdaptiveFamily,), {
                "__doc__": f"One {prefix}<det> per selected smoothed detector: --attack adaptive,{family} "
                           "--detectors smoothed_msp runs the plain and the EOT attack.",
                "__module__": __name__, "prefix": prefix}))
    for name, entry in registry.entries("detectors").items():
        if is_randomised(entry.obj) and is_differentiable(entry.obj):
            for prefix in EOT_PREFIXES:
                if not registry.generated("attacks", prefix + name):
                    eot_attack(name, prefix)
    for name, entry in registry.entries("attacks").items():  # the EOT attacks of smoothed detectors gone since
        if isinstance(entry.obj, type) and issubclass(entry.obj, EOTAttack) \
                and not registry.registered("detectors", entry.obj.detector):
            registry.unregister("attacks", name)
