"""BatchNorm with statistics from declared public data only (Davody et al. 2020; the guide's
layer section, option (a)).

A BatchNorm in training mode normalizes each example with the mean and variance of its batch, so
every example's output (and gradient) depends on the others: per-example clipping no longer
bounds one example's contribution, and dpfy refuses the layer (``grads/layers.check_model``).
:func:`public_batchnorm` replaces every ``nn.BatchNorm1d/2d/3d`` of a model, in place, by a
:class:`PublicBatchNorm` that normalizes with statistics computed from a batch of **public**
data, never from the private rows:

- ``refresh()`` forwards the next public batch through the model (``eval()`` mode, no gradient;
  each module's mode is restored after), and each :class:`PublicBatchNorm` on the way computes
  the mean and (biased) variance of its input over that batch, keeps them for the training
  forwards (``public_mean``, ``public_var``), updates its running estimates (``running_mean``,
  ``running_var``, BatchNorm's momentum rule) and normalizes the public batch with them, as a
  BatchNorm in training mode would, so the next layer's statistics are computed on normalized
  public activations;
- a training forward on private rows normalizes every row with ``public_mean``/``public_var``
  (a per-example affine map: row i of the output depends on example i and public data only);
  an evaluation forward with the running estimates, which are public data's too;
- ``attach(optimizer)`` refreshes after every update of the parameters (a step post hook on the
  optimizer that updates them; ``dpfy.make_private`` attaches it to the optimizer it is given),
  so the statistics follow the current weights, as a BatchNorm's batch statistics do.

The statistics are treated as constants in the backward: no gradient flows through them (they
are functions of public data and of weights already released). The affine parameters
(``weight``, ``bias``) are the BatchNorm's own ``nn.Parameter`` objects, so an optimizer built
before the swap is kept; their per-example gradients come from :class:`PublicBatchNormRule`.

Privacy: nothing of the private data enters the statistics; the buffers change only in
``refresh()``, between a step and the next forward, which the
:class:`~dpfy.buffers.BufferGuard` allows (it refuses changes made in a training forward or
between a forward and its step). The guarantee is then unchanged, and does not cover the public
data: name it in the report (``privacy_report(public_data=stats.description)``).

Where it differs from a BatchNorm: dropout and other ``eval()``-sensitive layers before a
BatchNorm are in eval mode when the public statistics are computed; the statistics are those of
the public data's distribution, not the private data's (the closer the two, the better).
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any, Iterator

import torch
from torch import nn
from torch.utils.data import Dataset

from dpfy._hooks import OwnHook
from dpfy._require import require
from dpfy.grads.rules.base import register_rule
from dpfy.layers.statistics_norm import (
    StatisticsNorm,
    StatisticsNormRule,
    at_least_float32,
    replace_batchnorms,
)

__all__ = [
    "PublicBatchNorm",
    "PublicBatchNormRule",
    "PublicStatistics",
    "attach_public_statistics",
    "public_batchnorm",
]

# model -> its PublicStatistics (found by make_private; a copy of the model is not registered)
_STATS: "weakref.WeakKeyDictionary[nn.Module, PublicStatistics]" = weakref.WeakKeyDictionary()


class PublicBatchNorm(StatisticsNorm):
    """A BatchNorm whose statistics come from public data only (see the module docstring).

    Build it with :meth:`from_batchnorm` (or :func:`public_batchnorm` for a whole model).
    Buffers: ``public_mean``/``public_var`` (the last public batch's, used in training mode),
    ``running_mean``/``running_var`` (running estimates over public batches, used in eval mode)
    and ``num_batches_tracked``. ``collecting`` (a Python flag) is set by
    :meth:`PublicStatistics.refresh` only.
    """

    public_mean: torch.Tensor
    public_var: torch.Tensor
    extra_buffers = (("public_mean", 0.0), ("public_var", 1.0))
    collecting: bool = False  # set on the instance by PublicStatistics.refresh only

    @torch.no_grad()
    def _collect(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A public batch: its statistics, kept for training and folded into the running ones."""
        dims = self.dims(x)
        n = x.numel() // x.shape[1]
        require(n > 1, "values per channel in the public batch", n, "> 1")
        var, mean = torch.var_mean(x.to(at_least_float32(x)), dim=dims, correction=0)
        self.public_mean.copy_(mean)
        self.public_var.copy_(var)
        self.fold(mean, var * (n / (n - 1)))  # unbiased, as nn.BatchNorm keeps it
        return self.public_mean, self.public_var

    def stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The (mean, variance) a forward in the current mode normalizes with."""
        if self.training:
            return self.public_mean, self.public_var
        return self.running_mean, self.running_var

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.collecting:
            return super().forward(x)
        return self.normalize(x, *self._collect(x))

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, public statistics"


@register_rule(PublicBatchNorm)
class PublicBatchNormRule(StatisticsNormRule):
    """Per-example gradients of a :class:`PublicBatchNorm` (:class:`StatisticsNormRule`)."""


class PublicStatistics:
    """The public data that feeds a model's :class:`PublicBatchNorm` layers, and its refresh.

    Args:
      model: the model (its BatchNorms already replaced by :func:`public_batchnorm`).
      public_data: a tensor of inputs (N, ...) or a ``Dataset`` whose items are an input or a
        tuple whose first element is the input. Declared public: it is outside the guarantee.
      batch_size: the public batch each refresh forwards (drawn in order from a shuffled
        permutation, reshuffled each pass; public data, so the order is not a secret).
      description: what the public data is, for the privacy report.
      seed: the public shuffle's seed.
    """

    def __init__(
        self,
        model: nn.Module,
        public_data: torch.Tensor | Dataset,
        *,
        batch_size: int = 256,
        description: str = "public data",
        seed: int = 0,
    ) -> None:
        n = len(public_data)  # type: ignore[arg-type]
        require(
            isinstance(batch_size, int) and 2 <= batch_size,
            "batch_size",
            batch_size,
            "an int >= 2 (a variance needs two values)",
        )
        require(n >= 2, "len(public_data)", n, ">= 2", "Pass at least two public examples")
        self._model = weakref.ref(model)  # the registry's value must not keep its key alive
        self.public_data = public_data
        self.batch_size, self.description = min(batch_size, n), description
        self.layers = [m for m in model.modules() if isinstance(m, PublicBatchNorm)]
        self._gen = torch.Generator().manual_seed(seed)
        self._order: Iterator[torch.Tensor] = iter(())
        self._versions = -1
        self._params: list[torch.Tensor] = []
        self._warned = False
        self.refreshes = 0
        self._hook = model.register_forward_pre_hook(OwnHook(self._check_fresh))

    @property
    def model(self) -> nn.Module:
        model = self._model()
        assert model is not None, "the model of these public statistics was garbage-collected"
        return model

    def _param_versions(self) -> int:
        """The parameters' version counters (of the objects seen at the last refresh: a
        ``functional_call`` inside a forward swaps in other tensors, which must not count)."""
        if not self._params:
            self._params = list(self.model.parameters())
        return sum(p._version for p in self._params)

    def _next_batch(self) -> torch.Tensor:
        idx = next(self._order, None)
        if idx is None:
            perm = torch.randperm(len(self.public_data), generator=self._gen)  # type: ignore[arg-type]
            self._order = iter(perm.split(self.batch_size))
            idx = next(self._order)
        if torch.is_tensor(self.public_data):
            return self.public_data[idx]
        items = [self.public_data[int(i)] for i in idx]
        return torch.stack([it[0] if isinstance(it, (tuple, list)) else it for it in items])

    @torch.no_grad()
    def refresh(self) -> None:
        """Forward the next public batch; every PublicBatchNorm keeps its statistics."""
        modes = [(m, m.training) for m in self.model.modules()]
        ref = next(self.model.parameters(), None)
        batch = self._next_batch()
        if ref is not None:  # the model's device, and its float dtype for float inputs
            dtype = ref.dtype if batch.is_floating_point() and ref.is_floating_point() else None
            batch = batch.to(device=ref.device, dtype=dtype)
        self.model.eval()
        for layer in self.layers:
            layer.collecting = True
        try:
            self.model(batch)
        finally:
            for layer in self.layers:
                layer.collecting = False
            for m, mode in modes:
                m.training = mode
        self._params = list(self.model.parameters())
        self._versions = self._param_versions()
        self.refreshes += 1

    def attach(self, optimizer: torch.optim.Optimizer) -> None:
        """Refresh after every ``step()`` of ``optimizer`` (for a ``DPOptimizer``, of the
        optimizer it wraps, which steps once per logical batch)."""
        inner = getattr(optimizer, "original_optimizer", optimizer)
        inner.register_step_post_hook(lambda *_: self.refresh())

    def _check_fresh(self, module: nn.Module, args: Any) -> None:
        """Warn (once) when a training forward comes after a parameter update without a
        refresh: the statistics are then the old weights' (public all the same)."""
        if self._warned or not module.training or any(m.collecting for m in self.layers):
            return
        if self._param_versions() != self._versions:
            self._warned = True
            warnings.warn(
                "PublicBatchNorm statistics are older than the parameters: call "
                "stats.attach(optimizer) (make_private does it for the optimizer it is given) "
                "or stats.refresh() after each update",
                stacklevel=2,
            )

    def detach(self) -> None:
        """Stop warning about stale statistics (hooks on optimizers stay)."""
        self._hook.remove()


def public_batchnorm(
    model: nn.Module,
    public_data: torch.Tensor | Dataset,
    *,
    batch_size: int = 256,
    description: str = "public data",
    seed: int = 0,
) -> PublicStatistics:
    """Replace every BatchNorm1d/2d/3d of ``model`` (in place) by a :class:`PublicBatchNorm`
    sharing its parameters, compute the first statistics from ``public_data``, and return the
    :class:`PublicStatistics` that refreshes them. Call it before ``make_private``, which
    attaches the refresh to the optimizer; with your own loop, call ``stats.attach(optimizer)``.

    The root module itself cannot be replaced in place: wrap a bare BatchNorm in a container.
    """
    swapped = replace_batchnorms(model, PublicBatchNorm.from_batchnorm, "public_batchnorm")
    require(
        swapped > 0 or any(isinstance(m, PublicBatchNorm) for m in model.modules()),
        "model",
        type(model).__name__,
        "a model with at least one BatchNorm1d/2d/3d",
        "public_batchnorm has nothing to do on it",
    )
    old = _STATS.get(model)
    if old is not None:
        old.detach()
    stats = PublicStatistics(
        model, public_data, batch_size=batch_size, description=description, seed=seed
    )
    stats.refresh()
    _STATS[model] = stats  # found by make_private
    return stats


def attach_public_statistics(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """If ``model`` went through :func:`public_batchnorm`, refresh its statistics after every
    step of ``optimizer`` (called by ``make_private``)."""
    stats = _STATS.get(model)
    if stats is not None:
        stats.attach(optimizer)
