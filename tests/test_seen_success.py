"""Masks are those of the images the detectors see (issue 24, item 5): under ``lorenz2024`` the stored float
image may be adversarial while its 8-bit truncation, which the detectors score, is not."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from advopenood.cli.main import main
from advopenood.config.protocols import quantize

REPO = Path(__file__).resolve().parents[1]
LIMIT = 64  # CIFAR-10 test images a run attacks


@pytest.fixture(scope="module")
def df_runs(data_root, session_cache, tmp_path_factory) -> dict[str, Path]:
    """DeepFool (minimal perturbations, so truncation undoes some) on :data:`LIMIT` CIFAR-10 images, both
    protocols."""
    folder = tmp_path_factory.mktemp("seen")
    cfg = yaml.safe_load((REPO / "configs" / "cifar10_resnet20.yaml").read_text())
    cfg["data"].update(root=str(data_root), ood=[{"kind": "npz", "path": "texture_test.npz", "name": "texture"}])
    path = folder / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    runs = {}
    for protocol in ("strong", "lorenz2024"):
        runs[protocol] = folder / protocol
        assert main(["run", "--config", str(path), "--limit", str(LIMIT), "--attack", "df", "--detectors", "msp",
                     "--protocol", protocol, "--out", str(runs[protocol]), "--quiet"]) == 0
    return runs


def _records(run: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    entry = json.loads((run / "run.json").read_text())["attacks"]["df"]
    parts = [np.load(p) for p in sorted(Path(entry["path"]).glob("shard_*.npz"))]
    return (np.concatenate([p["x_adv"] for p in parts]), np.concatenate([p["y"] for p in parts]),
            np.concatenate([p["success"] for p in parts]).astype(bool))


def test_lorenz2024_masks_are_recomputed_on_the_8bit_images(df_runs, cifar_model):
    x_adv, y, stored = _records(df_runs["lorenz2024"])
    with torch.no_grad():
        pred = cifar_model(quantize(torch.from_numpy(x_adv), "uint8_trunc")).argmax(1).numpy()
    with np.load(df_runs["lorenz2024"] / "scores" / "msp.npz") as d:
        seen, positive = d["df.success"], d["df.positive"]
    assert np.array_equal(seen, pred != y)
    assert (stored & ~seen).any()  # some float "successes" are no longer adversarial after truncation
    assert positive.all()  # lorenz2024: every attacked image is a positive
    ood = pd.read_csv(df_runs["lorenz2024"] / "ood.csv").set_index("attack")
    assert ood.loc["df", "positives"] == "all" and ood.loc["df", "n_ood"] == LIMIT


def test_strong_masks_are_the_stored_float_successes(df_runs):
    _, _, stored = _records(df_runs["strong"])
    with np.load(df_runs["strong"] / "scores" / "msp.npz") as d:
        assert np.array_equal(d["df.success"], stored) and np.array_equal(d["df.positive"], stored)
    ood = pd.read_csv(df_runs["strong"] / "ood.csv").set_index("attack")
    assert ood.loc["df", "positives"] == "successful" and ood.loc["df", "n_ood"] == stored.sum()


@pytest.mark.parametrize("protocol, phrase", [("strong", "the positives are the successful adversarial examples"),
                                              ("lorenz2024", "every attacked image, successful or not")])
def test_report_states_the_positives_of_the_protocol(df_runs, protocol, phrase):
    assert phrase in (df_runs[protocol] / "report.md").read_text()
