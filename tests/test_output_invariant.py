"""The output invariant (issue 49, item 1): a run removes or replaces only the files it wrote whose digest still
matches the previous run's manifest; everything else in ``--out`` (files, folders, links, FIFOs, earlier
``.kept-*`` copies) is kept byte-identical, under a new name where it is in the way (never over an existing kept
copy) and named on stderr; a commit that cannot complete is undone and leaves the previous outputs as they were
(one line, exit 3).

The commit is driven directly with small files (the listed cases, then a property test over random folder
states, failures injected into its renames), and twice end to end on the demo.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import shutil
import stat
from pathlib import Path

import pytest

from advopenood import io as aio
from advopenood.errors import StorageError
from advopenood.cli.main import main

ARGS = ["demo", "--limit", "30", "--attack", "fgsm", "--detectors", "msp", "--analysis", "", "--quiet"]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _tree(folder: Path) -> dict[str, tuple]:
    """Every entry below ``folder``, links not followed: ``("file", bytes)``, ``("link", target)``, ``("folder",)``
    or ``("fifo",)``."""
    found: dict[str, tuple] = {}
    for root, dirs, names in os.walk(folder):
        for name in dirs + names:
            path = Path(root) / name
            mode = os.lstat(path).st_mode
            rel = path.relative_to(folder).as_posix()
            if stat.S_ISLNK(mode):
                found[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(mode):
                found[rel] = ("folder",)
            elif stat.S_ISREG(mode):
                found[rel] = ("file", path.read_bytes())
            else:
                found[rel] = ("fifo",)
    return found


def _stage(folder: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return folder


def _previous_run(tmp_path: Path, files: dict[str, bytes]) -> Path:
    """``out`` as a run that wrote ``files`` left it (its manifest lists them)."""
    out = tmp_path / "out"
    aio.commit_output(_stage(tmp_path / "first", files), out)
    return out


def _read_only(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """``folder`` behaves as a read-only mount: every call that adds, removes or renames it or anything below it
    (a hard link out of it included: across mounts) fails with EROFS."""
    folder = Path(os.path.abspath(folder))

    def under(arg: object) -> bool:
        if not isinstance(arg, (str, os.PathLike)) or not os.path.isabs(os.fspath(arg)):
            return False  # a name relative to a dir_fd (shutil.rmtree of a staging folder)
        path = Path(os.path.abspath(os.fspath(arg)))
        return path == folder or folder in path.parents

    for name in ("replace", "rename", "unlink", "remove", "mkdir", "rmdir", "link", "symlink"):
        real = getattr(os, name)

        def fake(*args, _real=real, **kwargs):
            hit = next((a for a in args[:2] if under(a)), None)
            if hit is not None:
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(hit))
            return _real(*args, **kwargs)

        monkeypatch.setattr(os, name, fake)


OUTPUTS = {"asr.csv": b"asr\n", "claims.json": b"{}\n", "leaderboard.csv": b"lb\n", "ood.csv": b"ood\n",
           "paired.csv": b"paired\n", "plots/auroc_heatmap.png": b"png 1", "plots/roc_msp.png": b"png 2",
           "scores/msp.npz": b"npz"}
NEW = {rel: data + b" (new run)" for rel, data in OUTPUTS.items()}


# --- the listed cases of the issue ------------------------------------------------------------------------------


def test_a_read_only_subfolder_stops_the_commit_and_the_previous_outputs_stay(tmp_path, monkeypatch):
    """EROFS on ``plots/``: the commit used to delete asr.csv, claims.json, the leaderboard files, ood.csv and
    paired.csv, then stop; it stops with the folder as it was, in one line."""
    out = _previous_run(tmp_path, OUTPUTS)
    before = _tree(out)
    stage = _stage(tmp_path / "stage", NEW)
    _read_only(monkeypatch, out / "plots")
    with pytest.raises(StorageError) as info:  # exit 3 in the CLI
        aio.commit_output(stage, out)
    monkeypatch.undo()
    message = str(info.value)
    assert "\n" not in message and "the file system is read-only (EROFS)" in message and "undone" in message
    assert _tree(out) == before
    assert not list(tmp_path.glob(".out.*"))  # no folder of moved-away files left either
    aio.commit_output(stage, out)  # writable again: the same files commit
    assert {rel: (out / rel).read_bytes() for rel in NEW} == NEW


def test_an_existing_kept_copy_is_never_replaced(tmp_path):
    """``ood.csv`` edited, and ``ood.csv.kept-<sha8>`` already there with other content (an earlier edit): the
    commit used to rename the edited file over it; both are kept, the new one under a new name."""
    out = _previous_run(tmp_path, OUTPUTS)
    edited = b"ood, with my note\n"
    (out / "ood.csv").write_bytes(edited)
    earlier = out / f"ood.csv.kept-{_sha(edited)[:8]}"
    earlier.write_bytes(b"an earlier edit\n")
    kept: dict[str, str] = {}
    aio.commit_output(_stage(tmp_path / "stage", NEW), out, kept=kept)
    assert earlier.read_bytes() == b"an earlier edit\n"
    assert kept == {"ood.csv": f"ood.csv.kept-{_sha(edited)[:8]}-2"} and (out / kept["ood.csv"]).read_bytes() == edited
    assert (out / "ood.csv").read_bytes() == NEW["ood.csv"]


def test_a_kept_name_that_is_a_folder_is_left_alone(tmp_path):
    """The kept name taken by a folder: an IsADirectoryError traceback after part of the previous outputs were
    removed; now the edited file goes under the next free name and the folder stays."""
    out = _previous_run(tmp_path, OUTPUTS)
    edited = b"edited\n"
    (out / "paired.csv").write_bytes(edited)
    taken = out / f"paired.csv.kept-{_sha(edited)[:8]}"
    taken.mkdir()
    (taken / "mine.txt").write_bytes(b"mine\n")
    kept: dict[str, str] = {}
    aio.commit_output(_stage(tmp_path / "stage", NEW), out, kept=kept)
    assert (taken / "mine.txt").read_bytes() == b"mine\n" and (out / kept["paired.csv"]).read_bytes() == edited
    assert {rel: (out / rel).read_bytes() for rel in NEW} == NEW


def test_a_user_folder_where_the_previous_run_had_a_file(tmp_path):
    """A folder of the user's at ``asr.csv``: a traceback with the other previous files gone. It is a changed
    listed path for the preflight (``--overwrite`` needed), and the commit keeps it whole beside the new file."""
    out = _previous_run(tmp_path, OUTPUTS)
    (out / "asr.csv").unlink()
    (out / "asr.csv").mkdir()
    (out / "asr.csv" / "notes.txt").write_bytes(b"my notes\n")
    assert aio.changed_files(out) == ["asr.csv"]
    kept: dict[str, str] = {}
    aio.commit_output(_stage(tmp_path / "stage", NEW), out, kept=kept)
    assert kept == {"asr.csv": "asr.csv.kept-folder"}
    assert (out / "asr.csv.kept-folder" / "notes.txt").read_bytes() == b"my notes\n"
    assert {rel: (out / rel).read_bytes() for rel in NEW} == NEW


def test_a_user_file_where_the_previous_run_had_a_folder(tmp_path):
    """A file of the user's named ``plots`` where the previous run wrote ``plots/``: a FileExistsError traceback;
    now it is kept beside the new folder."""
    out = _previous_run(tmp_path, OUTPUTS)
    shutil.rmtree(out / "plots")
    (out / "plots").write_bytes(b"my plots list\n")
    kept: dict[str, str] = {}
    aio.commit_output(_stage(tmp_path / "stage", NEW), out, kept=kept)
    assert kept == {"plots": f"plots.kept-{_sha(b'my plots list' + bytes([10]))[:8]}"}
    assert (out / kept["plots"]).read_bytes() == b"my plots list\n"
    assert {rel: (out / rel).read_bytes() for rel in NEW} == NEW


def test_links_and_fifos_in_the_way_are_kept_and_never_followed(tmp_path):
    """A link where a folder goes, a link and a FIFO where files go (they appeared after the preflight, which
    refuses links): each is renamed aside as it is, nothing is written through the link, the FIFO is never
    opened."""
    out = _previous_run(tmp_path, OUTPUTS)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "roc_msp.png").write_bytes(b"precious")
    shutil.rmtree(out / "plots")
    (out / "plots").symlink_to(elsewhere, target_is_directory=True)
    (out / "ood.csv").unlink()
    (out / "ood.csv").symlink_to(elsewhere / "roc_msp.png")
    (out / "asr.csv").unlink()
    os.mkfifo(out / "asr.csv")
    kept: dict[str, str] = {}
    aio.commit_output(_stage(tmp_path / "stage", NEW), out, kept=kept)
    assert kept == {"plots": "plots.kept-link", "ood.csv": "ood.csv.kept-link", "asr.csv": "asr.csv.kept-fifo"}
    assert os.readlink(out / "plots.kept-link") == str(elsewhere)
    assert stat.S_ISFIFO(os.lstat(out / "asr.csv.kept-fifo").st_mode)
    assert _tree(elsewhere) == {"roc_msp.png": ("file", b"precious")}
    assert {rel: (out / rel).read_bytes() for rel in NEW} == NEW


def test_a_commit_whose_undo_fails_says_where_the_previous_files_are(tmp_path, monkeypatch):
    """Defence in depth: when even the undo cannot rename back, the line says so and where the previous run's
    files are; nothing is deleted."""
    out = _previous_run(tmp_path, OUTPUTS)
    stage = _stage(tmp_path / "stage", NEW)
    real, failing = os.replace, []

    def replace(src, dst):
        if failing or Path(dst) == out / "plots" / "auroc_heatmap.png":
            failing.append(dst)
            raise OSError(errno.EIO, os.strerror(errno.EIO), os.fspath(dst))
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(StorageError) as info:
        aio.commit_output(stage, out)
    monkeypatch.undo()
    message = str(info.value)
    assert "\n" not in message and "undoing it failed" in message and "nothing was deleted" in message
    trash = next(tmp_path.glob(".out.replaced-*"))
    assert str(trash) in message
    held = {p.read_bytes() for p in trash.iterdir()} | {v[1] for v in _tree(out).values() if v[0] == "file"}
    assert set(OUTPUTS.values()) <= held  # every previous file is somewhere, byte-identical


# --- the property test ------------------------------------------------------------------------------------------

PARTS = ("a", "b", "c.csv", "plots")
#: the documented kept names of what is not a file: ``<name>.kept-folder``, ``-link``, ``-fifo``
KEPT_TAGS = {stat.S_IFDIR: "folder", stat.S_IFLNK: "link", stat.S_IFIFO: "fifo"}


def _parents(rel: str) -> list[str]:
    parts = rel.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _random_paths(rng: random.Random, n: int) -> list[str]:
    """Up to ``n`` relative file paths, none of them a folder of another."""
    paths: list[str] = []
    for _ in range(n):
        rel = "/".join(rng.choice(PARTS) for _ in range(rng.randint(1, 3)))
        if all(rel != p and not rel.startswith(p + "/") and not p.startswith(rel + "/") for p in paths):
            paths.append(rel)
    return paths


def _is_folder(path: Path) -> bool:
    return stat.S_ISDIR(os.lstat(path).st_mode) if os.path.lexists(path) else False


def _put_foreign(rng: random.Random, path: Path, victim: Path) -> None:
    """Something advopenood did not write at ``path`` (whose folder exists): a file, a folder (empty or with a
    file), a FIFO, or a link (to a file or folder outside, or to nothing)."""
    kind = rng.choice(["file", "file", "folder", "empty", "fifo", "link-file", "link-folder", "dangling"])
    if kind == "file":
        path.write_bytes(rng.randbytes(rng.randint(0, 6)))
    elif kind in ("folder", "empty"):
        path.mkdir()
        if kind == "folder":
            (path / "mine.txt").write_bytes(b"mine " + rng.randbytes(3))
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to({"link-file": victim / "v.txt", "link-folder": victim, "dangling": victim / "none"}[kind])


def _mutate(rng: random.Random, out: Path, previous: list[str], new: list[str], victim: Path) -> None:
    """What a user (or anything) may have done to a previous run's folder since: edit, delete or replace its files,
    put things where the new files and their folders go, leave earlier kept copies (files and folders)."""
    for rel in previous:
        roll, path = rng.random(), out / rel
        if not os.path.lexists(path) or not stat.S_ISREG(os.lstat(path).st_mode):
            continue
        if roll < 0.15:
            path.write_bytes(path.read_bytes() + b" edited")
        elif roll < 0.25:
            path.unlink()
        elif roll < 0.35:
            path.unlink()
            _put_foreign(rng, path, victim)
    targets = set(new) | {p for rel in new for p in _parents(rel)} | set(_random_paths(rng, 3))
    for rel in sorted(targets):
        path = out / rel
        if rng.random() < 0.3 and not os.path.lexists(path) and _is_folder(path.parent):
            _put_foreign(rng, path, victim)
        if rng.random() < 0.3 and os.path.lexists(path) and _is_folder(path.parent):
            mode = os.lstat(path).st_mode
            tag = _sha(path.read_bytes())[:8] if stat.S_ISREG(mode) else KEPT_TAGS[stat.S_IFMT(mode)]
            copy = path.with_name(f"{path.name}.kept-{tag}")
            if not os.path.lexists(copy):
                if rng.random() < 0.5:
                    copy.write_bytes(b"an earlier kept copy")
                else:
                    copy.mkdir()
    if rng.random() < 0.2:  # a user's empty folder somewhere
        rel = rng.choice(PARTS) + ".mine"
        if not os.path.lexists(out / rel):
            (out / rel).mkdir()


def _fail_after(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    """The commit's ``count``-th rename, link or ``mkdir`` fails as on a full disk (once: the undo goes through)."""
    calls = {"n": 0}
    for name in ("replace", "mkdir", "link"):
        real = getattr(os, name)

        def fake(*args, _real=real, _name=name, **kwargs):
            calls["n"] += 1
            if calls["n"] == count:
                where = args[0] if _name == "mkdir" else args[1]
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(where))
            return _real(*args, **kwargs)

        monkeypatch.setattr(os, name, fake)


def _relocated(rel: str, kept: dict[str, str]) -> str:
    homes = [k for k in kept if rel == k or rel.startswith(k + "/")]
    assert len(homes) <= 1, (rel, kept)
    return kept[homes[0]] + rel[len(homes[0]):] if homes else rel


def _check_case(seed: int, root: Path) -> None:
    """One random case under ``root``: a previous run, changes since, a new run's files, a fault or none."""
    rng = random.Random(seed)
    victim = root / "victim"
    victim.mkdir(parents=True)
    (victim / "v.txt").write_bytes(b"outside --out")
    previous = {rel: rng.randbytes(4) for rel in _random_paths(rng, 6)}
    out = root / "out"
    aio.commit_output(_stage(root / "first", previous), out)
    listed = aio.read_manifest(out)
    new = {rel: (previous[rel] if rel in previous and rng.random() < 0.3 else rng.randbytes(5))
           for rel in (_random_paths(rng, 6) if rng.random() < 0.5 else [*previous, *_random_paths(rng, 2)])}
    new = {rel: data for rel, data in new.items()
           if all(not o.startswith(rel + "/") and not rel.startswith(o + "/") for o in new)}
    _mutate(rng, out, list(previous), list(new), victim)
    stage = _stage(root / "stage", new)
    before, outside = _tree(out), _tree(victim)
    ours = {rel for rel in listed if before.get(rel) == ("file", previous[rel])  # what the commit may remove
            and all(before.get(p) == ("folder",) for p in _parents(rel))}
    ours_folders = {p for rel in ours for p in _parents(rel)}
    folders = [rel for rel, entry in before.items() if entry == ("folder",)]
    fault = rng.choice(["none", "read-only", "fail"])
    with pytest.MonkeyPatch.context() as mp:
        if fault == "read-only" and folders:
            _read_only(mp, out / rng.choice(folders))
        elif fault == "fail":
            _fail_after(mp, rng.randint(1, 12))
        kept: dict[str, str] = {}
        try:
            aio.commit_output(stage, out, kept=kept)
            error = None
        except Exception as exc:  # checked below: the folder as it was, and one line
            error = exc
    case = f"case {seed}: previous {sorted(previous)}, new {sorted(new)}, fault {fault}, before {before}"
    assert _tree(victim) == outside, case
    assert not [p for p in root.glob(".out.*")], case  # the previous run's moved-away files: deleted or put back
    if error is not None:
        assert _tree(out) == before, f"{case}: {error!r}"  # all or nothing
        assert isinstance(error, StorageError) and "\n" not in str(error) and "undone" in str(error), case
        return
    after = _tree(out)
    assert aio.read_manifest(out) == {rel: _sha(data) for rel, data in new.items()}, case
    assert all(after[rel] == ("file", data) for rel, data in new.items()), case
    assert all(aside not in before and rel in before and rel not in ours for rel, aside in kept.items()), case
    expected: dict[str, tuple] = {rel: ("file", data) for rel, data in new.items()}
    expected.update({p: ("folder",) for rel in new for p in _parents(rel)})
    for rel, entry in before.items():  # everything that is not the previous run's unchanged output, kept as it was
        if rel == aio.MANIFEST or rel in ours or (rel in ours_folders and entry == ("folder",)):
            continue
        home = _relocated(rel, kept)
        assert after.get(home) == entry, f"{case}: {rel!r} ({entry}) is not at {home!r}: {after.get(home)}"
        expected[home] = entry
    emptied = {_relocated(rel, kept) for rel in ours_folders}  # the previous run's folders may go or stay
    extra = {rel: entry for rel, entry in after.items() if rel not in expected and rel != aio.MANIFEST
             and not (rel in emptied and entry == ("folder",))}
    assert not extra, f"{case}: left over {extra}"


def test_the_output_invariant_holds_over_random_folder_states(tmp_path, monkeypatch):
    """150 random previous folders (files edited, deleted or replaced by folders, FIFOs and links; things where
    the new files and folders go; earlier kept copies, files and folders), each committed over with no fault, a
    read-only subfolder, or a failure at a random step: either every new file is in place and everything that
    was not the previous run's unchanged output is there byte-identical (at its place or under the kept name
    reported), or the folder is exactly as it was."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)  # durability is not what this test checks; keeps it fast
    for seed in range(150):
        _check_case(seed, tmp_path / str(seed))


# --- end to end -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory, session_cache: Path) -> Path:
    """One demo run's folder, copied by each test."""
    out = tmp_path_factory.mktemp("demo") / "out"
    assert main([*ARGS, "--out", str(out)]) == 0
    return out


def test_a_read_only_plots_folder_fails_a_rerun_in_one_line_and_keeps_every_file(tmp_path, monkeypatch, capsys,
                                                                                   demo_run):
    out = tmp_path / "out"
    shutil.copytree(demo_run, out, symlinks=True)
    before = _tree(out)
    _read_only(monkeypatch, out / "plots")
    capsys.readouterr()
    assert main([*ARGS, "--out", str(out)]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "the commit stopped: the file system is read-only (EROFS)" in err and "the previous outputs are as" in err
    monkeypatch.undo()
    assert _tree(out) == before and not aio.staging_dirs(out) and not list(tmp_path.glob(".out.replaced-*"))
    assert main([*ARGS, "--out", str(out)]) == 0


def test_things_in_the_way_of_a_rerun_are_kept_and_named(tmp_path, capsys, demo_run):
    """A folder where asr.csv was, a file named ``plots`` where the plots folder was, an edited ood.csv whose kept
    name an earlier copy holds: refused without --overwrite (asr.csv changed, nothing touched); with it, the run
    goes ahead, keeps each under a new name, names it on stderr, and writes one run's files."""
    out = tmp_path / "out"
    shutil.copytree(demo_run, out, symlinks=True)
    (out / "asr.csv").unlink()
    (out / "asr.csv").mkdir()
    (out / "asr.csv" / "notes.txt").write_bytes(b"mine\n")
    shutil.rmtree(out / "plots")
    (out / "plots").write_bytes(b"my file\n")
    edited = (out / "ood.csv").read_bytes() + b"my note\n"
    (out / "ood.csv").write_bytes(edited)
    earlier = out / f"ood.csv.kept-{_sha(edited)[:8]}"
    earlier.write_bytes(b"an earlier kept copy\n")
    before = _tree(out)
    capsys.readouterr()
    assert main([*ARGS, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'asr.csv', and 1 more changed since the run that wrote it" in err, err
    assert _tree(out) == before
    assert main([*ARGS, "--out", str(out), "--overwrite"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    asides = {"asr.csv": "asr.csv.kept-folder", "plots": f"plots.kept-{_sha(b'my file' + bytes([10]))[:8]}",
              "ood.csv": f"{earlier.name}-2"}
    for rel, aside in asides.items():
        assert f"{rel!r} in {str(out)!r} was not the previous run's" in err and f"kept as {aside!r}" in err, err
    after = _tree(out)
    assert after[earlier.name] == ("file", b"an earlier kept copy\n") and after[asides["ood.csv"]] == ("file", edited)
    assert after["asr.csv.kept-folder/notes.txt"] == ("file", b"mine\n")
    assert after[asides["plots"]] == ("file", b"my file\n") and after["plots"] == ("folder",)
    manifest = json.loads((out / "manifest.json").read_text())["files"]
    assert {rel: _sha(after[rel][1]) for rel in manifest} == manifest and "asr.csv" in manifest
    assert set(after) - {"manifest.json", "plots", "scores"} == \
        set(manifest) | set(asides.values()) | {earlier.name, "asr.csv.kept-folder/notes.txt"}
