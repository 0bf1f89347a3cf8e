"""Declared plugin capabilities, the one plugin factory, run-time adaptive attacks, the one seeded row selection."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor

from conftest import make_plan
from advopenood import registry
from advopenood.attacks.base import build_attack
from advopenood.capabilities import (AttackFamily, DetectorAware, DifferentiableDetector, Invertible, bind_attack,
                                     is_detector_aware, is_differentiable, is_family)
from advopenood.cli.main import main
from advopenood.data.datasets import seeded_prefix
from advopenood.detection.openood_backend import OpenOODPostprocessor
from advopenood.detection.outputs import Outputs
from advopenood.detection.postprocessor import Postprocessor
from advopenood.detection.bank import fit_rows
from advopenood.errors import UsageError
from advopenood_plugins.detectors import BUILTIN_DETECTORS

CPU = torch.device("cpu")


# ------------------------------------------------------------------------------------------- declarations


@pytest.mark.parametrize("name", BUILTIN_DETECTORS)
def test_builtin_detectors_declare_a_differentiable_score_and_the_openood_backend_reads_their_needs(name):
    cls = registry.get("detectors", name)
    assert is_differentiable(cls) and issubclass(cls, DifferentiableDetector)
    wrapped = OpenOODPostprocessor(cls)
    assert wrapped.requires_fit == cls.requires_fit
    # CachedNet serves logits and features only: a detector reading tapped maps runs OpenOOD's own pass
    assert wrapped.own_pass == (cls.own_pass or cls.needs_taps)
    assert wrapped.own_pass == (name in ("odin", "gram"))
    assert (cls.openood_wrapper is not None) == (name in ("react", "ash", "scale"))


@pytest.mark.parametrize("name, aware, invertible, family", [
    ("pgd", False, False, False), ("fgsm", False, False, False), ("df", False, False, False),
    ("adaptive_mds", True, True, False), ("adaptive_ood_knn", True, True, False),
    ("adaptive", False, False, True), ("adaptive_ood", False, False, True)])
def test_attacks_declare_what_they_are(name, aware, invertible, family):
    cls = registry.get("attacks", name)
    assert is_family(cls) == family == (isinstance(cls, type) and issubclass(cls, AttackFamily))
    assert is_detector_aware(cls) == aware == issubclass(cls, DetectorAware)
    assert issubclass(cls, Invertible) == invertible


def test_bind_attack_binds_detector_aware_attacks_only(cifar_model, pack_set):
    fit = pack_set("cifar10_train", "cifar10_train_10k.npz", 200)
    pgd = build_attack("pgd", input_size=32)
    assert bind_attack(pgd, cifar_model, fit, seed=0, batch_size=64, device=CPU) is pgd and pgd.context == {}
    adaptive = build_attack("adaptive_knn", input_size=32)
    bind_attack(adaptive, cifar_model, fit, seed=3, batch_size=64, device=CPU, detector_params={"KNN": {"K": 7}})
    from advopenood.provenance import code_identity
    from advopenood_plugins.detectors.features import KNN

    assert adaptive.context == {"fit": fit.identity(), "detector": "knn", "detector_params": {"K": 7}, "fit_seed": 3,
                                "detector_code": [code_identity(KNN)]}


def test_an_attack_keys_on_the_code_of_its_detector_and_of_every_detector_it_wraps(cifar_model, pack_set,
                                                                                   monkeypatch):
    """Issue 48: ``ross_gen``'s scale changed in ``plugins/detectors/logits.py``, not in any attack's files; the
    attack sets made against it must be recomputed, so the bound context (part of the store key) holds the code
    identity of ``ross_gen``'s class and of ``gen``'s, and editing either file changes it."""
    import advopenood.provenance as provenance

    fit = pack_set("cifar10_train", "cifar10_train_10k.npz", 200)

    def context() -> dict:
        attack = build_attack("robust_id_eot_ross_gen", input_size=32)
        return bind_attack(attack, cifar_model, fit, seed=0, batch_size=64, device=CPU).context

    before = context()
    assert len(before["detector_code"]) == 2
    real = provenance.source_sha
    monkeypatch.setattr(provenance, "source_sha",
                        lambda obj: "edited" if "logits" in str(getattr(obj, "__module__", "")) else real(obj))
    after = context()
    assert after["detector_code"][1] != before["detector_code"][1]
    assert after["detector_code"][0] == before["detector_code"][0]


# --------------------------------------------------------------------------------------------- the factory


#: (kind, name, params, fragment of the one-line error): unknown and ill-typed parameters of every kind
FACTORY_ERRORS = [
    ("attacks", "pgd", {"stepz": 3}, "unknown parameter 'stepz' for attack 'pgd'; did you mean 'steps'?"),
    ("attacks", "pgd", {"steps": "ten"}, "parameter steps of attack 'pgd' is 'ten'; valid choices: int"),
    ("attacks", "adaptive_mds", {"kappa": -1.0}, "kappa -1.0 for attack 'adaptive_mds'"),
    ("detectors", "knn", {"k": 5}, "unknown parameter 'k' for detector 'knn'"),
    ("detectors", "knn", {"K": "abc"}, "parameter K of detector 'knn' is 'abc'"),
    ("evaluators", "ood", {"bogus": 1}, "unknown parameter 'bogus' for evaluator 'ood'"),
    ("analyses", "bintest", {"kappa": 1.5}, "analysis bintest: kappa 1.5; valid choices: 0 < kappa < 1"),
    ("analyses", "bintest", {"gap": "wide"}, "parameter gap of analysis 'bintest' is 'wide'"),
    ("analyses", "gradcam", {"treshold": 2}, "unknown parameter 'treshold' for analysis 'gradcam'"),
    ("analyses", "transfer", {"fractions": [150]}, "fraction 150"),
]


@pytest.mark.parametrize("kind, name, params, fragment", FACTORY_ERRORS,
                         ids=[f"{k}-{n}-{next(iter(p))}" for k, n, p, _ in FACTORY_ERRORS])
def test_the_factory_refuses_bad_parameters_in_one_line(kind, name, params, fragment):
    with pytest.raises(UsageError) as err:
        registry.create(kind, name, **params)
    message = str(err.value)
    assert fragment in message and "\n" not in message


def test_build_attack_layers_defaults_protocol_overrides_and_eps():
    pgd = build_attack("pgd", {"steps": 7}, input_size=32, protocol="lorenz2024", eps=2 / 255)
    assert pgd.params["steps"] == 7 and pgd.params["eps"] == 2 / 255
    assert pgd.params["rel_stepsize"] == pytest.approx(0.01 / 0.3)  # from the protocol layer
    assert build_attack("pgd", pgd.params).params == pgd.params  # full parameters (an AttackSpec's) round-trip
    assert build_attack("df", input_size=32, eps=0.5).params["eps"] is None  # unbounded: --eps does not apply


# ------------------------------------------------------------------------ adaptive attacks for a new detector


class _NegEnergy(Postprocessor, DifferentiableDetector):
    """Energy score (test detector): logsumexp of the logits."""

    def score(self, net: torch.nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return torch.logsumexp(out.logits, 1)

    grad_score = score


class _Flat(Postprocessor):
    """A detector without a declared differentiable score (test detector)."""

    def score(self, net: torch.nn.Module, x: Tensor, out: Outputs) -> Tensor:
        return out.logits.max(1).values


@pytest.fixture
def test_detectors(fresh_registry):
    """Two test detectors in the test's own registry."""
    registry.register("detectors", "zzenergy")(_NegEnergy)
    registry.register("detectors", "zzflat")(_Flat)


def test_a_detector_registered_at_run_time_gets_adaptive_attacks(test_detectors, capsys, cifar_model, pack_set,
                                                                 cifar_batch):
    assert main(["list", "attacks", "--all"]) == 0
    listed = {line.split()[0] for line in capsys.readouterr().out.splitlines()}
    assert {"adaptive_zzenergy", "adaptive_ood_zzenergy"} <= listed
    assert not {n for n in listed if "zzflat" in n}
    assert registry.get("attacks", "adaptive").members(make_plan(detectors=["zzenergy", "zzflat"])) == ["adaptive_zzenergy"]

    fit = pack_set("cifar10_train", "cifar10_train_10k.npz", 500)
    x, y = cifar_batch[0][:8], cifar_batch[1][:8]
    runs = {}
    for lams in ([0.0], [0.0, 4.0]):
        attack = registry.create("attacks", "adaptive_zzenergy", **{**registry.get("attacks", "adaptive_zzenergy")
                                                                    .defaults(32), "steps": 5, "lam": lams})
        bind_attack(attack, cifar_model, fit, seed=0, batch_size=128, device=CPU)
        x_adv = attack(cifar_model, x, y, seed=0)
        assert (x_adv - x).abs().max() <= attack.params["eps"] + 1e-6
        with torch.no_grad():
            fooled = cifar_model(x_adv).argmax(1) != y
        runs[len(lams)] = (fooled, attack.detector_score(x_adv))
    assert runs[1][0].any()
    both = runs[1][0] & runs[2][0]
    # the lam=0 run is among the candidates of [0, 4], so the energy term can only raise the kept confidence
    assert (runs[2][1][both] >= runs[1][1][both] - 1e-4).all() and (runs[2][1][both] > runs[1][1][both]).any()


# ------------------------------------------------------------------------------------ seeded row selection


def _shuffled(n: int, seed: int) -> np.ndarray:
    """A seeded Fisher-Yates order written independently: PCG64 through ``Generator.shuffle`` of ``arange``."""
    rows = np.arange(n)
    np.random.Generator(np.random.PCG64(seed)).shuffle(rows)
    return rows


@pytest.mark.parametrize("n, k, seed", [(10, 3, 0), (1000, 64, 7), (50_000, 1000, 123), (5, None, 2), (5, 9, 1)])
def test_seeded_prefix_is_the_seeded_shuffle_prefix(n, k, seed):
    expected = _shuffled(n, seed) if k is None else _shuffled(n, seed)[:k]
    np.testing.assert_array_equal(seeded_prefix(n, k, seed, sort=False), expected)
    np.testing.assert_array_equal(seeded_prefix(n, k, seed), np.sort(expected))
    np.testing.assert_array_equal(fit_rows(n, k, seed), expected)
    if k:
        assert set(seeded_prefix(n, k // 2, seed)) <= set(seeded_prefix(n, k, seed))


def test_every_seeded_selection_uses_the_one_order():
    from advopenood_plugins.analyses.gradcam.plugin import _select_rows
    from advopenood_plugins.analyses.transfer.adversary import fraction_rows
    from advopenood_plugins.analyses.transfer.tables import eval_rows

    np.testing.assert_array_equal(fraction_rows(200, 25, 4), np.sort(_shuffled(200, 4)[:50]))
    np.testing.assert_array_equal(_select_rows(300, 20, 5), np.sort(_shuffled(300, 5)[:20]))
    correct = np.arange(40) % 3 != 0
    rows = np.flatnonzero(correct)
    np.testing.assert_array_equal(eval_rows(correct, 9, 6), np.sort(rows[_shuffled(len(rows), 6)[:9]]))
