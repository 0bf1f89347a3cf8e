"""Detector work in the store: a re-run fits and scores nothing, a changed parameter recomputes one detector."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from advopenood.cli.main import main

REPO = Path(__file__).resolve().parents[1]


def _run(tmp_path: Path, cache: Path, out: str, knn_k: int) -> dict:
    cfg = yaml.safe_load((REPO / "configs" / "cifar10_resnet20.yaml").read_text())
    cfg["data"]["ood"] = cfg["data"]["ood"][:2]
    cfg["data"]["fit_limit"] = 1000
    cfg["detector_params"] = {"knn": {"K": knn_k}}
    cfg["batch_size"] = 16  # several batches per scored set of 40: stored outputs are read back batch by batch
    path = tmp_path / f"cfg_{knn_k}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["run", "--config", str(path), "--data-root", str(REPO.parent / "shared" / "data"), "--limit", "40",
                 "--attack", "fgsm", "--detectors", "msp,mds,knn", "--evaluator", "ood", "--out", str(tmp_path / out),
                 "--cache-dir", str(cache), "--quiet"]) == 0
    return json.loads((tmp_path / out / "run.json").read_text())["detector_work"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data_root) -> tuple[Path, list[dict]]:
    tmp = tmp_path_factory.mktemp("scorecache")
    cache = tmp / "cache"
    work = [_run(tmp, cache, "first", 50), _run(tmp, cache, "second", 50), _run(tmp, cache, "third", 7)]
    return tmp, work


def test_first_run_computes_every_score_set(runs):
    _, (first, _, _) = runs
    # 3 detectors x (id, tin, mnist, fgsm)
    assert first == {"fitted": 3, "fits_reused": 0, "fits_computed": 2, "fit_states_reused": 0, "fit_pass_computed": 1,
                     "fit_pass_reused": 0, "set_passes_computed": 4, "set_passes_reused": 0,
                     "score_sets_computed": 12, "score_sets_reused": 0, "selection_sets_computed": 0,
                     "selection_sets_reused": 0}


def test_identical_rerun_fits_nothing_and_gives_identical_results(runs):
    tmp, (_, second, _) = runs
    assert second == {"fitted": 0, "fits_reused": 3, "fits_computed": 0, "fit_states_reused": 0, "fit_pass_computed": 0,
                      "fit_pass_reused": 0, "set_passes_computed": 0, "set_passes_reused": 0,
                      "score_sets_computed": 0, "score_sets_reused": 12, "selection_sets_computed": 0,
                      "selection_sets_reused": 0}
    assert (tmp / "first" / "ood.csv").read_text() == (tmp / "second" / "ood.csv").read_text()
    for det in ("msp", "mds", "knn"):
        a, b = np.load(tmp / "first" / "scores" / f"{det}.npz"), np.load(tmp / "second" / "scores" / f"{det}.npz")
        assert all(np.array_equal(a[k], b[k]) for k in a.files)


def test_changed_parameter_recomputes_only_that_detector(runs):
    tmp, (_, _, third) = runs
    # KNN refits from the stored fit pass and scores from each set's stored outputs: no network pass at all
    assert third == {"fitted": 1, "fits_reused": 2, "fits_computed": 1, "fit_states_reused": 0, "fit_pass_computed": 0,
                     "fit_pass_reused": 1, "set_passes_computed": 0, "set_passes_reused": 4,
                     "score_sets_computed": 4, "score_sets_reused": 8, "selection_sets_computed": 0,
                     "selection_sets_reused": 0}
    a, b = np.load(tmp / "first" / "scores" / "knn.npz"), np.load(tmp / "third" / "scores" / "knn.npz")
    assert not np.array_equal(a["id"], b["id"])
    a, b = np.load(tmp / "first" / "scores" / "mds.npz"), np.load(tmp / "third" / "scores" / "mds.npz")
    assert np.array_equal(a["id"], b["id"])


def test_scores_from_stored_set_outputs_equal_a_fresh_run(runs):
    """KNN with K = 7 scored from the stored logits and features equals KNN with K = 7 in a run with an empty
    cache (its own network pass over every set), bit for bit."""
    tmp, (_, _, third) = runs
    fresh = _run(tmp, tmp / "fresh_cache", "fresh", 7)
    assert third["set_passes_reused"] == 4 and fresh["set_passes_computed"] == 4
    a, b = np.load(tmp / "third" / "scores" / "knn.npz"), np.load(tmp / "fresh" / "scores" / "knn.npz")
    assert a.files == b.files and all(np.array_equal(a[k], b[k]) for k in a.files)


def test_corrupt_score_file_is_recomputed(runs):
    tmp, _ = runs
    cache = tmp / "cache" / "scores"
    victim = sorted(cache.glob("msp-*/*.npy"))[0]
    victim.write_bytes(victim.read_bytes()[:-8] + b"\0" * 8)
    with pytest.warns(UserWarning, match="does not match its checksum"):
        work = _run(tmp, tmp / "cache", "fourth", 7)
    assert work["score_sets_computed"] == 1 and work["fitted"] == 1 and work["fits_computed"] == 0
    assert (tmp / "fourth" / "ood.csv").read_text() == (tmp / "third" / "ood.csv").read_text()


def test_fit_work_is_read_back(cifar_model, pack_set, cifar_batch, tmp_path):
    """GRAM's fitted state and the fit pass come back from the store: a second fit runs no pass for GRAM, a
    detector without a stored state refits from the stored fit pass, and the scores are unchanged; a corrupt
    fit-pass file is recomputed with a warning."""
    import torch

    from advopenood.detection.scoring import fit_detectors
    from advopenood.detection.scorecache import ScoreCache

    fit, cache = pack_set("cifar10_train", "cifar10_train_10k.npz", 200), ScoreCache(tmp_path / "scores")
    kwargs = dict(batch_size=64, device="cpu", seed=0, progress=False, cache=cache, model_hash="resnet20")
    x = cifar_batch[0]
    score = lambda bank: bank.score({"x": lambda: [(x, torch.zeros(len(x)))]}, progress=False)
    first = fit_detectors(["gram", "mds"], "pytorch-ood", cifar_model, fit, **kwargs)
    assert first.work == {"fits_computed": 2, "fit_states_reused": 0, "fit_pass_computed": 1, "fit_pass_reused": 0}
    gram = fit_detectors(["gram"], "pytorch-ood", cifar_model, fit, **kwargs)
    assert gram.work == {"fits_computed": 0, "fit_states_reused": 1, "fit_pass_computed": 0, "fit_pass_reused": 0}
    mds = fit_detectors(["mds"], "pytorch-ood", cifar_model, fit, **kwargs)
    assert mds.work == {"fits_computed": 1, "fit_states_reused": 0, "fit_pass_computed": 0, "fit_pass_reused": 1}
    assert np.array_equal(score(first)["gram"]["x"], score(gram)["gram"]["x"])
    assert np.array_equal(score(first)["mds"]["x"], score(mds)["mds"]["x"])
    victim = next((tmp_path / "scores" / "_fit").glob("fitpass-*.pt"))
    victim.write_bytes(victim.read_bytes()[:-8] + b"\0" * 8)
    with pytest.warns(UserWarning, match="does not match its checksum"):
        again = fit_detectors(["mds"], "pytorch-ood", cifar_model, fit, **kwargs)
    assert again.work["fit_pass_computed"] == 1
    assert np.array_equal(score(first)["mds"]["x"], score(again)["mds"]["x"])
