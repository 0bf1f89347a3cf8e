"""ROSS detectors ``ross_<det>`` (issue 33): Hekal, Lomuscio & Stoica, "A Robust Out-of-Distribution Detection
Framework via Synergistic Smoothing" (CVPR Findings 2026, arXiv 2605.08191), as their code computes it:
``openood/postprocessors/ross_postprocessor.py`` of Abdu-Hekal/ROSS (f8f030d), ``postprocess`` lines 119-137 and
``setup`` lines 83-112, with the defaults of ``configs/postprocessors/ross.yml``.

For an image ``x`` (their ``data``: a batch in the network's *normalised* input space) and the base detector's
confidence ``c`` (their ``base_pp``; higher = more ID):

    ``s_j = c(x + e_j)``, ``e_j ~ N(0, noise_magnitude^2 I)``, ``j = 1..num_samples`` (line 122, no clipping)
    ``m = median_j s_j``  (``torch.median``: for even ``n`` the *lower* of the two middle values, line 130)
    ``MAD = mean_j |s_j - m|``  (line 131: the mean absolute deviation from the median, *not* the median of the
    deviations that "MAD" usually names)
    ``ROSS = min(m, q) + max(m - q, 0) * (1 + lambda / (MAD + 1e-12))``  (lines 133-136)

with ``q`` the 5 % quantile (``np.quantile``, linear) of ``m`` over the ID validation images (``setup``, line 112).

**The base confidence ``c`` is on the scale their code gates.** Their ``base_pp`` is OpenOOD's postprocessor, and the
gate ``lambda / (MAD + 1e-12)`` is not scale-invariant: a confidence ``k`` times larger gives ROSS at ``lambda`` the
ranking of ROSS at ``lambda / k``. So ``c`` is the base detector's ``source_score``
(:meth:`~advopenood.detection.postprocessor.Postprocessor.source_score`), by its ``source_scale``: ``"same"`` (MSP,
EBO, MLS: OpenOOD's value already), ``"openood"`` (GEN: OpenOOD's sum over the top-M classes, unclamped, 10 times
pytorch-ood's mean on CIFAR-10; KNN: the squared distance OpenOOD's faiss index returns) or ``"unchecked"`` (every
other detector, a third party's too: this project's value, not compared with OpenOOD's; ``lambda`` then has this
project's units, which docs/detectors.md states). Until 0.2.x ``ross_gen`` gated pytorch-ood's mean, which ranks as
ROSS at ten times ``lambda`` (issue 48).
They also return the components ``median`` (``m``), ``-MAD`` and ``-MAD / (m + 1e-12)`` ("cov"); here parameter
``component`` picks which one is the confidence (``ross``, ``median``, ``neg_mad``, ``neg_cov``).

Parameters (defaults: ``configs/postprocessors/ross.yml``, the one config their code ships for CIFAR-10, CIFAR-100
and ImageNet-200 alike): ``n`` (``num_samples``, 25; at least 3), ``sigma`` (``noise_magnitude``, 0.1, in the
network's **normalised** input units, as theirs: our networks take [0, 1] pixels and normalise inside, so the
noise added to the pixels is ``sigma * std_c`` per channel ``c`` of the network's normalisation; :func:`pixel_sigma`
gives it and the audit tables write it), ``lam`` (``lambda_``, 0.05), ``quantile`` (0.05), ``component``
(``ross``), ``val_size`` (1000), ``eval_seed`` (null: from the run's seed) and every parameter of ``<det>``.
Note: their table script (``scripts/ross/run_experiments.py``) copies ``scripts/ross/ross_default_config.yml``
(``noise_magnitude: 0.05``, ``lambda_: 0.01``) over ``ross.yml`` before it runs the paper's tables; set ``sigma``
and ``lam`` to those for that setting.

Fit: ``<det>``'s own fit on the first fit rows, then ``q`` on the last ``val_size`` fit rows, which ``<det>`` never
saw (their ``q`` comes from OpenOOD's ID validation split, disjoint from the base detector's training data and the
test images; ours from the run's fit rows, never the test images). Each validation image's median takes its own
``n`` draws from the evaluation stream, as their ``setup`` draws fresh noise.

Noise: as ``smoothed_<det>`` (:mod:`advopenood_plugins.detectors.smoothed`), from two independent seeded streams:
the run scores every set from the evaluation stream (``eval_seed``, recorded in ``run.json``), every attack draws
from the attack stream. Their code draws unseeded ``torch.randn_like`` noise; ROSS's README notes that results
"may vary slightly due to random noise in the post-processing steps": the audit (``benchmarks/ross_audit.py``)
measures that spread over evaluation seeds.

Gradients (for the attacks on ROSS itself; ``<det>`` must be differentiable). The forward value is always the
confidence above, drawn from the attack stream. Its gradient is that of one of :data:`SURROGATES` (the attacks take,
per image, the best of their results, because ``1 / (MAD + 1e-12)`` can blow up or hide the gradient):
``ross`` (the score itself), ``median`` (``m`` alone) or ``log_gate`` (``log(max(m - q, 1e-12)) +
log(1 + lambda / (MAD + 1e-12))``, the log of the gated term), computed end to end from ``m`` noisy copies:

* without EOT (``eot_samples == 0``; ``adaptive_ross_<det>``, ``robust_id_ross_<det>``, ...): the ``n`` copies of one
  noise draw fixed for the whole attack (a generator seeded once from the attack stream), so the attack optimises
  one deterministic function of the image;
* with EOT (``adaptive_eot_ross_<det>``, ``robust_id_eot_ross_<det>``, ...; Athalye, Engstrom, Ilyas & Kwok 2018;
  Athalye, Carlini & Wagner 2018, Sec. 4.3): ``m`` (parameter ``eot`` of the attack, default ``n``) fresh draws at
  every step (the image-seeded attack stream: a new iterate has new noise), all ``m`` copies in one batched pass;
  for ``m >= n`` the forward value is read from the first ``n`` of them (the same draws), so a step costs ``m``
  forward-backward passes and nothing more.
"""
from __future__ import annotations

import copy
import math
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn as nn
from torch import Tensor

from advopenood.plugin import (Batches, Composite, DifferentiableDetector, Outputs, Postprocessor, UsageError,
                               create_detector, grad_outputs, is_differentiable, pass_outputs, registry, take_rows)
from advopenood_plugins.detectors.smoothed import SmoothedDetector, is_smoothed, noise_draws
from advopenood_plugins.kit.detectors import straight_through
from advopenood_plugins.kit.networks import normalisation

#: ROSS's parameters and defaults (``configs/postprocessors/ross.yml``); every other parameter goes to ``<det>``
ROSS_DEFAULTS: dict[str, Any] = {"n": 25, "sigma": 0.1, "lam": 0.05, "quantile": 0.05, "component": "ross",
                                 "val_size": 1000, "eval_seed": None}
COMPONENTS = ("ross", "median", "neg_mad", "neg_cov")
#: the objectives whose gradient an attack may follow (the forward value stays the confidence)
SURROGATES = ("ross", "median", "log_gate")
PREFIX = "ross_"
EPS = 1e-12  # their ``eps`` (lines 88 and 129)


def ross_statistics(copies: Tensor, q: float, lam: float) -> dict[str, Tensor]:
    """ROSS's statistics of the base confidences of ``n`` noisy copies (``n x B``): ``median`` (``torch.median``, the
    lower middle value for even ``n``), ``mad`` (mean absolute deviation from it), ``ross``, ``neg_mad``,
    ``neg_cov`` (their ``-score_cov``) and ``log_gate``; differentiable in ``copies``."""
    m = copies.median(dim=0).values
    mad = (copies - m).abs().mean(dim=0)
    ross = torch.clamp(m, max=q) + torch.clamp(m - q, min=0.0) * (1 + lam / (mad + EPS))
    log_gate = torch.log(torch.clamp(m - q, min=EPS)) + torch.log1p(lam / (mad + EPS))
    return {"median": m, "mad": mad, "ross": ross, "neg_mad": -mad, "neg_cov": -(mad / (m + EPS)),
            "log_gate": log_gate}


def _number(value: Any) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value))


def input_scale(net: nn.Module, like: Tensor, normalised_input: bool) -> Tensor:
    """Pixel units per normalised unit, per channel (``1 x C x 1 x 1``): the network's normalisation ``std``
    (:func:`~advopenood_plugins.kit.networks.normalisation`); 1 where the network takes normalised inputs itself
    (``normalised_input``, OpenOOD's) or declares no ``std``."""
    std = normalisation(net, like)[1]
    return torch.ones_like(std) if normalised_input else std


def pixel_sigma(net: nn.Module, sigma: float, channels: int = 3) -> list[float]:
    """ROSS's noise std in [0, 1] pixel units, per channel, for a network: ``sigma * std_c``."""
    scale = input_scale(net, torch.zeros(1, channels, 1, 1), False)
    return [float(sigma) * float(v) for v in scale.flatten()]


class RossDetector(SmoothedDetector, Composite):
    """Base of ``ross_<det>`` (see the module docstring); :class:`Derived` and :class:`Randomised` as the smoothed
    detectors: ``--detectors all`` does not select it, the run scores from the evaluation stream."""

    #: the gradient objective (one of :data:`SURROGATES`); set by :meth:`with_surrogate`
    surrogate: str = "ross"
    #: the fitted 5 % quantile of the validation medians (``None`` before the fit)
    q: float | None = None
    #: not a smoothed detector's median or mean: the ``smoothed`` evaluator has no row for it
    smoothing = False

    def __init__(self, **params: Any):
        clash = sorted(set(ROSS_DEFAULTS) & set(self.base_defaults()))
        if clash:
            raise UsageError(f"detector {self.base_name!r} has a parameter {clash[0]!r}, which {self.name!r} uses; "
                             "valid choices: wrap a detector without parameters named as ROSS's")
        Postprocessor.__init__(self, **params)
        p = self.params
        n, sigma, lam, quantile = p["n"], p["sigma"], p["lam"], p["quantile"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 3:
            raise UsageError(f"n {n!r} for detector {self.name!r}; valid choices: an integer >= 3 (a median and its "
                             "deviation need at least three draws)")
        if not _number(sigma) or float(sigma) < 0:
            raise UsageError(f"sigma {sigma!r} for detector {self.name!r}; valid choices: a number >= 0 (noise std "
                             "in the network's normalised input units)")
        if not _number(lam) or float(lam) < 0:
            raise UsageError(f"lam {lam!r} for detector {self.name!r}; valid choices: a number >= 0")
        if not _number(quantile) or not 0 <= float(quantile) <= 1:
            raise UsageError(f"quantile {quantile!r} for detector {self.name!r}; valid choices: a number in [0, 1]")
        component = self.p.component.lower()
        if component not in COMPONENTS:
            raise UsageError(f"component {p['component']!r} for detector {self.name!r}; valid choices: "
                             f"{', '.join(COMPONENTS)}")
        val = p["val_size"]
        if isinstance(val, bool) or not isinstance(val, int) or val < 2:
            raise UsageError(f"val_size {val!r} for detector {self.name!r}; valid choices: an integer >= 2")
        eval_seed = p["eval_seed"]
        if eval_seed is not None and (isinstance(eval_seed, bool) or not isinstance(eval_seed, int) or eval_seed < 0):
            raise UsageError(f"eval_seed {eval_seed!r} for detector {self.name!r}; valid choices: an integer >= 0, or "
                             "null for one derived from the run's seed")
        typed = self.p
        self.n, self.sigma, self.lam, self.quantile = typed.n, typed.sigma, typed.lam, typed.quantile
        self.component, self.val_size = component, typed.val_size
        p["component"] = component
        inner = {k: v for k, v in params.items() if k not in ROSS_DEFAULTS}
        #: the base detector (pytorch-ood implementation); its code enters the store's key (``wrapped``)
        self.base = create_detector(self.base_name, "pytorch-ood", inner)

    @property
    def name(self) -> str:
        return PREFIX + self.base_name

    @classmethod
    def default_params(cls) -> dict[str, Any]:
        return {**ROSS_DEFAULTS, **cls.base_defaults()}

    # ------------------------------------------------------------------------------------------------ fit

    @property
    def requires_fit(self) -> bool:  # type: ignore[override]
        return True  # q, whatever the base detector needs

    @property
    def fit_size(self) -> int | None:
        """The fit rows the run reads for it: the base detector's ``fit_size`` and the ``val_size`` rows after them
        (None: the whole fit set)."""
        base = self.base.fit_size
        return None if base is None else base + self.val_size

    def rows_needed(self, n: int) -> int:
        """The base detector's rows, then :attr:`val_size` rows of ID validation images for ``q``."""
        if n <= self.val_size:
            raise UsageError(f"detector {self.name!r} needs more than val_size={self.val_size} fit rows (the base "
                             f"detector fits on the rows before them); the fit set has {n}; valid choices: a smaller "
                             "val_size, or a larger fit set")
        return min(n, self.base.rows_needed(n - self.val_size) + self.val_size)

    def fit(self, net: nn.Module, outputs: Outputs, labels: Tensor, batches: Batches) -> None:
        """``<det>``'s fit on the first rows; ``q`` = the ``quantile`` (5 %) of the noisy medians of the last
        :attr:`val_size` rows (their ``setup``: ``np.quantile(medians, 0.05)``, line 112)."""
        rows = len(labels)
        first = rows - self.val_size
        if first < 1:
            raise UsageError(f"detector {self.name!r}: {rows} fit rows leave none for {self.base_name!r} before "
                             f"the val_size={self.val_size} validation rows; valid choices: a smaller val_size")
        if self.base.requires_fit:
            self.base.fit(net, outputs.rows(slice(0, first)), labels[:first], lambda: take_rows(batches(), first))
        medians = []
        with torch.no_grad():
            seen = 0
            for x, _ in batches():
                lo, hi = max(first - seen, 0), min(len(x), rows - seen)
                seen += len(x)
                if hi > lo:
                    medians.append(self.statistics(net, x[lo:hi].to(self.device))["median"].cpu())
        self.q = float(np.quantile(torch.cat(medians).numpy(), self.quantile))

    def fit_state(self) -> dict[str, Tensor] | None:
        base = self.base.fit_state() if self.base.requires_fit else {}
        if base is None:
            return None  # the base refits from the fit pass; so does q
        return {**{f"base.{k}": v for k, v in base.items()}, "ross_q": torch.tensor([self.q], dtype=torch.float64)}

    def load_fit_state(self, net: nn.Module, state: dict[str, Tensor]) -> None:
        if self.base.requires_fit:
            self.base.load_fit_state(net, {k[5:]: v for k, v in state.items() if k.startswith("base.")})
        self.q = float(state["ross_q"][0])

    # ---------------------------------------------------------------------------------------------- scores

    def copies(self, net: nn.Module, x: Tensor, noise: Tensor, grad: bool) -> Tensor:
        """The base confidence of every noisy copy ``x + noise_j`` (``noise``: ``m x B x C x H x W`` in pixel units),
        ``m x B`` (float64), all copies in one pass; with ``grad`` differentiable in ``x``."""
        m, b = noise.shape[:2]
        noisy = (x.unsqueeze(0) + noise).reshape(m * b, *x.shape[1:])
        base = self.base
        if grad:
            graph = grad_outputs(net, noisy, keep_maps=False, taps=base.needs_taps)
            conf = base.source_grad_score(net, noisy, graph)
        else:
            noisy, graph, out = pass_outputs(net, noisy.detach(), base.needs_taps, base.needs_input_grad)
            with torch.set_grad_enabled(base.needs_input_grad):  # ODIN differentiates its pass, even under no_grad
                conf = base.source_score(net, noisy, graph if base.needs_input_grad else out)
            conf = torch.as_tensor(conf).detach()
        return conf.reshape(m, b).to(x.device, torch.float64)

    def noise(self, net: nn.Module, x: Tensor, count: int, fixed: bool = False) -> Tensor:
        """``count`` noise draws for batch ``x`` in pixel units (``count x B x C x H x W``): the image-seeded draws of
        this instance's stream, or (``fixed``) one draw from a generator seeded with the stream's seed alone, the
        same at every call on a batch of this shape (the attack without EOT)."""
        scale = input_scale(net, x, self.input_std is not None) * self.sigma
        if fixed:
            gen = torch.Generator().manual_seed(self.draw_seed())
            e = torch.randn((count, *x.shape), generator=gen).to(x.device, x.dtype)
        else:
            e = torch.stack(list(noise_draws(x.detach(), self.draw_seed(), count)))
        return e * scale

    def statistics(self, net: nn.Module, x: Tensor) -> dict[str, Tensor]:
        """ROSS's statistics of batch ``x`` from this instance's stream (no gradient)."""
        with torch.no_grad():
            copies = self.copies(net, x.detach(), self.noise(net, x, self.n), grad=False)
        return ross_statistics(copies, math.inf if self.q is None else self.q, self.lam)

    def score(self, net: nn.Module, x: Tensor, out: Outputs) -> Tensor:
        if self.q is None:
            raise RuntimeError(f"detector {self.name!r} is not fitted (no quantile q)")
        return self.statistics(net, x)[self.component]

    def with_surrogate(self, surrogate: str) -> RossDetector:
        """The same fitted detector whose gradient follows ``surrogate`` (one of :data:`SURROGATES`)."""
        if surrogate not in SURROGATES:
            raise UsageError(f"surrogate {surrogate!r} for detector {self.name!r}; valid choices: "
                             f"{', '.join(SURROGATES)}")
        twin = copy.copy(self)
        twin.surrogate = surrogate
        return twin



class DifferentiableRoss(RossDetector, DifferentiableDetector):
    """A ROSS detector over a differentiable base: gradients end to end through its own score."""

    #: the objectives an attack runs, each image keeping its best result (:mod:`advopenood_plugins.attacks.adaptive`)
    surrogates: ClassVar[tuple[str, ...]] = SURROGATES

    def grad_score(self, net: nn.Module, x: Tensor, out: Outputs | None) -> Tensor:
        """The confidence (forward) with the gradient of :attr:`surrogate` over ``m`` noisy copies: the fixed draw
        of ``n`` copies without EOT, ``eot_samples`` fresh image-seeded draws with it (module docstring)."""
        if not torch.is_grad_enabled():
            return self.score(net, x, out)
        count = self.eot_samples or self.n
        copies = self.copies(net, x, self.noise(net, x, count, fixed=self.eot_samples == 0), grad=True)
        if self.eot_samples >= self.n:  # the first n EOT draws are the stream's draws of the value: one batched pass
            value = ross_statistics(copies[:self.n].detach(), self.q, self.lam)[self.component]
        else:
            with torch.no_grad():
                value = self.score(net, x, out)
        surrogate = ross_statistics(copies, self.q, self.lam)[self.surrogate]
        return straight_through(value, surrogate)


def is_ross(obj: Any) -> bool:
    """Whether a registered detector (class or instance) is a ROSS detector."""
    cls = obj if isinstance(obj, type) else type(obj)
    return issubclass(cls, RossDetector)


@registry.family("detectors", PREFIX, accepts=lambda obj: not is_ross(obj) and not is_smoothed(obj),
                 hint="any detector that is not randomised itself (smoothed or ROSS)",
                 description="ROSS over a detector (Hekal et al. 2026): the median of its confidence over n Gaussian "
                             "copies, gated by their mean absolute deviation above the ID quantile q.")
def ross_detector(detector: str) -> type[RossDetector]:
    """The class of ``ross_<detector>`` for a registered detector (the family's factory)."""
    obj = registry.get("detectors", detector)
    base = DifferentiableRoss if is_differentiable(obj) else RossDetector
    return type(PREFIX + detector, (base,), {
        "__doc__": f"ROSS over {detector.upper()} (Hekal et al. 2026): the median of its confidence over n Gaussian "
                   "copies, gated by their mean absolute deviation above the ID quantile q.",
        "__module__": __name__, "base_name": detector})
