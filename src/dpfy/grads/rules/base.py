"""The layer-rule registry: one rule object per layer type, carrying per-sample gradients,
ghost norms and book-keeping weighted sums (CONTRIBUTING.md, "Adding a layer rule").

For a layer y = f(a; θ) called on a batch, the engine captures the input ``a`` (forward hook) and
the output gradient ``g = ∂L/∂y`` (tensor hook) during the user's single backward pass. A rule
turns (a, g) into, per trainable parameter θ_k of the layer:

- ``grad_sample``: the per-sample gradients ∂ℓ_i/∂θ_k, shape (B, *θ_k.shape);
- ``sq_norm`` (optional, "ghost"): ‖∂ℓ_i/∂θ_k‖², shape (B,), without materializing them;
- ``weighted_sum``: Σ_i w_i ∂ℓ_i/∂θ_k for per-sample weights w (B,), by contracting w⊙g with
  a (book-keeping, Bu et al. 2022), i.e. no second backward pass.

``prefers_ghost`` decides per call, by size, whether the ghost route is cheaper (the hybrid rule
of fast-differential-privacy: ghost when T² < d_in·d_out for a sequence of length T).

Lookup is by *exact* type: a subclass of ``nn.Linear`` is not silently treated as a Linear (its
forward may differ); it goes to the vmap route and ``dpfy explain`` says so.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

__all__ = ["LayerRule", "RULES", "device_path", "register_rule", "rule_for"]

# Force the rules' accelerator code path on the CPU (benchmarks/step_ops.py counts what a GPU
# would launch): no data-dependent shortcut that reads the device, no CPU-only kernel.
FORCE_DEVICE_PATH = False


def device_path(t: torch.Tensor) -> bool:
    """Whether ``t``'s rules take the accelerator path: a host read of ``t`` would synchronize
    the device, so shortcuts decided by reading data are skipped (the general path is exact)."""
    return FORCE_DEVICE_PATH or t.device.type != "cpu"


class LayerRule:
    """Per-sample gradient math for one layer type.

    Subclasses implement ``grad_sample``; they may add ``sq_norm`` (then set ``has_ghost``)
    and a faster ``weighted_sum``. ``a`` is the layer's captured input (the first positional
    argument), ``g`` the gradient of the loss w.r.t. its output, already rescaled so that row i
    is the gradient of example i's own loss ℓ_i.
    """

    has_ghost: bool = False
    # Position-additive rules: the per-sample gradient is a sum over positions of a term of the
    # input and output gradient at that position alone (Linear: Σ_t g_t a_tᵀ; Embedding:
    # Σ_t onehot(x_t) g_tᵀ). ``(k_a, k_g)``: how many trailing dims of ``a`` and ``g`` are
    # features, the dims between the batch and them being positions. The rows of one privacy
    # unit then pack into one longer sequence whose ghost norm is the unit's norm
    # (``grads/packing.py``). None: not position-additive (a convolution's patches overlap).
    position_tails: tuple[int, int] | None = None

    def params(self, layer: nn.Module) -> dict[str, nn.Parameter]:
        """The layer's own parameters by attribute name (``None`` ones skipped)."""
        return {n: p for n, p in layer.named_parameters(recurse=False)}

    def batch_input(self, layer: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The input ``a`` the rule works on, from the call's (detached) arguments.

        Default: the first positional argument, or the keyword argument ``input``. A rule whose
        layer takes its batch in several arguments (EmbeddingBag's ids and offsets) returns one
        tensor with the batch in dimension 0 that its other methods read.
        """
        return args[0] if args else kwargs.get("input")

    def batch_dims(self, layer: nn.Module, a: torch.Tensor) -> tuple[int, ...]:
        """The dimensions of ``a`` that may hold the batch (the batch guard moves the one of the
        private batch's size to dim 0, if only one has it). Default: dim 0 only; a layer that
        treats all leading dimensions alike (Linear, Embedding) allows each of them."""
        return (0,)

    def grad_sample(
        self, layer: nn.Module, a: torch.Tensor, g: torch.Tensor, saved: Any = None
    ) -> dict[str, torch.Tensor]:
        """``saved``: what :meth:`capture` kept, passed only by rules that keep something."""
        raise NotImplementedError

    def sq_norm(
        self, layer: nn.Module, a: torch.Tensor, g: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        raise NotImplementedError(f"{type(self).__name__} has no ghost norm")

    def prefers_ghost(self, layer: nn.Module, a: torch.Tensor, g: torch.Tensor) -> bool:
        return False

    def capture(self, layer: nn.Module, output: torch.Tensor) -> Any:
        """Called in the forward hook: values the layer's own forward already computed that
        ``grad_sample`` can reuse instead of recomputing them (e.g. LayerNorm's mean and
        1/std, read from the output's autograd node), or None. A rule that returns something
        here receives it as ``grad_sample(layer, a, g, saved=...)``. Default: None."""
        return None

    def weighted_sum(
        self, layer: nn.Module, a: torch.Tensor, g: torch.Tensor, w: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """Σ_i w_i ∂ℓ_i/∂θ. Default: contract the materialized per-sample gradients."""
        gs = self.grad_sample(layer, a, g)  # sensitive: name -> (B, *θ.shape)
        return {n: torch.einsum("b,b...->...", w[n].to(t.dtype), t) for n, t in gs.items()}


RULES: dict[type[nn.Module], LayerRule] = {}


def register_rule(*layer_types: type[nn.Module]) -> Callable[[type[LayerRule]], type[LayerRule]]:
    """Class decorator: register one rule instance for the given exact layer types.

    Registering a type twice raises (no silent overwrite).
    """

    def deco(cls: type[LayerRule]) -> type[LayerRule]:
        rule = cls()
        for t in layer_types:
            if t in RULES:
                raise ValueError(
                    f"a layer rule for {t.__name__} is already registered by "
                    f"{type(RULES[t]).__name__}; unregister it first"
                )
            RULES[t] = rule
        return cls

    return deco


def rule_for(layer: nn.Module) -> LayerRule | None:
    """The rule registered for exactly ``type(layer)``, or None."""
    return RULES.get(type(layer))
