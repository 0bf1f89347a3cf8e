"""Grad-CAM attention shift: the distance, the regimes, and the analysis on real attacks."""
from __future__ import annotations

import dataclasses

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest
import torch

from conftest import assert_section_rerendered, make_plan
from advopenood import registry
from advopenood.evaluation.context import CleanRecord, RunContext
from advopenood.data.datasets import build_dataset, limit_dataset, stack
from advopenood.errors import UsageError
from advopenood.models.classifier import weights_hash
from advopenood.attacks.store import AdvStore
from advopenood.capabilities import is_verifiable
from advopenood.evaluation.intervals import wilson
from advopenood.evaluation.verify import RunFiles
from advopenood.outputs.results import as_written
from advopenood_plugins.analyses.gradcam.plugin import CSV_COLUMNS, CamExtractor, GradCamAnalysis, cam_distance, upsample
from advopenood_plugins.analyses.gradcam.regimes import REGIMES, classify_regime

CPU = torch.device("cpu")
YY, XX = np.mgrid[0:32, 0:32]


def blob(cy: float, cx: float, sigma: float = 4.0) -> np.ndarray:
    return np.exp(-((YY - cy) ** 2 + (XX - cx) ** 2) / (2 * sigma**2))


def test_identical_maps_have_zero_l2_and_unit_ssim():
    rng = np.random.default_rng(0)
    for m in (blob(12, 20), rng.random((32, 32)), np.zeros((32, 32)), np.ones((16, 16))):
        l2, ssim = cam_distance(m, m.copy())
        assert l2 == 0.0
        assert ssim == pytest.approx(1.0)


def test_l2_is_the_mean_squared_difference():
    a, b = blob(10, 10), blob(12, 14)
    l2, _ = cam_distance(a, b)
    assert l2 == pytest.approx(float(np.mean((a - b) ** 2)))
    assert l2 < float(np.linalg.norm(a - b))  # not the Euclidean norm


def test_shifted_blob_has_high_l2_and_lower_ssim_than_a_slight_change():
    base = blob(10, 10)
    l2_shift, ssim_shift = cam_distance(base, blob(22, 22))
    l2_slight, ssim_slight = cam_distance(base, 0.9 * base)
    assert l2_shift > 0.05 > 0.001 > l2_slight
    assert ssim_shift < 0.3 < 0.95 < ssim_slight
    regimes = classify_regime([l2_shift, l2_slight], [ssim_shift, ssim_slight], l2_threshold=0.02, ssim_threshold=0.5)
    assert list(regimes) == ["changed", "unchanged"]


def test_regimes_follow_the_thresholds():
    l2 = [0.5, 0.5, 0.001, 0.001, 0.02]
    ssim = [0.1, 0.9, 0.9, 0.1, 0.5]
    assert list(classify_regime(l2, ssim, 0.02, 0.5)) == ["changed", "moved", "unchanged", "low_l2_low_ssim", "moved"]


def test_maps_too_small_for_ssim_must_be_upsampled_first():
    small_a, small_b = np.random.default_rng(1).random((2, 4, 4))  # the demo CNN's last block is 4x4
    with pytest.raises(ValueError, match="upsample"):
        cam_distance(small_a, small_b)
    big = upsample(np.stack([small_a, small_b]), (32, 32))
    assert big.shape == (2, 32, 32)
    l2, ssim = cam_distance(big[0], big[1])
    assert 0 < l2 < 1 and -1 <= ssim < 1


def test_registered_and_validates_parameters():
    assert registry.get("analyses", "gradcam") is GradCamAnalysis
    with pytest.raises(UsageError, match="l2_threshold"):
        GradCamAnalysis(l2_threshold=0)
    with pytest.raises(UsageError, match="ssim_threshold"):
        GradCamAnalysis(ssim_threshold=2)
    with pytest.raises(UsageError, match="max_samples"):
        GradCamAnalysis(max_samples=0)
    with pytest.raises(UsageError, match="'adversarial' is unknown; valid choices: prediction, clean"):
        GradCamAnalysis(target="adversarial")
    assert GradCamAnalysis().target == "prediction"  # the paper's rule is the default


def test_demo_model_maps_have_input_size_and_lie_in_unit_interval(demo_net):
    ds = build_dataset({"kind": "demo", "name": "digits", "split": "test"}, None, 1, 16)
    x, y = stack(ds, np.arange(48))
    flags = [p.requires_grad for p in demo_net.parameters()]
    for p in demo_net.parameters():
        p.requires_grad_(False)  # frozen, as during an attack
    try:
        with CamExtractor(demo_net, CPU) as cam:
            maps, pred = cam(x)
            other, _ = cam(x, (pred + 1) % 10)
        assert not any(p.requires_grad for p in demo_net.parameters())
    finally:
        for p, flag in zip(demo_net.parameters(), flags):
            p.requires_grad_(flag)
    assert maps.shape == (48, 16, 16) and maps.dtype == np.float32
    assert maps.min() >= 0.0 and maps.max() <= 1.0
    assert np.isclose(maps.reshape(48, -1).max(1), 1.0, atol=1e-4).mean() > 0.9  # min-max scaled per image
    assert (pred == y.numpy()).mean() > 0.9  # the trained demo CNN; the forward pass gives the predictions
    assert np.abs(maps - other).mean() > 0.01  # the target class matters
    assert not demo_net.last_block._forward_hooks  # hooks removed on exit


@pytest.fixture(scope="module")
def weak_fgsm_run(cifar_model, data_root, tmp_path_factory):
    """A real FGSM set at eps 1/255 on 40 CIFAR-10 images (some attacks fail) and its Grad-CAM analysis with each
    target rule (paper's default, then the clean-target variant), under a named protocol."""
    out = tmp_path_factory.mktemp("gradcam_run")
    ds = limit_dataset(build_dataset({"kind": "npz", "path": "cifar10_test.npz", "name": "cifar10"}, data_root, 3, 32),
                       40, 0)
    fgsm = registry.get("attacks", "fgsm")(eps=1 / 255)
    adv = AdvStore(out / "store").generate(ds, cifar_model, fgsm, model_hash=weights_hash(cifar_model), seed=0,
                                           device=CPU, progress=False)
    x, y = stack(ds)
    with torch.no_grad():
        pred = cifar_model(x).argmax(1).numpy()
    ctx = RunContext(plan=make_plan(batch_size=40, protocol="lorenz2024"), out=out, model=cifar_model, id_set=ds,
                     fit_set=ds, ood_sets={}, adv_sets={"fgsm": adv}, clean=CleanRecord(y.numpy(), pred),
                     progress=False)
    clean_rule = GradCamAnalysis(target="clean", n_examples=0)(dataclasses.replace(ctx, out=out / "clean_target"))
    result = GradCamAnalysis(n_examples=3)(ctx)
    return ctx, adv, result, clean_rule


def test_per_sample_table_matches_the_records(weak_fgsm_run):
    ctx, adv, result, clean_rule = weak_fgsm_run
    df = result["gradcam.csv"]
    assert list(df.columns) == CSV_COLUMNS
    rec = adv.records
    assert len(df) == len(rec) == 40
    for col in ("index", "y", "clean_pred", "adv_pred", "success"):
        np.testing.assert_array_equal(df[col].to_numpy(), rec[col].to_numpy())
    # the paper's rule: each map explains its own image's prediction
    assert set(df["target_rule"]) == {"prediction"} and set(df["protocol"]) == {"lorenz2024"}
    np.testing.assert_array_equal(df["clean_target"], df["clean_pred"])
    np.testing.assert_array_equal(df["adv_target"], df["adv_pred"])
    assert set(df["threshold_origin"]) == {"advopenood default (not from the paper)"}
    assert set(df["l2_threshold"]) == {0.02} and set(df["ssim_threshold"]) == {0.5}
    assert df["l2"].between(0, 1).all() and df["ssim"].between(-1, 1).all()
    assert set(df["regime"]) <= set(REGIMES)
    # the clean-target variant: both maps explain the clean prediction; the two rules agree exactly where the
    # prediction did not move and differ on the successful attacks
    other = clean_rule["gradcam.csv"]
    assert set(other["target_rule"]) == {"clean"}
    np.testing.assert_array_equal(other["adv_target"], other["clean_pred"])
    same = (df["adv_pred"] == df["clean_pred"]).to_numpy()
    np.testing.assert_allclose(other.loc[same, "l2"], df.loc[same, "l2"], atol=1e-6)
    assert np.abs(other.loc[~same, "l2"].to_numpy() - df.loc[~same, "l2"].to_numpy()).min() > 1e-4


def manual_gradcam(model: torch.nn.Module, x: torch.Tensor, target: int) -> np.ndarray:
    """Grad-CAM by hand (Selvaraju et al. 2017): weights = spatial mean of d logit_target / d A over the last
    block's output A, map = ReLU(sum_k w_k A_k), min-max scaled, bilinearly upsampled to the input, scaled again
    (pytorch-grad-cam's order)."""
    acts = []
    hook = model.last_block.register_forward_hook(lambda m, i, o: acts.append(o))
    try:
        with torch.enable_grad():
            logits = model(x[None].clone().requires_grad_(True))
            grad = torch.autograd.grad(logits[0, target], acts[0])[0][0]
    finally:
        hook.remove()
    a = acts[0][0].detach()
    cam = torch.relu((grad.mean((1, 2))[:, None, None] * a).sum(0)).numpy()
    cam = cam - cam.min()
    cam = upsample(cam / (1e-7 + cam.max()), tuple(x.shape[-2:]))
    cam = cam - cam.min()
    return cam / (1e-7 + cam.max())


def test_adversarial_map_explains_the_adversarial_prediction(weak_fgsm_run, cifar_model):
    """For successful attacks on the pack's ResNet-20, the adversarial map is the Grad-CAM of the adversarial
    prediction (the class the model gives the adversarial image), computed here by hand, not of the clean one."""
    ctx, adv, result, _ = weak_fgsm_run
    df = result["gradcam.csv"]
    hits = df[df["success"]].head(4)
    assert len(hits) >= 2 and (hits["adv_pred"] != hits["y"]).all()
    rows = hits.index.to_numpy()  # the run covers every row, in order
    x, _ = stack(ctx.id_set, rows)
    x_adv = adv.load(rows)
    cifar_model.eval()
    with torch.no_grad():
        adv_pred = cifar_model(x_adv).argmax(1).numpy()
    np.testing.assert_array_equal(hits["adv_target"], adv_pred)
    for i, r in enumerate(hits.itertuples()):
        assert r.adv_target == r.adv_pred != r.clean_pred
        clean_map = manual_gradcam(cifar_model, x[i], int(r.clean_pred))
        own = cam_distance(clean_map, manual_gradcam(cifar_model, x_adv[i], int(r.adv_pred)))
        fixed = cam_distance(clean_map, manual_gradcam(cifar_model, x_adv[i], int(r.clean_pred)))
        assert r.l2 == pytest.approx(own[0], abs=1e-4) and r.ssim == pytest.approx(own[1], abs=1e-3)
        assert abs(r.l2 - fixed[0]) > 10 * abs(r.l2 - own[0])


def test_unsuccessful_attacks_are_reported_separately(weak_fgsm_run):
    _, _, result, _ = weak_fgsm_run
    df, summary = result["gradcam.csv"], result["gradcam_summary.csv"]
    correct = df["clean_pred"] == df["y"]
    flipped, failed, wrong = df[correct & df["success"]], df[correct & ~df["success"]], df[~correct]
    assert len(flipped) and len(failed) and len(wrong)  # eps 1/255 leaves some images correctly classified
    assert wrong["success"].all()  # the store counts a clean-misclassified image as a success
    rows = summary.set_index("subset")
    assert list(rows.index) == ["all", "successful", "unsuccessful", "clean_misclassified"]
    assert [rows.loc[k, "n"] for k in ("successful", "unsuccessful", "clean_misclassified")] == \
        [len(flipped), len(failed), len(wrong)]
    for subset, part in (("successful", flipped), ("unsuccessful", failed), ("clean_misclassified", wrong),
                         ("all", df)):
        assert rows.loc[subset, "l2_mean"] == pytest.approx(part["l2"].mean())
        assert rows.loc[subset, "ssim_median"] == pytest.approx(part["ssim"].median())
        shares = [rows.loc[subset, f"pct_{r}"] for r in REGIMES]
        assert shares[0] == pytest.approx(100 * (part["regime"] == "changed").mean())
        assert sum(shares) == pytest.approx(100.0)
    # failed attacks barely move the maps compared with successful ones
    assert rows.loc["unsuccessful", "l2_median"] < rows.loc["successful", "l2_median"]
    assert (rows["target_rule"] == "prediction").all() and (rows["protocol"] == "lorenz2024").all()
    assert (rows["threshold_origin"] == "advopenood default (not from the paper)").all()


def _written(result, folder) -> RunFiles:
    """The analysis's two tables as the run writes them (6 significant digits) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("gradcam.csv", "gradcam_summary.csv"):
        as_written(result[name].drop(columns=["row"], errors="ignore")).to_csv(folder / name, index=False,
                                                                               float_format="%.6g")
    return RunFiles(folder)


def test_summary_has_an_interval_beside_every_number(weak_fgsm_run):
    """Every mean, median and share of gradcam_summary.csv has its 95 % interval and the ci column names the
    methods (issue 40): Wilson's on the shares, an interval that holds the estimate for the means and medians."""
    _, _, result, _ = weak_fgsm_run
    df, summary = result["gradcam.csv"], result["gradcam_summary.csv"]
    numbers = [f"{c}_{s}" for c in ("l2", "ssim") for s in ("mean", "median")] + [f"pct_{r}" for r in REGIMES]
    assert summary["ci"].str.contains("wilson").all() and summary["ci"].str.contains("order-statistic").all()
    rows = summary.set_index("subset")
    for col in numbers:
        full = rows.loc["all"]
        assert full[f"{col}_lo"] <= full[col] <= full[f"{col}_hi"], col
        assert full[f"{col}_hi"] > full[f"{col}_lo"] or col.startswith("pct_"), col
    k = int((df["regime"] == "changed").sum())
    assert (rows.loc["all", "pct_changed_lo"], rows.loc["all", "pct_changed_hi"]) == wilson(k, len(df))


def test_verify_rederives_the_summary_and_catches_an_edit(weak_fgsm_run, tmp_path):
    _, _, result, _ = weak_fgsm_run
    assert is_verifiable(GradCamAnalysis)
    assert GradCamAnalysis.verify(_written(result, tmp_path / "run")) == []
    for col in ("l2_median_lo", "pct_changed_hi", "ssim_mean"):
        run = _written(result, tmp_path / col)
        table = pd.read_csv(run.path / "gradcam_summary.csv")
        table.loc[0, col] = table.loc[0, col] + 0.01
        table.to_csv(run.path / "gradcam_summary.csv", index=False)
        found = GradCamAnalysis.verify(run)
        assert len(found) == 1 and col in found[0] and "gradcam_summary.csv" in found[0], found


def test_plots_are_written_and_render(weak_fgsm_run):
    ctx, _, result, _ = weak_fgsm_run
    assert result.figures == [ctx.plot_dir / "gradcam_fgsm.png", ctx.plot_dir / "gradcam_examples_fgsm.png"]
    [section] = result.sections
    assert section.title == "Grad-CAM attention shift" and section.figures == result.figures
    shift = mpimg.imread(ctx.plot_dir / "gradcam_fgsm.png")
    examples = mpimg.imread(ctx.plot_dir / "gradcam_examples_fgsm.png")
    assert shift.shape[0] > 300 and shift.shape[1] > 300 and shift[..., :3].std() > 0.05
    assert examples.shape[0] > 300 and examples.shape[1] > 300
    assert examples[..., :3].std() > 0.05


def test_max_samples_is_a_seeded_subset(weak_fgsm_run, tmp_path):
    ctx, _, full, _ = weak_fgsm_run
    ctx = dataclasses.replace(ctx, out=tmp_path)
    out = {k: GradCamAnalysis(max_samples=10, n_examples=0)(ctx)["gradcam.csv"] for k in range(2)}
    pd.testing.assert_frame_equal(out[0], out[1])
    assert len(out[0]) == 10 and out[0]["index"].is_monotonic_increasing
    merged = out[0].merge(full["gradcam.csv"], on="index", suffixes=("", "_full"))
    np.testing.assert_allclose(merged["l2"], merged["l2_full"], rtol=1e-5, atol=1e-7)


def test_verify_rerenders_the_gradcam_section(demo_analyses_run, tmp_path):
    """Issue 49, item 2: a sentence added to the Grad-CAM section passed, the section taken as saved; verify renders
    it again from gradcam_summary.csv and the plots the folder holds."""
    assert_section_rerendered(demo_analyses_run, tmp_path, "Grad-CAM attention shift")
