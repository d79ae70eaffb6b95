"""The vmap route: per-sample gradients of *any* module with torch.func.

The math is written for one example: for a captured call y = m(x; θ) with output gradient
ḡ = ∂L/∂y, example i's gradient is ∇_θ ⟨m(x_i; θ), ḡ_i⟩ (a vector–Jacobian product). ``vmap``
batches that over i. It needs the captured inputs and output gradients of the call, and costs one
more forward and backward of the module, vectorized over the batch.

Assumptions (checked by the engine's batch guard when the call is captured): the batch dimension
is dim 0 of every tensor argument, positional or keyword, that has the batch's rows; a tensor with
one row (or a scalar) is shared by all examples (``position_ids`` of shape (1, T)), and so is any
non-tensor argument; the module does not mix examples
(BatchNorm is refused before we get here) and uses no randomness (vmap raises on random ops, and
dropout modules in training mode are refused with a clear message, since recomputing the forward
would draw different masks).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.utils._pytree import tree_flatten

__all__ = ["vmap_grad_sample", "SWAPPABLE", "check_no_dropout"]

_DROPOUTS = (
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
    nn.AlphaDropout,
    nn.FeatureAlphaDropout,
)


# The torch types that dpfy.layers replaces by a DP layer built from Linears (exact types, as
# dpfy.layers.DP_REPLACEMENTS keys them). Written here because grads sits below layers and
# must not import it; tests/layers/test_swap.py checks that the two lists agree.
SWAPPABLE = (nn.RNN, nn.GRU, nn.LSTM, nn.MultiheadAttention)

_FIX_BY_SWAP = (
    "Call model = dpfy.validate(model, fix=True) (or dpfy.layers.swap_layers(model)) "
    "to use its dpfy.layers DP replacement, which takes the engine's exact rules"
)


def check_no_dropout(module: nn.Module, name: str) -> None:
    """Refuse dropout (a dropout module, or attention dropout) in training mode inside
    ``module`` (called ``name``): vmap recomputes the forward, so its masks would differ from
    those of the user's loss. Checked before a vmap layer's per-sample gradients, and by
    :func:`dpfy.validate` ahead of training."""
    for sub_name, sub in module.named_modules():
        full = ".".join(x for x in (name, sub_name) if x) or type(module).__name__
        if isinstance(sub, nn.MultiheadAttention) and sub.training and sub.dropout > 0:
            raise ValueError(
                f"module {full!r} (MultiheadAttention) must not use attention dropout inside a "
                f"vmap layer, got dropout = {sub.dropout} in training mode: dropout "
                f"randomness under vmap is the cause (the forward is recomputed, so the masks "
                f"would differ from your loss's). {_FIX_BY_SWAP} (DPMultiheadAttention "
                f"supports dropout and masks)"
            )
        if isinstance(sub, _DROPOUTS) and sub.training and sub.p > 0:
            raise ValueError(
                f"module {full!r} ({type(sub).__name__}) must not be active inside a "
                f"vmap layer, got p = {sub.p} in training mode. The vmap route recomputes "
                f"the forward, so dropout masks would differ from the ones used in your loss; "
                f"use route='ghost' with supported layers, move dropout out of the module, or "
                f"call .eval() on it"
            )


def vmap_grad_sample(
    module: nn.Module,
    name: str,
    params: dict[str, nn.Parameter],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    out_grads: list[torch.Tensor | None],
    in_dims: tuple[tuple, dict] | None = None,
) -> dict[str, torch.Tensor]:
    """Per-sample gradients {qualified name: (B, *θ.shape)} of ``params`` for one call.

    Args:
      module: the module that was called.
      name: its qualified name (for error messages).
      params: the trainable parameters of the module's subtree, by name relative to ``module``.
      args, kwargs: the captured (detached) call arguments.
      out_grads: the gradient of the loss w.r.t. each tensor leaf of the output, None where the
        loss did not depend on it.
      in_dims: (per argument, per keyword argument) 0 where the tensor is batched in dim 0,
        None where it is shared; default: positional tensors batched, keywords shared.
    """
    check_no_dropout(module, name)
    detached = {n: p.detach() for n, p in params.items()}
    frozen = {n: t.detach() for n, t in module.named_parameters() if n not in params}
    frozen.update(dict(module.named_buffers()))
    if in_dims is None:
        in_dims = (tuple(0 if torch.is_tensor(a) else None for a in args), {})
    arg_dims, kw_dims = in_dims
    batched_kw = {k: v for k, v in kwargs.items() if kw_dims.get(k) == 0}
    shared_kw = {k: v for k, v in kwargs.items() if kw_dims.get(k) != 0}
    used = [i for i, g in enumerate(out_grads) if g is not None]
    grads = tuple(g for g in out_grads if g is not None)  # the gradients at `used`, in order
    if any(g.dim() == 0 for g in grads):  # an output with no batch dim reached the loss
        raise ValueError(
            f"module {name or '(root)'!r} ({type(module).__name__}) must return per-example "
            f"outputs (batch in dim 0) for its vmap layer, got a 0-dim output that the loss "
            f"depends on — a loss computed inside the forward (Hugging Face models do this "
            f"when given labels) is a reduction over the batch, which vmap cannot split per "
            f"example. Use route='auto' (layer rules read the model's own backward), or call "
            f"the model without labels and compute the loss from its logits"
        )

    def inner_product(
        p: dict[str, torch.Tensor],
        xs: tuple[Any, ...],
        kws: dict[str, Any],
        gs: tuple[torch.Tensor, ...],
    ) -> torch.Tensor:
        one = tuple(x.unsqueeze(0) if d == 0 else x for x, d in zip(xs, arg_dims))  # batch of 1
        kw = {**shared_kw, **{k: v.unsqueeze(0) for k, v in kws.items()}}
        leaves = tree_flatten(functional_call(module, {**p, **frozen}, one, kw))[0]
        outs = [t for t in leaves if torch.is_tensor(t)]
        return sum(
            ((outs[i] * g.unsqueeze(0)).sum() for i, g in zip(used, gs)),
            start=torch.zeros((), dtype=gs[0].dtype if gs else torch.float32),
        )

    try:
        per_sample = vmap(grad(inner_product), in_dims=(None, tuple(arg_dims), 0, 0))(
            detached, args, batched_kw, grads
        )
    except RuntimeError as e:  # an op torch.func cannot batch, randomness, data-dependent flow
        first = str(e).splitlines()[0]
        cause = (
            " Randomness under vmap (dropout or another random op in the module) is the "
            "cause: the forward is recomputed, so its draws would differ from your loss's."
            if "random" in first.lower()
            else ""
        )
        fix = (
            _FIX_BY_SWAP
            if type(module) in SWAPPABLE
            else "Register a layer rule for it with dpfy.grads.register_rule, or replace the layer"
        )
        raise ValueError(
            f"module {name or '(root)'!r} ({type(module).__name__}) must be supported by "
            f"torch.func.vmap for per-sample gradients, got: {first}.{cause} {fix}"
        ) from e
    return per_sample  # sensitive: name -> (B, *θ.shape)
