"""Shared fixtures: the benchmark pack beside the checkout, the real CIFAR ResNet-20, a per-session cache."""
from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # idle OpenMP threads sleep: steady times when processes share cores
# one OpenMP thread a process, the CLI subprocesses that tests start included: the README's command runs two
# pytest-xdist workers on two cores, and two threads each (four on two cores) cost a third more CPU for the same
# work (the demo CNN's training: 15.7 s against 12.1 s) and stall each parallel region on a descheduled thread
os.environ.setdefault("OMP_NUM_THREADS", "1")
#: glibc's malloc settings of every test process: a freed block stays in the heap for the next tensor of its size
#: instead of being unmapped (above 128 kB by default) and page-faulted in again, which cost a test file up to a
#: quarter of its CPU time in the kernel (test_noise_selection: 9 of 36 s); the CLI subprocesses that tests start
#: read them from the environment, this process takes them through mallopt below
MALLOC = {"MALLOC_MMAP_THRESHOLD_": (-3, 32 << 20), "MALLOC_TRIM_THRESHOLD_": (-1, 1 << 30),
          "MALLOC_TOP_PAD_": (-2, 64 << 20)}
for _name, (_param, _value) in MALLOC.items():
    os.environ.setdefault(_name, str(_value))

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("ADVOPENOOD_TEST_DATA", REPO.parent / "shared" / "data"))


def pytest_configure(config: pytest.Config) -> None:
    # one thread in every process, pytest-xdist workers included (above); the demo network's weights, which depend
    # on the thread count, do not change with it: trained_model trains on TRAIN_THREADS (2) threads whatever the
    # process's count
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    _set_malloc()


def _set_malloc() -> None:
    """:data:`MALLOC` (the environment's values) in this process, where the C library has glibc's ``mallopt``."""
    import ctypes

    mallopt = getattr(ctypes.CDLL(None), "mallopt", None) if os.name == "posix" else None
    if mallopt is not None:
        for name, (param, _) in MALLOC.items():
            mallopt(param, int(os.environ[name]))


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


#: the small demo run that the tests which only read a run's outputs share (60 images a set, FGSM and PGD, five
#: detectors, the ood evaluator, no analysis); a test that runs it again (``--latex all``) reads it from the store
SMALL_DEMO = ["run", "--config", "demo", "--limit", "60", "--attack", "fgsm,pgd", "--detectors", "msp,mls,ebo,knn,ash",
              "--analysis", "", "--quiet"]


@pytest.fixture(scope="session")
def small_demo_run(tmp_path_factory: pytest.TempPathFactory, session_cache: Path) -> tuple[Path, str]:
    """:data:`SMALL_DEMO` run once per session: its output folder and its stdout. Read only: a test that changes a
    file works on a copy (``shutil.copytree``, :func:`edited_copy`)."""
    import contextlib
    import io

    from advopenood.cli.main import main

    out = tmp_path_factory.mktemp("small_demo") / "run"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main([*SMALL_DEMO, "--out", str(out)]) == 0
    return out, stdout.getvalue()


@pytest.fixture(scope="session")
def demo_analyses_run(tmp_path_factory: pytest.TempPathFactory, session_cache: Path) -> Path:
    """A real ``advopenood run`` of the demo with FGSM on 20 images, MSP, no evaluator and the gradcam and bintest
    analyses (bintest shrunk: 49 inner points, 50 random ones, 4 images); read only, as :func:`small_demo_run`."""
    import yaml

    from advopenood.cli.main import main

    folder = tmp_path_factory.mktemp("demo_analyses")
    cfg = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs" / "demo.yaml").read_text())
    cfg["analysis_params"] = {"bintest": {"n_inner": 49, "n_random": 50, "limit": 4}, "gradcam": {"n_examples": 2}}
    (folder / "demo.yaml").write_text(yaml.safe_dump(cfg))
    out = folder / "run"
    assert main(["run", "--config", str(folder / "demo.yaml"), "--limit", "20", "--attack", "fgsm", "--detectors",
                 "msp", "--evaluator", "", "--analysis", "gradcam,bintest", "--out", str(out), "--quiet"]) == 0
    return out


def make_plan(**settings):
    """A run plan for tests that build a :class:`~advopenood.evaluation.context.RunContext` by hand: a CIFAR-size
    model section and a demo ID set named ``cifar10`` unless ``settings`` say otherwise, no attacks, detectors or
    plugins. The plan carries the context's settings (``ctx.seed``, ``ctx.device``, ``ctx.dataset``, ...)."""
    from advopenood.config.loading import validate

    return validate({"model": {"arch": "resnet20"}, "data": {"dataset": "cifar10", "id": {"kind": "demo"}},
                     "attacks": [], "detectors": "", "evaluators": "", **settings})


def pack_config(folder: Path, data_root: Path, changes: dict | None = None, name: str = "tiny") -> str:
    """A tiny config file in ``folder`` on the pack (ResNet-20, 8 CIFAR-10 test images vs Textures, FGSM, MSP,
    the ood evaluator) with ``changes`` (dotted key -> value; a list index as a number, a new list item by
    index ``len``) applied; ``<tmp>`` in a value stands for the folder above ``folder``. Returns its path."""
    import yaml

    cfg: dict = {
        "name": name, "batch_size": 8, "limit": 8,
        "model": {"arch": "resnet20", "checkpoint": str(data_root / "resnet20_cifar10.pt"), "num_classes": 10,
                  "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]},
        "data": {"root": str(data_root), "dataset": "cifar10",
                 "id": {"kind": "npz", "path": "cifar10_test.npz", "name": "cifar10"},
                 "ood": [{"kind": "npz", "path": "texture_test.npz", "name": "texture"}]},
        "attacks": ["fgsm"], "detectors": "msp", "evaluators": ["ood"], "analyses": []}
    for key, value in (changes or {}).items():
        *parents, last = key.split(".")
        node = cfg
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            node.append(value)
        else:
            node[last] = value
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg).replace("<tmp>", str(folder.parent)))
    return str(path)


@pytest.fixture()
def fresh_registry():
    """A registry of the test's own: the installed plugins and families, discovered, in a copy that is the default
    registry for the test (what it registers, overrides or makes ends with it)."""
    from advopenood import registry

    for kind in registry.KINDS:
        registry.discover(kind)
    with registry.using(registry.default().copy()) as reg:
        yield reg


@pytest.fixture()
def empty_registry():
    """An empty registry, the default for the test: no plugin, no family, no entry point to discover."""
    from advopenood import registry

    reg = registry.Registry()
    reg.discovered.update(registry.KINDS)
    with registry.using(reg):
        yield reg


def registered(plugins: dict):
    """Register ``{(kind, name): class}`` for the duration of a fixture (a generator: ``yield from``)."""
    from advopenood import registry

    for (kind, name), obj in plugins.items():
        registry.register(kind, name)(obj)
    yield
    for kind, name in plugins:
        registry.unregister(kind, name)


def edited_copy(out: Path, tmp_path: Path, table: str, column: str, delta: float = -1.0, row: int = 0) -> Path:
    """A copy of the run folder ``out`` with one cell of ``table`` moved by ``delta`` (written at CSV precision),
    for tests that expect ``advopenood verify`` to find exactly that difference."""
    import shutil

    import pandas as pd

    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    frame = pd.read_csv(copy / table)
    frame[column] = frame[column].astype(float)  # a column of whole numbers reads back as integers
    frame.loc[row, column] += delta
    frame.to_csv(copy / table, index=False, float_format="%.6g")
    return copy


#: the sentence :func:`section_sentence_added` types into a section: a ranking no table states
ADDED_SENTENCE = "MSP is the most robust detector."


def section_sentence_added(out: Path, tmp_path: Path, title: str, source: str = "") -> Path:
    """A copy of the run folder ``out`` whose report section ``title`` holds :data:`ADDED_SENTENCE` (a bullet
    after the section's first list, else a paragraph; a new section of plugin ``source`` where the run wrote none
    of that title), in ``report_sections.json`` and in ``report.md`` and ``report.html`` written again from it, and
    ``manifest.json`` written again with the files' digests: as a hand that edited the report would; only
    re-rendering the section from its tables can find the sentence."""
    import json
    import shutil

    from advopenood.io import sha256_file
    from advopenood.outputs.report import write_report

    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    saved = json.loads((copy / "report_sections.json").read_text())
    section = next((s for s in saved["sections"] if s["title"] == title), None)
    if section is None:
        section = {"title": title, "source": source, "items": []}
        saved["sections"].append(section)
    bullets = next((i for i in section["items"] if i.get("kind") == "bullets"), None)
    if bullets is not None:
        bullets["items"].append(ADDED_SENTENCE)
    else:
        section["items"].append({"kind": "paragraph", "text": ADDED_SENTENCE})
    (copy / "report_sections.json").write_text(json.dumps(saved))
    write_report(copy)
    assert ADDED_SENTENCE in (copy / "report.md").read_text()
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["files"] = {rel: sha256_file(copy / rel) for rel in manifest["files"] if (copy / rel).is_file()}
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def assert_section_rerendered(out: Path, tmp_path: Path, title: str, source: str = "") -> None:
    """``advopenood verify`` re-renders the report section ``title`` from the run's tables: the untouched folder
    verifies clean with no plugin's sections taken as saved, and :func:`section_sentence_added`'s copy is one
    difference per added sentence (the section's title too for a new section of ``source``), naming it and the
    section."""
    from advopenood.evaluation.verify import verify_run

    found = verify_run(out)
    assert found.differences == [], found  # (a module's other tests may re-draw a shared folder's plots: files aside)
    assert not [n for n in found.notes if "declares no report_sections" in n], found.notes
    edited = verify_run(section_sentence_added(out, tmp_path, title, source))
    assert edited.files == [], edited.files
    added = [title, ADDED_SENTENCE] if source else [ADDED_SENTENCE]
    assert edited.differences == [f"report_sections.json: section {title!r}: {text!r} is not a sentence the run's "
                                  "files render (the section, or a table it reads, was edited)" for text in added]
