"""What the capture (``grads/capture.py``) keeps of one forward call of a layer, and the two
pieces every route reads with it: :class:`Call` (the detached inputs, the output gradients, the
eagerly formed per-sample gradients), :class:`Tap` (the identity that lets a constant first-layer
output still receive its gradient) and :func:`check_unchanged` (the refusal of an input changed
in place after the layer ran, which autograd no longer notices with the weights frozen)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from dpfy.grads.layers import Layer

__all__ = ["Call", "Tap", "at_least_float32", "check_unchanged", "version_of"]


def at_least_float32(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32 if it is a half-precision float (autocast), else unchanged.

    Per-sample norms decide the clipping, and a norm under-estimated in bfloat16 (3 significant
    digits) would let an example contribute more than C: rule layers work in float32 at least.
    """
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def version_of(t: Any) -> int | None:
    """A tensor's in-place version counter (None: not a tensor, or one that has none): noted
    when a layer's input is captured (:mod:`dpfy.grads.capture`), so that
    :func:`check_unchanged` can refuse an input modified in place before ``backward()``."""
    if not torch.is_tensor(t):
        return None
    try:
        return t._version
    except RuntimeError:  # e.g. inference tensors
        return None


class Tap(torch.autograd.Function):
    """Identity on a layer output that does not require grad, so that its gradient is still seen.

    With the parameters frozen, the output of a first layer (its input is data) is a constant.
    Making that output a leaf with ``requires_grad_()`` would work but costs an AccumulateGrad
    copy of its gradient into ``.grad`` and refuses in-place operations after the layer (e.g.
    ``ReLU(inplace=True)``). Instead the output passes through this function, anchored on a
    0-element leaf so that autograd records it; its backward hands the gradient to ``keep`` and
    returns none (nothing is accumulated anywhere). The output aliases the input's storage but
    is not a view, so in-place operations after the layer are allowed.
    """

    @staticmethod
    def forward(
        ctx: Any, anchor: torch.Tensor, t: torch.Tensor, keep: Callable[[torch.Tensor], None]
    ) -> torch.Tensor:
        ctx.keep = keep
        return t.detach()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, None]:
        ctx.keep(grad)  # sensitive
        return None, None, None


@dataclass
class Call:
    """One captured forward call of a layer and the gradients its outputs received.

    For a rule layer whose route is "materialized", the per-sample gradients are formed in the
    backward hook as soon as the output gradient arrives, and the input and output gradient are
    dropped (``eager``): for small layers such as LayerNorm that frees B·T·d activations early.
    """

    args: tuple[Any, ...]  # detached inputs; args[0] is (B, ...) sensitive
    kwargs: dict[str, Any]
    batch_size: int
    grads: list[torch.Tensor | None] = field(default_factory=list)  # per output leaf, sensitive
    eager: dict[str, torch.Tensor] | None = None  # per-sample gradients (B, *θ), sensitive
    saved: Any = None  # the rule's ``capture`` of the output, sensitive
    versions: tuple[int | None, ...] = ()  # version counters of the tensor args at capture
    batch_dim: int = 0  # where the output gradient holds the batch
    problem: str | None = None  # why this call's rows are not the batch's
    in_dims: tuple[Any, Any] = ((), {})  # vmap layers: batch dim per arg / kwarg
    shared: bool = False  # inputs shared by every example (broadcast)

    @property
    def used(self) -> bool:
        return self.eager is not None or any(g is not None for g in self.grads)

    def rule_grad_sample(self, layer: Layer, g: torch.Tensor) -> dict[str, torch.Tensor]:
        """The rule's per-sample gradients {rel: (B, *θ)} for this call's input and output
        gradient ``g``, with what its ``capture`` kept. Sensitive."""
        assert layer.rule is not None, "rule_grad_sample is asked of rule layers only"
        if self.saved is None:
            return layer.rule.grad_sample(layer.module, self.args[0], g)
        return layer.rule.grad_sample(layer.module, self.args[0], g, saved=self.saved)

    def row_dims(self, layer: Layer) -> Any:
        """The batch dimension(s) of the inputs as the capture split them, for the row-identity
        probe: a vmap layer's in-dims, or a rule layer's batch dimension (None: an input shared by
        the batch)."""
        if layer.rule is None:
            return self.in_dims
        return None if self.shared else self.batch_dim


def check_unchanged(layer: Layer, call: Call) -> None:
    """Refuse inputs that were modified in place after the layer ran.

    With its weights frozen, autograd no longer saves a layer's input, so nothing else would
    notice: the per-sample gradients would be computed from the modified values.
    """
    for a, v in zip(call.args, call.versions):
        if v is not None and version_of(a) != v:
            raise ValueError(
                f"the input of {layer.label} must not change after the layer ran, got it "
                f"modified in place before backward() (version {v} -> {version_of(a)}). Use an "
                f"out-of-place operation there, e.g. x = x + f(x) instead of x += f(x)"
            )
