"""Failure paths: a failing plugin costs only its own outputs, the run says so and exits 3 (issue 24, item 8)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import registered
from advopenood.attacks import Attack
from advopenood.cli.main import main
from advopenood.detection.postprocessor import Postprocessor
from advopenood.io import save_figure, staging_dirs
from advopenood.outputs.results import Results


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


class _BadOutput(Attack):
    """A third party's Linf attack whose output is wrong in the way ``mode`` says (issue 30, item 15)."""

    norm = "linf"
    mode = ""

    @classmethod
    def defaults(cls, input_size: int) -> dict:
        return {"eps": 8 / 255}

    def perturb(self, model, x, y):
        if self.mode == "nan":
            return torch.where(torch.arange(len(x))[:, None, None, None] % 2 == 0, torch.nan, x)
        if self.mode == "shape":
            return x[:, :, 1:]
        if self.mode == "raise":
            raise RuntimeError("zzraise's solver diverged")
        return x + 0.5 * (torch.randint(0, 2, x.shape, dtype=x.dtype) * 2 - 1)  # Linf 0.5 at eps 8/255


BAD_ATTACKS = {"zznan": ("nan", "returned NaN or infinite pixels in 30 of 60 images (first: row 0)"),
               "zzshape": ("shape", "returned (60, 1, 15, 16) for input images of shape (60, 1, 16, 16)"),
               "zzover": ("over", "beyond its budget: linf norm up to 0.5 > eps 0.03137 in 60 of 60 images"),
               "zzraise": ("raise", "RuntimeError: zzraise's solver diverged")}
PLUGINS = {("detectors", "zzboom"): _Raises, ("detectors", "zzlate"): _FailsLater,
           ("evaluators", "zzbroken"): _BrokenEvaluator, ("analyses", "zzhalf"): _BrokenAnalysis,
           **{("attacks", name): type(f"_{mode.title()}", (_BadOutput,), {"name": name, "mode": mode})
              for name, (mode, _) in BAD_ATTACKS.items()}}


@pytest.fixture(scope="module", autouse=True)
def _plugins():
    """The failing plugins, registered for this module only (``detectors: all`` elsewhere must not meet them)."""
    yield from registered(PLUGINS)


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
    assert not staging_dirs(out)
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


@pytest.mark.parametrize("attack", list(BAD_ATTACKS))
def test_an_attack_with_impossible_output_costs_only_its_set(attack, tmp_path, capsys, session_cache):
    """NaN pixels, a wrong shape, a perturbation beyond eps, or an exception: the set is left out of every output
    and never stored, named in run.json, errors.log and stderr, exit 3; the other set and the detectors go on."""
    out = tmp_path / "run"
    rc = main(["run", "--config", "demo", "--out", str(out), "--quiet", "--limit", "60", "--attack",
               f"fgsm,{attack}", "--eps", "8/255", "--detectors", "msp", "--evaluator", "ood", "--analysis", ""])
    err = capsys.readouterr().err
    assert rc == 3 and "Traceback" not in err, err
    message = BAD_ATTACKS[attack][1]
    assert f"advopenood: attack:{attack} failed: " in err and message in err
    info = json.loads((out / "run.json").read_text())
    assert set(info["plugin_errors"]) == {f"attack:{attack}"} and message in info["plugin_errors"][f"attack:{attack}"]
    assert set(info["attacks"]) == {"fgsm"}
    assert list(pd.read_csv(out / "asr.csv")["attack"]) == ["fgsm"]
    ood = pd.read_csv(out / "ood.csv")
    assert len(ood) and not ood["dataset"].str.contains(attack).any() and ood["auroc"].notna().all()
    with np.load(out / "scores" / "msp.npz") as scores:
        assert "fgsm" in scores.files and not any(k.startswith(attack) for k in scores.files)
    assert message in (out / "errors.log").read_text() and attack in (out / "report.md").read_text()
    assert not list((session_cache / "adv").glob(f"{attack}-*/shard_*.npz"))


@pytest.mark.parametrize("classes", [[0], [0, 1, 2, 3, 4], list(range(9))])
def test_class_conditional_detectors_fail_on_a_fit_set_missing_classes(classes, data_root, tmp_path, capsys):
    """MDS and RMDS (class means) fitted on a subset of the model's classes are detector errors, exit 3, as
    docs/detectors.md promises; MSP, which fits nothing, is scored (issue 30, item 16)."""
    import yaml

    with np.load(data_root / "cifar10_train_10k.npz") as d:
        rows = np.concatenate([np.flatnonzero(d["y"] == c)[:12] for c in classes])
        np.savez(tmp_path / "fit.npz", x=d["x"][rows], y=d["y"][rows])
    cfg = {"name": "cover", "out": str(tmp_path / "run"), "cache_dir": str(tmp_path / "cache"),
           "model": {"arch": "resnet20", "num_classes": 10, "checkpoint": "resnet20_cifar10.pt"},
           "data": {"root": str(data_root), "id": {"kind": "npz", "path": "cifar10_test.npz", "name": "cifar10"},
                    "fit": {"kind": "npz", "path": str(tmp_path / "fit.npz"), "name": "fit"},
                    "ood": [{"kind": "npz", "path": "tin_test.npz", "name": "tin"}]},
           "attacks": [], "detectors": "msp,mds,rmds", "evaluators": "ood", "analyses": []}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    rc = main(["run", "--config", str(tmp_path / "cfg.yaml"), "--quiet", "--limit", "16"])
    err = capsys.readouterr().err
    assert rc == 3 and "Traceback" not in err, err
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    first = ", ".join(str(c) for c in [c for c in range(10) if c not in classes][:5])
    for det in ("mds", "rmds"):
        assert f"covers {len(classes)} of the model's 10 classes (no image of class {first}" in \
            info["detector_errors"][det]
    assert set(info["detector_errors"]) == {"mds", "rmds"}
    ood = pd.read_csv(tmp_path / "run" / "ood.csv")
    assert ood[ood["detector"] == "msp"]["auroc"].notna().all()


def test_a_clean_run_exits_0_without_an_error_log(tmp_path, capsys, session_cache):
    rc, err, out = _run(tmp_path, capsys, "--detectors", "msp", "--evaluator", "ood", "--analysis", "")
    assert rc == 0 and "failed" not in err
    assert not (out / "errors.log").exists()
    assert json.loads((out / "run.json").read_text())["plugin_errors"] == {}


def test_a_crash_in_the_core_leaves_no_staging_folder(tmp_path, monkeypatch, session_cache):
    from advopenood.run import detect

    def explode(*args, **kwargs):
        raise OSError("disk gone")

    monkeypatch.setattr(detect, "write_scores", explode)
    out = tmp_path / "run"
    with pytest.raises(OSError):
        main(["run", "--config", "demo", "--out", str(out), "--quiet", "--limit", "30", "--attack", "fgsm",
              "--eps", "16/255", "--detectors", "msp", "--analysis", ""])
    assert not staging_dirs(out) and not out.exists()


def test_detector_dropped_on_one_set_is_not_scored_on_the_next(cifar_model, pack_set):
    """The old scoring loop looked a detector dropped on an earlier set up again (KeyError) with a store."""
    from advopenood.detection.scoring import score_all
    from advopenood.detection.scorecache import ScoreCache

    _FailsLater.calls = 0
    fit = pack_set("cifar10_fit", "cifar10_train_10k.npz", 64)
    idset, ood = pack_set("cifar10", "cifar10_test.npz", 40), pack_set("tin", "tin_test.npz", 24)
    from advopenood.data.datasets import make_loader

    sets = {"id": lambda: make_loader(idset, 64), "tin": lambda: make_loader(ood, 64)}
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        result = score_all(["msp", "zzlate"], "pytorch-ood", cifar_model, fit, sets, batch_size=64,
                           device=torch.device("cpu"), seed=0, progress=False, cache=ScoreCache(Path(tmp)),
                           identities={"id": idset.identity(), "tin": ood.identity()}, model_hash="m")
    assert set(result.scores) == {"msp"} and set(result.scores["msp"]) == {"id", "tin"}
    assert "zzlate" in result.errors and "Traceback" in result.traces["zzlate"]
