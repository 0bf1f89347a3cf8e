"""EOT attacks on randomised detectors (``adaptive_eot_<det>``, ``adaptive_ood_eot_<det>``,
``adaptive_apgd_eot_<det>``) and their families: the expectation-over-transformation twins of the adaptive attacks,
for every randomised detector with a differentiable score (the smoothed detectors, ``plugins/detectors/smoothed.py``,
whose docstring describes the plain and the EOT attack).
"""
from __future__ import annotations

import functools

from advopenood.plugin import is_differentiable, is_randomised, registry
from advopenood_plugins.attacks.adaptive import AdaptiveAttack, AdaptiveFamily, EOTAttack
from advopenood_plugins.attacks.autoattack import AdaptiveAPGD

#: EOT attack name prefix -> the plain attack's prefix (the adaptive families' prefixes)
EOT_PREFIXES = {"adaptive_eot_": "adaptive_", "adaptive_ood_eot_": "adaptive_ood_",
                "adaptive_apgd_eot_": "adaptive_apgd_"}
#: what each EOT attack does, in its description
WHAT = {"adaptive_eot_": "Linf PGD, misclassify an ID image while it keeps it in-distribution",
        "adaptive_ood_eot_": "Linf PGD, make a natural OOD image look in-distribution to it",
        "adaptive_apgd_eot_": "APGD-Linf, misclassify an ID image while it keeps it in-distribution"}


def eot_name(plain_attack: str) -> str:
    """The EOT twin's name of a plain attack on a smoothed detector (``adaptive_smoothed_msp`` ->
    ``adaptive_eot_smoothed_msp``)."""
    for eot, plain in sorted(EOT_PREFIXES.items(), key=lambda kv: -len(kv[1])):
        if plain_attack.startswith(plain):
            return eot + plain_attack[len(plain):]
    raise ValueError(f"{plain_attack!r} is not a plain adaptive attack")


def eot_attack(detector: str, prefix: str) -> type:
    """The class of the EOT attack ``<prefix><detector>`` (``prefix`` in :data:`EOT_PREFIXES`) for a randomised
    detector with a differentiable score: the families' factory."""
    base = AdaptiveAPGD if prefix == "adaptive_apgd_eot_" else AdaptiveAttack
    source = "ood" if prefix == "adaptive_ood_eot_" else "id"
    name = prefix + detector
    return type(name, (EOTAttack, base), {
        "__doc__": f"EOT detector-adaptive attack against {detector.upper()}: {WHAT[prefix]}, its gradient averaged "
                   "over the detector's noise draws (lambda swept per sample).",
        "__module__": __name__, "detector": detector, "source": source,
        "plain_attack": EOT_PREFIXES[prefix] + detector})


def randomised_differentiable(obj: object) -> bool:
    """Whether a detector has EOT attacks: randomised, with a differentiable score."""
    return is_randomised(obj) and is_differentiable(obj)


# the EOT attacks of every randomised detector with a differentiable score (and no others), and their shorthands
# (``adaptive_eot``, ``adaptive_ood_eot``, ``adaptive_apgd_eot``: one per selected detector, as ``adaptive``)
for _prefix in EOT_PREFIXES:
    _family = _prefix.rstrip("_")
    registry.register("attacks", _family, family=_family)(type(_family, (AdaptiveFamily,), {
        "__doc__": f"One {_prefix}<det> per selected smoothed detector: --attack adaptive,{_family} "
                   "--detectors smoothed_msp runs the plain and the EOT attack.",
        "__module__": __name__, "prefix": _prefix}))
    registry.family("attacks", _prefix, functools.partial(eot_attack, prefix=_prefix), source=__name__,
                    accepts=randomised_differentiable, shorthand=_family,
                    hint="a randomised detector with a differentiable score",
                    description=f"EOT detector-adaptive attack against a detector: {WHAT[_prefix]}, its gradient "
                                "averaged over the detector's noise draws (lambda swept per sample).")
