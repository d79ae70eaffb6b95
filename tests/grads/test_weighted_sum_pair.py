"""Two weighted sums for the price of one when w1 = c·w2 wherever w2 ≠ 0 (OSO's clipped
gradient and threshold gradient): each sum equals the float64 per-example loop's, no example's
effective weight exceeds its declared one, and a pair that is not proportional takes the
general path (exact too)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import oracles
from dpfy.grads import GradEngine
from dpfy.grads.routes import find_split

B = 9


def loss_sum(out, y):
    return nn.functional.cross_entropy(out, y, reduction="sum")


def _models():
    return {
        "mlp": (nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3)), torch.randn(B, 6)),
        "cnn": (nn.Sequential(nn.Conv2d(1, 2, 3), nn.Tanh(), nn.Flatten(), nn.Linear(2 * 4 * 4, 3)),
                torch.randn(B, 1, 6, 6)),
        "seq": (nn.Sequential(nn.Embedding(7, 4), nn.LayerNorm(4), nn.Flatten(), nn.Linear(12, 3)),
                torch.randint(0, 7, (B, 3))),
    }


def _oso_pair(norms: torch.Tensor, c: float) -> tuple[torch.Tensor, torch.Tensor]:
    """min(1, C/‖g_i‖) and 1[‖g_i‖ > C]/‖g_i‖, computed as OSO computes them."""
    clipped = norms > c
    w1 = torch.where(clipped, c / norms, torch.ones_like(norms))
    w2 = torch.where(clipped, 1.0 / norms, torch.zeros_like(norms))
    return w1, w2


@pytest.mark.parametrize("name", ["mlp", "cnn", "seq"])
@pytest.mark.parametrize("pair", ["oso", "unrelated", "none_clipped"])
def test_pair_of_sums_equals_the_float64_loop(name, pair):
    torch.manual_seed(0)
    model, x = _models()[name]
    model = model.double()
    x = x.double() if x.is_floating_point() else x
    y = torch.arange(B) % 3
    ref = oracles.per_example_grads(model, x, y, loss_sum)          # name -> (B, *θ)
    norms = torch.sqrt(sum(g.reshape(B, -1).square().sum(1) for g in ref.values()))
    if pair == "oso":
        w1, w2 = _oso_pair(norms, float(norms.median()))             # about half clipped
    elif pair == "none_clipped":
        w1, w2 = _oso_pair(norms, float(norms.max()) * 2)            # w2 all zero
    else:
        w1, w2 = torch.linspace(0.1, 1, B).double(), torch.linspace(1, 0, B).double()
    eng = GradEngine(model, loss_reduction="sum")
    try:
        loss_sum(model(x), y).backward()
        sq = eng.per_sample_sq_norms()
        sums1, sums2 = eng.weighted_sums_many([{n: w1 for n in sq}, {n: w2 for n in sq}])
    finally:
        eng.detach()
    for n, g in ref.items():
        torch.testing.assert_close(sums1[n], torch.einsum("b,b...->...", w1, g),
                                   rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(sums2[n], torch.einsum("b,b...->...", w2, g),
                                   rtol=1e-9, atol=1e-12)


def test_split_takes_the_smallest_ratio_and_refuses_non_constant_ones():
    w2 = torch.tensor([0.0, 0.5, 0.25, 0.0], dtype=torch.float32)
    w1 = torch.tensor([1.0, 0.05, 0.025 * (1 + 3e-6), 1.0], dtype=torch.float32)
    s = find_split(w1, w2)
    ratios = w1.double()[1:3] / w2.double()[1:3]
    assert s is not None and s.ratio == float(ratios.min())  # no example gains weight
    assert s.zero.tolist() == [0, 3] and s.nonzero.tolist() == [1, 2]
    assert find_split(torch.tensor([1.0, 0.2]), torch.tensor([0.5, 0.5])) is None   # ratio 2 vs 0.4
    assert find_split(torch.ones(3), torch.zeros(3)) is None                        # no w2 rows
