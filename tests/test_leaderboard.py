"""Standard benchmarks, their entries and the leaderboard (issue 52): what a benchmark fixes and refuses, and, on
copies of the committed ``smoke`` runs in ``benchmarks/leaderboard/runs/`` (16 + 16 images of the pack, both
ResNet-20s x 5 detectors), that they are the current benchmark's runs, the entries they hold, the page and its
exports (the committed page's cells), ``--verify`` on untouched and edited entries, the best known and
``unreliable``, and every kind of bad entry costing only its own line. The browser test opens the page in headless
Chromium (skipped where none is installed). No test runs a benchmark: ``advopenood run --benchmark smoke --detectors
msp`` alone takes 28 s of CPU (100 s on the loaded 2-core machine); its refusals are tested, as they come before any
work."""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from conftest import edited_copy, pack_config

from advopenood.cli.main import main
from advopenood.config.benchmarks import FIXED_KEYS, apply_benchmark, benchmark, benchmarks
from advopenood.io import read_manifest
from advopenood.run.entries import manifest_digest


REPO = Path(__file__).resolve().parents[1]
#: the committed runs of the smoke benchmark (never edited here: every test works on copies)
RUNS = REPO / "benchmarks" / "leaderboard" / "runs"
STANDARD, AT = RUNS / "smoke_cifar10_resnet20", RUNS / "smoke_cifar10_resnet20_at"
DETECTORS = ["ebo", "gen", "knn", "mds", "msp"]
_VERIFIED: dict[str, tuple[Path, Any]] = {}


@pytest.fixture(autouse=True)
def verify_each_content_once(monkeypatch):
    """``advopenood verify`` of a run folder is a function of its files' bytes: a folder whose every file (path and
    bytes) equals one verified before gets that verdict again when it was clean (or is the same folder); every other
    folder, an edited one included, is verified for real."""
    from advopenood.evaluation import verify

    real = verify.verify_run

    def once(path):
        folder = Path(path)
        key = hashlib.sha256(b"".join(str(p.relative_to(folder)).encode() + b"\0" + p.read_bytes()
                                      for p in sorted(folder.rglob("*")) if p.is_file())).hexdigest()
        seen = _VERIFIED.get(key)
        if seen is not None and (seen[0] == folder.resolve() or not (seen[1].differences or seen[1].files)):
            return seen[1]
        found = real(path)
        _VERIFIED[key] = (folder.resolve(), found)
        return found

    monkeypatch.setattr(verify, "verify_run", once)


def _copy(run: Path, tmp_path: Path, name: str) -> Path:
    copy = tmp_path / name
    shutil.copytree(run, copy)
    return copy


def _edit(path: Path, change) -> None:
    entry = json.loads(path.read_text())
    change(entry)
    path.write_text(json.dumps(entry))


def _claim_more(entry: dict) -> None:
    """The msp entry claims more than its run found: 60.0 [50.0, 70.0] on tin."""
    entry["robust"]["tin"].update(robust_auroc=60.0, robust_auroc_lo=50.0, robust_auroc_hi=70.0)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The page built from a copy of the committed run of the adversarially trained ResNet-20 (the cheaper of the
    two to verify)."""
    folder = tmp_path_factory.mktemp("site")
    assert main(["leaderboard", str(_copy(AT, folder, AT.name)), "--out", str(folder / "site")]) == 0
    return folder / "site"


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


@pytest.mark.parametrize("run", [STANDARD, AT], ids=["standard", "at"])
def test_the_committed_runs_are_the_current_benchmarks(run):
    """Each committed run is of ``configs/benchmarks/smoke.yaml`` as it resolves now (name, version, evaluation,
    image digests, everything the benchmark fixes in the run's config) and holds the files its manifest lists: a
    change of the benchmark without a new version, or an edit of a committed run, fails here."""
    bench = benchmark("smoke")
    config = json.loads((run / "run.json").read_text())["config"]
    fixed, _ = apply_benchmark({}, bench)
    assert config["benchmark"] == bench.key and {k: config[k] for k in FIXED_KEYS} == {k: fixed[k] for k in FIXED_KEYS}
    assert {k: config["data"][k] for k in ("dataset", "fit_limit", "ood_limit")} == \
        {k: fixed["data"][k] for k in ("dataset", "fit_limit", "ood_limit")}
    assert [(s["name"], s["path"], s["group"]) for s in config["data"]["ood"]] == \
        [(s["name"], s["path"], s["group"]) for s in fixed["data"]["ood"]]
    listed = read_manifest(run)
    assert {rel: hashlib.sha256((run / rel).read_bytes()).hexdigest() for rel in listed} == listed
    assert sorted(p.stem for p in (run / "entries").glob("*.json")) == DETECTORS
    for path in (run / "entries").glob("*.json"):
        entry = json.loads(path.read_text())
        assert entry["benchmark"] == {"name": "smoke", "version": bench.version, "evaluation": bench.evaluation.version,
                                      "eps": bench.threat.eps}
        assert entry["images"] == {s.name: s.image_digest for s in bench.sets}
        assert entry["run"] == {"folder": run.name, "manifest_digest": manifest_digest(listed)}


def test_entries_hold_the_runs_numbers():
    entry = json.loads((AT / "entries" / "msp.json").read_text())
    robust = pd.read_csv(AT / "robust_auroc.csv")
    row = robust[(robust.detector == "msp") & (robust.method == "ensemble")].iloc[0]
    assert entry["robust"]["tin"]["robust_auroc"] == pytest.approx(row.robust_auroc)
    assert entry["robust"]["tin"]["n_id"] == 16 and entry["model"]["checkpoint_sha256"]
    assert [s["attack"] for s in entry["curve"]][0] == "none" and entry["curve"][-1]["attack"] == "square"


def test_the_page_and_its_exports_hold_the_committed_pages_cells(site):
    page = (site / "smoke-0.1.html").read_text()
    assert "<script>" in page and "http" not in page.split("<body>")[1]  # self-contained: no CDN
    table = pd.read_csv(site / "smoke-0.1.csv", dtype=str)
    assert sorted(table.detector) == DETECTORS and "tin robust AUROC" in table
    assert (site / "smoke-0.1.md").is_file() and "\\begin" in (site / "smoke-0.1.tex").read_text()
    committed = pd.read_csv(REPO / "docs" / "leaderboard" / "smoke-0.1.csv", dtype=str)  # both models: other ranks
    committed = committed[committed.run == AT.name].reset_index(drop=True)
    pd.testing.assert_frame_equal(table.drop(columns="tin rank"), committed.drop(columns="tin rank"))


def test_a_rank_is_a_range_by_the_holm_paired_rule_or_none_below_min_conclusive(site):
    """The page's rank is the range of places the paired Holm tests allow (``rank_ranges``: a clearly best row
    ``1``, two not shown apart ``2-3``, a clearly worst ``4``), never a tie with a group's leader; on the committed
    smoke run (16 + 16 images, below min_conclusive) no rank is stated, in the page and each export alike."""
    from advopenood.evaluation.metrics import auroc
    from advopenood.run.leaderboard import rank_label, rank_ranges

    rng = np.random.default_rng(0)
    conf_id, conf_ood = rng.normal(1, 1, 150), rng.normal(0, 1, 150)
    arrays = [(conf_id, conf_ood - 1.5), (conf_id, conf_ood + 0.01 * rng.normal(size=150)),
              (conf_id, conf_ood + 0.02 * rng.normal(size=150)), (conf_id, conf_ood + 0.8)]
    values = [100 * auroc(*a) for a in arrays]
    assert [rank_label(*r) for r in rank_ranges(values, arrays, 0, "leaderboard|tin", 500)] == ["1", "2-3", "2-3", "4"]
    with pytest.raises(ValueError):  # rows that do not hold the same images are not compared
        rank_ranges(values[:2], [arrays[0], (conf_id[:100], conf_ood)], 0, "leaderboard|tin", 100)
    table = pd.read_csv(site / "smoke-0.1.csv", dtype=str)
    assert set(table["tin rank"]) == {"no rank (16 + 16 images)"}
    for export in ("smoke-0.1.md", "smoke-0.1.html"):
        assert (site / export).read_text().count("no rank (16 + 16 images)") == len(table)
    assert "tin rank no rank (16 + 16 images)" in (site / "smoke-0.1.tex").read_text()  # one value: in the caption


def test_verify_passes_untouched_entries_and_names_an_edited_cell(tmp_path, capsys):
    untouched = _copy(AT, tmp_path, "untouched")
    assert main(["leaderboard", str(untouched), "--verify"]) == 0
    copy = _copy(AT, tmp_path, "edited")
    _edit(copy / "entries" / "msp.json", _claim_more)
    assert main(["leaderboard", str(copy), "--verify"]) == 1
    out = capsys.readouterr().out
    assert "robust.tin.robust_auroc: entry 60.0" in out and "msp" in out and "ebo @" not in out


def test_a_lower_external_evaluation_makes_the_entry_unreliable(tmp_path):
    own = _copy(AT, tmp_path, "own")  # the entry claims more than the external run of the same cell found
    _edit(own / "entries" / "msp.json", _claim_more)
    external = _copy(AT, tmp_path, "external")
    assert main(["leaderboard", str(own / "entries" / "msp.json"), str(external / "entries" / "msp.json"),
                 "--out", str(tmp_path / "site")]) == 0
    row = pd.read_csv(tmp_path / "site" / "smoke-0.1.csv", dtype=str, keep_default_na=False).iloc[0]
    assert row["tin robust AUROC"].startswith("60.0") and row["tin evaluations"] == "2"
    assert float(row["tin best known"]) < 50 and "unreliable" in row["flags"]


def test_bad_entries_cost_one_line_each_and_keep_the_others(tmp_path, capsys):
    run = _copy(AT, tmp_path, "run0")
    lone = tmp_path / "lone.json"  # an entry without its run folder
    shutil.copy(run / "entries" / "ebo.json", lone)
    other = _copy(AT, tmp_path, "other")
    _edit(other / "entries" / "msp.json", lambda e: e["benchmark"].update(version="9.9"))
    clash = _copy(AT, tmp_path, "clash")
    _edit(clash / "entries" / "ebo.json", lambda e: e["images"].update(tin="0" * 64))
    edited = edited_copy(AT, tmp_path, "robust_auroc.csv", "robust_auroc", delta=5.0)  # fails verify
    args = [str(run / "entries" / "msp.json"), str(lone), str(other / "entries" / "msp.json"),
            str(run / "entries" / "ebo.json"), str(clash / "entries" / "ebo.json"),
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


def test_the_page_sorts_in_headless_chromium_without_console_errors(site, tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium binary (apt-get install -y chromium)")
    page = tmp_path / "smoke-0.1.html"
    text = (site / page.name).read_text().replace(
        "</script>", "document.querySelector('#board th:nth-child(3)').click();"
        "document.querySelector('#board th:nth-child(3)').click();"
        "document.title='sorted:'+[...document.querySelectorAll('#board tbody tr')]"
        ".map(r=>r.children[2].textContent).join(',');</script>")
    page.write_text(text)
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
                           "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert f"<title>sorted:{','.join(reversed(DETECTORS))}</title>" in done.stdout
    console = [line for line in done.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert not console, console


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
