"""One pass through a run (issue 32, item 5): each stage module is entered once, in the order data flows, and
nothing calls back into the pipeline module; the plan is read by attribute (no ``thaw(`` outside the config
package); the 60-line rule is tests/test_architecture.py's."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
from conftest import make_plan

from advopenood.cli.main import main

REPO = Path(__file__).resolve().parents[1]
CORE = REPO / "advopenood"
RUN = CORE / "run"
STAGES = ["prepare", "attack", "detect", "evaluate", "report"]


def _functions(path: Path) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_the_core_outside_the_config_package_never_thaws_the_plan():
    """Parameters are read from the plan (``plan.params`` / ``plan.param_section``), never thawed into dicts (one
    test over every module)."""
    calls = [f"{path.relative_to(REPO)}:{n.lineno}" for path in sorted(CORE.rglob("*.py"))
             if "config" not in path.relative_to(CORE).parts for n in ast.walk(ast.parse(path.read_text()))
             if isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", None)) == "thaw"]
    assert calls == []


def _trace_run(argv: list[str]) -> tuple[list[str], list[str]]:
    """The stage modules the pipeline module enters (consecutive calls of a module's functions counted once), and every
    call into the pipeline module from outside it, during ``advopenood`` ``argv``."""
    pipeline = str(RUN / "pipeline.py")
    stage_files = {str(RUN / f"{s}.py"): s for s in STAGES}
    entered: list[str] = []
    callbacks: list[str] = []

    def profile(frame, event, arg):
        if event != "call" or frame.f_back is None:
            return
        callee, caller = frame.f_code.co_filename, frame.f_back.f_code.co_filename
        # a stage is entered through its module's functions; reading a value it returned (a property of its
        # dataclass, e.g. ``Setup.plan``) is no entry
        if caller == pipeline and callee in stage_files and "." not in frame.f_code.co_qualname:
            if not entered or entered[-1] != stage_files[callee]:
                entered.append(stage_files[callee])
        elif callee == pipeline and caller != pipeline and frame.f_code.co_name not in ("run", "<module>"):
            callbacks.append(f"{frame.f_code.co_name} from {Path(caller).name}")

    sys.setprofile(profile)
    try:
        rc = main(argv)
    finally:
        sys.setprofile(None)
    assert rc == 0
    return entered, callbacks


@pytest.mark.parametrize("command, stages", [
    ("run", STAGES),
    ("attack", ["prepare", "attack", "report"]),
])
def test_a_run_enters_each_stage_once_in_order(tmp_path, session_cache, command, stages):
    """A real tiny run on the demo data: prepare -> attack -> detect -> evaluate -> report, each entered once
    from the driver, and no stage calls back into the pipeline module."""
    argv = [command, "--config", "demo", "--out", str(tmp_path / "run"), "--quiet", "--limit", "8", "--attack",
            "fgsm", "--detectors", "msp", "--evaluator", "ood", "--analysis", ""]
    entered, callbacks = _trace_run(argv[:10] if command == "attack" else argv)
    assert entered == stages
    assert callbacks == []


def test_plugins_read_a_frozen_view_and_the_evaluate_stage_returns_what_happened(tmp_path):
    """Issue 51: a plugin gets a read-only view (``RunView``; the frozen ``RunContext``), reading ``plot_dir`` writes
    nothing, and a plugin's failure and nothing-to-compute entry come back in the stage's result, not written into
    the context the plugins share."""
    import dataclasses

    import numpy as np
    import pandas as pd
    import torch

    from advopenood.evaluation.context import CleanRecord, RunContext
    from advopenood.outputs.results import Results
    from advopenood.plugin import RunView
    from advopenood.run.evaluate import evaluate

    class Broken:
        def __call__(self, ctx):
            raise RuntimeError("no table today")

    class Empty:
        def __call__(self, ctx):
            assert ctx.plot_dir.is_dir()  # the stage makes it while the plugin runs
            return Results(empty_reason="nothing to compare")

    ctx = RunContext(make_plan(), tmp_path, None, None, None, {}, {}, CleanRecord(np.zeros(0), np.zeros(0)))
    assert isinstance(ctx, RunView) and ctx.plot_dir == tmp_path / "plots"
    assert not ctx.plot_dir.exists()  # reading where figures go makes no folder
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.seed = 1  # type: ignore[misc]
    evaluated = evaluate(ctx, [("evaluator:zzbroken", Broken()), ("analysis:zzempty", Empty())],
                         pd.DataFrame())
    assert evaluated.errors == {"evaluator:zzbroken": "RuntimeError: no table today"}
    assert "no table today" in evaluated.traces["evaluator:zzbroken"]
    assert evaluated.nothing_computed == {"analysis:zzempty": "nothing to compare"}
    assert ctx.plugin_errors == {} and ctx.nothing_computed == {} and ctx.traces == {}
    assert not (tmp_path / "plots").exists()  # made while each plugin ran, removed as it stayed empty


def test_the_plan_is_the_one_carrier_of_the_run_settings(tmp_path):
    """Issue 51: the context repeats none of its plan's settings (``seed``, ``device``, ``batch_size``, ``protocol``,
    ``dataset``, ``arch`` were fields beside ``plan``): each is a read-only property of the plan, so a new plan is
    a context's new settings; a context built with them as keywords puts them into its plan, with a warning."""
    import dataclasses

    import numpy as np
    import torch

    from advopenood.evaluation.context import CleanRecord, RunContext

    repeated = {"seed", "device", "batch_size", "protocol", "dataset", "arch"}
    assert not repeated & {f.name for f in dataclasses.fields(RunContext)}
    plan = make_plan(seed=7, batch_size=5, protocol="lorenz2024")
    ctx = RunContext(plan, tmp_path, None, None, None, {}, {}, CleanRecord(np.zeros(0), np.zeros(0)))
    assert (ctx.seed, ctx.device, ctx.batch_size, ctx.protocol, ctx.dataset, ctx.arch) == (
        plan.seed, torch.device(plan.device), plan.batch_size, plan.protocol, plan.data.dataset, plan.model.arch) == (
        7, torch.device("cpu"), 5, "lorenz2024", "cifar10", "resnet20")
    later = dataclasses.replace(ctx, plan=plan.replace(seed=8))
    assert later.seed == later.intervals.seed == 8 and ctx.intervals.seed == 7
    with pytest.warns(DeprecationWarning, match="the plan carries the run's settings"):
        old = RunContext(plan=plan, out=tmp_path, model=None, device=torch.device("cpu"), seed=9, dataset="digits",
                         arch="democnn", protocol="strong", id_set=None, fit_set=None, ood_sets={}, adv_sets={},
                         clean=ctx.clean)
    assert (old.seed, old.dataset, old.arch, old.protocol) == (9, "digits", "democnn", "strong") and plan.seed == 7
    assert old.plan.seed == 9 and [s.set_name for s in old.plan.attack_specs] == []
