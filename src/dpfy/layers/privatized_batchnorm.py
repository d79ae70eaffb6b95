"""BatchNorm with privatized statistics: each step's batch mean and mean of squares released
with Gaussian noise and recorded in the ledger (the guide's layer section, option (b); Table 5:
"add noise to Batch norm mean and mean of squares calculation").

A BatchNorm in training mode normalizes each example with its batch's statistics, so one
example moves every other example's output and gradient and per-example clipping no longer
bounds its contribution. :func:`privatized_batchnorm` replaces every ``nn.BatchNorm1d/2d/3d`` of
a model, in place, by a :class:`PrivatizedBatchNorm` whose training forward normalizes with
statistics *released* from the batch:

The release (one per layer per logical batch, the first training forward of the batch). For
example i and channel c, with S_c its values of channel c (spatial positions, or one value for a
(B, C) input):

    m_ic = clamp(mean_{s} x_ics, −A, A),      q_ic = min(mean_{s} x_ics², A²)

the example's contribution clipped to the declared activation bound A (a NaN mean, from a NaN
value or +inf and −inf in one example, counts as 0: clamp would leave it unbounded). Then

    μ̃ = (Σ_i m_i + N(0, (σ_bn Δ_m)² I_C)) / b,   ν̃ = (Σ_i q_i + N(0, (σ_bn Δ_q)² I_C)) / b,

with b the *expected* batch size (the sampler's normalizer, qN for Poisson sampling) and the
variance max(ν̃ − μ̃², floor). Sensitivity (add or remove one example, which adds or removes
one m_i and one q_i): every coordinate of m_i is in [−A, A] and of q_i in [0, A²], so
‖m_i‖₂ ≤ Δ_m = A·√C and ‖q_i‖₂ ≤ Δ_q = A²·√C. Each sum with its noise is therefore a Gaussian
mechanism at noise multiplier σ_bn: two releases per layer, recorded in the ledger as
``Release("bn_mean:<layer>", σ_bn)`` and ``Release("bn_square:<layer>", σ_bn)`` beside the
gradient's, in the same step (the same sampled batch: the accountants compose them with it,
σ_eff = (σ_g⁻² + 2L·σ_bn⁻²)^(−1/2) for L layers; replace-one adjacency doubles every Δ as for
the gradient). Layer l's input depends on layer l−1's released statistics: adaptive composition
of Gaussian mechanisms, which that formula covers.

Per-example sensitivity of the gradient is kept: the released statistics are constants
(detached), so row i of every output depends on example i and released values only, and the
engine's row probes accept the layer (:class:`~dpfy.layers.statistics_norm.StatisticsNormRule`
forms the affine parameters' per-example gradients).

What is released when: the statistics are drawn at the batch's first training forward and kept
for every later forward of the same logical batch (the engine's probe forwards, a method's loss
probes): post-processing, no second release. They are recorded when the step records its
gradient (the mechanism :func:`~dpfy.layers.batchnorm_setup.attach_privatized_statistics`
wraps); only then are they folded into the running estimates that an ``eval()`` forward uses
(``running_mean``, ``running_var``: built from released values only). A forward whose batch is
never stepped on releases nothing: its statistics reach no model state and no released value.
A logical batch cut into physical batches would release statistics of a part of it (whose
membership one example can shift): refused. Every step records the releases of every layer,
whether a forward used them or not (an over-count, never an under-count).
"""

from __future__ import annotations

import math
import warnings
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from dpfy._require import require
from dpfy.buffers import watched
from dpfy.errors import PrivacyRefusal
from dpfy.grads.rules.base import register_rule
from dpfy.layers.statistics_norm import (
    StatisticsNorm,
    StatisticsNormRule,
    at_least_float32,
    replace_batchnorms,
)
from dpfy.noise.generator import NoiseSource
from dpfy.privacy.ledger import Release

if TYPE_CHECKING:
    from dpfy.sampling import BatchCursor

__all__ = [
    "PrivatizedBatchNorm",
    "PrivatizedBatchNormRule",
    "PrivatizedStatistics",
    "privatized_batchnorm",
    "privatized_statistics_of",
]

# layer -> the PrivatizedStatistics that releases its statistics (a copy of a model is not
# registered: its layers normalize with their running estimates and release nothing)
_OWNER: "weakref.WeakKeyDictionary[nn.Module, PrivatizedStatistics]" = weakref.WeakKeyDictionary()
# model -> its PrivatizedStatistics (found by make_private's set-up)
_STATS: "weakref.WeakKeyDictionary[nn.Module, PrivatizedStatistics]" = weakref.WeakKeyDictionary()


class PrivatizedBatchNorm(StatisticsNorm):
    """A BatchNorm whose training statistics are released with Gaussian noise (module
    docstring). Build it with :func:`privatized_batchnorm`. A layer that no
    :class:`PrivatizedStatistics` owns (a copy of the model, such as ``dpfy.validate``'s)
    normalizes with its running estimates in training mode too, with a warning: no release,
    nothing of the batch in the statistics."""

    def stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The (mean, variance) a forward in the current mode normalizes with: in training
        mode, this logical batch's released statistics (running estimates for a copy)."""
        owner = _OWNER.get(self)
        if not self.training or owner is None:
            return self.running_mean, self.running_var
        return owner.current(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.dims(x)
        owner = _OWNER.get(self)
        if not self.training:
            return self.normalize(x, self.running_mean, self.running_var)
        if owner is None:  # a copy (dpfy.validate's, a user's): nothing to release with
            warnings.warn(
                "PrivatizedBatchNorm: this layer belongs to no PrivatizedStatistics (a copy of "
                "the model?), so its training forward normalizes with its running estimates "
                "and releases nothing; call privatized_batchnorm() on the model you train",
                stacklevel=2,
            )
            return self.normalize(x, self.running_mean, self.running_var)
        return self.normalize(x, *owner.statistics(self, x))

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, privatized"


@register_rule(PrivatizedBatchNorm)
class PrivatizedBatchNormRule(StatisticsNormRule):
    """Per-example gradients of a :class:`PrivatizedBatchNorm` (:class:`StatisticsNormRule`):
    the released statistics are constants of the step."""


@dataclass
class _Released:
    """One layer's released statistics for one logical batch (noisy: no longer sensitive)."""

    key: Any
    mean: torch.Tensor
    var: torch.Tensor
    folded: bool = False


class PrivatizedStatistics:
    """The noisy statistics releases of a model's :class:`PrivatizedBatchNorm` layers.

    Args:
      model: the model (its BatchNorms replaced by :func:`privatized_batchnorm`).
      bound: A, the declared activation bound each example's per-channel mean is clipped to
        ([−A, A]; its mean of squares to [0, A²]). Sensitivities A·√C and A²·√C.
      noise_multiplier: σ_bn of every release (noise std / sensitivity); or None with
        ``share``.
      share: instead of σ_bn: the fraction of each step's Gaussian precision Σ σ⁻² the
        statistics take (0 < share < 1); σ_bn then follows from the gradient's σ when the
        statistics are attached to a run (:mod:`dpfy.layers.batchnorm_setup`).
      expected_batch_size: b, the divisor of the noisy sums; set from the sampler when attached.
      noise: the generator of the noise (the run's, when attached; else a secure one).

    In a loop of your own (no ``make_private``): add :meth:`releases` to the step's ledger
    record beside the gradient's and call :meth:`commit` after each step; every training forward
    between two commits reuses the statistics of the first.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        bound: float,
        noise_multiplier: float | None = None,
        share: float | None = None,
        expected_batch_size: float | None = None,
        noise: NoiseSource | None = None,
    ) -> None:
        require(
            isinstance(bound, (int, float)) and math.isfinite(bound) and bound > 0,
            "bound",
            bound,
            "a finite number > 0",
            "Declare the activation bound A that each example's per-channel mean is clipped to",
        )
        require(
            (noise_multiplier is None) != (share is None),
            "noise_multiplier and share",
            (noise_multiplier, share),
            "exactly one of them",
            "Declare σ_bn (noise_multiplier=) or the statistics' share of each step (share=)",
        )
        if noise_multiplier is not None:
            require(
                math.isfinite(noise_multiplier) and noise_multiplier > 0,
                "noise_multiplier",
                noise_multiplier,
                "a finite number > 0",
                "Statistics released without noise would not be private",
            )
        if share is not None:
            require(0 < share < 1, "share", share, "in (0, 1)")
        self.bound, self.noise_multiplier, self.share = float(bound), noise_multiplier, share
        self.expected_batch_size = expected_batch_size
        self.noise = noise
        self._model = weakref.ref(model)
        self.layers = [m for m in model.modules() if isinstance(m, PrivatizedBatchNorm)]
        names = {id(m): n for n, m in model.named_modules()}
        self.names = [names[id(m)] for m in self.layers]
        self.cursor: BatchCursor | None = None
        self.generation = 0  # without a cursor: the statistics of one step between commits
        self._released: dict[int, _Released] = {}
        self.releases_made = 0  # how many layer releases were drawn (for tests and reports)
        for m in self.layers:
            _OWNER[m] = self

    # -- the release ----------------------------------------------------------------------------
    def _key(self, check: bool = True) -> Any:
        """Which logical batch a training forward belongs to: the loader's, when attached."""
        if self.cursor is None:
            return ("step", self.generation)
        c = self.cursor
        if check and c.pending and not c.last:
            raise PrivacyRefusal(
                "a logical batch must be one physical batch with privatized BatchNorm "
                "statistics, got a logical batch cut into physical batches "
                "(max_physical_batch_size): the statistics of a part of the batch change with "
                "which examples the cut puts there, so one example could move two parts. Drop "
                "max_physical_batch_size= (or raise it above the largest logical batch); "
                "nothing of this step was released"
            )
        return ("batch", self.generation, c.logical)

    def statistics(self, layer: PrivatizedBatchNorm, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The released (mean, variance) this training forward normalizes with: this logical
        batch's, released now from ``x`` if it is the batch's first forward through ``layer``."""
        key = self._key()
        i = self.layers.index(layer)
        got = self._released.get(i)
        if got is None or got.key != key:
            self._check_rows(i, x)
            mean, var = self._release(layer, x)
            got = self._released[i] = _Released(key, mean, var)
        return got.mean, got.var

    def _check_rows(self, i: int, x: torch.Tensor) -> None:
        """While a loader batch awaits its step, a release must come from it, one row per
        example: an example spread over T rows (a sequence flattened to (B·T, C)) moves the sums
        by T·Δ, and rows of other data are not the sampled batch the step records."""
        c = self.cursor
        if c is None or c.pending == 0 or c.indices is None:
            return  # no step can record this release (the next batch is a new key)
        rows = int(c.indices.shape[0])
        if x.shape[0] != rows:
            raise PrivacyRefusal(
                f"the input of privatized BatchNorm {self.names[i]!r} must have one row per "
                f"example of the private batch ({rows} rows), got {x.shape[0]} rows: each row is "
                f"clipped as one example's statistics, so an example spread over several rows "
                f"would move the sums by more than the recorded sensitivity, and rows of other "
                f"data are not the sampled batch. Feed the layer the loader's batch with the "
                f"positions last, (B, C, T) (BatchNorm1d averages each example's positions); "
                f"nothing of this step was released"
            )

    def current(self, layer: PrivatizedBatchNorm) -> tuple[torch.Tensor, torch.Tensor]:
        """The statistics the last training forward through ``layer`` used (the rule's capture
        reads them; a forward comes first)."""
        got = self._released.get(self.layers.index(layer))
        if got is None:
            return layer.running_mean, layer.running_var
        return got.mean, got.var

    @property
    def num_releases(self) -> int:
        """k: the Gaussian releases of one step (the mean and the mean of squares per layer)."""
        return 2 * len(self.layers)

    def sigma(self) -> float:
        """σ_bn (set from ``share`` when the statistics are attached to a run)."""
        require(
            self.noise_multiplier is not None,
            "noise_multiplier",
            None,
            "set before the first release",
            "Declare noise_multiplier=, or attach the statistics to a run that derives it "
            "from share= (make_private(batchnorm='privatized'))",
        )
        assert self.noise_multiplier is not None
        return float(self.noise_multiplier)

    def sensitivities(self, channels: int) -> tuple[float, float]:
        """(Δ_m, Δ_q) = (A·√C, A²·√C): the L2 sensitivities of the two sums of a C-channel
        layer under adding or removing one example (module docstring)."""
        return self.bound * math.sqrt(channels), self.bound**2 * math.sqrt(channels)

    @torch.no_grad()
    def _release(self, layer: PrivatizedBatchNorm, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Clip each example's per-channel mean and mean of squares, sum, add noise, divide."""
        b = self.expected_batch_size
        require(
            b is not None and b > 0,
            "expected_batch_size",
            b,
            "> 0 before a training forward",
            "Attach the statistics to a run (make_private does) or pass expected_batch_size=",
        )
        assert b is not None
        if self.cursor is None and watched(layer):  # in a private run (of any model holding it)
            raise PrivacyRefusal(
                "privatized BatchNorm statistics must be attached to the private run of their "
                "model, got a model made private (make_private) without them: its steps would "
                "not record the statistics' releases. Call attach_privatized_statistics(stats, "
                "optimizer) (dpfy.layers.batchnorm_setup) right after make_private"
            )
        sigma = self.sigma()
        if self.noise is None:
            self.noise = NoiseSource()  # secure
        a, c = self.bound, layer.num_features
        xs = x.detach().to(at_least_float32(x))  # sensitive
        xs = xs[:, :, None] if xs.dim() == 2 else xs.flatten(2)  # (B, C, S); B may be 0
        # clamp leaves NaN (a NaN value, +inf and −inf in one example) unbounded: count it as 0
        m = xs.mean(-1).nan_to_num_(0.0).clamp_(-a, a)  # (B, C) sensitive, each in [−A, A]
        q = xs.square().mean(-1).nan_to_num_(0.0).clamp_(max=a * a)  # (B, C) sensitive, [0, A²]
        d_m, d_q = self.sensitivities(c)
        like = m.new_zeros(c)
        mean = m.sum(0) + self.noise.gaussian(like, sigma * d_m)
        square = q.sum(0) + self.noise.gaussian(like, sigma * d_q)
        del xs, m, q
        mean, square = mean / b, square / b  # released
        # a variance below the noise of its own estimate is indistinguishable from 0: floor it
        floor = sigma * d_q / b
        var = (square - mean.square()).clamp_(min=floor)
        self.releases_made += 1
        dt = x.dtype if x.is_floating_point() else mean.dtype
        return mean.to(dt), var.to(dt)

    # -- the ledger --------------------------------------------------------------------------------
    def releases(self) -> tuple[Release, ...]:
        """What each step releases besides the gradient: two Gaussian releases per layer."""
        sigma = self.sigma()
        out: list[Release] = []
        for name in self.names:
            out += [Release(f"bn_mean:{name}", sigma), Release(f"bn_square:{name}", sigma)]
        return tuple(out)

    def commit(self) -> None:
        """The step was recorded: fold this batch's released statistics into the running
        estimates (post-processing of released values; once per release)."""
        key = self._key(check=False)
        for i, got in self._released.items():
            if got.key == key and not got.folded:
                self.layers[i].fold(got.mean, got.var)
                got.folded = True
        if self.cursor is None:
            self.generation += 1  # the next training forward starts the next step's release


def privatized_statistics_of(model: nn.Module) -> PrivatizedStatistics | None:
    """The :class:`PrivatizedStatistics` of ``model``, if :func:`privatized_batchnorm` ran on it."""
    return _STATS.get(model)


def privatized_batchnorm(
    model: nn.Module,
    *,
    bound: float,
    noise_multiplier: float | None = None,
    share: float | None = None,
    expected_batch_size: float | None = None,
) -> PrivatizedStatistics:
    """Replace every BatchNorm1d/2d/3d of ``model`` (in place) by a :class:`PrivatizedBatchNorm`
    sharing its parameters, and return the :class:`PrivatizedStatistics` that releases their
    statistics (arguments there). Call it before ``make_private`` and attach the statistics
    to the run after it (:func:`dpfy.layers.batchnorm_setup.attach_privatized_statistics`), or
    let ``make_private(batchnorm="privatized", ...)`` do both."""
    swapped = replace_batchnorms(model, PrivatizedBatchNorm.from_batchnorm, "privatized_batchnorm")
    require(
        swapped > 0,
        "model",
        type(model).__name__,
        "a model with at least one BatchNorm1d/2d/3d",
        "privatized_batchnorm has nothing to do on it",
    )
    stats = PrivatizedStatistics(
        model,
        bound=bound,
        noise_multiplier=noise_multiplier,
        share=share,
        expected_batch_size=expected_batch_size,
    )
    _STATS[model] = stats
    return stats
