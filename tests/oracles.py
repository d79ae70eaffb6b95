"""The slow, obviously-correct reference: a float64 per-example loop (the math is written for one
example; every layer rule and both engines are tested against it).

For each example i we run the model on x[i:i+1] alone, backpropagate its own loss ℓ_i and read
the parameter gradients. Everything the engines compute (per-sample norms, clipped sums) is tested
against this loop.
"""

from __future__ import annotations

import copy
from typing import Callable

import torch
from torch import nn

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def per_example_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn
                      ) -> dict[str, torch.Tensor]:
    """{name: (B, *θ.shape)} float64 gradients of ℓ_i = loss_fn(model(x_i), y_i), one at a time."""
    m = copy.deepcopy(model).double()
    for sub in m.modules():  # a plain copy: no hooks of a private engine attached to `model`
        for hooks in (sub._forward_hooks, sub._forward_pre_hooks, sub._backward_hooks,
                      sub._forward_hooks_with_kwargs):
            hooks.clear()
    for p in m.parameters():
        p.requires_grad_(True)
    names = [n for n, _ in m.named_parameters()]
    rows: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    for i in range(x.shape[0]):
        xi = x[i:i + 1].double() if x.is_floating_point() else x[i:i + 1]
        m.zero_grad(set_to_none=False)
        loss_fn(m(xi), y[i:i + 1]).backward()
        for n, p in m.named_parameters():
            rows[n].append(p.grad.detach().clone())
    return {n: (torch.stack(r) if r else torch.zeros(0, *dict(m.named_parameters())[n].shape,
                                                    dtype=torch.float64)) for n, r in rows.items()}


def per_example_norms(grads: dict[str, torch.Tensor]) -> torch.Tensor:
    """Total L2 norm of each example's gradient over all parameters, (B,)."""
    b = next(iter(grads.values())).shape[0]
    return torch.sqrt(sum(g.reshape(b, g[0].numel() if b else 0).square().sum(1) for g in grads.values()))


def clipped_sum(grads: dict[str, torch.Tensor], clip: float) -> dict[str, torch.Tensor]:
    """Σ_i g_i · min(1, C/‖g_i‖) (flat clipping, Abadi et al. 2016)."""
    norms = per_example_norms(grads)
    w = torch.clamp(clip / norms, max=1.0)
    return {n: torch.einsum("b,b...->...", w, g) for n, g in grads.items()}
