"""The content-addressed store: keys, resume, checksums, float-exact round trip, streaming reads."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from advopenood import registry
from advopenood.data.datasets import Subset, stack
from advopenood.models.classifier import weights_hash
from advopenood.attacks.store import AdvStore
from advopenood.detection.scorecache import ScoreCache


@pytest.fixture(scope="module")
def small(cifar_test):
    return Subset(cifar_test, np.arange(40))


def fgsm(**params):
    cls = registry.get("attacks", "fgsm")
    return cls(**{**cls.defaults(32), **params})


def gen(store, ds, model, attack, seed=0):
    return store.generate(ds, model, attack, model_hash=weights_hash(model), seed=seed,
                          device=torch.device("cpu"), progress=False)


def test_round_trip_is_float_exact_and_records_are_right(tmp_path, small, cifar_model):
    store = AdvStore(tmp_path, shard_size=16)
    adv = gen(store, small, cifar_model, fgsm())
    assert adv.stats == {"shards": 3, "generated": 3, "reused": 0, "regenerated": 0, "recomputed": False,
                         "seconds": adv.stats["seconds"]} and adv.stats["seconds"] > 0
    x, y = stack(small)
    direct = torch.cat([fgsm()(cifar_model, x[i:i + 16], y[i:i + 16], seed=s)
                        for i, s in zip(range(0, 40, 16), [adv_seed(i) for i in range(3)])])
    stored = torch.cat([b for b, _ in adv.iter_batches(7)])
    assert torch.equal(stored, direct)
    r = adv.records
    assert list(r["index"]) == list(range(40)) and (r.y.to_numpy() == y.numpy()).all()
    with torch.no_grad():
        assert (r.adv_pred.to_numpy() == cifar_model(stored).argmax(1).numpy()).all()
    assert np.allclose(r.linf, (stored - x).flatten(1).abs().amax(1).numpy())
    assert (r.success == (r.adv_pred != r.y)).all()
    assert torch.equal(adv.load(np.array([39, 0, 17])), stored[[39, 0, 17]])


def adv_seed(i: int) -> int:
    from advopenood.provenance import derive_seed

    return derive_seed(0, i)


def test_second_run_reuses_everything_and_key_tracks_inputs(tmp_path, small, cifar_model):
    store = AdvStore(tmp_path, shard_size=16)
    first = gen(store, small, cifar_model, fgsm())
    again = gen(store, small, cifar_model, fgsm())
    assert again.stats["generated"] == 0 and again.stats["reused"] == 3 and again.key == first.key
    assert gen(store, small, cifar_model, fgsm(), seed=1).key != first.key
    assert gen(store, small, cifar_model, fgsm(eps=4 / 255)).key != first.key
    assert gen(store, Subset(small.base, np.arange(1, 41)), cifar_model, fgsm()).key != first.key
    assert (first.path / "manifest.json").is_file() and (first.path / "spec.json").is_file()
    assert first.path.name.startswith("fgsm-") and first.attack == "fgsm"


def test_interrupted_run_resumes_at_missing_shard(tmp_path, small, cifar_model):
    store = AdvStore(tmp_path, shard_size=16)
    full = gen(store, small, cifar_model, fgsm())
    reference = [s.read_bytes() for s in full.shards]
    full.shards[2].unlink()
    (full.shards[1].parent / (full.shards[1].name + ".sha256")).unlink()
    resumed = gen(store, small, cifar_model, fgsm())
    assert resumed.stats["generated"] == 2 and resumed.stats["reused"] == 1
    assert [s.read_bytes() for s in resumed.shards] == reference


def test_corrupt_shard_is_regenerated_with_a_warning(tmp_path, small, cifar_model):
    store = AdvStore(tmp_path, shard_size=16)
    full = gen(store, small, cifar_model, fgsm())
    good = full.shards[0].read_bytes()
    data = bytearray(good)
    data[-100] ^= 0xFF
    full.shards[0].write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="checksum"):
        again = gen(store, small, cifar_model, fgsm())
    assert again.stats["regenerated"] == 1 and again.stats["generated"] == 1
    assert again.shards[0].read_bytes() == good


def test_masked_streaming_keeps_order(tmp_path, small, cifar_model):
    adv = gen(AdvStore(tmp_path, shard_size=16), small, cifar_model, fgsm())
    mask = np.arange(40) % 3 == 0
    picked = torch.cat([b for b, _ in adv.iter_batches(5, mask=mask)])
    assert torch.equal(picked, adv.load(np.nonzero(mask)[0]))


def _leftovers(folder, age: float) -> dict[str, object]:
    """What a writer killed mid-write leaves (ours, ``age`` seconds old), a running writer's fresh temporary file,
    and files that only look alike (not ours: they must stay)."""
    import os
    import time

    folder.mkdir(parents=True, exist_ok=True)
    paths = {"stale": folder / ".shard_00001.npz.k3x_9q2a.tmp", "fresh": folder / ".shard_00002.npz.ab12cd34.tmp",
             "notes": folder / ".notes.tmp", "plain": folder / "shard.tmp", "short": folder / ".x.abc.tmp"}
    for path in paths.values():
        path.write_bytes(b"partial")
    for key in ("stale", "notes", "plain", "short"):
        os.utime(paths[key], (time.time() - age, time.time() - age))
    return paths


@pytest.mark.parametrize("opener, sub", [(AdvStore, "fgsm-0123456789abcdef"), (ScoreCache, "_parts/0123")])
def test_opening_the_store_removes_what_a_killed_writer_left(tmp_path, opener, sub):
    """Issue 39, item 12: kill -9 during a write leaves ``.<name>.<random>.tmp`` beside the store's files. Opening
    the store (or the score cache) removes ours once no running writer can hold them (a day old here; the bound
    is an hour), and nothing else."""
    paths = _leftovers(tmp_path / sub, 24 * 3600)
    opener(tmp_path)
    assert not paths["stale"].exists()
    assert all(paths[k].read_bytes() == b"partial" for k in ("fresh", "notes", "plain", "short"))


def test_a_shard_under_its_lock_removes_its_own_temporary_files(tmp_path, small, cifar_model):
    """A shard regenerated under its lock: that shard's temporary files are nobody's, whatever their age."""
    store = AdvStore(tmp_path, shard_size=16)
    adv = gen(store, small, cifar_model, fgsm())
    adv.shards[1].unlink()  # killed while writing shard 1: no shard, a fresh temporary file beside it
    left = adv.path / f".{adv.shards[1].name}.zz99yy88.tmp"
    other = adv.path / ".spec.json.ab12cd34.tmp"  # another name's: not under this lock, too young
    left.write_bytes(b"partial")
    other.write_bytes(b"partial")
    again = gen(store, small, cifar_model, fgsm())
    assert again.stats["generated"] == 1 and not left.exists() and other.exists()


#: a valid entry of ``costs.json`` (another attack's), kept through a rewrite
OTHER_COST = {"attack": "pgd", "seconds_per_image": 0.5, "images": 8}


@pytest.mark.parametrize("content, kept", [
    ("[1, 2]", {}),                                                    # a JSON list
    ("{not json", {}),
    ('{"k": "abc"}', {}),                                              # an entry that is not a mapping
    (json.dumps({"k": {"seconds_per_image": "fast"}, "other": OTHER_COST}), {"other": OTHER_COST}),
])
def test_a_corrupt_cost_file_is_one_warning_and_never_costs_the_finished_set(tmp_path, small, cifar_model, content,
                                                                             kept):
    """Issue 49, item 3: ``costs.json`` holds estimates, never a set's data. A file that does not read as costs gave
    a traceback (the estimate) or lost the finished set (the record, before the manifest); now the estimate is
    unavailable with one warning, the set is complete, and the file is rewritten whole with its valid entries."""
    from advopenood.attacks.store import COSTS_FILE, cost_key

    (tmp_path / COSTS_FILE).write_text(content)
    store = AdvStore(tmp_path, shard_size=16)
    attack, model_hash = fgsm(), weights_hash(cifar_model)
    with pytest.warns(UserWarning) as caught:
        assert store.cost(attack, model_hash, "cpu") is None
        adv = gen(store, Subset(small, np.arange(8)), cifar_model, attack)
    said = [str(w.message) for w in caught if COSTS_FILE in str(w.message)]
    assert len(said) == 1 and "the attack time estimates it held are unavailable" in said[0], said
    assert (adv.path / "manifest.json").is_file() and adv.stats["generated"] == 1
    costs = json.loads((tmp_path / COSTS_FILE).read_text())
    key = cost_key(attack, model_hash, "cpu")
    assert set(costs) == {key, *kept} and all(costs[k] == v for k, v in kept.items())
    assert AdvStore(tmp_path).cost(attack, model_hash, "cpu") == pytest.approx(costs[key]["seconds_per_image"])
