"""The output folder is the only place a run writes or deletes (issue 30, items 11 and 12).

A crafted ``manifest.json`` must never make a run delete a file outside ``--out`` or through a symbolic link; a
manifest we did not write is refused before any work; two runs on one ``--out`` never share a staging folder, and
the second is refused in one line while the first holds the folder.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from advopenood import io as aio
from advopenood.cli.main import main

DIGEST = "0" * 64
ARGS = ["demo", "--limit", "30", "--attack", "fgsm", "--detectors", "msp", "--analysis", "", "--quiet"]


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_text("not advopenood's\n")
    return path


def _manifest(out: Path, doc: object) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").write_text(json.dumps(doc) if not isinstance(doc, str) else doc)


@pytest.mark.parametrize("listed", ["../victim.txt", "ABSOLUTE", "./../victim.txt", "sub/../../victim.txt",
                                    "..\\victim.txt"])
def test_a_manifest_listing_a_path_outside_out_is_refused_and_deletes_nothing(tmp_path, victim, capsys, listed,
                                                                               session_cache):
    out = tmp_path / "out"
    rel = str(victim) if listed == "ABSOLUTE" else listed
    _manifest(out, {aio.MANIFEST_MARK: 1, "files": {rel: DIGEST}})
    assert main([*ARGS, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "not a plain relative path" in err and len(err.strip().splitlines()) == 1
    assert victim.read_text() == "not advopenood's\n"


@pytest.mark.parametrize("doc, reason", [
    ({"name": "someone else's manifest", "files": ["a"]}, "not written by advopenood"),
    ("{not json", "not readable JSON"),
    ([1, 2], "not written by advopenood"),
    ({aio.MANIFEST_MARK: 1, "files": {"a.csv": 3}}, "malformed"),
])
def test_a_foreign_or_malformed_manifest_is_refused_before_any_work(tmp_path, capsys, doc, reason, session_cache):
    out = tmp_path / "out"
    _manifest(out, doc)
    before = (out / "manifest.json").read_bytes()
    assert main([*ARGS, "--out", str(out), "--overwrite"]) == 2
    assert reason in capsys.readouterr().err
    assert (out / "manifest.json").read_bytes() == before  # not overwritten
    assert not aio.staging_dirs(out)


def test_a_symlink_inside_out_is_refused_and_its_target_kept(tmp_path, capsys, session_cache):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "auroc_heatmap.png").write_bytes(b"precious")
    _manifest(out, {aio.MANIFEST_MARK: 1, "files": {"plots/auroc_heatmap.png": DIGEST}})
    (out / "plots").symlink_to(elsewhere, target_is_directory=True)
    assert main([*ARGS, "--out", str(out)]) == 2
    assert "symbolic link 'plots'" in capsys.readouterr().err
    assert (elsewhere / "auroc_heatmap.png").read_bytes() == b"precious"


def test_commit_never_deletes_through_a_link_or_outside_out(tmp_path, victim):
    """The commit itself (after the preflight) deletes only regular files reached without a link."""
    out, stage, elsewhere = tmp_path / "out", tmp_path / "stage", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "x.csv").write_text("keep\n")
    stage.mkdir()
    (stage / "new.csv").write_text("a\n")
    _manifest(out, {aio.MANIFEST_MARK: 1, "files": {"old.csv": DIGEST, "link/x.csv": DIGEST}})
    (out / "old.csv").write_text("old\n")
    (out / "link").symlink_to(elsewhere, target_is_directory=True)
    assert aio.commit_output(stage, out) == ["new.csv"]
    assert not (out / "old.csv").exists() and (elsewhere / "x.csv").read_text() == "keep\n"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest == {aio.MANIFEST_MARK: 1, "files": {"new.csv": manifest["files"]["new.csv"]}}


def test_commit_refuses_to_write_through_a_link(tmp_path):
    out, stage, elsewhere = tmp_path / "out", tmp_path / "stage", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (stage / "plots").mkdir(parents=True)
    (stage / "plots" / "a.png").write_bytes(b"png")
    out.mkdir()
    (out / "plots").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(aio.OutputError, match="through a symbolic link"):
        aio.commit_output(stage, out)
    assert not list(elsewhere.iterdir())


@pytest.mark.parametrize("rel, ok", [("a.csv", True), ("plots/a.png", True), ("scores/msp.npz", True),
                                     ("", False), ("/etc/passwd", False), ("../a", False), ("a/../../b", False),
                                     ("a//b", False), ("./a", False), ("C:/a", False), ("a\\b", False),
                                     ("a\0b", False), (3, False)])
def test_safe_relpath(rel, ok):
    assert aio.safe_relpath(rel) is ok


def test_a_legacy_manifest_of_the_previous_version_is_still_ours(tmp_path):
    out = tmp_path / "out"
    _manifest(out, {"files": {"asr.csv": DIGEST}})
    assert aio.read_manifest(out) == {"asr.csv": DIGEST}


def test_a_second_run_on_a_locked_out_is_refused_in_one_line(tmp_path, capsys, session_cache):
    out = tmp_path / "out"
    with aio.OutputLock(out):
        assert main([*ARGS, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"in use by another advopenood run (pid {os.getpid()})" in err and len(err.strip().splitlines()) == 1
        assert not out.exists() and not aio.staging_dirs(out)
    assert main([*ARGS, "--out", str(out)]) == 0  # released: the next run goes ahead
    assert (out / "asr.csv").is_file() and not (tmp_path / ".out.lock").exists()


def test_a_dead_holder_releases_the_lock(tmp_path):
    out = tmp_path / "out"
    code = (f"from advopenood import io; import os, time; l = io.OutputLock({str(out)!r}).__enter__(); "
            "print('locked', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(aio.OutputError, match=f"pid {proc.pid}"):
            aio.OutputLock(out).__enter__()
    finally:
        proc.kill()
        proc.wait()
    with aio.OutputLock(out) as lock:
        assert lock.fd is not None


def test_each_process_stages_in_its_own_folder(tmp_path):
    out = tmp_path / "out"
    code = f"from advopenood import io; print(io.begin_output({str(out)!r}))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    first = Path(done.stdout.strip())
    second = aio.begin_output(out)
    assert first != second and f"-{os.getpid()}-" in second.name and second.parent == tmp_path
    assert not first.exists()  # begin_output (run under the lock) removes what an interrupted run left


def test_two_runs_at_once_on_one_out_lose_nothing(tmp_path, session_cache):
    """Two real processes on one --out: one writes every output, the other is refused (exit 2) or runs after it;
    never a run that says it wrote and left no asr.csv."""
    out = tmp_path / "out"
    env = {**os.environ, "ADVOPENOOD_CACHE": str(session_cache)}
    cmd = [sys.executable, "-m", "advopenood.cli", *ARGS, "--out", str(out)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)]
    time.sleep(0.5)
    procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    results = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    codes = sorted(rc for rc, _ in results)
    assert codes in ([0, 0], [0, 2]), results
    for rc, err in results:
        if rc == 2:
            assert "in use by another advopenood run" in err and "Traceback" not in err
    manifest = json.loads((out / "manifest.json").read_text())["files"]
    assert "asr.csv" in manifest and "ood.csv" in manifest
    assert all((out / rel).is_file() for rel in manifest)
    assert not aio.staging_dirs(out)


def test_the_old_staging_dir_still_imports_with_a_deprecation_warning(tmp_path):
    """``advopenood.io.staging_dir`` (public at the last landed version) keeps working, with a warning."""
    out = tmp_path / "out"
    with pytest.warns(DeprecationWarning, match="staging_dirs"):
        legacy = aio.staging_dir(out)
    assert legacy == tmp_path / ".out.partial"
    stage = aio.begin_output(out)
    assert stage.name.startswith(legacy.name) and aio.staging_dirs(out) == [stage]
