"""Nothing stale is served: attack code, the images behind an image list and --recompute (issue 24, item 9);
one --eps for attacks of different threat models is refused (item 10); a changed view of the data (input size,
channels, resizing) is computed again (issue 30, item 13)."""
from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import pack_config
import torch
from PIL import Image

from advopenood import registry
from advopenood.cli.main import main
from advopenood.data.datasets import build_dataset
from advopenood.attacks.store import AdvStore
from advopenood.provenance import code_identity

ATTACK_SRC = '''
import torch
from advopenood.attacks.base import Attack


class Step(Attack):
    name = "zzstep"

    @classmethod
    def defaults(cls, input_size):
        return {"eps": 8 / 255}

    def perturb(self, model, x, y):
        x = x.clone().requires_grad_(True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        grad, = torch.autograd.grad(loss, x)
        return (x + STEP * self.params["eps"] * grad.sign()).clamp(0, 1)
'''


def _load_attack(folder: Path, step: str) -> type:
    """Write the plugin module with ``STEP = step`` and import it afresh (as a new process would); registered in the
    calling test's own registry (``fresh_registry``), so that it does not outlive the test."""
    path = folder / "zzstep_plugin.py"
    path.write_text(ATTACK_SRC.replace("STEP", step))
    # the cached bytecode of the last version goes: "1.0" -> "0.0" keeps the size, and within the same second the
    # mtime, so where Python writes bytecode (the default; not under PYTHONDONTWRITEBYTECODE) it would run the old code
    shutil.rmtree(folder / "__pycache__", ignore_errors=True)
    spec = importlib.util.spec_from_file_location("zzstep_plugin", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["zzstep_plugin"] = module
    spec.loader.exec_module(module)
    registry.register("attacks", "zzstep")(module.Step)
    return module.Step


def test_editing_an_attacks_code_recomputes_its_sets(tmp_path, cifar_model, pack_set, fresh_registry):
    ds = pack_set("cifar10", "cifar10_test.npz", 32)
    store = AdvStore(tmp_path / "adv", shard_size=16)
    kwargs = dict(model_hash="m", seed=0, device=torch.device("cpu"), progress=False)
    strong = store.generate(ds, cifar_model, _load_attack(tmp_path, "1.0")(), **kwargs)
    assert strong.stats["generated"] == 2
    again = store.generate(ds, cifar_model, _load_attack(tmp_path, "1.0")(), **kwargs)
    assert again.key == strong.key and again.stats["reused"] == 2
    # the author turns perturb into a no-op: the old (successful) shards must not be served
    noop = store.generate(ds, cifar_model, _load_attack(tmp_path, "0.0")(), **kwargs)
    assert noop.key != strong.key and noop.stats["generated"] == 2
    assert strong.records["success"].mean() > 0.5 and noop.records["success"].mean() < 0.3


def test_code_identity_names_the_distribution_of_a_builtin():
    ident = code_identity(registry.get("attacks", "pgd"))
    assert ident["distribution"].startswith("advopenood==") and len(ident["files"]) >= 2


def _imglist_root(root: Path, data_root: Path, n: int, invert_ood: bool) -> Path:
    """An OpenOOD layout with ``n`` CIFAR-10 test images (ID) and ``n`` Tiny-ImageNet images (OOD) as PNGs."""
    for name, file, label in (("cifar10", "cifar10_test.npz", True), ("tin", "tin_test.npz", False)):
        with np.load(data_root / file) as d:
            x, y = d["x"][:n], d["y"][:n]
        folder = root / "images_classic" / name
        folder.mkdir(parents=True, exist_ok=True)
        lines = []
        for i, img in enumerate(x):
            img = 255 - img if (invert_ood and name == "tin") else img
            Image.fromarray(img).save(folder / f"{i}.png")
            lines.append(f"{name}/{i}.png {int(y[i]) if label else -1}")
        lists = root / "benchmark_imglist" / "cifar10"
        lists.mkdir(parents=True, exist_ok=True)
        (lists / f"test_{name}.txt").write_text("\n".join(lines) + "\n")
    return root


@pytest.mark.parametrize("how", ["stat", "content"])
def test_other_images_behind_the_same_list_have_another_identity(tmp_path, data_root, how):
    spec = {"kind": "openood", "imglist": "benchmark_imglist/cifar10/test_tin.txt", "name": "tin"}
    a = build_dataset(spec, _imglist_root(tmp_path / "a", data_root, 8, False), 3, 32, how)
    b = build_dataset(spec, _imglist_root(tmp_path / "b", data_root, 8, True), 3, 32, how)
    assert a.identity()["source"] == b.identity()["source"]  # the list files are identical
    assert a.identity() != b.identity()


def test_content_identity_survives_a_copy(tmp_path, data_root):
    import shutil

    spec = {"kind": "openood", "imglist": "benchmark_imglist/cifar10/test_tin.txt", "name": "tin"}
    a = _imglist_root(tmp_path / "a", data_root, 8, False)
    shutil.copytree(a, tmp_path / "b")  # new modification times, same bytes
    assert build_dataset(spec, a, 3, 32, "content").identity() == \
        build_dataset(spec, tmp_path / "b", 3, 32, "content").identity()


def _cfg(root: Path, data_root: Path, how: str = "stat") -> str:
    import yaml

    cfg = {"name": "stale", "batch_size": 32,
           "model": {"arch": "resnet20", "checkpoint": str(data_root / "resnet20_cifar10.pt"), "num_classes": 10,
                     "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]},
           "data": {"root": str(root), "dataset": "cifar10", "image_identity": how,
                    "id": {"kind": "openood", "imglist": "benchmark_imglist/cifar10/test_cifar10.txt",
                           "name": "cifar10"},
                    "ood": [{"kind": "openood", "imglist": "benchmark_imglist/cifar10/test_tin.txt", "name": "tin"}]},
           "attacks": [], "detectors": "msp", "evaluators": ["ood"], "analyses": []}
    path = root / "stale.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


@pytest.mark.parametrize("how,id_reused", [("stat", 0), ("content", 1)])
def test_a_run_on_other_images_behind_the_same_lists_recomputes(tmp_path, data_root, capsys, how, id_reused):
    """The issue's case: a second data root with the same lists and inverted Tiny-ImageNet images, same cache.
    Under ``stat`` the copied ID images (new modification times) are scored again too; under ``content`` they
    are recognised and read back."""
    cache = tmp_path / "cache"
    aucs, work = [], []
    for which, invert in (("a", False), ("b", True), ("fresh", True)):
        root = _imglist_root(tmp_path / which, data_root, 48, invert)
        out = tmp_path / f"out_{which}"
        args = ["run", "--config", _cfg(root, data_root, how), "--out", str(out), "--quiet"]
        assert main([*args, "--cache-dir", str(cache if which != "fresh" else tmp_path / "cache2")]) == 0
        ood = json.loads((out / "run.json").read_text())["detector_work"]
        work.append(ood)
        import pandas as pd

        aucs.append(float(pd.read_csv(out / "ood.csv").query("ood_set == 'tin'")["auroc"].iloc[0]))
    assert work[1]["score_sets_reused"] == id_reused  # the inverted set is never read back
    assert aucs[1] == aucs[2] != aucs[0]


def test_recompute_regenerates_chosen_attacks_and_detectors(tmp_path, data_root, capsys):
    root = _imglist_root(tmp_path / "a", data_root, 32, False)
    base = ["run", "--config", _cfg(root, data_root), "--quiet", "--cache-dir", str(tmp_path / "cache"),
            "--attack", "fgsm", "--detectors", "msp,ebo"]
    assert main([*base, "--out", str(tmp_path / "o1")]) == 0
    assert main([*base, "--out", str(tmp_path / "o2"), "--recompute", "fgsm,msp"]) == 0
    info = json.loads((tmp_path / "o2" / "run.json").read_text())
    assert info["attacks"]["fgsm"]["generated"] == 1 and info["attacks"]["fgsm"]["reused"] == 0
    # msp's three vectors computed again, ebo's read back
    assert info["detector_work"]["score_sets_computed"] == 3 and info["detector_work"]["score_sets_reused"] == 3
    first = np.load(tmp_path / "o1" / "scores" / "msp.npz")
    second = np.load(tmp_path / "o2" / "scores" / "msp.npz")
    assert all(np.array_equal(first[k], second[k]) for k in first.files)
    rc = main([*base, "--out", str(tmp_path / "o3"), "--recompute", "pgd"])
    assert rc == 2 and "neither an attack set nor a detector" in capsys.readouterr().err


@pytest.mark.parametrize("attacks", ["pgd,mead_pgd_ce_l2", "mead_pgd_ce_linf,mead_pgd_ce_l1"])
def test_one_eps_for_two_threat_models_is_refused(attacks, capsys):
    rc = main(["run", "--config", "demo", "--attack", attacks, "--eps", "8/255"])
    err = capsys.readouterr().err
    assert rc == 2 and "different threat models" in err and "Traceback" not in err and len(err.splitlines()) == 1


def test_one_eps_for_one_threat_model_applies(capsys):
    from advopenood.config.loading import apply_overrides, load_config
    from advopenood.config.plan import expand_attacks

    cfg, folder = load_config("demo")
    cfg = apply_overrides(cfg, config_dir=folder, attack="pgd,fgsm,df", eps="4/255")
    specs = {s.set_name: s.params["eps"] for s in expand_attacks(cfg, 16)}
    assert specs["pgd"] == specs["fgsm"] == pytest.approx(4 / 255) and specs["df"] != pytest.approx(4 / 255)


@pytest.fixture(scope="module")
def view_cache(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> Path:
    """A store holding the attacks and scores of the unchanged tiny run."""
    root = tmp_path_factory.mktemp("view")
    cfg = pack_config(root, data_root, name="view")
    args = ["run", "--config", cfg, "--out", str(root / "out"), "--cache-dir", str(root / "cache"), "--quiet"]
    assert main(args) == 0
    return root / "cache"


#: a setting that changes the tensors the model sees, and what must be computed again: the ID attack, and which
#: score sets (of id, texture and fgsm: 3) at least
VIEW_CHANGES = [
    ("model.input_size", 40, True, 3),
    ("data.id.pre_size", 36, True, 2),
    ("data.ood.0.pre_size", 36, False, 1),
]


@pytest.mark.parametrize("key,value,attacked,scored", VIEW_CHANGES, ids=[c[0] for c in VIEW_CHANGES])
def test_a_changed_view_of_the_data_is_computed_again(tmp_path, data_root, view_cache, key, value, attacked, scored):
    """Issue 30, item 13: a run with another input size or resizing on the same store recomputes what the change
    touches and gets a fresh run's scores (the old size's attacks and scores were served before, exit 0)."""
    cfg = pack_config(tmp_path, data_root, {key: value}, name="view")
    scores = []
    for which, cache in (("shared", view_cache), ("fresh", tmp_path / "fresh")):
        out = tmp_path / which
        assert main(["run", "--config", cfg, "--out", str(out), "--cache-dir", str(cache), "--quiet"]) == 0
        info = json.loads((out / "run.json").read_text())
        with np.load(out / "scores" / "msp.npz") as d:
            scores.append({k: d[k] for k in d.files})
        if which == "shared":
            assert info["attacks"]["fgsm"]["reused"] == (0 if attacked else 1)
            assert info["detector_work"]["score_sets_computed"] >= scored
    assert scores[0].keys() == scores[1].keys()
    assert all(np.array_equal(scores[0][k], scores[1][k]) for k in scores[0])


@pytest.mark.parametrize("kind", ["npz", "openood"])
@pytest.mark.parametrize("view", [{"channels": 1}, {"size": 40}, {"pre_size": 36}],
                         ids=["channels", "size", "pre_size"])
def test_every_setting_of_the_model_view_enters_the_identity(tmp_path, data_root, kind, view):
    """Channel count, input size and resize-and-crop size each give a dataset another identity (another key)."""
    if kind == "npz":
        root, spec = data_root, {"kind": "npz", "path": "tin_test.npz", "name": "tin"}
    else:
        root = _imglist_root(tmp_path, data_root, 4, False)
        spec = {"kind": "openood", "imglist": "benchmark_imglist/cifar10/test_tin.txt", "name": "tin"}
    base = {"channels": 3, "size": 32, "pre_size": None}
    changed = {**base, **view}
    a = build_dataset(spec, root, base["channels"], base["size"]).identity()
    b = build_dataset({**spec, "pre_size": changed["pre_size"]}, root, changed["channels"], changed["size"]).identity()
    assert a != b and a["source"] == b["source"]
