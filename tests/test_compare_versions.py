"""``benchmarks/compare_versions.py``: which files of two run folders it compares, and that it names every one that
differs or that one side lacks."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def compare_versions():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import compare_versions
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    return compare_versions


def _folder(root: Path) -> Path:
    """A run folder's comparable files (two CSVs, two score files) and ones it leaves out (run.json, a plot, an npz
    outside ``scores/``)."""
    (root / "scores").mkdir(parents=True)
    pd.DataFrame({"detector": ["msp", "mds"], "auroc": [81.25, 97.5]}).to_csv(root / "ood.csv", index=False)
    pd.DataFrame({"attack": ["pgd"], "asr": [100.0]}).to_csv(root / "asr.csv", index=False)
    for det in ("msp", "mds"):
        np.savez(root / "scores" / f"{det}.npz", id=np.linspace(0, 1, 8), pgd=np.linspace(-1, 0, 8))
    (root / "run.json").write_text('{"versions": {"advopenood": "0.2.0"}}')
    (root / "plots").mkdir()
    (root / "plots" / "heatmap.npz").write_bytes(b"not compared")
    return root


def test_identical_folders_compare_equal_whatever_their_provenance(compare_versions, tmp_path):
    old, new = _folder(tmp_path / "old"), _folder(tmp_path / "new")
    (new / "run.json").write_text('{"versions": {"advopenood": "0.3.0"}}')  # versions and timings may differ
    (new / "plots" / "heatmap.npz").write_bytes(b"drawn again")
    assert compare_versions.compared(old, new) == (4, [])


def test_an_edited_cell_and_a_missing_score_file_are_named(compare_versions, tmp_path):
    old, new = _folder(tmp_path / "old"), _folder(tmp_path / "new")
    table = pd.read_csv(new / "ood.csv")
    table.loc[1, "auroc"] = 97.4
    table.to_csv(new / "ood.csv", index=False)
    (old / "scores" / "mds.npz").unlink()
    assert compare_versions.compared(old, new) == (4, ["ood.csv", "scores/mds.npz"])
