"""RobustBench model-zoo architectures from local files (issue 23, item 2).

The architectures come from the ``robustbench`` package (no weights are downloaded: the tests build them and save
their own state dicts); the behavioural checks run on the pack's trained ResNet-18, saved in RobustBench's layout.
Without robustbench (``pip install --no-deps robustbench==1.1.1 geotorch torchdiffeq``) the zoo tests skip.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from advopenood.config.loading import validate
from advopenood.errors import UsageError
from advopenood.models.classifier import build_model, weights_hash

WRN = "robustbench:cifar10/Linf/Standard"  # WideResNet-28-10
R18 = "robustbench:cifar10/Linf/Sehwag2021Proxy_R18"  # robustbench.model_zoo.architectures.resnet.ResNet18


@pytest.fixture(scope="module")
def zoo_ready() -> None:
    if importlib.util.find_spec("robustbench") is None:
        pytest.skip("robustbench is not installed (docs/models.md, 'Installing robustbench (one environment that keeps working)')")
    from advopenood.models.robustbench import zoo

    try:
        zoo()
    except UsageError as exc:
        pytest.skip(str(exc))


def _perturbed_state(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """The model's state dict with every float tensor moved by seeded noise (so it differs from a bare build),
    except the network's own normalisation constants."""
    from advopenood.models.robustbench import NORMALISATION_BUFFERS

    g = torch.Generator().manual_seed(seed)
    return {k: (v + 0.01 * torch.randn(v.shape, generator=g))
            if v.is_floating_point() and k.rsplit(".", 1)[-1] not in NORMALISATION_BUFFERS else v.clone()
            for k, v in model.state_dict().items()}


@pytest.mark.parametrize("arch, size, family, n_stages", [
    (WRN, 32, "WideResNet (TRADES layout)", 4),
    ("robustbench:cifar10/Linf/Hendrycks2019Using", 32, "WideResNet (TRADES layout)", 4),  # rescales x to [-1, 1] first
    ("robustbench:cifar10/Linf/Gowal2021Improving_28_10_ddpm_100m", 32, "DMWideResNet (DeepMind layout)", 4),
    ("robustbench:cifar10/Linf/Rebuffi2021Fixing_R18_ddpm", 32, "DMPreActResNet (DeepMind layout)", 5),
    (R18, 32, "ResNet (CIFAR layout)", 5),
    ("robustbench:cifar10/Linf/Wong2020Fast", 32, "PreActResNet (CIFAR layout)", 5),  # normalises with mu / sigma
    ("robustbench:imagenet/Linf/Salman2020Do_R18", 224, "torchvision ResNet (ImageNet)", 5),  # inside normalize_model
])
def test_family_declarations(zoo_ready, arch, size, family, n_stages):
    """Logits equal the zoo network's own forward (its internal normalisation once, ours none), the penultimate
    feature is the pooled last stage map, GRAM reads the declared stage maps, Grad-CAM the last stage module."""
    from advopenood.detection.outputs import Taps
    from advopenood_plugins.analyses.gradcam.plugin import CamExtractor

    model = build_model(arch, 1000 if "imagenet" in arch else 10, input_size=size)
    bb = model.backbone
    assert bb.family.name == family
    assert model.mean.flatten().tolist() == [0.0] * 3 and model.std.flatten().tolist() == [1.0] * 3
    x = torch.rand(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, feature, maps = model.forward_all(x)
        own = bb.model(x)
        _, grams = Taps(model)(x)
    assert torch.allclose(logits, own, atol=1e-5)
    assert len(maps) == n_stages and all(m.ndim == 4 for m in maps)
    assert torch.allclose(maps[-1].mean(dim=(2, 3)), feature, atol=1e-5)
    assert Taps(model).layers == list(bb.taps) and len(grams) == n_stages
    assert all(torch.equal(a, b) for a, b in zip(grams, maps))
    assert model.cam_layer is model.last_block is bb.model.get_submodule(bb._stage_names[-1])
    assert model.cam_reshape is None
    with CamExtractor(model, torch.device("cpu")) as cam:
        heat, preds = cam(x)
    assert heat.shape == (2, size, size) and np.isfinite(heat).all()  # seeded weights: maps may be flat
    assert np.array_equal(preds, logits.argmax(1).numpy())


@pytest.mark.parametrize("arch, layout", [
    (R18, "bare"), (R18, "state_dict+module"), (R18, "last"), (R18, "model.prefix"),
    ("robustbench:imagenet/Linf/Salman2020Do_R18", "torchvision keys, no normaliser"),
])
def test_checkpoint_layouts_robustbench_reads_load(zoo_ready, tmp_path, arch, layout):
    """The layouts RobustBench's load_model reads (robustbench/utils.py 1.1.1) load strictly into the zoo network."""
    size, classes = (224, 1000) if "imagenet" in arch else (32, 10)
    src = build_model(arch, classes, input_size=size)
    state = _perturbed_state(src.backbone.model, 3)
    src.backbone.model.load_state_dict(state)
    saved = {
        "bare": state,
        "state_dict+module": {"state_dict": {"module." + k: v for k, v in state.items()}},
        "last": {"last": state, "best": {k: torch.zeros_like(v) for k, v in state.items()}},
        "model.prefix": {"model." + k: v for k, v in state.items()},
        "torchvision keys, no normaliser": {k.removeprefix("model."): v for k, v in state.items()
                                            if not k.startswith("normalize.")},
    }[layout]
    torch.save(saved, tmp_path / "ckpt.pt")
    dst = build_model(arch, classes, tmp_path / "ckpt.pt", input_size=size)
    assert weights_hash(dst) == weights_hash(src) != weights_hash(build_model(arch, classes, input_size=size))


def _pack_resnet18_in_zoo_layout(data_root: Path, path: Path) -> Path:
    """The pack's trained ResNet-18 (AutoAttack's example model, fc renamed back to RobustBench's ``linear``) saved
    as RobustBench's checkpoints are: ``{"state_dict": {"module.<key>": ...}}``."""
    state = torch.load(data_root / "resnet18_32x32_cifar10.pt", weights_only=True)
    state = {("linear." + k[3:] if k.startswith("fc.") else k): v for k, v in state.items()}
    torch.save({"state_dict": {"module." + k: v for k, v in state.items()}}, path)
    return path


def test_trained_resnet18_reads_the_same_through_the_zoo(zoo_ready, data_root, cifar_batch, tmp_path):
    """The pack's trained ResNet-18 in the zoo's ResNet18 gives the logits and features of our own ResNet18_32x32
    with mean 0 / std 1 (the pack says it takes [0, 1] unnormalised): nothing normalises twice."""
    zoo_model = build_model(R18, 10, _pack_resnet18_in_zoo_layout(data_root, tmp_path / "r18.pt"))
    ours = build_model("resnet18_32x32", 10, data_root / "resnet18_32x32_cifar10.pt", mean=(0, 0, 0), std=(1, 1, 1))
    x, y = cifar_batch
    with torch.no_grad():
        (l1, f1, _), (l2, f2, _) = zoo_model.forward_all(x), ours.forward_all(x)
    assert torch.allclose(l1, l2, atol=1e-4) and torch.allclose(f1, f2, atol=1e-4)
    assert (l1.argmax(1) == y).float().mean() > 0.75  # the pack README: 85.3 % on the first 2,000 test images


def _config(data_root: Path, arch: str, checkpoint: Path, out: Path, cache: Path, **over) -> dict:
    return {"name": "zoo", "seed": 0, "device": "cpu", "batch_size": 8, "out": str(out), "cache_dir": str(cache),
            "model": {"arch": arch, "checkpoint": str(checkpoint), "num_classes": 10, "in_channels": 3,
                      "input_size": 32},
            "data": {"root": str(data_root), "dataset": "cifar10",
                     "id": {"kind": "npz", "path": "cifar10_test.npz", "name": "cifar10"},
                     "fit": {"kind": "npz", "path": "cifar10_train_10k.npz", "name": "cifar10_train"},
                     "fit_limit": 200, "ood": [{"kind": "npz", "path": "texture_test.npz", "name": "texture"}]},
            "attacks": ["fgsm"], "detectors": "all", "evaluators": ["ood"], "analyses": ["gradcam"], "limit": 16, **over}


def test_every_detector_and_gradcam_run_on_a_trained_zoo_network(zoo_ready, data_root, tmp_path):
    """Every registered detector scores, GRAM reads the declared stage maps, Grad-CAM maps every image (trained
    ResNet-18 in the zoo layout; 8 ID images, 200 fit rows)."""
    from advopenood.detection.outputs import Taps
    from advopenood.run.pipeline import run
    from advopenood.registry import parse_names

    ckpt = _pack_resnet18_in_zoo_layout(data_root, tmp_path / "r18.pt")
    ctx = run(validate(_config(data_root, R18, ckpt, tmp_path / "out", tmp_path / "cache", limit=8)), progress=False)
    assert len(Taps(ctx.model).layers) == 5
    ood = pd.read_csv(tmp_path / "out" / "ood.csv")
    assert set(ood.detector) == set(parse_names("detectors", "all"))
    assert ood[["auroc", "fpr95"]].notna().all().all(), ood[ood.auroc.isna()][["detector", "error"]].values.tolist()
    cam = pd.read_csv(tmp_path / "out" / "gradcam.csv")
    assert len(cam) > 0 and cam.l2.between(0, 1).all() and cam.ssim.notna().all()


def _cli(config: dict, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(config))
    return subprocess.run([sys.executable, "-m", "advopenood.cli", "run", "--config", str(path), "--quiet", *args],
                          capture_output=True, text=True, timeout=900)


def test_wrn_28_10_runs_two_detectors_from_a_local_state_dict(zoo_ready, data_root, tmp_path):
    """The done-when of issue 23, item 2: RobustBench's cifar10/Linf/Standard (WideResNet-28-10), weights from a
    local state dict in RobustBench's layout, runs msp and mds end to end through the CLI (4 images)."""
    src = build_model(WRN, 10)
    state = _perturbed_state(src.backbone.model, 5)
    torch.save({"state_dict": {"module." + k: v for k, v in state.items()}}, tmp_path / "Standard.pt")
    cfg = _config(data_root, WRN, tmp_path / "Standard.pt", tmp_path / "out", tmp_path / "cache",
                  detectors=["msp", "mds"], analyses=[], limit=4)
    cfg["data"]["fit_limit"] = 32
    proc = _cli(cfg, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ood = pd.read_csv(tmp_path / "out" / "ood.csv")
    assert set(ood.detector) == {"msp", "mds"} and set(ood.ood_set) == {"texture", "fgsm"}
    assert ood.auroc.between(0, 100).all() and (ood.n_id == 4).all()
    info = json.loads((tmp_path / "out" / "run.json").read_text())
    assert info["model"]["arch"] == WRN


def test_an_html_page_named_pt_exits_2_in_one_line(zoo_ready, data_root, tmp_path):
    """What a failed Google Drive download leaves (RobustBench issues 158, 174, 177): refused before any work
    (the same for our own architectures: tests/test_models.py)."""
    page = tmp_path / "Standard.pt"
    page.write_text("<!DOCTYPE html><html><head><title>Google Drive - Virus scan warning</title></head></html>\n")
    proc = _cli(_config(data_root, WRN, page, tmp_path / "out", tmp_path / "cache"), tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "is an HTML page" in lines[0] and "Standard.pt" in lines[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("mean, std, refused", [
    ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225], True), ([0.0, 0.0, 0.0], [0.5, 0.5, 0.5], True),
    ([0.0, 0.0, 0.0], [1.0, 1.0, 1.0], False), (None, None, False)])
def test_a_second_normalisation_is_refused(zoo_ready, data_root, tmp_path, mean, std, refused):
    cfg = _config(data_root, R18, tmp_path / "absent.pt", tmp_path / "out", tmp_path / "cache")
    cfg["model"].update({"mean": mean, "std": std})
    if refused:
        with pytest.raises(Exception, match="would normalise twice"):
            validate(cfg)
        with pytest.raises(UsageError, match="would normalise twice"):
            build_model(R18, 10, mean=mean, std=std)
    else:
        assert validate(cfg).model.arch == R18
        assert build_model(R18, 10, mean=mean, std=std).std.flatten().tolist() == [1.0] * 3


@pytest.mark.parametrize("arch, message", [
    ("robustbench:cifar10/Linf/Standrd", "did you mean Standard"),
    ("robustbench:cifar10/Linf2/Standard", "unknown RobustBench threat model of cifar10 'Linf2'; did you mean Linf"),
    ("robustbench:cifar11/Linf/Standard", "unknown RobustBench dataset 'cifar11'"),
    ("robustbench:cifar10/Standard", "is not robustbench:<dataset>/<threat>/<model_id>"),
    ("robustbench:imagenet/Linf/Standard_R50", "cannot be built offline"),  # torchvision resnet50(pretrained=True)
    ("robustbench:cifar10/Linf/Chen2020Adversarial", "is not a family advopenood reads"),  # an ensemble of three
])
def test_bad_entries_are_one_line_usage_errors(zoo_ready, arch, message):
    with pytest.raises(UsageError) as err:
        build_model(arch, 1000 if "imagenet" in arch else 10, input_size=224 if "imagenet" in arch else 32)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_without_robustbench_the_error_says_how_to_install(monkeypatch):
    """No robustbench package: one line with the install command (runs whether or not robustbench is installed)."""
    from advopenood.models import robustbench as robustbench_zoo

    monkeypatch.setattr(robustbench_zoo.importlib.util, "find_spec", lambda name: None)
    robustbench_zoo.zoo.cache_clear()
    try:
        with pytest.raises(UsageError, match=r"needs the robustbench package.*pip install --no-deps robustbench"):
            build_model(WRN, 10)
    finally:
        monkeypatch.undo()
        robustbench_zoo.zoo.cache_clear()


def test_robustbench_stays_optional():
    """Importing advopenood (models, config, the robustbench module itself) imports no robustbench code."""
    code = ("import sys, advopenood.models, advopenood.config, advopenood.models.robustbench; "
            "print(any(m == 'robustbench' or m.startswith('robustbench.') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
