"""Detectors on real data: the 16 built-ins on CIFAR-10 ResNet-20, the shared pass, bad input, the ood evaluator.

Uses the benchmark data pack (conftest's ``data_root``): 256 CIFAR-10 test images as ID, 384 training images
to fit, 128 MNIST images as natural OOD and a PGD-5 set made from 128 of the ID images.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import make_plan
from advopenood import registry
from advopenood.evaluation.context import CleanRecord, RunContext
from advopenood.data.datasets import limit_dataset, make_loader
from advopenood.detection.postprocessor import Postprocessor, vim_dim
from advopenood.detection.outputs import Taps, fc_layer, grad_outputs
from advopenood.detection.bank import create_detector, fit_subset
from advopenood.detection.scoring import fit_detectors, score_all
from advopenood.detection.openood_backend import resolve_backend
from advopenood.errors import UsageError
from advopenood.evaluation.metrics import ood_metrics
from advopenood.models.classifier import weights_hash
from advopenood.attacks.store import AdvStore
from advopenood.provenance import seeded
from advopenood_plugins.detectors import BUILTIN_DETECTORS
from advopenood_plugins.detectors.gram import gram_statistics, gram_vectors

ALL = list(BUILTIN_DETECTORS)
BS = 128
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def bench(pack_set, cifar_model, tmp_path_factory):
    """Model, data, a PGD set and the shared-pass scores of all 16 detectors (pytorch-ood backend)."""
    model = cifar_model
    id_set = pack_set("cifar10", "cifar10_test.npz", 256)
    fit_set = pack_set("train", "cifar10_train_10k.npz", 384)
    mnist = pack_set("mnist", "mnist_test.npz", 128)
    attack = registry.get("attacks", "pgd")(steps=5, rel_stepsize=0.5)
    adv = AdvStore(tmp_path_factory.mktemp("adv"), shard_size=128).generate(
        limit_dataset(id_set, 128, 0), model, attack, model_hash=weights_hash(model), seed=0, device=CPU, progress=False)
    sets = {"id": lambda: make_loader(id_set, BS), "mnist": lambda: make_loader(mnist, BS),
            "pgd": lambda: adv.iter_batches(BS)}
    result = score_all(ALL, "pytorch-ood", model, fit_set, sets, batch_size=BS, device=CPU, seed=0, progress=False)
    return {"model": model, "id": id_set, "fit": fit_set, "mnist": mnist, "adv": adv, "sets": sets, "result": result}


def test_sixteen_registered_with_descriptions():
    entries = registry.entries("detectors")
    assert set(ALL) <= set(entries)
    assert all(entries[n].description and issubclass(entries[n].obj, Postprocessor) for n in ALL)


def test_every_detector_gives_finite_scores(bench):
    result = bench["result"]
    assert result.backend == "pytorch-ood" and result.errors == {}
    assert list(result.scores) == ALL
    for name, per_set in result.scores.items():
        for set_name, n in (("id", 256), ("mnist", 128), ("pgd", 128)):
            conf = per_set[set_name]
            assert conf.dtype == np.float64 and conf.shape == (n,), (name, set_name)
            assert np.isfinite(conf).all(), (name, set_name)


def test_shared_pass_equals_one_pass_per_detector(bench):
    """Each detector's own OpenOOD-style setup + inference gives the shared pass's scores (to 1e-5)."""
    model, fit = bench["model"], fit_subset(bench["fit"], seed=0)
    fit_loader = make_loader(fit, BS)
    for name in ALL:
        det = create_detector(name, "pytorch-ood", seed=0, batch_size=BS)
        det.setup(model, {"train": fit_loader, "val": fit_loader}, {})
        _, conf, _ = det.inference(model, make_loader(bench["mnist"], BS), progress=False)
        shared = bench["result"].scores[name]["mnist"]
        scale = max(1.0, float(np.abs(shared).max()))
        assert np.abs(conf - shared).max() <= 1e-5 * scale, name


@pytest.fixture(scope="module")
def gram_odin(bench):
    """GRAM and ODIN fitted on 200 training images, and 64 ID plus 64 MNIST test images."""
    bank = fit_detectors(["gram", "odin"], "pytorch-ood", bench["model"], limit_dataset(bench["fit"], 200, 0),
                         batch_size=64, device=CPU, seed=0, progress=False)
    x = torch.cat([next(iter(make_loader(limit_dataset(ds, 64, 0), 64)))[0] for ds in (bench["id"], bench["mnist"])])
    return bank, x


def _pod_gram(model: torch.nn.Module, fit, powers: list[int], seed: int):
    """pytorch-ood's own ``Gram``, fitted with its own pass over the fit rows (the way GRAM fitted before it read
    the shared fit pass): every tapped map is one sequential stage."""
    from pytorch_ood.detector import Gram

    taps, state = Taps(model), {}

    def stage(i: int):
        def run(x: torch.Tensor) -> torch.Tensor:
            if i == 0:
                state["logits"], state["maps"] = taps(x)
            return state["maps"][i]
        return run

    n_maps = len(taps(fit[0][0][None])[1])
    det = Gram(head=lambda _: state["logits"], feature_layers=[stage(i) for i in range(n_maps)], num_classes=10,
               num_poles_list=powers).to("cpu")
    with seeded(seed):
        return det.fit(make_loader(fit, 64))


def _old_way(name: str, det: Postprocessor, model: torch.nn.Module, x: torch.Tensor, fit) -> torch.Tensor:
    """Today's scores from pytorch-ood's classes directly: ``Gram`` fitted by its own ``fit`` and scored by
    ``predict_structured`` on a tapped pass, ``ODIN.predict``."""
    from pytorch_ood.detector import ODIN
    if name == "gram":
        logits, maps = Taps(model)(x)
        gram = _pod_gram(model, fit, list(det.params["powers"]), det.seed)
        return -gram.predict_structured(logits, maps) / logits.softmax(1).max(1).values
    return -ODIN(model, eps=float(det.params["noise"]), temperature=float(det.params["temperature"])).predict(x)


@pytest.fixture(scope="module")
def tapped(bench):
    """GRAM's tapped maps of 100 CIFAR-10 test images (an odd batch: pieces of unequal size) on the trained model."""
    x = next(iter(make_loader(limit_dataset(bench["id"], 100, 0), 100)))[0]
    return Taps(bench["model"])(x)[1]


@pytest.mark.parametrize("power", [1, 2, 3, 4, 5])
def test_gram_fit_statistics_follow_pytorch_ood(tapped, power):
    """The fit's statistics are pytorch-ood's ``Gram._gram_vector`` to the last bit for p <= 3 (torch's ``pow``
    multiplies there too) and within 1e-6 of the largest statistic for p = 4, 5 (repeated multiplication vs
    ``pow``; an odd power's row sums cancel, so a small entry can differ by more than that relative to itself)."""
    from pytorch_ood.detector import Gram
    ours = gram_vectors(tapped, [power])[:, 0]
    theirs = torch.cat([Gram._gram_vector(t, power) for t in tapped], 1)
    if power <= 3:
        assert torch.equal(ours, theirs)
    else:
        assert not torch.equal(ours, theirs) and (ours - theirs).abs().max() <= 1e-6 * theirs.abs().max()


def test_gram_scoring_statistics_agree_and_do_not_depend_on_the_batch(tapped):
    """The scoring statistics (``F^p colsum(F^p)``, in pieces) agree with the fit's (the Gram matrix's row sums)
    to float rounding, and each sample's statistics are the same in a batch of 100 as on its own."""
    powers = [1, 2, 3, 4, 5]
    fast, exact = gram_statistics(tapped, powers), gram_vectors(tapped, powers)
    assert fast.shape == exact.shape == (100, 5, exact.shape[2])
    assert torch.allclose(fast, exact, rtol=1e-4, atol=1e-4 * float(exact.abs().max()))
    for row in (0, 37, 99):
        assert torch.equal(gram_statistics([t[row:row + 1] for t in tapped], powers)[0], fast[row])


@pytest.mark.parametrize("name", ["gram", "odin"])
def test_gram_odin_equal_pytorch_ood(gram_odin, bench, name):
    """The shared-pass GRAM (fitted from the shared fit pass's statistics and scored vectorised) and ODIN equal
    pytorch-ood's classes (GRAM fitted by its own pass) to 1e-5 relative to the score scale (GRAM's deviations
    reach ~1e3), and ``grad_score`` agrees with ``score``."""
    bank, x = gram_odin
    model, det = bench["model"], bank.dets[name]
    old = _old_way(name, det, model, x, fit_subset(limit_dataset(bench["fit"], 200, 0), seed=0)).double()
    new = torch.as_tensor(bank.score({"x": lambda: [(x, torch.zeros(len(x)))]}, progress=False)[name]["x"])
    scale = max(1.0, float(old.abs().max()))
    assert old.std() > 0 and (new - old).abs().max() <= 1e-5 * scale
    grad = det.grad_score(model, x, grad_outputs(model, x)).detach().double()
    assert (grad - new).abs().max() <= 1e-5 * scale


def test_gram_maps_recorded_only_when_needed(gram_odin, bench):
    """The shared pass records the tapped maps only for a bank with GRAM in it."""
    bank, x = gram_odin
    seen = []
    gram = bank.dets["gram"]
    original = type(gram).score
    type(gram).score = lambda self, net, x_, out: seen.append(out.taps is not None) or original(self, net, x_, out)
    try:
        bank.score({"x": lambda: [(x, torch.zeros(len(x)))]}, progress=False, only=["gram"])
        bank.score({"x": lambda: [(x, torch.zeros(len(x)))]}, progress=False, only=["odin"])
    finally:
        type(gram).score = original
    assert seen == [True]


def test_odin_one_backward_one_extra_forward(gram_odin, bench):
    """Per batch: the shared forward (with gradients, as ODIN is scored), ODIN's one backward for the input
    gradient and one forward on the perturbed input (counted at the final layer, which every pass runs)."""
    bank, x = gram_odin
    head, calls = fc_layer(bench["model"]), {"forward": 0, "backward": 0}
    fwd = head.register_forward_hook(lambda *_: calls.__setitem__("forward", calls["forward"] + 1))
    bwd = head.register_full_backward_hook(lambda *_: calls.__setitem__("backward", calls["backward"] + 1))
    try:
        bank.score({"x": lambda: [(x[:32], None), (x[32:], None)]}, progress=False, only=["odin"])
    finally:
        fwd.remove()
        bwd.remove()
    assert calls == {"forward": 2 * 2, "backward": 2}


def test_pgd_breaks_logit_detectors_but_not_mahalanobis(bench):
    """The paper's picture (Table 4, CIFAR-10 PGD): MSP/MLS/EBO/ODIN below 50 AUROC, MDS/RMDS well above."""
    success = bench["adv"].records["success"].to_numpy(bool)
    assert success.mean() > 0.9
    scores = bench["result"].scores
    auroc = {n: ood_metrics(scores[n]["id"], scores[n]["pgd"][success])["auroc"] for n in ALL}
    for name in ("msp", "mls", "ebo", "odin"):
        assert auroc[name] < 50, auroc
    for name in ("mds", "rmds"):
        assert auroc[name] > 70 and auroc[name] > auroc["msp"] + 25, auroc


def test_unknown_detector_lists_valid_names(bench):
    with pytest.raises(UsageError, match=r"unknown detector 'nope'; valid choices: .*msp.*"):
        score_all(["msp", "nope"], "pytorch-ood", bench["model"], bench["fit"], {}, batch_size=BS, device=CPU, seed=0)


def test_bad_backend_and_parameters(bench):
    with pytest.raises(UsageError, match="valid choices: auto, openood, pytorch-ood"):
        resolve_backend("tensorflow")
    with pytest.raises(UsageError, match="unknown parameter 'k' for detector 'knn'; valid choices: K, fit_size"):
        score_all(["knn"], "pytorch-ood", bench["model"], bench["fit"], {}, batch_size=BS, device=CPU, seed=0,
                  params={"knn": {"k": 5}})


@pytest.mark.skipif(resolve_backend("auto") == "openood", reason="OpenOOD is installed here")
def test_openood_backend_without_openood_says_how_to_install():
    with pytest.raises(UsageError, match=r"pip install --no-deps -e \./OpenOOD .*docs/openood\.md") as err:
        resolve_backend("openood")
    assert "'advopenood[openood]'" not in str(err.value)  # advopenood is not on PyPI


@pytest.fixture()
def plugin(fresh_registry):
    """Register test detectors in the test's own registry."""

    def add(name, obj):
        registry.register("detectors", name)(obj)

    return add


class _Broken(Postprocessor):
    """Fails on every batch."""

    def score(self, net, x, out):
        raise RuntimeError("feature width mismatch")


class _PlainMSP:
    """A third-party detector with only OpenOOD's interface (setup / postprocess)."""

    def __init__(self, temperature: float = 1.0):
        self.temperature = temperature

    def setup(self, net, id_loader_dict, ood_loader_dict):
        assert next(iter(id_loader_dict["train"]))["data"].dim() == 4

    @torch.no_grad()
    def postprocess(self, net, data):
        conf, pred = torch.softmax(net(data) / self.temperature, 1).max(1)
        return pred, conf


class _NaN(Postprocessor):
    """Returns NaN for the first sample of every batch."""

    def score(self, net, x, out):
        conf = out.logits.max(1).values.clone()
        conf[0] = float("nan")
        return conf


def test_failing_detector_is_skipped_plain_class_works_nan_kept(bench, plugin):
    plugin("test_broken", _Broken)
    plugin("test_plain", _PlainMSP)
    plugin("test_nan", _NaN)
    result = score_all(["msp", "test_broken", "test_plain", "test_nan"], "pytorch-ood", bench["model"],
                       bench["fit"], {"id": bench["sets"]["id"]}, batch_size=BS, device=CPU, seed=0, progress=False)
    assert list(result.scores) == ["msp", "test_plain", "test_nan"]
    assert result.errors == {"test_broken": "scoring 'id' failed: RuntimeError: feature width mismatch"}
    np.testing.assert_allclose(result.scores["test_plain"]["id"], result.scores["msp"]["id"], rtol=1e-6)
    assert np.isnan(result.scores["test_nan"]["id"]).sum() == 2  # one per batch, kept for the evaluator to report


def test_vim_dim_and_nnguide_bank():
    from advopenood_plugins.detectors.features import nnguide_bank_size

    assert vim_dim(256, 512) == 256 and vim_dim(256, 64) == 32 and vim_dim(1000, 2048) == 1000
    assert nnguide_bank_size(10_000, 0.01, 128, 100) == 128  # OpenOOD stops after the first batch > 1 %
    assert nnguide_bank_size(50_000, 0.01, 200, 100) == 600
    assert nnguide_bank_size(90, 0.01, 128, 100) == 90


def _context(bench, tmp_path, scores, errors) -> RunContext:
    return RunContext(plan=make_plan(batch_size=BS), out=tmp_path, model=bench["model"], id_set=bench["id"],
                      fit_set=bench["fit"], ood_sets={"mnist": bench["mnist"]}, adv_sets={"pgd": bench["adv"]},
                      clean=CleanRecord(np.zeros(1), np.zeros(1)), backend="pytorch-ood", scores=scores,
                      detector_errors=errors)


def test_ood_evaluator_rows_scores_and_table(bench, tmp_path):
    scores = {n: bench["result"].scores[n] for n in ("msp", "mds")}
    scores["nan_det"] = {k: v.copy() for k, v in scores["msp"].items()}
    scores["nan_det"]["mnist"][3] = np.nan
    ctx = _context(bench, tmp_path, scores, {"broken": "fit failed: ValueError: singular"})
    out = registry.get("evaluators", "ood")()(ctx)
    df = out["ood.csv"]
    metrics = [c for m in ("fpr95", "auroc", "aupr_in", "aupr_out") for c in (m, f"{m}_lo", f"{m}_hi")]
    assert list(df.columns[:23]) == ["dataset", "arch", "attack", "eps", "detector", "backend", "ood_set", "group",
                                     *metrics, "ci", "n_id", "n_ood"]
    assert set(df.group) == {"far", "adversarial"}  # MNIST is far-OOD for CIFAR-10 in OpenOOD v1.5
    assert len(df) == 4 * 2  # 4 detectors x (mnist + pgd)
    success = bench["adv"].records["success"].to_numpy(bool)
    pgd = df[(df.attack == "pgd") & (df.detector == "mds")].iloc[0]
    assert pgd.ood_set == "pgd" and pgd.n_ood == success.sum() and pgd.n_id == 256
    assert pgd.eps == pytest.approx(8 / 255)
    assert pgd.auroc == pytest.approx(ood_metrics(scores["mds"]["id"], scores["mds"]["pgd"][success])["auroc"])
    clean = df[(df.attack == "none") & (df.detector == "msp")].iloc[0]
    assert clean.ood_set == "mnist" and math.isnan(clean.eps) and clean.error == ""
    nan_row = df[(df.detector == "nan_det") & (df.ood_set == "mnist")].iloc[0]
    assert math.isnan(nan_row.auroc) and "NaN scores: 0 of 256 ID and 1 of 128 OOD" in nan_row.error
    broken = df[df.detector == "broken"]
    assert len(broken) == 2 and broken.auroc.isna().all() and (broken.error == "fit failed: ValueError: singular").all()

    from advopenood.run.detect import write_scores

    write_scores(ctx)  # the core saves the scores and masks every table is re-derived from
    with np.load(tmp_path / "scores" / "mds.npz") as d:
        assert set(d.files) == {"id", "mnist", "pgd", "pgd.success", "pgd.positive"}
        again = ood_metrics(d["id"], d["pgd"][d["pgd.positive"]])["auroc"]
    assert again == pytest.approx(pgd.auroc)

    table = out["table_ood.csv"]
    assert list(table.detector) == ["msp", "mds", "nan_det", "broken"]
    assert list(table.columns[1:]) == [f"cifar10 {a} {m}{end}" for a in ("none", "pgd") for m in ("FPR95", "AUROC")
                                       for end in ("", " lo", " hi")]  # every number with its interval
    assert table.set_index("detector").loc["mds", "cifar10 pgd AUROC"] == pytest.approx(pgd.auroc)
    assert out["table_ood.md"] is table
