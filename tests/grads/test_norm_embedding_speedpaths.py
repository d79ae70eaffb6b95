"""The LayerNorm, GroupNorm and Embedding rules' fast paths against the float64 per-example loop.

Each rule entry point (``grad_sample``, ``sq_norm`` where the rule has one, ``weighted_sum``) is
called directly on a captured (input, output gradient) pair and compared with the gradient of
each example's loss computed alone (tests/oracles.py). The cases are the ones the fast paths
branch on: repeated and all-distinct ids, padding ids (repeated or not), index tensors with
more than one position dimension; LayerNorm without bias or affine parameters, over several
trailing dims, with zeros in γ and with inputs whose mean dwarfs their spread.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import oracles
from dpfy.grads import GradEngine, rule_for
from dpfy.grads.rules import groupnorm

RTOL = 1e-9  # float64 throughout: only summation order differs from the loop


def loss_sum(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # Σ_i ℓ_i with a non-trivial output gradient for any output shape
    w = torch.linspace(-1, 1, out.shape[1:].numel(), dtype=out.dtype).reshape(out.shape[1:])
    return ((out * w).sum(tuple(range(1, out.dim()))) ** 2 * (1 + y.to(out.dtype))).sum()


def captured(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The output gradient the engine would capture: row i is ∂ℓ_i/∂(layer output)_i."""
    out = layer(x).detach().requires_grad_(True)
    loss_sum(out, torch.arange(x.shape[0]) % 2).backward()
    return out.grad


def check_rule(layer: nn.Module, x: torch.Tensor) -> None:
    """Per-sample gradients, ghost norms (if any) and a weighted sum of the rule equal the loop."""
    layer = layer.double()
    x = x.double() if x.is_floating_point() else x
    b = x.shape[0]
    ref = oracles.per_example_grads(layer, x, torch.arange(b) % 2, loss_sum)  # (B, *θ) each
    rule, g = rule_for(layer), captured(layer, x)
    gs = rule.grad_sample(layer, x, g)
    assert set(gs) == set(ref)
    for n, want in ref.items():
        torch.testing.assert_close(gs[n], want, rtol=RTOL, atol=1e-12)
    if rule.has_ghost:
        sq = rule.sq_norm(layer, x, g)
        for n, want in ref.items():
            torch.testing.assert_close(sq[n], want.reshape(b, -1).square().sum(1),
                                       rtol=RTOL, atol=1e-12)
    w = torch.linspace(0.1, 1.0, b, dtype=torch.float64)  # (B,) arbitrary weights
    sums = rule.weighted_sum(layer, x, g, {n: w for n in ref})
    for n, want in ref.items():
        torch.testing.assert_close(sums[n], torch.einsum("b,b...->...", w, want),
                                   rtol=RTOL, atol=1e-12)


def check_engine(model: nn.Module, x: torch.Tensor) -> None:
    """The engine's norms (whatever route it picks) equal the loop's: the eager hook path too."""
    model = model.double()
    x = x.double() if x.is_floating_point() else x
    b = x.shape[0]
    y = torch.arange(b) % 2
    ref = oracles.per_example_grads(model, x, y, loss_sum)
    eng = GradEngine(model, loss_reduction="sum")
    try:
        loss_sum(model(x), y).backward()
        sq = eng.per_sample_sq_norms()
    finally:
        eng.detach()
    for n, want in ref.items():
        torch.testing.assert_close(sq[n], want.reshape(b, -1).square().sum(1),
                                   rtol=RTOL, atol=1e-12)


# -- Embedding ---------------------------------------------------------------------------------
@pytest.mark.parametrize("pad", [None, 0, 2])
@pytest.mark.parametrize("ids", [
    torch.tensor([[1, 2, 1, 1, 3], [0, 0, 2, 2, 2], [3, 1, 0, 2, 4]]),  # repeats, one distinct row
    torch.tensor([[0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [2, 0, 4, 1, 3]]),  # every row distinct
    torch.tensor([[2], [0], [2]]),  # T = 1
    torch.arange(5).repeat(3, 1),  # the same distinct ids in every example (positions)
    torch.tensor([[3, 0, 3, 1, 2]] * 3),  # the same ids in every example, with repeats
    torch.tensor([[[1, 1], [2, 0]], [[0, 0], [0, 0]], [[4, 3], [2, 1]]]),  # (B, 2, 2) ids
])
def test_embedding_ids(ids, pad):
    torch.manual_seed(0)
    check_rule(nn.Embedding(5, 3, padding_idx=pad), ids)


@pytest.mark.parametrize("pad", [None, 1])
def test_embedding_random_ids_int32(pad):
    torch.manual_seed(0)
    ids = torch.randint(0, 6, (7, 9), dtype=torch.int32)  # int32 indices are accepted by torch
    check_rule(nn.Embedding(6, 4, padding_idx=pad), ids)


def test_embedding_positions_in_engine():
    # token + position embeddings as in the benchmark encoder, through the engine
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(4, 3, padding_idx=0), nn.Embedding(6, 3)

        def forward(self, ids):
            pos = torch.arange(ids.shape[1]).repeat(ids.shape[0], 1)
            return (self.tok(ids) + self.pos(pos)).flatten(1)

    torch.manual_seed(0)
    check_engine(Net(), torch.randint(0, 4, (5, 6)))


# -- LayerNorm ---------------------------------------------------------------------------------
def _layernorm(shape, affine=True, bias=True, zeros=False) -> nn.LayerNorm:
    ln = nn.LayerNorm(shape, elementwise_affine=affine, bias=bias)
    if affine:
        with torch.no_grad():
            ln.weight.uniform_(0.5, 1.5)
            if zeros:
                ln.weight.view(-1)[::2] = 0  # γ with zeros: nothing may divide by it
            if ln.bias is not None:
                ln.bias.uniform_(-1, 1)
    return ln


@pytest.mark.parametrize("shape,x_shape", [
    ((5,), (3, 5)),  # no position dim
    ((5,), (3, 4, 5)),
    ((5,), (3, 2, 4, 5)),  # several position dims
    ((3, 4), (3, 2, 3, 4)),  # several normalized dims
    ((2, 3, 4), (3, 2, 3, 4)),  # everything normalized but the batch
])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("zeros", [False, True])
def test_layernorm_shapes(shape, x_shape, bias, zeros):
    torch.manual_seed(0)
    check_rule(_layernorm(shape, bias=bias, zeros=zeros), torch.randn(x_shape))


def test_layernorm_without_affine_has_no_gradients():
    ln = nn.LayerNorm(5, elementwise_affine=False)
    x = torch.randn(2, 3, 5)
    assert rule_for(ln).grad_sample(ln, x, torch.randn_like(x)) == {}


def test_layernorm_large_mean_float32():
    # centring before squaring: a mean 10⁴ times the spread must not cancel the variance away
    # (E[x²] − μ² is off by ~10³ here; float32 rounding of x − μ alone, which torch's own
    # layer_norm shares, leaves ~5e-3)
    torch.manual_seed(0)
    ln = _layernorm(8)
    x, g = 1e4 + torch.randn(4, 6, 8), torch.randn(4, 6, 8)
    got = rule_for(ln).grad_sample(ln, x, g)["weight"]
    xhat = nn.functional.layer_norm(x.double(), (8,), eps=ln.eps)  # same inputs, in float64
    want = (g.double() * xhat).sum(1)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2)


def test_layernorm_in_engine():
    # the eager route in the backward hook, with an output gradient that is expanded over T
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.ln = nn.Linear(4, 5), _layernorm(5)

        def forward(self, x):
            return self.ln(self.lin(x)).mean(1)

    torch.manual_seed(0)
    check_engine(Net(), torch.randn(3, 6, 4))


@pytest.mark.parametrize("shape,x_shape", [((5,), (3, 4, 5)), ((3, 4), (3, 2, 3, 4))])
def test_layernorm_reuses_the_forwards_statistics(shape, x_shape):
    # capture() reads mean and 1/std from the output's autograd node (input requires grad);
    # grad_sample with them equals the loop, and equals the recomputing route
    torch.manual_seed(0)
    ln = _layernorm(shape).double()
    ln.requires_grad_(False)
    x = torch.randn(x_shape, dtype=torch.float64)
    rule, g = rule_for(ln), captured(ln, x)
    saved = rule.capture(ln, ln(x.clone().requires_grad_(True)))
    lead = x_shape[:x.dim() - len(shape)]
    assert saved is not None and saved[0].shape == lead + (1,) * len(shape)
    assert rule.capture(ln, ln(x)) is None  # a constant input: no autograd node, recompute
    ref = oracles.per_example_grads(ln, x, torch.arange(x.shape[0]) % 2, loss_sum)
    with_saved = rule.grad_sample(ln, x, g, saved=saved)
    for n, want in ref.items():
        torch.testing.assert_close(with_saved[n], want, rtol=RTOL, atol=1e-12)
        torch.testing.assert_close(with_saved[n], rule.grad_sample(ln, x, g)[n],
                                   rtol=RTOL, atol=1e-12)


# -- GroupNorm ---------------------------------------------------------------------------------
@pytest.mark.parametrize("groups,x_shape", [
    (2, (3, 4, 5, 6)), (1, (3, 4, 5)), (4, (3, 4, 2, 3)), (2, (3, 4)), (4, (2, 4, 3, 2, 2)),
    (2, (2, 4, 32, 32)),  # 2048 values per group: the F.group_norm route
])
@pytest.mark.parametrize("zeros", [False, True])
def test_groupnorm_shapes(groups, x_shape, zeros):
    torch.manual_seed(0)
    gn = nn.GroupNorm(groups, x_shape[1])
    with torch.no_grad():
        gn.weight.uniform_(0.5, 1.5)
        if zeros:
            gn.weight[::2] = 0
        gn.bias.uniform_(-1, 1)
    check_rule(gn, torch.randn(x_shape))


def test_groupnorm_routes_both_taken():
    assert 2 * 32 * 32 >= groupnorm.NATIVE_MIN_GROUP > 4 * 5 * 6
