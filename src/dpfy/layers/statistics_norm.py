"""What the two DP BatchNorm replacements share: normalization with statistics *given* to the
layer, never computed from the batch being normalized, and the per-example gradient rule.

:class:`StatisticsNorm` is a BatchNorm whose training forward normalizes every row with a
per-channel (mean, variance) pair that :meth:`StatisticsNorm.stats` returns: a fixed affine map
per channel, so row i of the output depends on example i and those statistics only, and no
gradient flows through them (they are constants of the step). An ``eval()`` forward uses the
running estimates. Where the statistics come from is the subclass's:

- :class:`~dpfy.layers.public_batchnorm.PublicBatchNorm`: a batch of declared public data
  (option (a) of the guide's layer section);
- :class:`~dpfy.layers.privatized_batchnorm.PrivatizedBatchNorm`: the private batch's mean and
  mean of squares, released with Gaussian noise and recorded in the ledger (option (b)).

:class:`StatisticsNormRule` forms the per-example gradients of the affine parameters for both.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from dpfy._require import require
from dpfy.grads.rules.base import LayerRule

__all__ = ["StatisticsNorm", "StatisticsNormRule", "at_least_float32", "replace_batchnorms"]

_SWAPPED = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
N = TypeVar("N", bound="StatisticsNorm")


def at_least_float32(x: torch.Tensor) -> torch.dtype:
    """float64 stays float64; half precision is summed in float32."""
    return torch.promote_types(x.dtype, torch.float32)


class StatisticsNorm(nn.Module):
    """A BatchNorm that normalizes with the statistics :meth:`stats` gives (module docstring).

    Buffers: ``running_mean``/``running_var`` (used in eval mode) and ``num_batches_tracked``,
    then a subclass's ``extra_buffers`` (name, initial value), one value per channel.
    """

    extra_buffers: tuple[tuple[str, float], ...] = ()

    running_mean: torch.Tensor
    running_var: torch.Tensor
    num_batches_tracked: torch.Tensor
    weight: nn.Parameter | None
    bias: nn.Parameter | None

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
    ) -> None:
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.weight = nn.Parameter(torch.ones(num_features)) if affine else None
        self.bias = nn.Parameter(torch.zeros(num_features)) if affine else None
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))
        for name, fill in self.extra_buffers:
            self.register_buffer(name, torch.full((num_features,), fill))

    @classmethod
    def from_batchnorm(cls: type[N], bn: _BatchNorm) -> N:
        """The replacement of ``bn``: its eps and momentum and its ``weight``/``bias`` Parameter
        objects (shared). Its running estimates are *not* carried over: a train-mode forward on
        private data (a warm-up, a shape check) would have left private batch statistics in
        them, and they ship with the model. They start where a new BatchNorm's do (mean 0,
        variance 1) and move only with the statistics the subclass allows."""
        new = cls(bn.num_features, bn.eps, bn.momentum, affine=False)
        new.weight, new.bias = bn.weight, bn.bias
        ref = bn.weight if bn.weight is not None else bn.running_mean
        new.to(device=ref.device if ref is not None else None)
        return new

    def dims(self, x: torch.Tensor) -> list[int]:
        """The dimensions a BatchNorm reduces over: all but the channels (dim 1)."""
        require(
            x.dim() >= 2 and x.shape[1] == self.num_features,
            f"the input of {type(self).__name__}",
            tuple(x.shape),
            f"(B, {self.num_features}, ...)",
        )
        return [0, *range(2, x.dim())]

    @torch.no_grad()
    def fold(self, mean: torch.Tensor, var: torch.Tensor) -> None:
        """Fold one batch's statistics into the running estimates (BatchNorm's momentum rule;
        ``momentum=None``: the cumulative average)."""
        self.num_batches_tracked.add_(1)
        m = self.momentum if self.momentum is not None else 1.0 / int(self.num_batches_tracked)
        self.running_mean.lerp_(mean.to(self.running_mean), m)
        self.running_var.lerp_(var.to(self.running_var), m)

    def stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The (mean, variance) a forward in the current mode normalizes with."""
        raise NotImplementedError

    def normalize(self, x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
        # training=False: normalize with the given statistics, never the batch's
        return F.batch_norm(x, mean, var, self.weight, self.bias, False, 0.0, self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.dims(x)
        return self.normalize(x, *self.stats())


class StatisticsNormRule(LayerRule):
    """Per-example gradients of a :class:`StatisticsNorm`: with the statistics constant,
    y = x̂ ⊙ γ_c + β_c and x̂ = (x − μ_c)/√(σ²_c + eps), so per example
    ∂ℓ_i/∂γ_c = Σ_s g_{c,s} x̂_{c,s} and ∂ℓ_i/∂β_c = Σ_s g_{c,s}. (B, C): always materialized.
    Each subclass is registered for one layer type (``register_rule`` takes exact types)."""

    def capture(self, layer: nn.Module, output: torch.Tensor) -> Any:
        assert isinstance(layer, StatisticsNorm)
        # the statistics this forward used (a refresh may come before the gradient is formed)
        return tuple(t.detach().clone() for t in layer.stats())

    def grad_sample(
        self, layer: nn.Module, a: torch.Tensor, g: torch.Tensor, saved: Any = None
    ) -> dict[str, torch.Tensor]:
        assert isinstance(layer, StatisticsNorm)
        b, c = a.shape[0], a.shape[1]
        g = g.reshape(b, c, -1)  # (B, C, S) sensitive
        out = {}
        if layer.weight is not None:
            mean, var = saved if saved is not None else layer.stats()
            dt = at_least_float32(a)
            scale = (var.to(dt) + layer.eps).rsqrt()[None, :, None]
            x_hat = (a.reshape(b, c, -1).to(dt) - mean.to(dt)[None, :, None]).mul_(scale)
            out["weight"] = x_hat.mul_(g).sum(-1).to(g.dtype)  # (B, C) sensitive
        if layer.bias is not None:
            out["bias"] = g.sum(-1)  # (B, C) sensitive
        return out


def replace_batchnorms(model: nn.Module, make: Any, what: str) -> int:
    """Replace (in place) every BatchNorm1d/2d/3d inside ``model`` by ``make(bn)``; the count.
    The root module itself cannot be replaced in place: it is refused, naming ``what``."""
    require(
        not isinstance(model, _BatchNorm),
        "model",
        type(model).__name__,
        "a container of BatchNorm layers",
        f"Wrap the layer, e.g. nn.Sequential(bn), before {what}",
    )
    swapped = 0
    for m in list(model.modules()):
        for child_name, child in list(m.named_children()):
            if type(child) in _SWAPPED:
                setattr(m, child_name, make(child))
                swapped += 1
    return swapped
