"""Bounded budgets (issue 49, item 3): every budget parameter has a documented upper bound, checked at plan time
(one line, exit 2, before any work): Square's queries and ``p_init``, iteration counts, EOT draws, a randomised
detector's noise copies, the analyses' counts and the length of a swept list; and
``attack_params.robust_square_*.n_queries`` is used or refused, never ignored."""
from __future__ import annotations

from pathlib import Path

import pytest

from advopenood import registry
from advopenood.attacks.base import build_attack
from advopenood.cli.main import main
from advopenood.config.loading import apply_overrides, load_config
from advopenood.config.schema import thaw
from advopenood.errors import UsageError
from advopenood.params import (MAX_DRAWS, MAX_EPOCHS, MAX_IMAGES, MAX_ITERATIONS, MAX_POINTS, MAX_QUERIES, MAX_SWEEP,
                               bound_of, declared_types)

REPO = Path(__file__).resolve().parents[1]
#: the budget parameters of the built-in attacks (the test's list: the core knows none of them)
BUDGET_KEYS = ("steps", "n_iter", "n_restarts", "n_queries", "binary_search_steps", "eot")
QUERIES = f"valid choices: an integer in [1, {MAX_QUERIES}] (the documented bound on queries)"
ITERATIONS = f"valid choices: an integer in [1, {MAX_ITERATIONS}] (the documented bound on iterations)"


def _run(tmp_path: Path, extra: str, *flags: str) -> list[str]:
    """``run --config`` of the CIFAR-10 config with ``extra`` appended and ``flags``. Its data files are not ``.npz``
    files: a config that passes the plan's checks is refused later for that (so no case runs on a code without the
    bounds either)."""
    from test_hostile_config import unreadable_data

    text = (REPO / "configs" / "cifar10_resnet20.yaml").read_text(encoding="utf-8")
    path = tmp_path / "bounds.yaml"
    path.write_text(text.replace("root: ../../shared/data", f"root: {unreadable_data(tmp_path, text)}") + extra,
                    encoding="utf-8")
    return ["run", "--config", str(path), "--detectors", "msp", "--out", str(tmp_path / "out"), *flags]


def _robust(params: str) -> str:
    """The ``evaluator_params`` line of ``robust_auroc`` (the cases select it with :data:`ROBUST`)."""
    return f"evaluator_params: {{robust_auroc: {{{params}}}}}\n"


ROBUST = ("--evaluator", "robust_auroc")
BINTEST = ("--attack", "fgsm", "--analysis", "bintest")
TRANSFER = ("--attack", "fgsm", "--analysis", "transfer")


#: name -> (config lines appended, flags, fragment of the one error line)
CASES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "square queries 10**12": ("attack_params: {square: {n_queries: 1000000000000}}\n", ("--attack", "square"),
                              f"n_queries 1000000000000 for attack 'square'; {QUERIES}"),
    "autoattack queries 10**7": ("attack_params: {autoattack: {n_queries: 10000000}}\n", ("--attack", "autoattack"),
                                 f"n_queries 10000000 for attack 'autoattack'; {QUERIES}"),
    "robust square queries 10**12": ("attack_params: {robust_square_id_msp: {n_queries: 1000000000000}}\n",
                                     ("--attack", "robust_square_id_msp"),
                                     f"n_queries 1000000000000 for attack 'robust_square_id_msp'; {QUERIES}"),
    "square p_init -1": ("attack_params: {square: {p_init: -1.0}}\n", ("--attack", "square"),
                         "p_init -1.0 for attack 'square'; valid choices: a number in (0, 1]"),
    "robust square p_init 0": ("attack_params: {robust_square_ood: {p_init: 0}}\n", ("--attack", "robust_square_ood"),
                               "p_init 0 for attack 'robust_square_ood_msp'; valid choices: a number in (0, 1]"),
    "robust square p_init 1.5": ("attack_params: {robust_square_id_msp: {p_init: 1.5}}\n",
                                 ("--attack", "robust_square_id_msp"), "p_init 1.5 for attack 'robust_square_id_msp'"),
    "pgd steps": ("attack_params: {pgd: {steps: 1000000}}\n", ("--attack", "pgd"),
                  f"steps 1000000 for attack 'pgd'; {ITERATIONS}"),
    "apgd_ce n_iter": ("attack_params: {apgd_ce: {n_iter: 1000000}}\n", ("--attack", "apgd_ce"),
                       f"n_iter 1000000 for attack 'apgd_ce'; {ITERATIONS}"),
    "apgd_ce n_restarts": ("attack_params: {apgd_ce: {n_restarts: 1000000}}\n", ("--attack", "apgd_ce"),
                           f"n_restarts 1000000 for attack 'apgd_ce'; {ITERATIONS}"),
    "cw binary search": ("attack_params: {cw: {binary_search_steps: 1000000}}\n", ("--attack", "cw"),
                         f"binary_search_steps 1000000 for attack 'cw'; {ITERATIONS}"),
    "mead steps": ("attack_params: {mead_pgd_ce_l2: {steps: 1000000}}\n", ("--attack", "mead_pgd_ce_l2"),
                   f"steps 1000000 for attack 'mead_pgd_ce_l2'; {ITERATIONS}"),
    "adaptive family steps": ("attack_params: {adaptive: {steps: 1000000}}\n", ("--attack", "adaptive"),
                              f"steps 1000000 for attack 'adaptive_msp'; {ITERATIONS}"),
    "robust apgd n_iter": ("attack_params: {robust_apgd_id_msp: {n_iter: 1000000}}\n",
                           ("--attack", "robust_apgd_id_msp"), f"n_iter 1000000 for attack 'robust_apgd_id_msp'"),
    "eot draws": ("attack_params: {adaptive_eot_smoothed_msp: {eot: 100000}}\n",
                  ("--attack", "adaptive_eot_smoothed_msp"),
                  f"eot 100000 for attack 'adaptive_eot_smoothed_msp'; valid choices: an integer in [1, {MAX_DRAWS}], "
                  "or null (the documented bound on draws)"),
    "smoothed noise copies": ("detector_params: {smoothed_msp: {n: 100000}}\n", ("--detectors", "smoothed_msp"),
                              "detector_params.smoothed_msp.n (bounds.yaml line 30, column 34): detector "
                              f"'smoothed_msp' would take 100000 noise draws per confidence; valid choices: at most "
                              f"{MAX_DRAWS}"),
    "ross noise copies": ("detector_params: {ross_msp: {n: 20000}}\n", ("--detectors", "ross_msp"),
                          "detector_params.ross_msp.n (bounds.yaml line 30, column 30): detector 'ross_msp' would "
                          "take 20000 noise draws"),
    # the evaluator's own settings name themselves
    "robust_auroc square_queries": (_robust("ensemble: standard, square_queries: 1000000000000"), ROBUST,
                                    "square_queries 1000000000000; valid choices: an integer in [1, 1000000]"),
    "robust_auroc eot": (_robust("eot: 100000"), (*ROBUST, "--detectors", "smoothed_msp"),
                         f"eot 100000; valid choices: an integer in [1, {MAX_DRAWS}]"),
    # attack_params of the Square members were overridden by the evaluator's default (500 or 5,000 queries)
    "robust square n_queries 0": (_robust("ensemble: standard") + "attack_params: {robust_square_id: {n_queries: 0}}\n",
                                  ROBUST, f"n_queries 0 for attack 'robust_square_id_msp'; {QUERIES}"),
    "robust square n_queries abc": (_robust("ensemble: standard")
                                    + "attack_params: {robust_square_ood: {n_queries: abc}}\n", ROBUST,
                                    "parameter n_queries of attack 'robust_square_ood_msp' is 'abc'; valid choices: "
                                    "int"),
    "robust square n_queries set twice": (_robust("ensemble: standard, square_queries: 40")
                                          + "attack_params: {robust_square_id_msp: {n_queries: 30}}\n", ROBUST,
                                          "evaluator_params.robust_auroc.square_queries 40 and attack_params."
                                          "robust_square_id_msp.n_queries 30 both set the queries of "
                                          "robust_square_id_msp; valid choices: set one of them"),
    # the counts of the analyses and the evaluators' swept lists (issue 49, item 3: they had no bound)
    "bintest n_inner": ("analysis_params: {bintest: {n_inner: 10000000}}\n", BINTEST,
                        f"n_inner 10000000 for analysis 'bintest'; valid choices: an integer in [1, {MAX_POINTS}] "
                        "(the documented bound on points per image)"),
    "bintest n_random": ("analysis_params: {bintest: {n_random: 10000000}}\n", BINTEST,
                         "n_random 10000000 for analysis 'bintest'; valid choices: an integer in [1, "),
    "bintest attacks": (f"analysis_params: {{bintest: {{attacks: [{', '.join(['fgsm'] * (MAX_SWEEP + 1))}]}}}}\n",
                        BINTEST, f"attacks: a list of {MAX_SWEEP + 1} values for analysis 'bintest'; valid choices: "
                                 f"one value or a list of at most {MAX_SWEEP} (the documented bound on attacks)"),
    "gradcam n_examples": ("analysis_params: {gradcam: {n_examples: 1000000}}\n", ("--analysis", "gradcam"),
                           "n_examples 1000000 for analysis 'gradcam'; valid choices: an integer in [0, 100]"),
    "gradcam max_samples": ("analysis_params: {gradcam: {max_samples: 1000000000000}}\n", ("--analysis", "gradcam"),
                            f"max_samples 1000000000000 for analysis 'gradcam'; valid choices: an integer in [1, "
                            f"{MAX_IMAGES}], or null"),
    "transfer epochs": ("analysis_params: {transfer: {epochs: 1000000}}\n", TRANSFER,
                        f"epochs 1000000 for analysis 'transfer'; valid choices: an integer in [1, {MAX_EPOCHS}], or "
                        "null (the documented bound on epochs)"),
    "transfer pure_epochs": ("analysis_params: {transfer: {pure_epochs: 1000000}}\n", TRANSFER,
                             "pure_epochs 1000000 for analysis 'transfer'"),
    "transfer jacobian_rounds": ("analysis_params: {transfer: {jacobian_rounds: 100000}}\n", TRANSFER,
                                 "jacobian_rounds 100000 for analysis 'transfer'; valid choices: an integer in [0, "
                                 "1000], or null"),
    "transfer steps": ("analysis_params: {transfer: {steps: 1000000}}\n", TRANSFER,
                       "steps 1000000 for analysis 'transfer'; valid choices: an integer in [1, "),
    "transfer max_augment": ("analysis_params: {transfer: {max_augment: 1000000000000}}\n", TRANSFER,
                             "max_augment 1000000000000 for analysis 'transfer'"),
    "transfer fractions": (f"analysis_params: {{transfer: {{fractions: [{', '.join(['50'] * 101)}]}}}}\n", TRANSFER,
                           "fractions: a list of 101 values for analysis 'transfer'"),
    "adaptive lam": (f"attack_params: {{adaptive_msp: {{lam: [{', '.join(['1.0'] * 500)}]}}}}\n",
                     ("--attack", "adaptive_msp"), "lam: a list of 500 values for attack 'adaptive_msp'; valid "
                                                   f"choices: one value or a list of at most {MAX_SWEEP}"),
    "robust_auroc eps": (_robust(f"eps: [{', '.join(['0.01'] * 200)}]"), ROBUST,
                         "eps: a list of 200 values for evaluator 'robust_auroc'"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_budget_beyond_its_bound_is_refused_in_one_line_before_work(name, tmp_path, capsys, monkeypatch):
    extra, flags, fragment = CASES[name]
    monkeypatch.setenv("ADVOPENOOD_CACHE", str(tmp_path / "cache"))
    rc = main(_run(tmp_path, extra, *flags))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("advopenood: error:"), err
    assert fragment in err[0], err[0]
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("name, params", [
    ("square", {"n_queries": MAX_QUERIES, "p_init": 1.0}),
    ("robust_square_id_msp", {"n_queries": MAX_QUERIES, "p_init": 1e-3}),
    ("pgd", {"steps": MAX_ITERATIONS}),
    ("adaptive_eot_smoothed_msp", {"eot": MAX_DRAWS}),
])
def test_a_budget_at_its_bound_is_taken(name, params):
    attack = build_attack(name, params, input_size=32)
    assert {key: getattr(attack.p, key) for key in params} == params


def _demo(detectors: str = "msp", **settings):
    cfg = thaw(load_config("demo")[0])
    cfg.update(settings)
    return apply_overrides(cfg, attack="fgsm", detectors=detectors)


def test_noise_copies_at_the_bound_are_taken():
    assert _demo("smoothed_msp", detector_params={"smoothed_msp": {"n": MAX_DRAWS}}).detectors == ("smoothed_msp",)


def test_noise_copies_of_a_detector_the_run_only_attacks_are_bounded_too():
    """``detector_params`` of a randomised detector reach the attacks on it even when it is not among the run's
    detectors (``adaptive_eot_smoothed_msp`` binds it with them)."""
    with pytest.raises(UsageError, match="detector_params.smoothed_msp.n: detector 'smoothed_msp' would take 20000"):
        _demo("msp", detector_params={"smoothed_msp": {"n": 20000}})


def test_draws_a_randomised_detector_names_no_parameter_for_are_checked_on_the_detector_the_run_builds(
        fresh_registry, tmp_path):
    """A randomised detector whose class names no draws parameter (``draws_parameter``): validating the config
    builds nothing (issue 51); ``resolve`` checks ``draws`` on the one detector it builds, before any work."""
    from advopenood.capabilities import Randomised
    from advopenood.detection.postprocessor import Postprocessor
    from advopenood.run.resolved import resolve

    built = []

    class Noisy(Postprocessor, Randomised):
        def __init__(self, **params):
            built.append(type(self).__name__)
            super().__init__(**params)

        @classmethod
        def default_params(cls):
            return {"copies": 8}

        @property
        def draws(self):
            return self.params["copies"]

        def evaluation_noise_seed(self):
            return 0

        def with_eot(self, samples):
            return self

        def score(self, net, x, out):
            return out.logits.max(1).values

    registry.register("detectors", "zznoisy")(Noisy)
    plan = _demo("zznoisy", detector_params={"zznoisy": {"copies": 20000}}, out=str(tmp_path / "out"))
    assert built == [] and plan.detectors == ("zznoisy",)
    with pytest.raises(UsageError, match="^detector_params.zznoisy.copies: detector 'zznoisy' would take 20000 noise "
                                         "draws per confidence; valid choices: at most"):
        resolve(plan)
    assert built == ["Noisy"] and not (tmp_path / "out").exists()


def _square_queries(**robust) -> dict[str, int]:
    plan = _demo(evaluators=["robust_auroc"], attack_params=robust.pop("attack_params", {}),
                 evaluator_params={"robust_auroc": {"ensemble": "standard", **robust}})
    return {s.set_name: s.params["n_queries"] for s in plan.attack_specs if "square" in s.set_name}


def test_the_square_members_take_their_own_attack_params_queries():
    """``attack_params.robust_square_id.n_queries`` (the family) or ``..._msp`` (the member) is the members' budget;
    the evaluator's default (500 on a CPU) applies where none is set; ``square_queries`` where it agrees."""
    assert _square_queries(attack_params={"robust_square_id": {"n_queries": 30}}) == {
        "robust_square_id_msp": 30, **{f"robust_square_ood_msp-{s}": 500 for s in ("textures", "blobs", "inverted")}}
    assert _square_queries(attack_params={"robust_square_ood_msp": {"n_queries": 20}}, square_queries=20) == {
        "robust_square_id_msp": 20, **{f"robust_square_ood_msp-{s}": 20 for s in ("textures", "blobs", "inverted")}}


def _attack_classes() -> dict[str, type]:
    """Every built-in attack class: the registered ones and each family's member for MSP and smoothed MSP."""
    names = [n for n in registry.default().table["attacks"] if isinstance(registry.get("attacks", n), type)]
    names += [fam.prefix + det for fam in registry.families("attacks").values() for det in ("msp", "smoothed_msp")
              if registry.resolves("attacks", fam.prefix + det)]
    return {n: registry.get("attacks", n) for n in names if hasattr(registry.get("attacks", n), "defaults")}


def test_every_budget_parameter_of_a_built_in_attack_declares_a_bound_the_docs_state():
    docs = (REPO / "docs" / "attacks.md").read_text(encoding="utf-8").split("### Budget bounds")[1].split("\n## ")[0]
    seen: set[str] = set()
    for name, cls in _attack_classes().items():
        if cls.__module__.startswith("advopenood_plugins"):
            declared = declared_types(cls)
            for key in set(cls.defaults(32)) & set(BUDGET_KEYS):
                assert bound_of(declared.get(key)) is not None, (name, key)
                seen.add(key)
    assert seen == set(BUDGET_KEYS)
    for key in (*BUDGET_KEYS, "p_init"):
        assert f"`{key}`" in docs, key
    for bound in ("1,000,000", "100,000", "10,000", "(0, 1]"):
        assert bound in docs, bound


#: the count parameters of the built-in evaluators and analyses (the test's list): each declares a bound
PLUGIN_COUNTS = {("analyses", "bintest"): ("n_inner", "n_random", "limit", "attacks"),
                 ("analyses", "gradcam"): ("max_samples", "n_examples"),
                 ("analyses", "transfer"): ("fractions", "attacks", "steps", "epochs", "pure_epochs", "jacobian_rounds",
                                            "max_augment", "limit"),
                 ("evaluators", "robust_auroc"): ("eps",)}


@pytest.mark.parametrize("kind, name", list(PLUGIN_COUNTS))
def test_every_count_of_an_analysis_declares_a_bound_the_docs_state(kind, name):
    """Each count parameter of a built-in analysis or evaluator declares its bound (``param_types``), and the docs
    state it (docs/analyses.md, "Parameter bounds"; robust_auroc's ``eps`` in docs/attacks.md, "Budget bounds")."""
    declared = declared_types(registry.get(kind, name))
    page, heading = ("analyses.md", "## Parameter bounds") if kind == "analyses" else ("attacks.md", "### Budget bounds")
    docs = (REPO / "docs" / page).read_text(encoding="utf-8").split(heading)[1].split("\n## ")[0]
    for key in PLUGIN_COUNTS[kind, name]:
        assert bound_of(declared.get(key)) is not None, (name, key)
        assert f"`{key}`" in docs, (name, key)


def test_counts_at_their_bound_are_taken():
    registry.check_declared("analyses", "bintest", {"n_inner": MAX_POINTS, "attacks": ["fgsm"] * MAX_SWEEP})
    registry.check_declared("analyses", "transfer", {"epochs": MAX_EPOCHS, "jacobian_rounds": 0, "fractions": 50})
    assert build_attack("adaptive_msp", {"lam": [1.0] * MAX_SWEEP}, input_size=32).p.lam == [1.0] * MAX_SWEEP
