"""Named evaluation protocols: what a run's numbers are computed on, and whose definition they follow.

A protocol fixes the settings that decide what a number means: which adversarial images count as OOD, how
the images are stored before the detectors see them, and (through each plugin's ``protocol_defaults``)
the attack and analysis parameters. Every CSV carries the protocol's name in a ``protocol`` column and
``run.json`` records the protocol with every effective parameter, so a reader can tell a paper's setting
from ours.

* ``strong`` (default, **ours**): the strongest settings we ship; an adversarial example counts as OOD
  only when its attack succeeded, and detectors score the float images the attack produced.
* ``lorenz2024``: Lorenz et al., "Deciphering the Definition of Adversarial Robustness for Post-Hoc OOD
  Detectors" (Sec. 4, Tables 3 and 4) and its reference code (``openood/evaluation_api/attackdataset.py`` of
  adverML/AdvOpenOOD 14393a1, merged into OpenOOD as a8b4fc7): "all attacked test images" are written as PNG
  through ``torchvision.transforms.ToPILImage`` (``x.mul(255).byte()``, i.e. truncation to 8 bits) and read back
  through OpenOOD's image lists, successful or not, and scored as OOD.
* ``mahmood2021``: Mahmood et al., "Beware the Black-Box" for the black-box adversary of the plugins that
  declare one (``protocol_defaults``); everything else as ``strong``.
* ``hekal2026``: Hekal, Lomuscio & Stoica, "A Robust Out-of-Distribution Detection Framework via Synergistic
  Smoothing" (ROSS; CVPR Findings 2026, arXiv 2605.08191, Table 2) as their code runs it (Abdu-Hekal/ROSS f8f030d:
  ``scripts/attack_ood.py``, ``scripts/ross/run_experiments.py`` ``generate_table2``,
  ``configs/postprocessors/ross.yml``): the ``hekal_min`` / ``hekal_max`` attacks in normalised units, unclipped,
  ROSS attacked through its base detector; every attacked image counts, scored as stored (float).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from advopenood.errors import UsageError

if TYPE_CHECKING:
    from advopenood.attacks.store import Quantize

Positives = Literal["successful", "all"]


@dataclass(frozen=True)
class Protocol:
    """The core settings of a named protocol (plugins add their own through ``protocol_defaults``)."""

    name: str
    #: which adversarial images of an ID->ID attack are OOD positives: ``successful`` ones or ``all`` attacked
    ood_positives: Positives
    #: how adversarial images reach the detectors: as stored (float32) or truncated to 8 bits (ToPILImage)
    quantize: Quantize
    source: str
    description: str
    #: the evaluator that writes the protocol's own table ("" when its numbers are every evaluator's)
    evaluator: str = ""
    #: the one command that runs the protocol's table (said when a run under it cannot write that table)
    command: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


#: ROSS's Table 2 as their protocol runs it (docs/ross-audit.md): their four budgets, PGD-Min and PGD-Max on GEN and
#: ROSS over GEN (``advopenood --help`` quotes it under ``--protocol``)
HEKAL_COMMAND = ("advopenood run --config cifar10_resnet20 --protocol hekal2026 --attack hekal_min,hekal_max "
                 "--eps 2/255,4/255,8/255,16/255 --detectors gen,ross_gen --evaluator ood,hekal2026")


PROTOCOLS: dict[str, Protocol] = {p.name: p for p in (
    Protocol("strong", "successful", "none", "ours",
             "our strongest settings; successful adversarial examples are the OOD positives"),
    Protocol("lorenz2024", "all", "uint8_trunc",
             "Lorenz et al. 2024, Sec. 4 and Tables 3-4; reference code openood/evaluation_api/attackdataset.py and "
             "openood/attacks/patch_attacks/masked_pgd.py of adverML/AdvOpenOOD 14393a1 (merged into OpenOOD as "
             "a8b4fc7); the paper's setting at 32 px only: at 224 px AdvOpenOOD attacks normalised tensors "
             "(docs/concepts.md, '224 px: not the paper's attacks')",
             "the paper's attacks (foolbox defaults, reference masked PGD); every attacked image, stored as an "
             "8-bit PNG, is an OOD positive"),
    Protocol("mahmood2021", "successful", "none",
             "Mahmood et al. 2021 (Beware the Black-Box) for black-box adversaries; ours elsewhere",
             "strong, with the black-box adversary of Mahmood et al.'s CIFAR-10 setting"),
    Protocol("hekal2026", "all", "none",
             "Hekal, Lomuscio & Stoica, CVPR Findings 2026 (ROSS, arXiv 2605.08191), Table 2; their code "
             "Abdu-Hekal/ROSS f8f030d: scripts/attack_ood.py (OODScoreModel, fb.PyTorchModel bounds (-inf, inf), "
             "LinfPGD, --attack-base-pp), scripts/ross/run_experiments.py generate_table2, "
             "configs/postprocessors/ross.yml; their attack settings elsewhere ours",
             "ROSS's attacks as their code runs them (hekal_min / hekal_max: Linf PGD in normalised units, no "
             "clipping, last iterate, ROSS through its base detector); every attacked image counts. Their Table 2 "
             "averages over six OOD sets and three checkpoints (mean +- std); a run reports each OOD set of its "
             "data with 95 % intervals instead",
             evaluator="hekal2026", command=HEKAL_COMMAND),
)}


def get(name: str) -> Protocol:
    """The protocol called ``name``; a UsageError lists the valid names otherwise."""
    if name not in PROTOCOLS:
        raise UsageError(f"unknown protocol {name!r}; valid choices: {', '.join(PROTOCOLS)}")
    return PROTOCOLS[name]


def __getattr__(name: str) -> Any:
    """``protocols.quantize`` and ``protocols.Quantize``, re-exported from :mod:`advopenood.attacks.store` when first
    read: a config is checked without importing torch (the CLI's refusals come before it loads)."""
    if name in ("quantize", "Quantize"):
        from advopenood.attacks import store

        return getattr(store, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
