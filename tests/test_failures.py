"""Failure paths: a failing plugin costs only its own outputs, the run says so and exits 3 (issue 24, item 8)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from advopenood import registry
from advopenood.cli import main
from advopenood.detectors import Postprocessor
from advopenood.io import save_figure, staging_dir
from advopenood.outputs import Results


class _Raises(Postprocessor):
    """A detector whose score raises on every set."""

    def score(self, net, x, out):
        raise RuntimeError("zzboom cannot score")


class _FailsLater(Postprocessor):
    """A detector that scores the first set it sees and raises on the next ones."""

    calls = 0

    def score(self, net, x, out):
        _FailsLater.calls += 1
        if _FailsLater.calls > 1:
            raise ValueError("zzlate fails on its second set")
        return out.logits.max(1).values


class _BrokenEvaluator:
    """Writes a table and a figure of its own, then raises."""

    def __call__(self, ctx):
        import matplotlib.pyplot as plt

        save_figure(plt.figure(), ctx.plot_dir / "zzbroken.png")
        (ctx.out / "zzbroken_partial.csv").write_text("a\n1\n")
        raise KeyError("zzbroken's missing column")


class _BrokenAnalysis:
    def __call__(self, ctx):
        return Results(tables={"zzhalf.csv": pd.DataFrame({"a": [1]})}, figures=[ctx.plot_dir / "never_written.png"])


PLUGINS = {("detectors", "zzboom"): _Raises, ("detectors", "zzlate"): _FailsLater,
           ("evaluators", "zzbroken"): _BrokenEvaluator, ("analyses", "zzhalf"): _BrokenAnalysis}


@pytest.fixture(scope="module", autouse=True)
def _plugins():
    """The failing plugins, registered for this module only (``detectors: all`` elsewhere must not meet them)."""
    for (kind, name), obj in PLUGINS.items():
        registry.register(kind, name)(obj)
    yield
    for kind, name in PLUGINS:
        registry.unregister(kind, name)


def _run(tmp_path: Path, capsys, *extra: str) -> tuple[int, str, Path]:
    out = tmp_path / "run"
    rc = main(["run", "--config", "demo", "--out", str(out), "--quiet", "--limit", "60", "--attack", "fgsm",
               "--eps", "16/255", *extra])
    return rc, capsys.readouterr().err, out


def test_failing_detector_evaluator_and_analysis_cost_only_their_outputs(tmp_path, capsys, session_cache):
    _FailsLater.calls = 0
    rc, err, out = _run(tmp_path, capsys, "--detectors", "msp,zzboom,zzlate", "--evaluator", "ood,zzbroken",
                        "--analysis", "zzhalf")
    assert rc == 3
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if " failed: " in line]
    assert {line.split(" failed:")[0] for line in lines} == {
        "advopenood: detector:zzboom", "advopenood: detector:zzlate", "advopenood: evaluator:zzbroken",
        "advopenood: analysis:zzhalf"}
    assert not staging_dir(out).exists()
    # every other output is there: msp's rows are complete, the failed detectors' rows carry their reason
    ood = pd.read_csv(out / "ood.csv")
    msp = ood[ood["detector"] == "msp"]
    assert len(msp) == 4 and msp["auroc"].notna().all()
    for det in ("zzboom", "zzlate"):
        rows = ood[ood["detector"] == det]
        assert len(rows) == 4 and rows["auroc"].isna().all() and rows["error"].str.contains("failed").all()
    assert (out / "scores" / "msp.npz").is_file() and (out / "report.md").is_file()
    # the failed plugins' own files are gone
    assert not (out / "zzbroken_partial.csv").exists() and not (out / "plots" / "zzbroken.png").exists()
    assert not (out / "zzhalf.csv").exists()
    info = json.loads((out / "run.json").read_text())
    assert set(info["plugin_errors"]) == {"evaluator:zzbroken", "analysis:zzhalf"}
    assert set(info["detector_errors"]) == {"zzboom", "zzlate"}
    report = (out / "report.md").read_text()
    for name in ("zzboom", "zzlate", "zzbroken", "zzhalf"):
        assert name in report
    log = (out / "errors.log").read_text()
    assert log.count("Traceback") == 4 and "zzbroken's missing column" in log
    manifest = json.loads((out / "manifest.json").read_text())["files"]
    assert "errors.log" in manifest and "zzhalf.csv" not in manifest


def test_a_clean_run_exits_0_without_an_error_log(tmp_path, capsys, session_cache):
    rc, err, out = _run(tmp_path, capsys, "--detectors", "msp", "--evaluator", "ood", "--analysis", "")
    assert rc == 0 and "failed" not in err
    assert not (out / "errors.log").exists()
    assert json.loads((out / "run.json").read_text())["plugin_errors"] == {}


def test_a_crash_in_the_core_leaves_no_staging_folder(tmp_path, monkeypatch, session_cache):
    from advopenood import pipeline

    def explode(*args, **kwargs):
        raise OSError("disk gone")

    monkeypatch.setattr(pipeline, "write_scores", explode)
    out = tmp_path / "run"
    with pytest.raises(OSError):
        main(["run", "--config", "demo", "--out", str(out), "--quiet", "--limit", "30", "--attack", "fgsm",
              "--eps", "16/255", "--detectors", "msp", "--analysis", ""])
    assert not staging_dir(out).exists() and not out.exists()


def test_detector_dropped_on_one_set_is_not_scored_on_the_next(cifar_model, pack_set):
    """The old scoring loop looked a detector dropped on an earlier set up again (KeyError) with a store."""
    from advopenood.detectors import score_all
    from advopenood.scorecache import ScoreCache

    _FailsLater.calls = 0
    fit = pack_set("cifar10_fit", "cifar10_train_10k.npz", 64)
    idset, ood = pack_set("cifar10", "cifar10_test.npz", 40), pack_set("tin", "tin_test.npz", 24)
    from advopenood.data import make_loader

    sets = {"id": lambda: make_loader(idset, 64), "tin": lambda: make_loader(ood, 64)}
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        result = score_all(["msp", "zzlate"], "pytorch-ood", cifar_model, fit, sets, batch_size=64,
                           device=torch.device("cpu"), seed=0, progress=False, cache=ScoreCache(Path(tmp)),
                           identities={"id": idset.identity(), "tin": ood.identity()}, model_hash="m")
    assert set(result.scores) == {"msp"} and set(result.scores["msp"]) == {"id", "tin"}
    assert "zzlate" in result.errors and "Traceback" in result.traces["zzlate"]
