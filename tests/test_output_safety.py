"""The output folder is the only place a run writes or deletes (issue 30, items 11 and 12).

A crafted ``manifest.json`` must never make a run delete a file outside ``--out`` or through a symbolic link; a
manifest we did not write is refused before any work; two runs on one ``--out`` never share a staging folder, and
the second is refused in one line while the first holds the folder.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from advopenood import errors as aio_errors
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
    _manifest(out, {aio.MANIFEST_MARK: 1, "files": {"old.csv": _sha(b"old\n"), "link/x.csv": _sha(b"keep\n")}})
    (out / "old.csv").write_text("old\n")
    (out / "link").symlink_to(elsewhere, target_is_directory=True)
    assert aio.commit_output(stage, out) == ["new.csv"]
    assert not (out / "old.csv").exists() and (elsewhere / "x.csv").read_text() == "keep\n"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest == {aio.MANIFEST_MARK: 1, "files": {"new.csv": manifest["files"]["new.csv"]}}


def test_commit_never_writes_through_a_link(tmp_path):
    """A link where the new files' folder goes (one that appeared after the preflight, which refuses links) is
    renamed aside as it is (issue 49, item 1: kept, never followed), and a real folder takes its place."""
    out, stage, elsewhere = tmp_path / "out", tmp_path / "stage", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (stage / "plots").mkdir(parents=True)
    (stage / "plots" / "a.png").write_bytes(b"png")
    out.mkdir()
    (out / "plots").symlink_to(elsewhere, target_is_directory=True)
    kept: dict[str, str] = {}
    assert aio.commit_output(stage, out, kept=kept) == ["plots/a.png"]
    assert not list(elsewhere.iterdir()) and kept == {"plots": "plots.kept-link"}
    assert os.readlink(out / "plots.kept-link") == str(elsewhere) and (out / "plots" / "a.png").read_bytes() == b"png"


@pytest.mark.parametrize("rel, ok", [("a.csv", True), ("plots/a.png", True), ("scores/msp.npz", True),
                                     ("", False), ("/etc/passwd", False), ("../a", False), ("a/../../b", False),
                                     ("a//b", False), ("./a", False), ("C:/a", False), ("a\\b", False),
                                     ("a\0b", False), (3, False)])
def test_safe_relpath(rel, ok):
    assert aio.safe_relpath(rel) is ok


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("flags", [[], ["--overwrite"]])
def test_an_unmarked_manifest_deletes_nothing_and_is_refused_in_one_line(tmp_path, capsys, flags, session_cache):
    """Issue 39, item 1: the old unmarked shape ``{"files": {...}}`` is anyone's to write; even with the right
    digests, the files it lists are not deleted, with or without --overwrite."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "ood.csv").write_text("someone's table\n")
    (out / "notes.md").write_text("someone's notes\n")
    _manifest(out, {"files": {"ood.csv": _sha(b"someone's table\n"), "notes.md": _sha(b"someone's notes\n")}})
    before = _snapshot(out)
    assert main([*ARGS, "--out", str(out), *flags]) == 2
    err = capsys.readouterr().err
    assert "not written by advopenood (no 'advopenood_manifest' mark" in err and len(err.strip().splitlines()) == 1
    assert _snapshot(out) == before and not aio.staging_dirs(out)


def test_a_file_changed_since_its_run_is_refused_without_overwrite_and_kept_with_it(tmp_path, capsys, session_cache):
    """A marked manifest whose ``ood.csv`` was edited since: refused (exit 2, naming the file, nothing touched);
    with --overwrite the run goes ahead and keeps the edited file beside the new one."""
    out = tmp_path / "out"
    assert main([*ARGS, "--out", str(out)]) == 0
    edited = (out / "ood.csv").read_bytes() + b"my note\n"
    (out / "ood.csv").write_bytes(edited)
    before = _snapshot(out)
    capsys.readouterr()
    assert main([*ARGS, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "'ood.csv' changed since the run that wrote it" in err and "--overwrite" in err
    assert len(err.strip().splitlines()) == 1 and _snapshot(out) == before
    assert main([*ARGS, "--out", str(out), "--overwrite"]) == 0
    kept = out / f"ood.csv.kept-{_sha(edited)[:8]}"
    assert kept.read_bytes() == edited and "kept as 'ood.csv.kept-" in capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())["files"]
    assert manifest["ood.csv"] == _sha((out / "ood.csv").read_bytes()) and kept.name not in manifest


def test_commit_never_deletes_a_listed_file_whose_digest_differs(tmp_path):
    """The commit itself (defence in depth, e.g. a file edited while the run ran): a listed file with another
    SHA-256 than the manifest's is neither deleted nor replaced; a file at a new file's path is kept aside."""
    out, stage = tmp_path / "out", tmp_path / "stage"
    stage.mkdir()
    (stage / "ood.csv").write_text("new\n")
    _manifest(out, {aio.MANIFEST_MARK: 1, "files": {"old.csv": _sha(b"old\n"), "ood.csv": _sha(b"ours\n"),
                                                    "sub/gone.csv": _sha(b"gone\n")}})
    (out / "old.csv").write_text("old, edited\n")
    (out / "ood.csv").write_text("ours, edited\n")
    (out / "sub").mkdir()
    (out / "sub" / "gone.csv").write_text("gone\n")
    stale = out / ".manifest.json.abcd1234.tmp"  # what a commit killed mid-write left; we hold the lock
    stale.write_text("{")
    kept: dict[str, str] = {}
    assert aio.commit_output(stage, out, kept=kept) == ["ood.csv"]
    aside = f"ood.csv.kept-{_sha(b'ours, edited' + bytes([10]))[:8]}"
    assert kept == {"ood.csv": aside} and (out / aside).read_text() == "ours, edited\n"
    assert (out / "old.csv").read_text() == "old, edited\n" and (out / "ood.csv").read_text() == "new\n"
    assert not (out / "sub").exists() and not stale.exists()  # unchanged: deleted, with the folder it leaves empty
    assert aio.read_manifest(out) == {"ood.csv": _sha(b"new\n")}


def test_a_full_disk_at_the_commit_leaves_the_previous_files(tmp_path, monkeypatch):
    """The manifest, the commit's one write, is written before anything is removed: ENOSPC there touches nothing."""
    out, stage = tmp_path / "out", tmp_path / "stage"
    stage.mkdir()
    (stage / "ood.csv").write_text("new\n")
    _manifest(out, {aio.MANIFEST_MARK: 1, "files": {"ood.csv": _sha(b"old\n")}})
    (out / "ood.csv").write_text("old\n")
    before = _snapshot(out)

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(aio.os, "fsync", full)
    with pytest.raises(aio.CommitError) as info:
        aio.commit_output(stage, out)
    assert info.value.__cause__.errno == errno.ENOSPC and info.value.__cause__.filename == str(out / "manifest.json")
    assert f"the disk is full (ENOSPC) at {str(out / 'manifest.json')!r}" in str(info.value)
    assert _snapshot(out) == before and (stage / "ood.csv").is_file()


@pytest.mark.parametrize("code, advice", [(errno.ENOSPC, "free space"), (errno.EROFS, "make the folder writable"),
                                         (errno.EXDEV, "keep the output folder on one file system")])
def test_a_stopped_commit_advises_for_its_cause(tmp_path, monkeypatch, code, advice):
    """The one line's advice fits the error (the round-5 tour: a read-only mount inside --out was told to free
    space): full disk, read-only folder, a rename across file systems."""
    out, stage = tmp_path / "out", tmp_path / "stage"
    stage.mkdir()
    (stage / "ood.csv").write_text("new\n")

    def fail(fd: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(aio.os, "fsync", fail)
    with pytest.raises(aio.CommitError) as info:
        aio.commit_output(stage, out)
    text = str(info.value)
    assert f"; {advice}" in text and text.count("free space") == (advice == "free space")


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
    assert {rel: aio.sha256_file(out / rel) for rel in manifest} == manifest  # one run's files, each as it wrote it
    assert not aio.staging_dirs(out)


def test_a_process_stages_beside_the_output_folder_where_staging_dirs_finds_it(tmp_path):
    """A process stages in ``.<out>.partial-<pid>-<random>`` beside ``out``, which :func:`staging_dirs` lists
    (``advopenood.io.staging_dir``, one folder for a run, was removed in 0.3.0: tests/test_release.py)."""
    out = tmp_path / "out"
    stage = aio.begin_output(out)
    assert stage.parent == tmp_path and stage.name.startswith(".out.partial-") and aio.staging_dirs(out) == [stage]


def _write_fails(monkeypatch, code: int, hit) -> list[Path]:
    """Make every atomic write whose path ``hit`` accepts fail in its ``write`` with OSError ``code`` (as a full,
    read-only or over-quota file system does: no file name); the paths it failed on."""
    real, failed = aio.atomic_write, []

    def atomic_write(path, writer):
        if not hit(Path(path)):
            return real(path, writer)
        failed.append(Path(path))

        def broken(f):
            raise OSError(code, os.strerror(code))

        return real(path, broken)

    monkeypatch.setattr(aio, "atomic_write", atomic_write)
    return failed


@pytest.fixture(scope="module")
def previous_run(tmp_path_factory, data_root) -> tuple[Path, Path]:
    """A folder with the tiny pack config (under ``cfg/``), its run's outputs (``out/``) and cache (``cache/``), and
    the config's path inside it: the run that the full-file-system tests re-run, made once; each test re-runs on a
    copy of its own."""
    from conftest import pack_config

    folder = tmp_path_factory.mktemp("previous")
    cfg = pack_config(folder / "cfg", data_root)
    assert main(["run", "--config", cfg, "--out", str(folder / "out"), "--cache-dir", str(folder / "cache"),
                 "--quiet"]) == 0
    return folder, Path(cfg).relative_to(folder)


@pytest.mark.parametrize("code, where, hit", [
    (errno.ENOSPC, "output", lambda p: p.name == "ood.csv"),  # was "evaluator:ood failed", and the run committed
    (errno.EDQUOT, "store", lambda p: p.name.startswith("shard_")),  # was "attack:fgsm failed"
    (errno.EROFS, "cache", lambda p: p.suffix == ".npy" and "scores" in p.parts),  # was a traceback
])
def test_a_full_file_system_fails_the_run_and_keeps_the_previous_outputs(previous_run, tmp_path, monkeypatch, capsys,
                                                                         code, where, hit):
    """Issue 39, item 2: an OSError of a full, read-only or over-quota file system in a re-run is the run's
    failure, not a plugin's: exit 3, one line saying what and where, nothing committed, the previous run's files
    byte-identical; the next run goes ahead."""
    import shutil

    folder, config = previous_run
    shutil.copytree(folder, tmp_path, dirs_exist_ok=True)
    out, cfg = tmp_path / "out", str(tmp_path / config)
    base = ["run", "--config", cfg, "--out", str(out), "--quiet"]
    before = _snapshot(out)
    capsys.readouterr()
    failed = _write_fails(monkeypatch, code, hit)
    again = [*base, "--cache-dir", str(tmp_path / ("cache" if where == "output" else "fresh-cache"))]
    code_seen = main(again)
    err = capsys.readouterr().err.strip()
    assert _snapshot(out) == before and not aio.staging_dirs(out)
    assert code_seen == 3 and failed and len(err.splitlines()) == 1, err
    assert f"{aio_errors.STORAGE_ERRNOS[code]} ({errno.errorcode[code]}) writing {str(failed[0])!r}" in err
    assert "committed nothing" in err and "failed" not in err
    assert not list(failed[0].parent.glob(f".{failed[0].name}.*.tmp"))  # no temporary file left either
    monkeypatch.undo()
    assert main(again) == 0


def test_a_dangling_symlink_as_out_is_refused_before_any_work(tmp_path, capsys, session_cache):
    """Issue 39, item 8: a link to nothing used to pass the preflight and lose every output at the final write."""
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "nowhere")
    assert main([*ARGS, "--out", str(link)]) == 2
    err = capsys.readouterr().err
    assert "is a symbolic link to" in err and "which does not exist" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "nowhere").exists() and link.is_symlink() and sorted(os.listdir(tmp_path)) == ["out"]


def test_out_through_a_symlink_writes_the_folder_and_shares_its_lock(tmp_path, capsys, session_cache):
    """A link to a folder is followed: the run writes into the folder (staging beside it) and takes the folder's
    own lock, so a run through the link and a run through the folder's name never go ahead together (issue 39,
    item 8: both went ahead)."""
    real, link = tmp_path / "real" / "out", tmp_path / "alias"
    real.mkdir(parents=True)
    link.symlink_to(real, target_is_directory=True)
    with aio.OutputLock(real):
        assert main([*ARGS, "--out", str(link)]) == 2
        err = capsys.readouterr().err
        assert f"{str(real)!r} is in use by another advopenood run" in err and len(err.strip().splitlines()) == 1
        assert not list(real.iterdir()) and not aio.staging_dirs(real) and not aio.staging_dirs(link)
        with pytest.raises(aio.OutputError, match="in use"):  # a link to the folder above: one lock too
            (tmp_path / "up").symlink_to(real.parent, target_is_directory=True)
            aio.OutputLock(tmp_path / "up" / "out").__enter__()
    assert main([*ARGS, "--out", str(link)]) == 0
    assert (real / "ood.csv").is_file() and link.is_symlink() and "ood.csv" in aio.read_manifest(real)
    assert not aio.staging_dirs(real) and not list(tmp_path.glob(".*")) and not list(real.parent.glob(".*"))


def test_a_full_disk_outside_a_run_is_one_line_not_a_traceback(tmp_path, monkeypatch, capsys):
    """eval-ood writes outside the run pipeline (its pickles, OpenOOD's outputs): a full disk there was a
    traceback; it is the command's failure in one line that names the file, exit 3, as for a run."""
    import advopenood.cli.eval_ood as bridge

    target = tmp_path / "scores" / "msp.pkl"

    def full_disk(argv):
        raise OSError(errno.ENOSPC, "No space left on device", str(target))

    monkeypatch.setattr(bridge, "eval_ood_main", full_disk)
    assert main(["eval-ood", "--root", str(tmp_path)]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the disk is full (ENOSPC)" in err[0] and str(target) in err[0], err
    assert "eval-ood stopped" in err[0] and "Traceback" not in err[0]
