"""A third party adds a detector, an attack, an evaluator and an analysis through entry points only
(``tests/thirdparty_plugin``, installed with ``pip install -e tests/thirdparty_plugin``), and the core runs and
reports them exactly as it does the built-in plugins."""
from __future__ import annotations

import importlib.util
import json
import re
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from advopenood import registry
from advopenood.capabilities import is_differentiable
from advopenood.cli.main import main
from advopenood.detection.outputs import grad_outputs

REPO = Path(__file__).resolve().parents[1]
PLUGINS = {"detectors": "topgap", "attacks": "randsign", "evaluators": "meanconf", "analyses": "pertnorm"}

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("advopenood_example") is None
    or not any(ep.name == "topgap" for ep in entry_points(group="advopenood.detectors")),
    reason="the example plugin is not installed (pip install -e tests/thirdparty_plugin)")


@pytest.fixture(scope="module")
def thirdparty_run(data_root, session_cache, tmp_path_factory) -> Path:
    """ResNet-20 on 32 CIFAR-10 images and 32 Textures images: the plugin's attack next to FGSM, its detector
    next to MSP, the built-in ``ood`` evaluator next to its evaluator, and its analysis."""
    folder = tmp_path_factory.mktemp("thirdparty")
    cfg = yaml.safe_load((REPO / "configs" / "cifar10_resnet20.yaml").read_text())
    cfg["data"].update(root=str(data_root), ood=[{"kind": "npz", "path": "texture_test.npz", "name": "texture"}])
    cfg.update(name="thirdparty", attacks=["randsign", "fgsm"], detectors=["topgap", "msp"],
               evaluators=["ood", "meanconf"], analyses=["pertnorm"])
    path = folder / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = folder / "out"
    assert main(["run", "--config", str(path), "--limit", "32", "--out", str(out), "--quiet"]) == 0
    return out


@pytest.mark.parametrize("kind, name", list(PLUGINS.items()))
def test_list_shows_the_third_party_plugin(capsys, kind, name):
    assert main(["list", kind]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if l.split()[0] == name)
    assert registry.entries(kind)[name].description in line and "advopenood_example" in registry.entries(kind)[name].source


def test_third_party_detector_and_attack_appear_in_ood_csv(thirdparty_run):
    ood = pd.read_csv(thirdparty_run / "ood.csv")
    assert set(ood.detector) == {"topgap", "msp"} and set(ood.ood_set) == {"texture", "randsign", "fgsm"}
    assert ood.auroc.notna().all()
    asr = pd.read_csv(thirdparty_run / "asr.csv").set_index("attack")
    assert asr.loc["randsign", "asr"] < asr.loc["fgsm", "asr"]  # random noise is a much weaker attack than FGSM
    if asr.loc["randsign", "asr"] > 0:  # its perturbation fills the eps-ball's corners
        assert asr.loc["randsign", "mean_linf"] == pytest.approx(8 / 255, abs=1e-3)


def test_third_party_evaluator_and_analysis_write_tables_and_report_sections(thirdparty_run):
    meanconf = pd.read_csv(thirdparty_run / "meanconf.csv")
    with np.load(thirdparty_run / "scores" / "topgap.npz") as data:
        assert meanconf.set_index(["detector", "set"]).loc[("topgap", "id"), "mean_conf"] == \
            pytest.approx(data["id"].mean(), rel=1e-5)
    md = (thirdparty_run / "report.md").read_text()
    assert "## Mean confidence per set (example plugin)" in md and "## Perturbation size (example plugin)" in md
    conf = meanconf.set_index(["detector", "set"])["mean_conf"]
    verb = "raises" if conf[("topgap", "fgsm")] > conf[("topgap", "id")] else "lowers"
    assert f"- fgsm {verb} topgap's mean confidence from {conf[('topgap', 'id')]:.3f}" in md
    pert = pd.read_csv(thirdparty_run / "pertnorm.csv").set_index("attack")
    assert f"fgsm succeeds on {pert.loc['fgsm', 'n_success']} of 32 images" in md
    assert "![meanconf](plots/meanconf.png)" in md and (thirdparty_run / "plots" / "meanconf.png").is_file()
    saved = json.loads((thirdparty_run / "report_sections.json").read_text())
    sources = [s["source"] for s in saved["sections"]]
    # ood: the headline (AUROC per detector and set), detection, the leaderboard, then the paired comparisons
    assert sources == ["core", "ood", "ood", "ood", "ood", "meanconf", "pertnorm"]
    assert [s.get("headline", False) for s in saved["sections"]] == [False, True, False, False, False, False, False]
    manifest = json.loads((thirdparty_run / "manifest.json").read_text())["files"]
    assert {"meanconf.csv", "pertnorm.csv", "plots/meanconf.png", "report_sections.json"} <= set(manifest)


def test_third_party_detector_score_is_differentiable(cifar_model, cifar_batch):
    detector = registry.create("detectors", "topgap")
    assert is_differentiable(detector)
    x = cifar_batch[0][:8].clone().requires_grad_(True)
    conf = detector.grad_score(cifar_model, x, grad_outputs(cifar_model, x))
    top2 = torch.topk(cifar_model(x), 2, dim=1).values
    torch.testing.assert_close(conf, top2[:, 0] - top2[:, 1])
    conf.sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_adaptive_attack_is_discovered_for_the_third_party_detector():
    assert "adaptive_topgap" in registry.names("attacks")
    attack = registry.create("attacks", "adaptive_topgap", eps=8 / 255)
    assert attack.detector == "topgap" and re.search("topgap", registry.entries("attacks")["adaptive_topgap"].description,
                                                     re.IGNORECASE)


def test_backend_column_says_what_computed_each_detector(thirdparty_run):
    """A third party's detector is not labelled with the built-ins' backend (issue 24, item 11)."""
    ood = pd.read_csv(thirdparty_run / "ood.csv")
    backends = ood.groupby("detector")["backend"].unique()
    assert list(backends["msp"]) == ["pytorch-ood"]
    assert len(backends["topgap"]) == 1 and re.fullmatch(r"plugin:advopenood[-_]example[-_]plugin==0\.2\.0",
                                                         backends["topgap"][0])
    info = json.loads((thirdparty_run / "run.json").read_text())
    assert info["detector_backends"]["topgap"] == backends["topgap"][0]


def test_verify_rederives_the_run_and_names_the_unverifiable_plugins(thirdparty_run, capsys):
    assert main(["verify", str(thirdparty_run)]) == 0
    out = capsys.readouterr().out
    assert "0 difference(s)" in out and "'meanconf' does not declare Verifiable" in out
