"""A run is resolved once, and :func:`advopenood.run.resolved.resolve` is its only builder (issues 41, 51): reading
the config and the flags yields one resolved run; nothing validates the plan again or resolves the data root again
(besides the CLI's check of the config's schema before torch loads, issue 50, which builds no plan for the run);
the model is loaded once; every detector, attack, evaluator and analysis (built-in or a third party's, subclasses
included) is constructed once and every detector fitted once, a detector-adaptive attack on the run's fitted
detector itself; a re-run from the store fits nothing (a detector it needs is read back from its stored state)."""
from __future__ import annotations

import functools
from collections import Counter
from importlib import resources
from pathlib import Path

import pandas as pd
import pytest
from conftest import pack_config

from advopenood import plugin_registry
from advopenood.attacks.base import Attack
from advopenood.config import loading
from advopenood.config.plan import RunPlan
from advopenood.detection import scoring
from advopenood.detection.postprocessor import Postprocessor
from advopenood.models import classifier

#: a third-party package of one plugin of each kind that counts what it is asked to do (``COUNTS``)
COUNTING = '''from collections import Counter

import pandas as pd

from advopenood.plugin import Attack, DifferentiableDetector, Paragraph, Postprocessor, Results, Section

COUNTS = Counter()


class Margin(Postprocessor, DifferentiableDetector):
    """The top logit over the fit set's mean top logit."""

    requires_fit = True

    def __init__(self, **params):
        COUNTS["detector"] += 1
        super().__init__(**params)
        self.mean = None

    def fit(self, net, outputs, labels, batches):
        COUNTS["fit"] += 1
        self.mean = outputs.logits.max(1).values.mean().detach()

    def fit_state(self):
        return {"mean": self.mean.reshape(1).cpu()}

    def load_fit_state(self, net, state):
        COUNTS["restore"] += 1
        self.mean = state["mean"][0]

    def score(self, net, x, out):
        return out.logits.max(1).values - self.mean.to(out.logits.device)

    def grad_score(self, net, x, out):
        return self.score(net, x, out)


class Nudge(Attack):
    """A fixed Linf step of eps towards brighter pixels."""

    norm = "linf"

    def __init__(self, **params):
        COUNTS["attack"] += 1
        super().__init__(**params)

    @classmethod
    def defaults(cls, input_size):
        return {"eps": 8 / 255}

    def perturb(self, model, x, y):
        return x + self.p.eps


class Sets:
    """The number of images of each adversarial set."""

    def __init__(self):
        COUNTS["evaluator"] += 1

    def __call__(self, ctx):
        table = pd.DataFrame({"set": list(ctx.adv_sets), "n": [len(a) for a in ctx.adv_sets.values()]})
        return Results(tables={"zzsets.csv": table})


class Attacks:
    """The run's attacks as it built them (the attack of each set)."""

    def __init__(self):
        COUNTS["analysis"] += 1

    def __call__(self, ctx):
        COUNTS["attacks seen"] += len(ctx.attacks)
        return Results(sections=[Section("Attacks (counting plugin)", [Paragraph(", ".join(ctx.attacks))])])
'''


@pytest.fixture()
def counting(fresh_registry, tmp_path, monkeypatch):
    """The counting package, installed as a third party's is (a distribution with entry points on ``sys.path``)."""
    import sys

    site = tmp_path / "site"
    site.mkdir()
    (site / "zz_counting.py").write_text(COUNTING)
    info = site / "zz_counting-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: zz-counting\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[advopenood.detectors]\nzzmargin = zz_counting:Margin\n[advopenood.attacks]\nzznudge = zz_counting:Nudge\n"
        "[advopenood.evaluators]\nzzsets = zz_counting:Sets\n[advopenood.analyses]\nzzattacks = zz_counting:Attacks\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(plugin_registry, "_DISTS", dict(plugin_registry._DISTS))
    fresh_registry.discovered.clear()
    yield
    sys.modules.pop("zz_counting", None)


def _count_init(monkeypatch: pytest.MonkeyPatch, counts: Counter, cls: type, kind: str, with_params: bool) -> None:
    """Count each construction of ``cls`` and its subclasses through ``cls.__init__``, by the constructed class (and
    its parameters when ``with_params``: an attack of several sets is several attacks)."""
    original = cls.__init__

    @functools.wraps(original)  # registry.create reads the constructor's signature through __wrapped__
    def init(self, *args, **kwargs):
        key = f"{kind}:{type(self).__module__}.{type(self).__qualname__}"
        counts[key + (f":{sorted(kwargs.items())!r}" if with_params else "")] += 1
        original(self, *args, **kwargs)

    monkeypatch.setattr(cls, "__init__", init)


def _count_calls(monkeypatch: pytest.MonkeyPatch, counts: Counter, owner: object, attr: str,
                 key: str | None = None) -> None:
    """Count each call of the function ``owner.attr`` (a module's function or a class's classmethod)."""
    original = getattr(owner, attr)
    if isinstance(owner, type):
        func = original.__func__

        def counted_method(cls, *args, **kwargs):
            counts[key or attr] += 1
            return func(cls, *args, **kwargs)

        monkeypatch.setattr(owner, attr, classmethod(counted_method))
        return

    def counted(*args, **kwargs):
        counts[key or attr] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, attr, counted)


def _run(tmp_path: Path, data_root: Path, out: Path) -> None:
    """One ``advopenood run``: ResNet-20 on 8 CIFAR-10 images vs Textures; FGSM, the counting attack and the
    detector-adaptive attack on the counting detector; smoothed MSP (a randomised detector, 2 noise copies, over
    MSP) and the counting detector; the ood and counting evaluators; the binarization test of the adaptive attack
    and the counting analysis."""
    from advopenood.cli.main import main

    config = pack_config(tmp_path / "cfg", data_root, {
        "data.fit": {"kind": "npz", "path": "cifar10_train_10k.npz", "name": "cifar10_train"}, "data.fit_limit": 64,
        "attack_params": {"adaptive_zzmargin": {"steps": 2, "lam": [1.0]}},
        "detector_params": {"smoothed_msp": {"n": 2}},
        "analysis_params": {"bintest": {"attacks": "adaptive_zzmargin", "limit": 1, "n_inner": 3, "n_random": 3,
                                        "progress": False}}})
    code = main(["run", "--config", config, "--data-root", str(data_root), "--attack", "fgsm,zznudge,adaptive_zzmargin",
                 "--detectors", "smoothed_msp,zzmargin", "--evaluator", "ood,zzsets", "--analysis",
                 "bintest,zzattacks",
                 "--detector-backend", "pytorch-ood", "--out", str(out), "--cache-dir", str(tmp_path / "cache"),
                 "--quiet"])
    assert code == 0


def test_a_whole_run_builds_loads_and_fits_each_part_once(counting, data_root, tmp_path, monkeypatch):
    import zz_counting

    counts: Counter = Counter()
    _count_calls(monkeypatch, counts, RunPlan, "model_validate")
    _count_calls(monkeypatch, counts, loading, "validate")
    _count_calls(monkeypatch, counts, loading, "resolve_data_root")
    _count_calls(monkeypatch, counts, loading, "check_config")
    _count_calls(monkeypatch, counts, classifier, "build_model", "model load")
    original_fit = scoring._fit_one

    def fit_one(det, *args, **kwargs):
        counts[f"fit:{type(det).__name__}"] += 1
        return original_fit(det, *args, **kwargs)

    monkeypatch.setattr(scoring, "_fit_one", fit_one)
    _count_init(monkeypatch, counts, Postprocessor, "detector", False)
    _count_init(monkeypatch, counts, Attack, "attack", True)
    from advopenood import registry

    for kind, names in (("evaluators", ("ood", "zzsets")), ("analyses", ("bintest", "zzattacks"))):
        for name in names:
            _count_init(monkeypatch, counts, registry.get(kind, name), kind, False)
    out = tmp_path / "out"
    _run(tmp_path, data_root, out)
    # the run did its work with what was built: every set in asr.csv, every plugin's output written
    assert list(pd.read_csv(out / "asr.csv")["attack"]) == ["fgsm", "zznudge", "adaptive_zzmargin"]
    assert set(pd.read_csv(out / "ood.csv")["detector"]) == {"smoothed_msp", "zzmargin"}
    assert (out / "zzsets.csv").is_file() and (out / "bintest.csv").is_file()
    built = {key: n for key, n in counts.items() if key.split(":")[0] in ("detector", "attack", "evaluators",
                                                                           "analyses")}
    assert sorted(key.split(":")[1].rsplit(".", 1)[-1] for key in built) == [
        "Attacks", "BinarizationTest", "FGSM", "MSP", "Margin", "Nudge", "OODEvaluator", "Sets", "adaptive_zzmargin",
        "smoothed_msp"]  # the smoothed detector's MSP is its own base (built by it, once), the run scores no MSP
    assert set(built.values()) == {1}, built
    rest = {key: n for key, n in counts.items() if key not in built}
    # the CLI's check before torch (check_config) validates the schema once more, and resolves the root for it
    assert rest == {"check_config": 1, "model_validate": 2, "validate": 2, "resolve_data_root": 2, "model load": 1,
                    "fit:Margin": 1}, rest  # smoothed MSP fits nothing; the adaptive attack attacks the run's Margin
    assert zz_counting.COUNTS == {"detector": 1, "attack": 1, "evaluator": 1, "analysis": 1, "fit": 1,
                                  "attacks seen": 3}
    # the same run again, from the store: every part built once, nothing fitted; the binarization test, which reads
    # the attacked detector, gets the run's detector restored once from its stored state
    counts.clear()
    zz_counting.COUNTS.clear()
    _run(tmp_path, data_root, out)
    assert set(counts) == set(built) | {"check_config", "model_validate", "validate", "resolve_data_root",
                                        "model load"}, counts
    assert {key: n for key, n in counts.items() if n != 1} == {"model_validate": 2, "validate": 2,
                                                               "resolve_data_root": 2}, counts
    assert zz_counting.COUNTS == {"detector": 1, "attack": 1, "evaluator": 1, "analysis": 1, "restore": 1,
                                  "attacks seen": 3}


def test_a_plan_holds_configuration_and_each_resolution_builds_its_own_parts(data_root, tmp_path, monkeypatch):
    """Reading the attack specs constructs no attack (the plan is configuration); each resolution of the same plan
    builds its own attacks (a run binds them to its model), and the plan is not validated again."""
    from advopenood.run.resolved import resolve

    plan, _ = loading.load_config(pack_config(tmp_path / "cfg", data_root, {"attacks": ["fgsm", "pgd"],
                                                                            "out": str(tmp_path / "out")}))
    counts: Counter = Counter()
    _count_calls(monkeypatch, counts, RunPlan, "model_validate")
    _count_init(monkeypatch, counts, Attack, "attack", False)
    assert [s.set_name for s in plan.attack_specs] == ["fgsm", "pgd"] and not counts
    first = resolve(plan)
    assert [s.set_name for s, _ in first.attacks] == ["fgsm", "pgd"] and first.plan is plan
    assert sorted(counts) == ["attack:advopenood_plugins.attacks.standard.FGSM",
                              "attack:advopenood_plugins.attacks.standard.PGD"] and set(counts.values()) == {1}
    second = resolve(plan)
    assert set(counts.values()) == {2} and "model_validate" not in counts
    assert all(a is not b for (_, a), (_, b) in zip(first.attacks, second.attacks))
    assert [type(a) for _, a in first.attacks] == [type(b) for _, b in second.attacks]
    assert first.model is not second.model and first.bank is not second.bank


def test_a_data_root_under_home_is_resolved_once_not_under_the_config_folder(data_root, tmp_path, monkeypatch):
    """``data.root: ~/pack`` in a config file is the home folder's ``pack`` (it was taken as ``<config
    folder>/~/pack`` when the CLI resolved the root a second time)."""
    from advopenood.cli.main import _plan, build_parser

    home = tmp_path / "home"
    home.mkdir()
    (home / "pack").symlink_to(data_root)
    monkeypatch.setenv("HOME", str(home))
    config = tmp_path / "cfg" / "home.yaml"
    config.parent.mkdir()
    packaged = resources.files("advopenood.configs") / "cifar10_resnet20.yaml"
    config.write_text(packaged.read_text().replace("root: ../../shared/data", "root: ~/pack"))
    plan = _plan(build_parser().parse_args(["run", "--config", str(config)]))
    assert plan.data_root == home / "pack"
    assert (plan.data_root / "cifar10_test.npz").is_file()
