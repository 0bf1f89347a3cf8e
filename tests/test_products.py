"""Issue 41, items 2 and 3: the stages return typed, frozen results that the driver hands on (no string-keyed
``extras`` on the context), and a table several evaluators read is a product: declared by name, computed once per
run by the core and handed to every evaluator that declares it; no evaluator package imports another."""
from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest

from conftest import pack_config

from advopenood.cli.main import main
from advopenood.evaluation.context import RunContext
from advopenood.evaluation.products import Product, Products, needs_of
from advopenood.evaluation.verify import verify_run
from advopenood.run import pipeline
from advopenood.run.detect import Detected
from advopenood.run.evaluate import Evaluated, call_plugin
from advopenood.run.report import Reported
from advopenood.evaluation import shared as kit_robust  # the robust table's home (re-exported by the kit)
from advopenood_plugins.kit.ood import SET_GROUPS
from advopenood_plugins.kit.robust import ROBUST_TABLE

REPO = Path(__file__).resolve().parents[1]
EVALUATORS = REPO / "plugins" / "evaluators"


@pytest.fixture(scope="module")
def shared_run(data_root, session_cache, tmp_path_factory):
    """A real run on the pack (ResNet-20, 8 CIFAR-10 images vs Textures, FGSM, MSP and the robust-AUROC sets of
    MSP, 5 steps) with ``ood``, ``robust_auroc`` and ``levels``, all three of which read the robust table; every
    stage's return value and every computation of the robust table recorded."""
    folder = tmp_path_factory.mktemp("products")
    cfg = pack_config(folder, data_root, {"evaluators": ["ood", "robust_auroc", "levels"],
                                          "attack_params": {"robust_id": {"steps": 5}, "robust_ood": {"steps": 5}},
                                          "ci": {"method": "bootstrap", "resamples": 200}})
    seen: dict[str, list] = {"tables": [], "stages": []}
    patch = pytest.MonkeyPatch()
    real_pairs = kit_robust.robust_pairs
    patch.setattr(kit_robust, "robust_pairs", lambda ctx: seen["tables"].append(ctx) or real_pairs(ctx))
    for stage in ("detect", "evaluate", "report"):
        real = getattr(pipeline, stage)
        patch.setattr(pipeline, stage, lambda *a, real=real, **k: seen["stages"].append(real(*a, **k)) or
                      seen["stages"][-1])
    returned = []
    real_run = pipeline.run
    patch.setattr(pipeline, "run", lambda *a, **k: returned.append(real_run(*a, **k)) or returned[-1])
    try:
        assert main(["run", "--config", cfg, "--out", str(folder / "out"), "--quiet"]) == 0
    finally:
        patch.undo()
    return returned[0], folder / "out", seen


def test_the_robust_table_is_computed_once_for_the_three_evaluators_that_read_it(shared_run):
    ctx, out, seen = shared_run
    assert len(seen["tables"]) == 1  # ood, robust_auroc and levels all declare it
    robust = pd.read_csv(out / "robust_auroc.csv")
    assert len(robust) == 1 and robust["id_attack"].iloc[0] == "robust_id_msp"
    levels = pd.read_csv(out / "levels.csv").set_index("criterion")
    assert levels.loc["robust_auroc", "auroc"] == pytest.approx(robust["robust_auroc"].iloc[0], abs=1e-4)
    assert levels.loc["robust_auroc", "worst_set"] == "robust_id_msp+robust_ood_msp-texture"
    (entry,) = json.loads((out / "leaderboard_openood.json").read_text())
    assert entry["Far-OOD_Robust_AUROC"] == f"{robust['robust_auroc'].iloc[0]:.2f}"
    found = verify_run(str(out))
    assert found.differences == [] and found.files == []


def test_each_stage_returns_a_frozen_typed_result_that_the_next_one_takes(shared_run):
    ctx, out, seen = shared_run
    detected, evaluated, reported = seen["stages"]
    assert isinstance(detected, Detected) and isinstance(evaluated, Evaluated) and isinstance(reported, Reported)
    for result in (detected, evaluated, reported, ctx.outcome):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(result, dataclasses.fields(result)[0].name, None)
    run_json = json.loads((out / "run.json").read_text())
    assert run_json["detector_work"] == dict(detected.work) and sum(detected.work.values()) > 0
    assert set(detected.scores) == {"msp"} and detected.ctx.scores is detected.scores
    claims = json.loads((out / "claims.json").read_text())
    assert len(claims["claims"]) == len(evaluated.claims) > 0
    assert [c["text"] for c in claims["summary"]] == list(reported.summary) == list(ctx.outcome.summary)
    assert set(evaluated.seconds) == {"evaluator:ood", "evaluator:robust_auroc", "evaluator:levels"}
    assert ctx.out == out and ctx.outcome.kept == {} and ctx.outcome.export == ()


def test_the_context_has_no_string_keyed_bag_and_types_what_plugins_read():
    fields = {f.name: f.type for f in dataclasses.fields(RunContext)}
    assert "extras" not in fields
    assert fields["plan"] == "RunPlan" and fields["bank"] == "DetectorBank | None"
    core = [p for p in (REPO / "advopenood").rglob("*.py")] + list((REPO / "plugins").rglob("*.py"))
    assert [str(p) for p in core if "extras[" in p.read_text()] == []


def _imported(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


@pytest.mark.parametrize("package", sorted(p.name for p in EVALUATORS.iterdir() if (p / "plugin.py").is_file()))
def test_no_evaluator_package_imports_another(package):
    """What evaluators share is in the plugin kit or the core (``.importlinter`` states it as a contract too)."""
    others = [f"advopenood_plugins.evaluators.{p.name}" for p in EVALUATORS.iterdir()
              if (p / "plugin.py").is_file() and p.name != package]
    found = {f"{path.name}: {m}" for path in (EVALUATORS / package).glob("*.py") for m in _imported(path)
             if any(m == o or m.startswith(o + ".") for o in others)}
    assert found == set()


def test_a_plugin_gets_exactly_the_products_it_declares_and_one_without_needs_the_context_alone(shared_run):
    ctx, _, _ = shared_run
    got = []

    class Plain:
        def __call__(self, ctx):
            got.append(("plain", ctx))

    class Reader:
        needs = (ROBUST_TABLE,)

        def __call__(self, ctx, products):
            table = products[ROBUST_TABLE]
            table["robust_auroc"] = -1.0  # a reader's change reaches no other reader
            got.append(("reader", products.names(), products["robust_table"]))
            with pytest.raises(KeyError, match="not declared"):
                products[SET_GROUPS]

    products = Products(ctx)
    call_plugin(ctx, Plain(), products)
    call_plugin(ctx, Reader(), products)
    call_plugin(ctx, Reader(), products)
    assert got[0] == ("plain", ctx) and products.computed == ("robust_table",)
    written = pd.read_csv(ctx.out / "robust_auroc.csv")
    for _, names, table in got[1:]:
        assert names == ("robust_table",)
        assert table["robust_auroc"].to_numpy() == pytest.approx(written["robust_auroc"].to_numpy(), abs=1e-4)


def test_two_different_products_under_one_name_are_refused(shared_run):
    ctx, _, _ = shared_run
    products = Products(ctx)
    products.get(ROBUST_TABLE)
    impostor = Product("robust_table", lambda c: pd.DataFrame())
    with pytest.raises(ValueError, match="two different products are named 'robust_table'"):
        products.get(impostor)
    with pytest.raises(TypeError, match="must be an advopenood.plugin.Product"):
        needs_of(type("Bad", (), {"needs": ("robust_table",)})())
