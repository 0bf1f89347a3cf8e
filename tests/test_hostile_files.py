"""Files a run reads that it may not have written: no pickle we did not write is unpickled, every ``torch.load`` is
``weights_only``, and a damaged file under ``verify`` is refused in one line (exit 2), never a traceback."""
from __future__ import annotations

import ast
import json
import os
import pickle
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from advopenood.cli.main import main
from advopenood.detection.outputs import FitPass, collect_outputs, merge_fit_passes
from advopenood.detection.scorecache import ScoreCache
from advopenood.errors import UsageError

REPO = Path(__file__).resolve().parents[1]


class _Crafted:
    """A pickle that runs code when loaded: it creates the file ``marker``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def _sources() -> list[Path]:
    return sorted([*(REPO / "advopenood").rglob("*.py"), *(REPO / "plugins").rglob("*.py")])


def _calls(name: str) -> list[tuple[str, ast.Call]]:
    """``(file:line, call)`` of every call to the dotted function ``name`` (e.g. ``torch.load``) in the core and the
    plugins."""
    found = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == name:
                found.append((f"{path.relative_to(REPO)}:{node.lineno}", node))
    return found


def _keyword(call: ast.Call, key: str) -> object:
    return next((ast.literal_eval(k.value) for k in call.keywords if k.arg == key), None)


def test_every_torch_load_is_weights_only():
    calls = _calls("torch.load")
    assert calls, "no torch.load found: the audit looks in the wrong place"
    unsafe = [where for where, call in calls if _keyword(call, "weights_only") is not True]
    assert not unsafe, unsafe


@pytest.mark.parametrize("name", ["pickle.load", "pickle.loads"])
def test_no_pickle_is_loaded_outside_the_checked_reader(name):
    """The only unpickling is eval-ood's :func:`read_pickle`, of pickles it wrote."""
    places = [where for where, _ in _calls(name)]
    assert [where.split(":")[0] for where in places] in ([], ["advopenood/cli/eval_ood.py"]), places


def test_no_npz_is_read_with_pickles():
    assert _calls("np.load") and not [where for where, call in _calls("np.load") if _keyword(call, "allow_pickle")]


def test_setup_requires_a_torch_whose_weights_only_load_is_safe():
    spec = re.search(r'"torch>=([\d.]+)"', (REPO / "setup.py").read_text(encoding="utf-8"))
    assert spec is not None and tuple(int(p) for p in spec.group(1).split(".")) >= (2, 6)


# --- eval-ood's pickles under --root ------------------------------------------------------------------------------


@pytest.mark.parametrize("folder", ["postprocessors", "scores"])
@pytest.mark.parametrize("content", ["crafted", "openood script's", "tampered"])
def test_eval_ood_unpickles_only_what_it_wrote(folder, content, tmp_path, cifar_batch):
    from advopenood.cli.eval_ood import _pickle_files, read_pickle, write_pickle

    trusted, sub = tmp_path / "cache" / "eval-ood-pickles", tmp_path / "root" / "s0"
    path = sub / folder / "msp.pkl"
    path.parent.mkdir(parents=True)
    marker = tmp_path / "code-ran"
    scores = {"id": {"test": (cifar_batch[1].numpy(), cifar_batch[0].mean((1, 2, 3)).numpy(), cifar_batch[1].numpy())}}
    if content == "crafted":
        path.write_bytes(pickle.dumps({"id": _Crafted(marker)}))
    elif content == "openood script's":
        path.write_bytes(pickle.dumps(scores, pickle.HIGHEST_PROTOCOL))
    else:
        write_pickle(scores, path, trusted)
        path.write_bytes(pickle.dumps({"id": _Crafted(marker)}))
    assert _pickle_files([sub], "msp") == [path]
    with pytest.raises(UsageError, match="is a pickle eval-ood did not write") as info:
        read_pickle(path, trusted)
    assert "\n" not in str(info.value) and str(path) in str(info.value)
    assert not marker.exists(), "the pickle was loaded"


def test_eval_ood_reads_back_the_pickles_it_wrote(tmp_path, cifar_batch):
    from advopenood.cli.eval_ood import read_pickle, write_pickle

    trusted, path = tmp_path / "cache" / "eval-ood-pickles", tmp_path / "root" / "s0" / "scores" / "msp.pkl"
    scores = {"id": {"test": (cifar_batch[1].numpy(), cifar_batch[0].mean((1, 2, 3)).numpy())}, "ood": {"near": {}}}
    write_pickle(scores, path, trusted)
    loaded = read_pickle(path, trusted)
    assert loaded.keys() == scores.keys() and loaded["ood"] == {"near": {}}
    assert all(np.array_equal(a, b) for a, b in zip(loaded["id"]["test"], scores["id"]["test"]))


# --- the score cache's rank parts (torchrun) -----------------------------------------------------------------------


def _fit_share(cifar_model, cifar_batch, rank: int | None) -> FitPass:
    """The fit pass over 64 CIFAR-10 images in batches of 16: one rank's of two (batches ``b % 2 == rank``), or all."""
    batches = [(cifar_batch[0][i:i + 16], cifar_batch[1][i:i + 16]) for i in range(0, 64, 16)]
    select = None if rank is None else (lambda b: b % 2 == rank)
    return collect_outputs(cifar_model, batches, torch.device("cpu"), select=select)


def test_rank_parts_merge_to_one_process_pass_without_pickle(tmp_path, cifar_model, cifar_batch):
    """Two ranks' fit-pass shares go through the store as plain data and merge into one process's pass, bit for
    bit; the scores' shares (tensors per batch, and error strings) come back as saved."""
    cache = ScoreCache(tmp_path / "scores")
    for rank in (0, 1):
        cache.save_part("fit" * 20, rank, _fit_share(cifar_model, cifar_batch, rank).state())
    merged = merge_fit_passes([FitPass.from_state(p) for p in cache.load_parts("fit" * 20, 2)])
    whole = _fit_share(cifar_model, cifar_batch, None)
    assert torch.equal(merged.outputs.logits, whole.outputs.logits) and torch.equal(merged.labels, whole.labels)
    assert merged.batches == [0, 1, 2, 3] and merged.sizes == [16, 16, 16, 16]
    conf = torch.softmax(whole.outputs.logits, 1).amax(1)
    share = {"scores": {"id": {"msp": {0: conf[:16].double(), 2: conf[32:48]}}, "fgsm@0.03": {}},
             "errors": {"knn": "fit: ValueError: too few rows"}}
    cache.save_part("scores" * 10, 0, share)
    (back,) = cache.load_parts("scores" * 10, 1)
    assert back["errors"] == share["errors"] and back["scores"]["fgsm@0.03"] == {}
    for b, want in share["scores"]["id"]["msp"].items():
        assert back["scores"]["id"]["msp"][b].dtype == want.dtype and torch.equal(back["scores"]["id"]["msp"][b], want)


def test_a_crafted_rank_part_is_not_unpickled(tmp_path):
    cache, marker = ScoreCache(tmp_path / "scores"), tmp_path / "code-ran"
    cache.save_part("k" * 64, 0, {"scores": {}, "errors": {}})
    (part,) = (tmp_path / "scores" / "_parts").rglob("rank0*")
    part.write_bytes(pickle.dumps(_Crafted(marker)))
    with pytest.raises(pickle.UnpicklingError):
        cache.load_parts("k" * 64, 1)
    assert not marker.exists(), "the part was unpickled"


# --- verify on damaged files -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_run(session_cache, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hostile") / "run"
    assert main(["run", "--config", "demo", "--out", str(out), "--quiet", "--limit", "40", "--attack", "fgsm",
                 "--detectors", "msp,ebo", "--analysis", ""]) == 0
    return out


def _private_copy(run: Path, tmp_path: Path) -> Path:
    """A copy of the run whose ``run.json`` points at a copy of its stored sets (damaging those harms no other test);
    its ``manifest.json`` records the new ``run.json``'s digest (verify checks every file against it)."""
    import hashlib

    target = tmp_path / "run"
    shutil.copytree(run, target)
    info = json.loads((target / "run.json").read_text(encoding="utf-8"))
    for name, entry in info["attacks"].items():
        entry["path"] = str(shutil.copytree(entry["path"], tmp_path / "store" / name))
    (target / "run.json").write_text(json.dumps(info), encoding="utf-8")
    manifest = json.loads((target / "manifest.json").read_text(encoding="utf-8"))
    manifest["files"]["run.json"] = hashlib.sha256((target / "run.json").read_bytes()).hexdigest()
    (target / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return target


def _truncate(path: Path, keep: float) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])
    return path


DAMAGE = {
    "scores npz cut in half": lambda run: _truncate(run / "scores" / "msp.npz", 0.5),
    "scores npz emptied": lambda run: _truncate(run / "scores" / "ebo.npz", 0.0),
    "store shard cut short": lambda run: _truncate(sorted(Path(json.loads((run / "run.json").read_text())["attacks"]
                                                              ["fgsm"]["path"]).glob("shard_*.npz"))[0], 0.9),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_verify_refuses_a_damaged_file_in_one_line(damage, small_run, tmp_path, capsys):
    run = _private_copy(small_run, tmp_path)
    assert main(["verify", str(run)]) == 0
    capsys.readouterr()
    path = DAMAGE[damage](run)
    assert main(["verify", str(run)]) == 2
    # the lines a terminal shows: verify's progress bar redraws one line with carriage returns and clears it
    err = [seg.rsplit("\r", 1)[-1] for seg in capsys.readouterr().err.strip().split("\n")]
    assert len(err) == 1 and err[0].startswith("advopenood: error:"), err
    assert str(path) in err[0] and "truncated or damaged" in err[0], err[0]


def test_a_non_ascii_data_file_is_found_under_the_c_locale(tmp_path, data_root, session_cache):
    """Issue 39, item 12: under ``LC_ALL=C`` without Python's UTF-8 mode the file-system encoding is ASCII, and a
    data file named in the (UTF-8) config as ``données_é.npz`` was reported "not found" although it exists. The
    name stands for its UTF-8 bytes on disk, as it does in every other locale."""
    import os
    import subprocess
    import sys

    from conftest import pack_config

    name = "données_é.npz"
    shutil.copyfile(data_root / "texture_test.npz", os.path.join(os.fsencode(tmp_path), name.encode()))
    cfg = pack_config(tmp_path / "cfg", data_root, {"data.ood.0.path": str(tmp_path / name)})
    out = tmp_path / "out"
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0",
           "ADVOPENOOD_CACHE": str(session_cache)}
    env.pop("PYTHONIOENCODING", None)
    done = subprocess.run([sys.executable, "-m", "advopenood.cli", "run", "--config", cfg, "--out", str(out),
                           "--quiet"], env=env, capture_output=True, timeout=600)
    err = done.stderr.decode("utf-8", "replace")
    assert done.returncode == 0 and "not found" not in err, err[-2000:]
    ood = (out / "ood.csv").read_text()
    assert "texture" in ood and "fgsm" in ood


# --- verify on what a run does not write (issue 49) --------------------------------------------------------------


def _verify(run: Path, capsys) -> tuple[int, list[str], str]:
    """``(exit code, finding lines, stderr)`` of ``advopenood verify RUN``, stopped after 120 s (a FIFO that were
    opened would block it for ever)."""
    import signal

    def stop(*_):
        raise TimeoutError("verify blocked")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(120)
    try:
        code = main(["verify", str(run)])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    captured = capsys.readouterr()
    return code, [x for x in captured.out.splitlines() if "DIFFERENCE: " in x or "FILE: " in x], captured.err


def _config_names(value):
    def edit(text: str) -> str:
        info = json.loads(text)
        info["config"]["evaluators"] = value
        return json.dumps(info)
    return edit


NOT_A_RUNS = {
    "a list": (lambda text: "[]", "holds a list"),
    "null": (lambda text: "null", "holds null"),
    "another tool's object": (lambda text: json.dumps({"tool": "other", "runs": [1, 2]}), "has 'config' null"),
    "a list where a name is expected": (_config_names([["ood"]]), "config.evaluators holding a list"),
    "a mapping where a name is expected": (_config_names([{"ood": 1}]), "config.evaluators holding an object"),
    "an attack set that is no object": (lambda text: json.dumps({**json.loads(text), "attacks": {"fgsm": "x"}}),
                                        "attack set 'fgsm' a string"),
}


@pytest.mark.parametrize("case", list(NOT_A_RUNS))
def test_verify_refuses_a_run_json_no_run_wrote_in_one_line(case, small_run, tmp_path, capsys):
    """Issue 49: run.json a list or null (verify on another tool's folder) ended in a traceback, a list or a mapping
    where a name is expected in an unhashable-type TypeError; each is one line, exit 2."""
    run = _private_copy(small_run, tmp_path)
    edit, said = NOT_A_RUNS[case]
    (run / "run.json").write_text(edit((run / "run.json").read_text()))
    code, _, err = _verify(run, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("advopenood: error:"), err
    assert "run.json" in lines[0] and said in lines[0], lines[0]


def _fifo_for(rel: str):
    def make(run: Path) -> None:
        (run / rel).unlink(missing_ok=True)
        os.mkfifo(run / rel)
    return make


UNEXPECTED = {
    "a FIFO": (_fifo_for("extra.fifo"), "extra.fifo: a FIFO"),
    "a FIFO in place of claims.json": (_fifo_for("claims.json"), "claims.json: a FIFO"),
    "a FIFO in place of ood.csv": (_fifo_for("ood.csv"), "ood.csv: a FIFO"),
    "a symbolic link loop": (lambda run: os.symlink("loop", run / "loop"), "loop: a symbolic link"),
    "a link to a file of the run": (lambda run: os.symlink(run / "asr.csv", run / "mine.csv"),
                                    "mine.csv: a symbolic link"),
    "a link in place of a score file": (lambda run: (shutil.move(run / "scores" / "msp.npz", run.parent / "msp.npz"),
                                                     os.symlink(run.parent / "msp.npz", run / "scores" / "msp.npz")),
                                        "scores/msp.npz: a symbolic link"),
}


@pytest.mark.parametrize("case", list(UNEXPECTED))
def test_an_entry_no_run_writes_is_a_file_finding_never_opened(case, small_run, tmp_path, capsys):
    """Issue 49: an unlisted FIFO or a symlink loop in the folder was no finding. Every entry that is not a regular
    file (a FIFO, a link, a loop) is a FILE line naming what it is, and none is opened: a FIFO where verify reads a
    file does not block it."""
    run = _private_copy(small_run, tmp_path)
    make, said = UNEXPECTED[case]
    make(run)
    code, lines, err = _verify(run, capsys)
    assert code == 1 and "Traceback" not in err, err
    assert any(f"FILE: {said}" in x for x in lines), lines


def test_an_oversized_file_is_a_finding_and_never_read(small_run, tmp_path, capsys):
    """Issue 49: report.html as an 8 GB sparse file was read into memory (MemoryError). Every file's size is checked
    before it is read: one over the bound (here by one byte, sparse) is a FILE line and is not read, nor hashed."""
    from advopenood.evaluation.runfiles import MAX_FILE_BYTES

    run = _private_copy(small_run, tmp_path)
    os.truncate(run / "report.html", MAX_FILE_BYTES + 1)
    code, lines, err = _verify(run, capsys)
    assert code == 1 and "Traceback" not in err, err
    assert lines == [f"advopenood verify: FILE: report.html: {MAX_FILE_BYTES + 1} bytes, over the bound of "
                     f"{MAX_FILE_BYTES} bytes of a file a run writes; not read, so its digest is not checked"], lines
