"""Names from the config become paths and keys: a safe character set, unique across the ID, OOD and attack sets,
``id`` reserved, refused at preflight before any work (issue 30, item 14)."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import pack_config

from advopenood.cli.main import main
from advopenood.config.loading import load_config, validate
from advopenood.run.preflight import check_names

REPO = Path(__file__).resolve().parents[1]


TIN = {"kind": "npz", "path": "tin_test.npz", "name": "tin"}

#: (case id, config changes, what the one-line error names)
HOSTILE = [
    ("label-dotdot", {"attacks": [{"name": "fgsm", "label": "../x"}]}, "attack set of 'fgsm'"),
    ("label-absolute", {"attacks": [{"name": "fgsm", "label": "<tmp>/escape"}]}, "attack set of 'fgsm'"),
    ("dataset-dotdot", {"data.dataset": "../../../escape"}, "data.dataset"),
    ("dataset-slash", {"data.dataset": "cifar/10"}, "data.dataset"),
    ("id-name-slash", {"data.id.name": "sub/cifar10", "data.dataset": None}, "data.id.name"),
    ("ood-named-id", {"data.ood.0.name": "id"}, "data.ood[0].name"),
    ("ood-named-ID", {"data.ood.0.name": "ID"}, "data.ood[0].name"),
    ("ood-duplicate", {"data.ood.+": {**TIN, "name": "texture"}}, "data.ood[1].name"),
    ("ood-duplicate-case", {"data.ood.+": {**TIN, "name": "Texture"}}, "data.ood[1].name"),
    ("ood-duplicate-stem", {"data.ood.0.name": None, "data.ood.+": {"kind": "npz", "path": "texture_test.npz"}},
     "data.ood[1].name"),
    ("ood-named-like-attack", {"data.ood.0.name": "fgsm"}, "attack set of 'fgsm'"),
    ("ood-named-like-label", {"attacks": [{"name": "fgsm", "label": "texture"}]}, "attack set of 'fgsm'"),
    ("ood-named-like-mask", {"data.ood.0.name": "fgsm.success"}, "data.ood[0].name"),
    ("ood-named-like-id-set", {"data.ood.0.name": "cifar10"}, "data.ood[0].name"),
    ("ood-dotfile", {"data.ood.0.name": ".hidden"}, "data.ood[0].name"),
    ("ood-space", {"data.ood.0.name": "my textures"}, "data.ood[0].name"),
    ("attack-duplicate-case", {"attacks": [{"name": "fgsm", "label": "weak"},
                                           {"name": "fgsm", "eps": 0.01, "label": "Weak"}]}, "attack set of 'fgsm'"),
]


@pytest.mark.parametrize("changes,key", [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE])
def test_a_hostile_name_is_refused_before_any_work(tmp_path, data_root, capsys, changes, key):
    """Exit 2 with one line naming the key and the valid choices; no output folder, no cache, nothing outside."""
    work = tmp_path / "work"
    work.mkdir()
    cfg = pack_config(work, data_root, changes, name="names")
    out, cache = work / "out", work / "cache"
    rc = main(["run", "--config", cfg, "--out", str(out), "--cache-dir", str(cache), "--export-png", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert key in err and "valid choices" in err
    assert sorted(p.name for p in work.iterdir()) == ["names.yaml"]  # nothing computed, nothing written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]  # nothing beside it either


@pytest.mark.parametrize("config", sorted(p.stem for p in (REPO / "configs").glob("*.yaml")))
def test_every_shipped_config_has_valid_names(config):
    cfg, _ = load_config(config)
    check_names(validate(cfg))


VALID = [
    ("sweep-and-label", {"attacks": [{"name": "pgd", "eps": [0.01, 0.03], "label": "pgd_weak+1"}, "fgsm"]}),
    ("dataset-equals-id-name", {"data.dataset": "cifar10", "data.id.name": "cifar10"}),
    ("names-from-stems", {"data.dataset": None, "data.id.name": None, "data.ood.0.name": None}),
    ("id-set-named-id", {"data.dataset": None, "data.id.name": "id"}),
]


@pytest.mark.parametrize("changes", [c[1] for c in VALID], ids=[c[0] for c in VALID])
def test_safe_unique_names_pass(tmp_path, data_root, changes):
    cfg, _ = load_config(pack_config(tmp_path, data_root, changes, name="names"))
    check_names(validate(cfg))
