"""Binarization test: is an attack strong enough to find adversarial examples that provably exist? The test itself;
the ``bintest`` analysis is ``plugin.py``, its report section ``report.py``.

Zimmermann, Brendel, Tramer, Carlini, "Increasing Confidence in Adversarial Robustness Evaluations"
(NeurIPS 2022), Algorithm 1 and Appendix B. For each correctly classified test sample ``x_c``:

1. Inner points ``X_i = {x_c} ∪ {x_c + δ_k}``, ``k = 1..N_i``, with ``δ_k`` uniform in the ball of radius
   ``(1 - gap) · eps`` (Linf: ``δ ~ U[-(1-gap)eps, (1-gap)eps]^d``; L2: uniform in the L2 ball), clipped to [0, 1].
2. One boundary point ``x_b`` with ``d(x_b, x_c) = eps`` (Linf: a corner ``x_c ± eps``; L2: uniform on the
   sphere, grown after clipping until ``||x_b - x_c||_2 = eps``).
3. Penultimate features ``F = f*(X)`` of the frozen model (eval mode, batch-norm statistics frozen), batched.
4. An unpenalised logistic regression ``s(f) = w·f + b`` separates inner (0) from boundary (1) features; a
   sample whose training accuracy is below 100 % is skipped and counted.
5. Boundary shift: ``s'(f) = s(f) - κ · s(f_b)``, so the boundary point keeps ``(1 - κ)`` of its margin
   (κ = 0.999) and every inner point stays on side 0. The two binary logits ``c · (-s'/2, s'/2) + o`` are
   rescaled to the original model's logit range on the same points: ``c = (L_max - L_min) / max|s'|``,
   ``o = L_min + c · max|s'| / 2``, so the attack sees logits of the usual magnitude.
6. The attack runs unchanged on ``h = g ∘ f*`` (a 2-class model on [0, 1] images) with label 0; it succeeds
   when its output lies in the eps-ball (and in [0, 1]) and ``h`` classifies it as 1.
7. Random baseline (R-ASR): ``n_random`` points, half uniform inside the eps-ball and half on its boundary
   (Linf corners); success when any of them is classified 1.

The attack passes when ASR ≥ 0.95 and the test is conclusive (R-ASR ≤ 0.75); together these imply an ASR at
least 0.2 above the random baseline. An R-ASR above 0.75 means the binary problem is too easy to tell
anything ("inconclusive"); raise ``n_inner`` then, as the paper does.

Detector variant (Appendix A.1): given a score function ``score_fn(x) -> conf`` (higher = more
in-distribution, OpenOOD's convention) and a threshold at 5 % FPR on clean data (5 % of clean samples fall
below it, i.e. are detected), the *regular* test draws the boundary point among corners that are not detected
and counts success as "classified 1 and not detected"; the *inverted* test draws a detected boundary point
and counts "classified 1 and detected". Passing needs both. A detector-adaptive attack (``adaptive_<det>``,
``plugins/attacks/adaptive.py``) brings its own detector: the ``bintest`` analysis runs both tests with it, the
regular test with the attack as it is and the inverted one with :meth:`inverted` (detector term negated). An
attack that declares :class:`~advopenood.capabilities.DetectorTestForms` (the robust-AUROC attacks
``robust_id_<det>``, ``robust_ood_<det>`` and their APGD forms, ``plugins/attacks/robust.py``, which move only the
detector's score) runs its ``test_form("regular")`` and ``test_form("inverted")``, on ID images whichever side it
attacks in the run. Any other attack runs the standard test.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch
import torch.nn as nn
from packaging.version import Version
from threadpoolctl import threadpool_limits
from tqdm.auto import tqdm

from advopenood.plugin import (Attack, DetectorTestForms, Invertible, UsageError, default_eps, derive_seed, frozen,
                               id_threshold)


NORMS = ("linf", "l2")
TESTS = ("standard", "regular", "inverted")
SUMMARY_COLUMNS = ("attack", "test", "norm", "eps", "n", "n_skipped", "n_misclassified", "asr", "random_asr",
                   "passed", "inconclusive", "kappa", "n_inner", "gap", "n_random")
SAMPLE_COLUMNS = ("index", "test", "setup_ok", "skip_reason", "train_acc", "boundary_dist", "attack_success",
                  "random_success", "logit_margin_adv", "dist_adv", "detected_adv")


def _unpenalised() -> dict[str, Any]:
    """No regularisation: ``C=inf`` from scikit-learn 1.8 on (``penalty`` is deprecated there), ``penalty=None`` before."""
    import sklearn

    return {"C": np.inf} if Version(sklearn.__version__) >= Version("1.8") else {"penalty": None}


#: Slack on the eps-ball membership of attack outputs (float32 rounding of ``x0 + delta``).
DIST_ATOL = 1e-6


def _check_norm(norm: str) -> str:
    if norm not in NORMS:
        raise UsageError(f"unknown norm {norm!r} for the binarization test; valid choices: {', '.join(NORMS)}")
    return norm


def distance(x: torch.Tensor, x_c: torch.Tensor, norm: str) -> torch.Tensor:
    """Per-row distance ``d(x_k, x_c)`` in ``norm`` (``x`` is a batch, ``x_c`` one image)."""
    delta = (x - x_c.unsqueeze(0)).flatten(1)
    return delta.abs().amax(1) if _check_norm(norm) == "linf" else delta.norm(dim=1)


def sample_inner_points(x_c: torch.Tensor, n: int, eps: float, norm: str, gap: float,
                        rng: np.random.Generator) -> torch.Tensor:
    """``n`` points uniform in the ``norm`` ball of radius ``(1 - gap) · eps`` around ``x_c``, clipped to [0, 1].

    Linf: ``δ ~ U[-r, r]^d``. L2: ``δ = r · u^(1/d) · z / ||z||`` with ``z ~ N(0, I)``, ``u ~ U[0, 1]``.
    """
    radius = (1.0 - gap) * eps
    shape = (n, *x_c.shape)
    if _check_norm(norm) == "linf":
        delta = (2.0 * rng.random(shape, dtype=np.float32) - 1.0) * radius
    else:
        z = rng.standard_normal(shape, dtype=np.float32)
        z /= np.linalg.norm(z.reshape(n, -1), axis=1).reshape(-1, *[1] * x_c.dim())
        u = rng.random(n, dtype=np.float32) ** (1.0 / x_c.numel())
        delta = z * (radius * u).reshape(-1, *[1] * x_c.dim())
    return (x_c.unsqueeze(0) + torch.from_numpy(delta).to(x_c.device)).clamp(0.0, 1.0)


def _grow_to_sphere(x_c: torch.Tensor, delta: torch.Tensor, eps: float, iters: int = 100) -> torch.Tensor:
    """Rescale each L2 perturbation until ``||clip(x_c + δ) - x_c||_2 = eps`` (clipping only shrinks it)."""
    x = (x_c.unsqueeze(0) + delta).clamp(0.0, 1.0)
    for _ in range(iters):
        d = x - x_c.unsqueeze(0)
        n = d.flatten(1).norm(dim=1).clamp_min(1e-12)
        if bool(((n - eps).abs() <= 1e-5 * eps).all()):
            break
        x = (x_c.unsqueeze(0) + d * (eps / n).view(-1, *[1] * x_c.dim())).clamp(0.0, 1.0)
    return x


def sample_boundary_points(x_c: torch.Tensor, n: int, eps: float, norm: str, rng: np.random.Generator) -> torch.Tensor:
    """``n`` points on the ``norm`` sphere of radius ``eps`` around ``x_c``, inside [0, 1].

    Linf: corners ``x_c + eps · σ``, ``σ ∈ {-1, 1}^d`` uniform (the paper's choice: the hardest boundary points);
    clipping keeps the Linf distance at ``eps`` as long as one coordinate is unclipped.
    L2: ``x_c + eps · z / ||z||`` with ``z ~ N(0, I)``, grown after clipping to norm ``eps``.
    """
    shape = (n, *x_c.shape)
    if _check_norm(norm) == "linf":
        signs = rng.integers(0, 2, size=shape).astype(np.float32) * 2.0 - 1.0
        return (x_c.unsqueeze(0) + torch.from_numpy(signs * eps).to(x_c.device)).clamp(0.0, 1.0)
    z = rng.standard_normal(shape, dtype=np.float32)
    z *= eps / np.linalg.norm(z.reshape(n, -1), axis=1).reshape(-1, *[1] * x_c.dim())
    return _grow_to_sphere(x_c, torch.from_numpy(z).to(x_c.device), eps)


def sample_random_attack_points(x_c: torch.Tensor, n: int, eps: float, norm: str,
                                rng: np.random.Generator) -> torch.Tensor:
    """The random attack's queries: ``n // 2`` points uniform inside the eps-ball, the rest on its boundary."""
    n_inside = n // 2
    return torch.cat([sample_inner_points(x_c, n_inside, eps, norm, 0.0, rng),
                      sample_boundary_points(x_c, n - n_inside, eps, norm, rng)])


@torch.no_grad()
def batched_logits_features(model: nn.Module, x: torch.Tensor, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logits, penultimate features)`` of ``x`` through the frozen model, ``batch_size`` rows at a time."""
    logits, feats = [], []
    with frozen(model):
        for i in range(0, len(x), batch_size):
            lo, fe = model(x[i:i + batch_size], return_feature=True)
            logits.append(lo)
            feats.append(fe.flatten(1))
    return torch.cat(logits), torch.cat(feats)


def train_readout(features: np.ndarray, labels: np.ndarray, max_iter: int = 2000) -> tuple[np.ndarray, float, float]:
    """Unpenalised logistic regression ``s(f) = w·f + b`` (class 1 where ``s > 0``); returns ``(w, b, train_acc)``.

    Fitted on standardised features with balanced class weights (one boundary point against ``N_i + 1`` inner
    points), then folded back to raw features. On separable data the unpenalised optimum lies at infinity; the
    solver stops once the gradient is tiny (or at ``max_iter``), and only the direction and the sign pattern
    matter (the scale is reset in :func:`shift_and_rescale`). BLAS runs single-threaded: on a ~1000 x 64
    problem its threads only spin (30x slower on a busy 2-core machine).
    """
    f = features.astype(np.float64)
    mu, sd = f.mean(0), f.std(0)
    sd[sd < 1e-12] = 1.0
    from sklearn.exceptions import ConvergenceWarning  # imported here: a second of start-up for every command
    from sklearn.linear_model import LogisticRegression

    clf = LogisticRegression(**_unpenalised(), class_weight="balanced", max_iter=max_iter, tol=1e-10)
    with warnings.catch_warnings(), threadpool_limits(1):
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit((f - mu) / sd, labels)
    w = clf.coef_[0] / sd
    b = float(clf.intercept_[0] - (clf.coef_[0] * mu / sd).sum())
    acc = float(np.mean(((f @ w + b) > 0) == (labels == 1)))
    return w, b, acc


def shift_and_rescale(w: np.ndarray, b: float, features: np.ndarray, boundary: int, kappa: float,
                      logit_min: float, logit_max: float) -> nn.Linear:
    """The binary readout ``g(f) = c · (-s'(f)/2, s'(f)/2) + o`` as a 2-class ``nn.Linear``.

    ``s'(f) = w·f + b - κ · s(f_b)`` keeps ``(1 - κ)`` of the boundary point's margin ``s(f_b) > 0`` (the
    reference implementation's ``decision_boundary_closeness``); ``c`` and ``o`` map the logits of the training
    points onto the original model's logit range ``[logit_min, logit_max]`` (its ``adaptive`` rescaling).
    """
    f = features.astype(np.float64)
    s = f @ w + b
    b_shift = b - kappa * s[boundary]
    s_shift = s - kappa * s[boundary]
    spread = float(np.abs(s_shift).max())
    c = (logit_max - logit_min) / spread
    offset = logit_min + c * spread / 2.0
    layer = nn.Linear(len(w), 2)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(np.stack([-c * w / 2.0, c * w / 2.0])))
        layer.bias.copy_(torch.tensor([-c * b_shift / 2.0 + offset, c * b_shift / 2.0 + offset]))
    layer.requires_grad_(False)
    return layer


class BinaryClassifier(nn.Module):
    """``h = g ∘ f*``: the frozen feature extractor of ``model`` followed by a 2-class readout; [0, 1] inputs."""

    num_classes = 2

    def __init__(self, model: nn.Module, readout: nn.Linear):
        super().__init__()
        self.model = model
        self.readout = readout
        self.eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.readout(self.model(x, return_feature=True)[1].flatten(1))


@dataclass
class BinarySetup:
    """One sample's binary problem: the model ``h``, the boundary point, and whether the setup is valid."""

    ok: bool
    reason: str = ""
    binary: BinaryClassifier | None = None
    x_inner: torch.Tensor | None = None
    x_boundary: torch.Tensor | None = None
    boundary_dist: float = float("nan")
    train_acc: float = float("nan")
    inner_dist_max: float = float("nan")


@dataclass
class DetectorCheck:
    """A detector as the test sees it: ``score_fn(x) -> conf`` (higher = more ID); detected iff ``conf < threshold``."""

    score_fn: Callable[[torch.Tensor], torch.Tensor]
    threshold: float

    @torch.no_grad()
    def detected(self, x: torch.Tensor) -> torch.Tensor:
        return self.score_fn(x).flatten() < self.threshold


def threshold_at_fpr(clean_scores: np.ndarray | torch.Tensor, fpr: float = 0.05) -> float:
    """The score below which a fraction ``fpr`` of clean (in-distribution) samples falls: detected iff ``conf < t``."""
    return id_threshold(torch.as_tensor(clean_scores).detach().cpu().numpy(), fpr)


def _accepts(test: str, detector: DetectorCheck | None, x: torch.Tensor) -> torch.Tensor:
    """Which points satisfy the test's detector condition (all of them for the standard test)."""
    if test == "standard" or detector is None:
        return torch.ones(len(x), dtype=torch.bool, device=x.device)
    detected = detector.detected(x).to(x.device)
    return ~detected if test == "regular" else detected


def build_binary_classifier(model: nn.Module, x_c: torch.Tensor, *, eps: float, norm: str, n_inner: int,
                            gap: float, kappa: float, rng: np.random.Generator, batch_size: int = 500,
                            test: str = "standard", detector: DetectorCheck | None = None,
                            n_candidates: int = 256) -> BinarySetup:
    """Steps 1-5 for one sample. In a detector test the boundary point is the first of ``n_candidates`` corners
    meeting the test's detector condition (the paper's rejection sampling); none found skips the sample."""
    x_inner = torch.cat([x_c.unsqueeze(0), sample_inner_points(x_c, n_inner, eps, norm, gap, rng)])
    n_draw = 1 if test == "standard" else n_candidates
    candidates = sample_boundary_points(x_c, n_draw, eps, norm, rng)
    ok = torch.cat([_accepts(test, detector, candidates[i:i + batch_size])
                    for i in range(0, n_draw, batch_size)]).nonzero().flatten()
    if len(ok) == 0:
        return BinarySetup(False, f"no boundary point meets the {test} detector condition in {n_draw} draws")
    x_b = candidates[int(ok[0])].unsqueeze(0)
    logits, feats = batched_logits_features(model, torch.cat([x_inner, x_b]), batch_size)
    f = feats.double().cpu().numpy()
    labels = np.zeros(len(f), dtype=np.int64)
    labels[-1] = 1
    w, b, acc = train_readout(f, labels)
    setup = BinarySetup(False, x_inner=x_inner, x_boundary=x_b[0], train_acc=acc,
                        boundary_dist=float(distance(x_b, x_c, norm)[0]),
                        inner_dist_max=float(distance(x_inner, x_c, norm).max()))
    if acc < 1.0:
        setup.reason = "readout cannot separate inner from boundary features"
        return setup
    readout = shift_and_rescale(w, b, f, len(f) - 1, kappa, float(logits.min()), float(logits.max())).to(x_c.device)
    binary = BinaryClassifier(model, readout)
    with torch.no_grad(), frozen(binary):
        setup.train_acc = float((readout(feats).argmax(1).cpu().numpy() == labels).mean())
        alone = int(binary(x_b).argmax(1)[0]), int(binary(x_c.unsqueeze(0)).argmax(1)[0])
    if setup.train_acc < 1.0 or alone != (1, 0):
        setup.reason = "shifted readout misclassifies a training point in float32"
        return setup
    setup.ok, setup.binary = True, binary
    return setup


@torch.no_grad()
def random_attack(binary: BinaryClassifier, x_c: torch.Tensor, *, eps: float, norm: str, n_random: int,
                  rng: np.random.Generator, batch_size: int = 500, test: str = "standard",
                  detector: DetectorCheck | None = None) -> bool:
    """Step 7: does any of ``n_random`` random points in the eps-ball fool ``h`` (under the test's detector rule)?"""
    x = sample_random_attack_points(x_c, n_random, eps, norm, rng)
    for i in range(0, len(x), batch_size):
        xb = x[i:i + batch_size]
        hit = (binary(xb).argmax(1) == 1) & _accepts(test, detector, xb)
        if bool(hit.any()):
            return True
    return False


def _evaluate_attack(setup: BinarySetup, x_c: torch.Tensor, attack: Attack, *, eps: float, norm: str, seed: int,
                     test: str, detector: DetectorCheck | None) -> dict[str, Any]:
    """Step 6: run the attack on ``h`` with label 0; success = in the eps-ball, in [0, 1] and classified 1."""
    x = x_c.unsqueeze(0)
    if test != "standard" and isinstance(attack, DetectorTestForms):
        attack = attack.test_form(test)
    elif test == "inverted" and isinstance(attack, Invertible):
        attack = attack.inverted()
    x_adv = attack(setup.binary, x, torch.zeros(1, dtype=torch.long, device=x.device), seed=seed)
    with torch.no_grad(), frozen(setup.binary):
        logits = setup.binary(x_adv)
    margin = float(logits[0, 1] - logits[0, 0])
    dist = float(distance(x_adv, x_c, norm)[0])
    in_ball = dist <= eps + DIST_ATOL and bool(((x_adv >= 0) & (x_adv <= 1)).all())
    detected = bool(detector.detected(x_adv)[0]) if detector is not None and test != "standard" else None
    success = in_ball and margin > 0 and bool(_accepts(test, detector, x_adv)[0])
    return {"attack_success": success, "logit_margin_adv": margin, "dist_adv": dist, "detected_adv": detected}


def summarize(samples: pd.DataFrame, *, pass_threshold: float = 0.95,
              inconclusive_above: float = 0.75) -> dict[str, Any]:
    """ASR and R-ASR over the valid samples of one test; passed iff ASR ≥ 0.95 and not inconclusive."""
    ok = samples[samples["setup_ok"].astype(bool)]
    asr = float(ok["attack_success"].astype(bool).mean()) if len(ok) else float("nan")
    rasr = float(ok["random_success"].astype(bool).mean()) if len(ok) else float("nan")
    inconclusive = bool(len(ok) == 0 or rasr > inconclusive_above)
    return {"n": len(ok), "n_skipped": len(samples) - len(ok), "asr": asr, "random_asr": rasr,
            "passed": bool(not inconclusive and asr >= pass_threshold), "inconclusive": inconclusive}


def summary_row(samples: pd.DataFrame, *, attack: str, norm: str, eps: float, n_misclassified: int, kappa: float,
                n_inner: int, gap: float, n_random: int, pass_threshold: float = 0.95,
                inconclusive_above: float = 0.75, detector_threshold: float | None = None,
                tests: list[str] | None = None) -> dict[str, Any]:
    """One ``bintest.csv`` row from the per-sample table of one attack.

    With detector tests (``test`` in regular/inverted) ``n``, ``asr`` and ``random_asr`` are the minimum over both
    tests (the paper's Figure 2), ``n_skipped`` the maximum, ``passed`` needs both and ``inconclusive`` either;
    the per-test values follow as ``<column>_regular`` and ``<column>_inverted``.
    """
    tests = tests or [t for t in TESTS if t in set(samples["test"])] or ["standard"]
    per_test = {t: summarize(samples[samples["test"] == t], pass_threshold=pass_threshold,
                             inconclusive_above=inconclusive_above) for t in tests}

    def pick(key: str, agg: Callable) -> Any:
        return agg(s[key] for s in per_test.values())

    row: dict[str, Any] = {
        "attack": attack, "test": "standard" if tests == ["standard"] else "detector", "norm": norm,
        "eps": float(eps), "n": pick("n", min), "n_skipped": pick("n_skipped", max),
        "n_misclassified": int(n_misclassified), "asr": pick("asr", min), "random_asr": pick("random_asr", min),
        "passed": pick("passed", all), "inconclusive": pick("inconclusive", any),
        "kappa": float(kappa), "n_inner": int(n_inner), "gap": float(gap), "n_random": int(n_random),
    }
    if row["test"] == "detector":
        row["detector_threshold"] = detector_threshold
        for t, s in per_test.items():
            row.update({f"{k}_{t}": v for k, v in s.items()})
    return row


def resolve_eps(attack: Attack, eps: float | None, norm: str, x: torch.Tensor) -> float:
    """The test's eps: ``eps`` if given, else the attack's own budget, else the paper's default for the input size."""
    attack_eps = attack.params.get("eps")
    if eps is None:
        eps = float(attack_eps) if attack.bounded and attack_eps is not None else default_eps(x.shape[-1])
    limit = 1.0 if norm == "linf" else float(np.sqrt(x[0].numel()))
    if not 0.0 < float(eps) <= limit:
        raise UsageError(f"eps {eps!r} for the binarization test is out of range; valid choices: 0 < eps <= {limit:g} "
                         f"for norm {norm!r}")
    return float(eps)


def _detector_check(model: nn.Module, x: torch.Tensor, detector: Callable[[torch.Tensor], torch.Tensor],
                    threshold: float | None, fpr: float, batch_size: int) -> DetectorCheck:
    """The detector half of the regular and inverted tests: ``threshold``, or the ``fpr`` quantile of the clean
    scores of ``x``."""
    if threshold is None:
        with torch.no_grad(), frozen(model):
            clean = torch.cat([detector(x[i:i + batch_size]).flatten() for i in range(0, len(x), batch_size)])
        threshold = threshold_at_fpr(clean, fpr)
    return DetectorCheck(detector, float(threshold))


def _test_sample(model: nn.Module, x: torch.Tensor, index: int, attack: Attack, test: str,
                 check: DetectorCheck | None, *, eps: float, norm: str, n_inner: int, gap: float, kappa: float,
                 n_random: int, seed: int, batch_size: int, n_candidates: int) -> dict[str, Any]:
    """One sample's row of ``bintest_samples.csv`` in one test: its points from ``SeedSequence([seed, index,
    test])``, the attack seeded by ``derive_seed``, so the row does not depend on batching."""
    salt = TESTS.index(test)
    setup_rng, random_rng = (np.random.default_rng(s) for s in
                             np.random.SeedSequence([int(seed), index, salt]).spawn(2))
    setup = build_binary_classifier(model, x, eps=eps, norm=norm, n_inner=n_inner, gap=gap, kappa=kappa,
                                    rng=setup_rng, batch_size=batch_size, test=test, detector=check,
                                    n_candidates=n_candidates)
    row: dict[str, Any] = {"index": index, "test": test, "setup_ok": setup.ok, "skip_reason": setup.reason,
                           "train_acc": setup.train_acc, "boundary_dist": setup.boundary_dist,
                           "attack_success": None, "random_success": None, "logit_margin_adv": float("nan"),
                           "dist_adv": float("nan"), "detected_adv": None}
    if setup.ok:
        row.update(_evaluate_attack(setup, x, attack, eps=eps, norm=norm, test=test, detector=check,
                                    seed=derive_seed(seed, index * len(TESTS) + salt)))
        with frozen(setup.binary):
            row["random_success"] = random_attack(setup.binary, x, eps=eps, norm=norm, n_random=n_random,
                                                  rng=random_rng, batch_size=batch_size, test=test, detector=check)
    return row


def run_bintest(model: nn.Module, x: torch.Tensor, y: torch.Tensor, attack: Attack, *, eps: float | None = None,
                norm: str | None = None, n_inner: int = 999, gap: float = 0.05, kappa: float = 0.999,
                n_random: int = 400, seed: int = 0, device: str | torch.device = "cpu", progress: bool = False,
                indices: np.ndarray | None = None, detector: Callable[[torch.Tensor], torch.Tensor] | None = None,
                detector_threshold: float | None = None, detector_fpr: float = 0.05, batch_size: int = 500,
                n_candidates: int = 256, pass_threshold: float = 0.95, inconclusive_above: float = 0.75,
                attack_name: str | None = None) -> tuple[dict[str, Any], pd.DataFrame]:
    """Binarization test of ``attack`` on the samples ``(x, y)`` of ``model`` (a classifier taking [0, 1] images
    with OpenOOD's ``forward(x, return_feature=True) -> (logits, penultimate)``).

    Only correctly classified samples are tested (a misclassified one has no clean decision to flip); they are
    counted in ``n_misclassified`` and left out of ``samples``. ``norm`` defaults to ``attack.norm``. ``eps`` is
    the test's ball; it defaults to the attack's own ``params["eps"]``, and for an unbounded attack (DeepFool)
    to :func:`advopenood.attacks.base.default_eps`; an attack succeeds only when its output lies in the ball (a
    smaller attack budget, e.g. FGSM at eps / 10, is a weaker attack on the same test).
    Sample ``i`` draws its points from ``SeedSequence([seed, indices[i], test])`` and attacks with
    ``derive_seed``, so results do not depend on batching or on which other samples are tested.

    With ``detector`` (``score_fn(x) -> conf``, higher = more ID) the regular and the inverted test run instead
    of the standard one: the threshold is ``detector_threshold`` or the ``detector_fpr`` quantile of the clean
    scores of ``x``; ``samples`` holds both tests' rows (column ``test``), see :func:`summary_row`.

    Returns ``(summary_row, samples)`` with the columns of ``bintest.csv`` and ``bintest_samples.csv``.
    """
    device = torch.device(device)
    norm = _check_norm(norm or attack.norm)
    eps = resolve_eps(attack, eps, norm, x)
    if not (0.0 <= gap < 1.0 and 0.0 <= kappa < 1.0 and n_inner >= 1 and n_random >= 2):
        raise UsageError(f"invalid binarization test setting (gap {gap}, kappa {kappa}, n_inner {n_inner}, "
                         f"n_random {n_random}); valid choices: 0 <= gap < 1, 0 <= kappa < 1, n_inner >= 1, "
                         "n_random >= 2")
    name = attack_name or attack.name or type(attack).__name__.lower()
    model = model.to(device)
    x, y = x.to(device), y.to(device)
    indices = np.arange(len(x)) if indices is None else np.asarray(indices)
    correct = (batched_logits_features(model, x, batch_size)[0].argmax(1) == y).cpu().numpy()

    check, tests = None, ["standard"]
    if detector is not None:
        check = _detector_check(model, x, detector, detector_threshold, detector_fpr, batch_size)
        tests = ["regular", "inverted"]

    todo = [(t, int(i)) for t in tests for i in np.nonzero(correct)[0]]
    setting = dict(eps=eps, norm=norm, n_inner=n_inner, gap=gap, kappa=kappa, n_random=n_random, seed=seed,
                   batch_size=batch_size, n_candidates=n_candidates)
    rows = [_test_sample(model, x[i], int(indices[i]), attack, test, check, **setting)
            for test, i in tqdm(todo, desc=f"bintest {name}", unit="sample", disable=not progress)]

    samples = pd.DataFrame(rows, columns=list(SAMPLE_COLUMNS))
    for col in ("attack_success", "random_success", "detected_adv"):
        samples[col] = samples[col].astype("boolean")
    summary = summary_row(samples, tests=tests, attack=name, norm=norm, eps=eps,
                          n_misclassified=int((~correct).sum()), kappa=kappa,
                          n_inner=n_inner, gap=gap, n_random=n_random, pass_threshold=pass_threshold,
                          inconclusive_above=inconclusive_above,
                          detector_threshold=None if check is None else check.threshold)
    return summary, samples
