"""Named protocols: what each number is computed on, re-derived from the files a run writes."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torchvision import transforms

from advopenood.config import protocols
from advopenood.cli.main import main
from advopenood.models.classifier import build_model

REPO = Path(__file__).resolve().parents[1]


def test_uint8_view_is_torchvisions_png_round_trip():
    """``quantize(x, "uint8_trunc")`` equals ToPILImage -> ToTensor, the paper's storage of adversarial images."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(4, 3, 8, 8, generator=gen)
    x[0, 0, 0, :4] = torch.tensor([0.0, 1.0, 0.5, 128 / 255])
    ref = torch.stack([transforms.ToTensor()(transforms.ToPILImage()(img)) for img in x])
    got = protocols.quantize(x, "uint8_trunc")
    assert torch.equal(got, ref)
    assert got[0, 0, 0, 2].item() == pytest.approx(127 / 255)  # 127.5 truncates to 127, rounding would give 128
    assert torch.equal(protocols.quantize(x, "none"), x)


@pytest.mark.parametrize("name", ["strong", "lorenz2024", "mahmood2021", "hekal2026"])
def test_every_protocol_names_its_source(name):
    p = protocols.get(name)
    assert p.source and p.description and p.ood_positives in ("successful", "all")


@pytest.fixture(scope="module")
def protocol_runs(tmp_path_factory, data_root, session_cache) -> dict[str, Path]:
    outs = {}
    for name in ("strong", "lorenz2024"):
        out = tmp_path_factory.mktemp(name)
        assert main(["run", "--config", str(REPO / "configs" / "cifar10_resnet20.yaml"), "--data-root", str(data_root),
                     "--protocol", name, "--attack", "fgsm,df", "--detectors", "msp", "--limit", "48", "--out", str(out),
                     "--quiet"]) == 0
        outs[name] = out
    return outs


@pytest.mark.parametrize("name", ["strong", "lorenz2024"])
def test_ood_positives_follow_the_protocol(protocol_runs, name):
    out = protocol_runs[name]
    ood = pd.read_csv(out / "ood.csv")
    assert (ood.protocol == name).all() and (pd.read_csv(out / "asr.csv").protocol == name).all()
    scores = np.load(out / "scores" / "msp.npz")
    for attack in ("fgsm", "df"):
        row = ood[ood.attack == attack].iloc[0]
        success = scores[f"{attack}.success"]
        if name == "lorenz2024":
            assert row.positives == "all" and row.n_ood == len(success) == 48
        else:
            assert row.positives == "successful" and row.n_ood == success.sum()
    assert np.load(out / "scores" / "msp.npz")["fgsm.success"].sum() < 48, "a failed attack must tell the two rules apart"
    assert (ood[ood.attack == "none"].positives == "natural").all()
    info = json.loads((out / "run.json").read_text())
    assert info["protocol"]["name"] == name and info["config"]["protocol"] == name


def test_lorenz2024_scores_are_the_8bit_images_and_the_metric_recomputes(protocol_runs, data_root):
    """Re-derive from the store and the npz alone: MSP of ToPILImage-stored adversarial images, then AUROC."""
    from sklearn.metrics import roc_auc_score

    out = protocol_runs["lorenz2024"]
    info = json.loads((out / "run.json").read_text())
    model = build_model("resnet20", 10, data_root / "resnet20_cifar10.pt", mean=(0.485, 0.456, 0.406),
                        std=(0.229, 0.224, 0.225))
    shards = sorted(Path(info["attacks"]["df"]["path"]).glob("shard_*.npz"))
    x_adv = torch.from_numpy(np.concatenate([np.load(s)["x_adv"] for s in shards]))
    stored = torch.stack([transforms.ToTensor()(transforms.ToPILImage()(img)) for img in x_adv])
    with torch.no_grad():
        msp = model(stored).softmax(1).max(1).values.double().numpy()
    scores = np.load(out / "scores" / "msp.npz")
    assert np.allclose(scores["df"], msp, atol=1e-5)
    with torch.no_grad():
        float_msp = model(x_adv).softmax(1).max(1).values.double().numpy()
    assert not np.allclose(scores["df"], float_msp, atol=1e-5), "scores must come from the 8-bit images"
    auroc = 100 * roc_auc_score(np.r_[np.zeros(len(scores["id"])), np.ones(len(msp))], -np.r_[scores["id"], msp])
    row = pd.read_csv(out / "ood.csv").query("attack == 'df'").iloc[0]
    assert row.auroc == pytest.approx(auroc, abs=1e-3)
