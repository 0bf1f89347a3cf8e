"""The model wrapper: checkpoints load (and mismatches are refused), OpenOOD's network interface holds."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from advopenood.data.datasets import stack
from advopenood.errors import UsageError
from advopenood.models.classifier import build_model, weights_hash


def test_pretrained_resnet20_accuracy(cifar_model, cifar_test):
    x, y = stack(cifar_test, list(range(500)))
    with torch.no_grad():
        acc = (cifar_model(x).argmax(1) == y).float().mean().item()
    assert acc > 0.85


def test_original_checkpoint_with_module_prefix_loads(data_root, cifar_batch):
    model = build_model("resnet20", 10, data_root / "resnet20_cifar10_original.th")
    x, y = cifar_batch
    with torch.no_grad():
        assert (model(x).argmax(1) == y).float().mean() > 0.6


def test_mismatched_checkpoint_names_arch_and_choices(data_root):
    with pytest.raises(UsageError, match="does not match architecture 'resnet18_32x32'.*valid choices: resnet20"):
        build_model("resnet18_32x32", 10, data_root / "resnet20_cifar10.pt")
    with pytest.raises(UsageError, match="unknown architecture 'vgg'"):
        build_model("vgg", 10)


def test_openood_interface(cifar_model, cifar_batch):
    x = cifar_batch[0][:4]
    with torch.no_grad():
        logits = cifar_model(x)
        l2, feat = cifar_model(x, return_feature=True)
        l3, maps = cifar_model(x, return_feature_list=True)
        assert torch.equal(logits, l2) and torch.equal(logits, l3) and feat.shape == (4, 64)
        assert maps[-2].shape == (4, 64, 8, 8) and torch.equal(maps[-1].flatten(1), feat)
        w, b = cifar_model.get_fc()
        assert torch.allclose(torch.from_numpy(w) @ feat.T + torch.from_numpy(b)[:, None], logits.T, atol=1e-4)
        clipped = cifar_model.forward_threshold(x, threshold=0.1)
        assert torch.allclose(clipped, cifar_model.fc(feat.clip(max=0.1)))
        assert cifar_model.intermediate_forward(x, 3).shape == (4, 64, 8, 8)
    assert cifar_model.last_block is cifar_model.backbone.layer3


def test_openood_resnet18_checkpoint_round_trip(tmp_path):
    torch.manual_seed(0)
    src = build_model("resnet18_32x32", 10)
    torch.save({"module." + k: v for k, v in src.backbone.state_dict().items()}, tmp_path / "best.ckpt")
    dst = build_model("resnet18_32x32", 10, tmp_path / "best.ckpt")
    assert weights_hash(src) == weights_hash(dst)
    assert {"fc.weight", "layer4.1.conv2.weight", "layer2.0.shortcut.0.weight"} <= set(dst.backbone.state_dict())


def test_weights_hash_tracks_weights(cifar_model):
    other = build_model("resnet20", 10)
    assert weights_hash(cifar_model) != weights_hash(other) and len(weights_hash(other)) == 64


def test_trained_weights_come_from_the_seed_alone(demo_net, tmp_path):
    """A fresh cache gives the session's demo weights whatever drew from torch's generator before and whatever
    the process's thread count (the key holds the seed, not the threads, so the seed must determine the weights:
    training runs on ``TRAIN_THREADS``); a run that trains leaves the caller's generator and thread count where a
    run that loads the cached weights leaves them; and the first run (trains) and a later one (loads) key their
    adversarial sets by the same weights hash. One training in a fresh cache for all three."""
    from advopenood.models.demo import demo_model

    threads = torch.get_num_threads()
    torch.set_num_threads(3)  # neither the session's count (one in a test worker) nor TRAIN_THREADS
    try:
        torch.manual_seed(2)
        torch.rand(1000)
        trained = demo_model(tmp_path, progress=False)
        after_training = torch.get_rng_state()
        assert torch.get_num_threads() == 3
        torch.manual_seed(2)
        torch.rand(1000)
        loaded = demo_model(tmp_path, progress=False)
    finally:
        torch.set_num_threads(threads)
    assert weights_hash(trained) == weights_hash(demo_net) == weights_hash(loaded)
    assert torch.equal(torch.get_rng_state(), after_training)


HTML_PAGES = {
    "google drive": "<!DOCTYPE html><html><head><title>Google Drive - Virus scan warning</title></head></html>\n",
    "bare html tag": "\n  <html lang='en'><body>Quota exceeded</body></html>",
    "comment first": "<!-- saved page --><html><body>Sign in</body></html>",
}


@pytest.mark.parametrize("page", list(HTML_PAGES))
def test_an_html_page_is_refused_as_one(tmp_path, page):
    """A failed download's web page saved as the checkpoint (RobustBench issues 158, 174, 177) is named as such,
    in one line, not as an unpickling error that suggests weights_only=False."""
    path = tmp_path / "model.pt"
    path.write_text(HTML_PAGES[page])
    with pytest.raises(UsageError) as err:
        build_model("resnet20", 10, path)
    assert "is an HTML page" in str(err.value) and "model.pt" in str(err.value) and "\n" not in str(err.value)


def test_a_non_html_non_checkpoint_keeps_the_load_error(tmp_path):
    path = tmp_path / "model.pt"
    path.write_bytes(b"<\x00\x01 not a page" + bytes(range(256)))
    with pytest.raises(UsageError, match="cannot be loaded as a state dict"):
        build_model("resnet20", 10, path)


def test_the_cli_exits_2_on_an_html_checkpoint(data_root, tmp_path):
    import subprocess
    import sys

    import yaml

    cfg = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs" / "cifar10_resnet20.yaml").read_text())
    (tmp_path / "model.pt").write_text(HTML_PAGES["google drive"])
    cfg["data"]["root"], cfg["out"] = str(data_root), str(tmp_path / "out")
    cfg["model"]["checkpoint"] = str(tmp_path / "model.pt")
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([sys.executable, "-m", "advopenood.cli", "run", "--config", str(tmp_path / "cfg.yaml")],
                          capture_output=True, text=True, timeout=600)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "is an HTML page" in lines[0]
    assert not (tmp_path / "out").exists()


def test_unknown_architecture_lists_the_robustbench_form():
    with pytest.raises(UsageError, match=r"robustbench:<dataset>/<threat>/<model_id>"):
        build_model("wrn", 10)
