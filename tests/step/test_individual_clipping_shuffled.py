"""Per-example thresholds (``clipping='individual'``) under shuffled passes apply each
example's own C_i, as under Poisson sampling: the shuffled sampler gives the step the batch's
dataset indices. It was refused ("the thresholds need the batch's dataset indices") though the
tree mechanism, which shuffles too, was admitted and ran. Expected values: a float64
per-example loop in this test."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy

N, D = 8, 3


@pytest.mark.parametrize("kw", [dict(poisson_sampling=False), dict(noise="tree")])
def test_each_example_is_clipped_to_its_own_threshold(kw):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, dtype=torch.float64, generator=g)
    y = torch.randn(N, dtype=torch.float64, generator=g)
    clips = torch.tensor([0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 0.05, 0.7], dtype=torch.float64)
    model = nn.Linear(D, 1, bias=False).double()
    w0 = model.weight.detach().clone()[0]
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    loader = DataLoader(TensorDataset(x, y), batch_size=N)  # one pass = one batch of all N
    # the tree needs σ > 0: 1e-12 moves the weights by ~1e-12, far below the tolerance
    sigma = 1e-12 if kw.get("noise") == "tree" else 0.0
    model, optimizer, loader = dpfy.make_private(
        model,
        optimizer,
        loader,
        noise_multiplier=sigma,
        max_grad_norm=clips,
        clipping="individual",
        loss_reduction="sum",
        **kw,
    )
    xb, yb = next(iter(loader))
    optimizer.zero_grad()
    ((model(xb).squeeze(1) - yb) ** 2).sum().backward()
    optimizer.step()
    # float64 loop: g_i = 2 (x_i·w − y_i) x_i, clipped to C_i, summed, divided by b = N
    grads = torch.stack([2 * (x[i] @ w0 - y[i]) * x[i] for i in range(N)])
    scale = torch.clamp(clips / grads.norm(dim=1), max=1.0)
    expected = w0 - (grads * scale[:, None]).sum(0) / N
    # float64 throughout; 1e-9 covers the sum's rounding and the tree's 1e-12 noise
    torch.testing.assert_close(model.weight.detach()[0], expected, rtol=0, atol=1e-9)
