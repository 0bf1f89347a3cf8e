"""A run is resolved once (issue 41): reading the config and the flags yields one resolved run
(:class:`advopenood.run.resolved.ResolvedRun`); nothing validates the plan again, resolves the data root again or
constructs an attack, an evaluator or an analysis twice."""
from __future__ import annotations

import functools
from collections import Counter
from importlib import resources

import pandas as pd
import pytest
from conftest import pack_config

from advopenood import registry
from advopenood.config import loading
from advopenood.config.plan import RunPlan


def _count_constructions(monkeypatch: pytest.MonkeyPatch, counts: Counter, kind: str, name: str) -> None:
    """Count each construction of the class registered as ``kind`` ``name`` (its own, not a subclass's), by name
    and parameters: one key per distinct plugin (an attack of several sets is several plugins)."""
    cls = registry.get(kind, name)
    original = cls.__init__

    @functools.wraps(original)  # registry.create reads the constructor's signature through __wrapped__
    def init(self, *args, **kwargs):
        if type(self) is cls:
            counts[f"{kind}:{name}" + (f":{sorted(kwargs.items())!r}" if kind == "attacks" else "")] += 1
        original(self, *args, **kwargs)

    monkeypatch.setattr(cls, "__init__", init)


def _count_calls(monkeypatch: pytest.MonkeyPatch, counts: Counter, owner: object, attr: str) -> None:
    """Count each call of the function ``owner.attr`` (a module's function or a class's classmethod)."""
    original = getattr(owner, attr)
    if isinstance(owner, type):
        func = original.__func__

        def counted_method(cls, *args, **kwargs):
            counts[attr] += 1
            return func(cls, *args, **kwargs)

        monkeypatch.setattr(owner, attr, classmethod(counted_method))
        return

    def counted(*args, **kwargs):
        counts[attr] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, attr, counted)


def test_a_whole_run_validates_resolves_and_constructs_each_thing_once(data_root, tmp_path, monkeypatch, capsys):
    from advopenood.cli.main import main

    counts: Counter = Counter()
    _count_calls(monkeypatch, counts, RunPlan, "model_validate")
    _count_calls(monkeypatch, counts, loading, "validate")
    _count_calls(monkeypatch, counts, loading, "resolve_data_root")
    # robust_auroc requires an ID-side set and one OOD-side set per natural OOD set (RequiresAttacks)
    attacks = ["fgsm", "pgd", "robust_id_msp", "robust_ood_msp"]
    plugins = [("attacks", a) for a in attacks] + [("evaluators", "ood"), ("evaluators", "robust_auroc"),
                                                   ("analyses", "gradcam")]
    for kind, name in plugins:
        _count_constructions(monkeypatch, counts, kind, name)
    out = tmp_path / "out"
    config = pack_config(tmp_path / "cfg", data_root, {  # the pack's ResNet-20 on 8 CIFAR-10 images vs Textures
        "data.fit": {"kind": "npz", "path": "cifar10_train_10k.npz", "name": "cifar10_train"}, "data.fit_limit": 500})
    code = main(["run", "--config", config, "--data-root", str(data_root), "--limit", "8",
                 "--attack", "fgsm,pgd", "--detectors", "msp", "--evaluator", "ood,robust_auroc",
                 "--analysis", "gradcam", "--out", str(out), "--cache-dir", str(tmp_path / "cache"), "--quiet"])
    assert code == 0, capsys.readouterr().err
    # the run did its work with what was constructed: every set in asr.csv, every plugin's table written
    sets = list(pd.read_csv(out / "asr.csv")["attack"])
    assert sets == ["fgsm", "pgd", "robust_id_msp", "robust_ood_msp-texture"]  # one natural OOD set
    assert (out / "ood.csv").is_file() and (out / "robust_auroc.csv").is_file()
    built = {key: n for key, n in counts.items() if key.startswith("attacks:")}
    assert len(built) == len(sets) and set(built.values()) == {1}, built  # one construction per adversarial set
    assert {key.split(":")[1] for key in built} == set(attacks)
    rest = {key: n for key, n in counts.items() if key not in built}
    assert rest == {"model_validate": 1, "validate": 1, "resolve_data_root": 1, "evaluators:ood": 1,
                    "evaluators:robust_auroc": 1, "analyses:gradcam": 1}


def test_a_plan_run_again_gets_attacks_of_its_own(data_root, tmp_path, monkeypatch):
    """The attacks constructed when the specs were resolved go to the first run of the plan; a second run of the
    same plan object constructs its own (a run binds its attacks to its model), and is not validated again."""
    from advopenood.run.resolved import resolve

    plan, _ = loading.load_config(pack_config(tmp_path / "cfg", data_root, {"attacks": ["fgsm", "pgd"],
                                                                            "out": str(tmp_path / "out")}))
    counts: Counter = Counter()
    _count_calls(monkeypatch, counts, RunPlan, "model_validate")
    for name in ("fgsm", "pgd"):
        _count_constructions(monkeypatch, counts, "attacks", name)
    first = resolve(plan)
    assert [s.set_name for s, _ in first.attacks] == ["fgsm", "pgd"] and first.plan is plan
    assert sorted(key.split(":")[1] for key in counts) == ["fgsm", "pgd"] and set(counts.values()) == {1}
    second = resolve(plan)
    assert sorted(key.split(":")[1] for key in counts) == ["fgsm", "pgd"] and set(counts.values()) == {2}
    assert all(a is not b for (_, a), (_, b) in zip(first.attacks, second.attacks))
    assert [type(a) for _, a in first.attacks] == [type(b) for _, b in second.attacks]


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
