"""Standard benchmarks, their entries and the leaderboard (issue 52), on one run of the ``smoke`` benchmark (16 + 16
images of the pack, the pretrained ResNet-20, MSP and EBO): what a benchmark fixes and refuses, the entries
committed with the run, the page and its exports, ``--verify`` on untouched and edited entries, the best known and
``unreliable``, and every kind of bad entry costing only its own line. The browser test opens the page in headless
Chromium (skipped where none is installed)."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from conftest import edited_copy, pack_config

from advopenood.cli.main import main
from advopenood.config.benchmarks import benchmark, benchmarks
from advopenood.io import read_manifest
from advopenood.run.entries import manifest_digest


@pytest.fixture(scope="module")
def smoke_run(data_root, session_cache, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("bench")
    out = folder / "smoke_run"
    config = pack_config(folder, data_root, {"shard_size": 8})  # the gpu suite's smoke shards: its run reuses them
    assert main(["run", "--benchmark", "smoke", "--config", config, "--detectors", "msp,ebo", "--out", str(out),
                 "--quiet"]) == 0
    return out


def _copy(run: Path, tmp_path: Path, name: str) -> Path:
    copy = tmp_path / name
    shutil.copytree(run, copy)
    return copy


def _edit(path: Path, change) -> None:
    entry = json.loads(path.read_text())
    change(entry)
    path.write_text(json.dumps(entry))


def test_the_shipped_benchmarks_fix_data_threat_and_evaluation(capsys):
    assert {"cifar10-linf-8-full", "cifar10-linf-8-pack-200", "cifar10-linf-2-full", "cifar10-linf-2-pack-200",
            "smoke"} <= set(benchmarks())
    pack = benchmark("cifar10-linf-8-pack-200")
    assert [(s.name, s.group, s.images) for s in pack.ood] == [("tin", "near", 200), ("mnist", "far", 200),
                                                               ("fashionmnist", "far", 200), ("texture", "far", 200)]
    assert benchmark("smoke").key != pack.key and len(benchmark("smoke").ood) == 1
    assert main(["list", "benchmarks"]) == 0
    assert "cifar10-linf-2-full" in capsys.readouterr().out


@pytest.mark.parametrize("flag", [["--limit", "4"], ["--eps", "4/255"], ["--attack", "fgsm"], ["--seed", "3"]])
def test_a_flag_that_changes_what_the_benchmark_fixes_is_refused_by_name(flag, tmp_path, capsys):
    assert main(["run", "--benchmark", "smoke", "--config", "demo", "--out", str(tmp_path / "o"), *flag]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and flag[0] in err and not (tmp_path / "o").exists()


def test_a_set_without_the_benchmarks_images_is_refused_before_any_work(data_root, tmp_path, capsys):
    fake = tmp_path / "data"
    fake.mkdir()
    for name in ("cifar10_test.npz", "cifar10_train_10k.npz", "tin_test.npz", "resnet20_cifar10.pt"):
        (fake / name).symlink_to(data_root / name)
    (fake / "tin_test.npz").unlink()
    shutil.copy(data_root / "mnist_test.npz", fake / "tin_test.npz")  # another set under the benchmark's file name
    config = pack_config(tmp_path, data_root)
    assert main(["run", "--benchmark", "smoke", "--config", config, "--data-root", str(fake), "--detectors", "msp",
                 "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "'tin'" in err and "does not hold the benchmark's" in err and not (tmp_path / "o").exists()


def test_entries_are_committed_with_the_run_and_hold_its_numbers(smoke_run):
    listed = read_manifest(smoke_run)
    assert {"entries/msp.json", "entries/ebo.json"} <= set(listed)
    entry = json.loads((smoke_run / "entries" / "msp.json").read_text())
    assert entry["benchmark"] == {"name": "smoke", "version": "0.1", "evaluation": "smoke-0.1", "eps": "8/255"}
    assert entry["run"]["manifest_digest"] == manifest_digest(listed)
    robust = pd.read_csv(smoke_run / "robust_auroc.csv")
    row = robust[(robust.detector == "msp") & (robust.method == "ensemble")].iloc[0]
    assert entry["robust"]["tin"]["robust_auroc"] == pytest.approx(row.robust_auroc)
    assert entry["robust"]["tin"]["n_id"] == 16 and entry["model"]["checkpoint_sha256"]
    assert [s["attack"] for s in entry["curve"]][0] == "none" and entry["curve"][-1]["attack"] == "square"


def test_the_page_and_its_exports(smoke_run, tmp_path):
    assert main(["leaderboard", str(smoke_run), "--out", str(tmp_path / "site")]) == 0
    page = (tmp_path / "site" / "smoke-0.1.html").read_text()
    assert "<script>" in page and "http" not in page.split("<body>")[1]  # self-contained: no CDN
    table = pd.read_csv(tmp_path / "site" / "smoke-0.1.csv")
    assert sorted(table.detector) == ["ebo", "msp"] and "tin robust AUROC" in table
    assert (tmp_path / "site" / "smoke-0.1.md").is_file()
    assert "\\begin" in (tmp_path / "site" / "smoke-0.1.tex").read_text()


def test_verify_passes_untouched_entries_and_names_an_edited_cell(smoke_run, tmp_path, capsys):
    assert main(["leaderboard", str(smoke_run), "--verify"]) == 0
    copy = _copy(smoke_run, tmp_path, "edited")
    _edit(copy / "entries" / "msp.json", lambda e: e["robust"]["tin"].update(robust_auroc=42.0))
    assert main(["leaderboard", str(copy), "--verify"]) == 1
    out = capsys.readouterr().out
    assert "robust.tin.robust_auroc: entry 42.0" in out and "msp" in out and "ebo @" not in out


def test_a_lower_external_evaluation_makes_the_entry_unreliable(smoke_run, tmp_path):
    own = _copy(smoke_run, tmp_path, "own")  # the entry claims more than the external run of the same cell found
    _edit(own / "entries" / "msp.json", lambda e: e["robust"]["tin"].update(robust_auroc=60.0, robust_auroc_lo=50.0,
                                                                            robust_auroc_hi=70.0))
    assert main(["leaderboard", str(own / "entries" / "msp.json"), str(smoke_run / "entries" / "msp.json"),
                 "--out", str(tmp_path / "site")]) == 0
    row = pd.read_csv(tmp_path / "site" / "smoke-0.1.csv").iloc[0]
    assert row["tin robust AUROC"].startswith("60.0") and row["tin evaluations"] == 2
    assert float(row["tin best known"]) < 50 and "unreliable" in row["flags"]


def test_bad_entries_cost_one_line_each_and_keep_the_others(smoke_run, tmp_path, capsys):
    lone = tmp_path / "lone.json"  # an entry without its run folder
    shutil.copy(smoke_run / "entries" / "ebo.json", lone)
    other = _copy(smoke_run, tmp_path, "other")
    _edit(other / "entries" / "msp.json", lambda e: e["benchmark"].update(version="9.9"))
    clash = _copy(smoke_run, tmp_path, "clash")
    _edit(clash / "entries" / "ebo.json", lambda e: e["images"].update(tin="0" * 64))
    edited = edited_copy(smoke_run, tmp_path, "robust_auroc.csv", "robust_auroc", delta=5.0)  # fails verify
    args = [str(smoke_run / "entries" / "msp.json"), str(lone), str(other / "entries" / "msp.json"),
            str(smoke_run / "entries" / "ebo.json"), str(clash / "entries" / "ebo.json"),
            str(edited / "entries" / "msp.json")]
    assert main(["leaderboard", *args, "--out", str(tmp_path / "site")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4
    assert "missing" in err[0] and "smoke@9.9" in err[1] and "other image digests" in err[2]
    assert "fails advopenood verify" in err[3] and "robust_auroc.csv" in err[3]
    table = pd.read_csv(tmp_path / "site" / "smoke-0.1.csv")
    assert sorted(table.detector) == ["ebo", "msp"] and set(table["tin evaluations"]) == {1}
    assert main(["leaderboard", *args, "--verify"]) == 1


def _chromium() -> str | None:
    return next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


def test_the_page_sorts_in_headless_chromium_without_console_errors(smoke_run, tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium binary (apt-get install -y chromium)")
    assert main(["leaderboard", str(smoke_run), "--out", str(tmp_path / "site")]) == 0
    page = tmp_path / "site" / "smoke-0.1.html"
    text = page.read_text().replace("</script>", "document.querySelector('#board th:nth-child(3)').click();"
                                    "document.querySelector('#board th:nth-child(3)').click();"
                                    "document.title='sorted:'+[...document.querySelectorAll('#board tbody tr')]"
                                    ".map(r=>r.children[2].textContent).join(',');</script>")
    page.write_text(text)
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
                           "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert "<title>sorted:msp,ebo</title>" in done.stdout
    console = [line for line in done.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert not console, console


def test_the_gpu_suite_runs_a_benchmark_and_builds_its_leaderboard(smoke_run, tmp_path):
    """``benchmarks/gpu_suite.py --only benchmark``: at ``--smoke`` sizes the ``smoke`` benchmark for MSP (its attacks
    reused from the module's run), verified, and the page."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import gpu_suite
    finally:
        sys.path.pop(0)
    assert gpu_suite.main(["--smoke", "--only", "benchmark", "--out", str(tmp_path)]) == 0
    info = json.loads((tmp_path / "suite.json").read_text())
    assert info["runs"]["benchmark/smoke_cifar10_resnet20"]["verified"] is True
    assert (tmp_path / "benchmark" / "leaderboard" / "smoke-0.1.html").is_file()


def test_a_config_cannot_claim_a_benchmark_itself(data_root, tmp_path, capsys):
    """``benchmark:`` is set by ``--benchmark`` only: a config naming one is refused, and so is a plan that names
    one without its settings (the Python API)."""
    from advopenood.errors import UsageError
    from advopenood.run.pipeline import run

    config = pack_config(tmp_path, data_root, {"benchmark": "smoke@0.1"})
    assert main(["run", "--config", config, "--out", str(tmp_path / "o")]) == 2
    assert "is set by advopenood run --benchmark" in capsys.readouterr().err
    import yaml

    raw = yaml.safe_load(Path(config).read_text())
    with pytest.raises(UsageError, match="not the benchmark's"):
        run({**raw, "out": str(tmp_path / "o")}, progress=False)
    assert not (tmp_path / "o").exists()
