"""Shared fixtures: the benchmark pack beside the checkout, the real CIFAR ResNet-20, a per-session cache."""
from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # idle OpenMP threads sleep: steady times when processes share cores

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("ADVOPENOOD_TEST_DATA", REPO.parent / "shared" / "data"))


def pytest_configure(config: pytest.Config) -> None:
    torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(scope="session")
def data_root() -> Path:
    if not (DATA / "cifar10_test.npz").is_file():
        pytest.skip(f"needs the benchmark pack (../shared/data or $ADVOPENOOD_TEST_DATA); not found at {DATA}")
    return DATA


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for the session (the demo CNN is trained once), set as $ADVOPENOOD_CACHE for subprocesses too."""
    path = tmp_path_factory.mktemp("cache")
    os.environ["ADVOPENOOD_CACHE"] = str(path)
    return path


@pytest.fixture(scope="session")
def cifar_model(data_root: Path):
    from advopenood.models.classifier import build_model

    return build_model("resnet20", 10, data_root / "resnet20_cifar10.pt")


@pytest.fixture(scope="session")
def cifar_test(data_root: Path):
    from advopenood.data.datasets import build_dataset

    return build_dataset({"kind": "npz", "path": "cifar10_test.npz", "name": "cifar10"}, data_root, 3, 32)


@pytest.fixture(scope="session")
def pack_set(data_root: Path):
    """``pack_set(name, file, n)``: the first ``n`` rows (seeded order) of an npz set of the pack at 3 x 32 x 32."""
    from advopenood.data.datasets import build_dataset, limit_dataset

    return lambda name, path, n: limit_dataset(build_dataset({"kind": "npz", "path": path, "name": name}, data_root,
                                                             3, 32), n, 0)


@pytest.fixture(scope="session")
def cifar_batch(cifar_test):
    """64 real CIFAR-10 test images and labels."""
    from advopenood.data.datasets import stack

    return stack(cifar_test, list(range(64)))


@pytest.fixture(scope="session")
def demo_net(session_cache: Path):
    from advopenood.models.demo import demo_model

    return demo_model(session_cache, seed=0, progress=False)


def make_plan(**settings):
    """A run plan for tests that build a :class:`~advopenood.evaluation.context.RunContext` by hand: a CIFAR-size
    model section and a demo ID set unless ``settings`` say otherwise, no attacks, detectors or plugins."""
    from advopenood.config.loading import validate

    return validate({"model": {"arch": "resnet20"}, "data": {"id": {"kind": "demo"}}, "attacks": [], "detectors": "",
                     "evaluators": "", **settings})
