"""Run-scoped outputs: a run owns its output folder, and its report shows only its own files."""
from __future__ import annotations

import json
import re
from pathlib import Path

from advopenood import io as aio
from advopenood.cli.main import main


def _files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def test_second_run_into_one_folder_leaves_only_its_own_files(tmp_path, session_cache):
    out = tmp_path / "out"
    base = ["demo", "--limit", "60", "--attack", "fgsm", "--detectors", "msp,mds", "--out", str(out), "--quiet"]
    assert main([*base, "--analysis", "gradcam"]) == 0
    first = _files(out)
    assert "gradcam.csv" in first and any(f.startswith("plots/gradcam") for f in first)
    stale = out.parent / f"{aio.staging_prefix(out)}-999999-x"  # what an interrupted run leaves behind
    stale.mkdir()
    (stale / "stale.csv").write_text("x\n")
    assert main([*base, "--analysis", ""]) == 0
    second = _files(out)
    assert "gradcam.csv" not in second and not any("gradcam" in f for f in second)
    manifest = json.loads((out / "manifest.json").read_text())["files"]
    assert set(manifest) | {"manifest.json"} == second
    assert not aio.staging_dirs(out)
    report = (out / "report.md").read_text() + (out / "report.html").read_text()
    assert "gradcam" not in report.lower()
    for ref in re.findall(r"\]\(([^)]+\.png)\)", (out / "report.md").read_text()):
        assert ref in manifest, ref


def test_foreign_files_need_overwrite_and_are_kept(tmp_path, session_cache, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me\n")
    args = ["demo", "--limit", "40", "--attack", "fgsm", "--detectors", "msp", "--analysis", "", "--out", str(out),
            "--quiet"]
    assert main(args) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main([*args, "--overwrite"]) == 0
    assert (out / "notes.txt").read_text() == "keep me\n" and (out / "ood.csv").is_file()
    assert "notes.txt" not in json.loads((out / "manifest.json").read_text())["files"]


def test_relative_out_folder_as_in_the_readme_command(tmp_path, session_cache, monkeypatch):
    """``--out runs/demo`` (relative to the working directory, as the README's first command): the figures the
    plugins list are found, and the report links them relative to the output folder."""
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--limit", "40", "--attack", "fgsm", "--detectors", "msp", "--analysis", "",
                 "--out", "runs/demo", "--quiet"]) == 0
    out = tmp_path / "runs" / "demo"
    manifest = json.loads((out / "manifest.json").read_text())["files"]
    refs = re.findall(r"\]\(([^)]+\.png)\)", (out / "report.md").read_text())
    assert refs and all(ref.startswith("plots/") and ref in manifest for ref in refs), refs
    saved = json.loads((out / "report_sections.json").read_text())["sections"]
    paths = [i["path"] for s in saved for i in s["items"] if i["kind"] == "figure"]
    assert paths and all(p.startswith("plots/") and (out / p).is_file() for p in paths), paths
