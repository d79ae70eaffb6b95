"""Every layer rule and both routes against the float64 per-example loop (tests/oracles.py).

For each layer we check, per example i and parameter θ: the per-sample gradient, its squared
norm (ghost route and materialized route) and the weighted sum Σ_i w_i ∂ℓ_i/∂θ, against the
gradient of ℓ_i computed alone in float64 — the definition, not a formula. Shapes come from
hypothesis and include B = 0 (an empty Poisson batch).
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Iterator

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch import nn

import oracles
from dpfy.grads import GradEngine, RULES, LayerRule, register_rule, rule_for
from dpfy.grads.rules import base

RTOL = 1e-9  # the engine runs in float64 here, so only summation order differs from the loop


def loss_sum(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # a loss with a non-trivial output gradient for any output shape: Σ (out · fixed weights)²
    w = torch.linspace(-1, 1, out.shape[1:].numel(), dtype=out.dtype).reshape(out.shape[1:])
    return ((out * w).sum(tuple(range(1, out.dim()))) ** 2 * (1 + y.to(out.dtype))).sum()


def check(model: nn.Module, x: torch.Tensor, route: str = "auto") -> None:
    """Norms and a weighted sum from the engine (run in float64) equal the float64 loop."""
    model = model.double()
    x = x.double() if x.is_floating_point() else x
    b = x.shape[0]
    y = torch.arange(b) % 2
    ref = oracles.per_example_grads(model, x, y, loss_sum)  # name -> (B, *θ) float64
    eng = GradEngine(model, route=route, loss_reduction="sum")
    try:
        loss_sum(model(x), y).backward()
        sq = eng.per_sample_sq_norms()
        w = torch.linspace(0.1, 1.0, b, dtype=torch.float64)  # (B,) arbitrary weights
        sums = eng.weighted_sums({n: w for n in sq})
    finally:
        eng.detach()
    for n, g in ref.items():
        want_sq = g.reshape(b, g[0].numel()).square().sum(1) if b else g.new_zeros(0)
        torch.testing.assert_close(sq[n], want_sq, rtol=RTOL, atol=1e-12)
        want = torch.einsum("b,b...->...", w.double(), g)
        torch.testing.assert_close(sums[n], want, rtol=RTOL, atol=1e-12)


B = st.integers(0, 4)


@contextlib.contextmanager
def device_path(on: bool) -> Iterator[None]:
    """The rules' accelerator code path (what a GPU takes) forced on the CPU, or not."""
    kept = base.FORCE_DEVICE_PATH
    base.FORCE_DEVICE_PATH = on
    try:
        yield
    finally:
        base.FORCE_DEVICE_PATH = kept


@settings(max_examples=12, deadline=None)
@given(b=B, t=st.integers(1, 4), d_in=st.integers(1, 6), d_out=st.integers(1, 6),
       bias=st.booleans(), seq=st.booleans(), on_device_path=st.booleans())
def test_linear(b, t, d_in, d_out, bias, seq, on_device_path):
    # the device path has no fused CPU kernel (and its 2-D weighted sum always scales gᵀ)
    torch.manual_seed(0)
    x = torch.randn(b, t, d_in) if seq else torch.randn(b, d_in)
    with device_path(on_device_path):
        check(nn.Linear(d_in, d_out, bias=bias), x)


@settings(max_examples=12, deadline=None)
@given(b=B, c=st.sampled_from([1, 2, 4]), groups=st.sampled_from([1, 2]),
       k=st.integers(1, 3), stride=st.integers(1, 2), pad=st.integers(0, 2),
       dil=st.integers(1, 2), mode=st.sampled_from(["zeros", "reflect", "circular"]))
def test_conv2d(b, c, groups, k, stride, pad, dil, mode):
    torch.manual_seed(0)
    groups = groups if c % groups == 0 else 1
    layer = nn.Conv2d(c, 2 * groups, k, stride=stride, padding=pad, dilation=dil,
                      groups=groups, padding_mode=mode)
    check(layer, torch.randn(b, c, 7, 6))


@settings(max_examples=8, deadline=None)
@given(b=B, k=st.integers(1, 3), stride=st.integers(1, 2), bias=st.booleans())
def test_conv1d(b, k, stride, bias):
    torch.manual_seed(0)
    check(nn.Conv1d(3, 4, k, stride=stride, padding=1, bias=bias), torch.randn(b, 3, 9))


def test_conv_same_padding():
    torch.manual_seed(0)
    check(nn.Conv2d(2, 3, 3, padding="same"), torch.randn(3, 2, 5, 5))


@settings(max_examples=8, deadline=None)
@given(b=B, t=st.integers(1, 5), pad=st.sampled_from([None, 0]))
def test_embedding(b, t, pad):
    torch.manual_seed(0)
    x = torch.randint(0, 4, (b, t))  # few ids: repeated tokens exercise the ghost cross terms
    model = nn.Sequential(nn.Embedding(4, 3, padding_idx=pad), nn.Flatten())
    check(model, x)


@settings(max_examples=8, deadline=None)
@given(b=B, t=st.integers(1, 3), affine=st.booleans())
def test_layernorm(b, t, affine):
    torch.manual_seed(0)
    ln = nn.LayerNorm(5, elementwise_affine=affine)
    if affine:
        with torch.no_grad():
            ln.weight.uniform_(0.5, 1.5)
            ln.bias.uniform_(-1, 1)
    model = nn.Sequential(nn.Linear(4, 5), ln)  # a Linear before it so B=0 still has params
    check(model, torch.randn(b, t, 4))


@settings(max_examples=8, deadline=None)
@given(b=B, groups=st.sampled_from([1, 2, 4]))
def test_groupnorm(b, groups):
    torch.manual_seed(0)
    gn = nn.GroupNorm(groups, 4)
    with torch.no_grad():
        gn.weight.uniform_(0.5, 1.5)
        gn.bias.uniform_(-1, 1)
    check(nn.Sequential(nn.Conv2d(2, 4, 2), gn), torch.randn(b, 2, 4, 4))


@pytest.mark.parametrize("route", ["auto", "vmap"])
def test_unsupported_layer_goes_to_vmap(route):
    # nn.PReLU and nn.Bilinear have no rule: the auto route runs torch.func on them only
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.act, self.bil = nn.Linear(3, 4), nn.PReLU(), nn.Bilinear(4, 4, 2)

        def forward(self, x):
            h = self.act(self.a(x))
            return self.bil(h, h)

    model = Net()
    check(model, torch.randn(3, 3), route)
    eng = GradEngine(model, route="auto")
    routes = {r["module"]: r["route"] for r in eng.explain()}
    eng.detach()
    assert routes["act"] == "vmap" and routes["bil"] == "vmap" and routes["a"] != "vmap"


def test_multihead_attention_vmap_fallback():
    # nn.MultiheadAttention reads out_proj.weight without calling out_proj: the whole module
    # must be one vmap layer so that out_proj's parameters are not left out.
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    model = nn.Sequential(layer, nn.Flatten())
    check(model, torch.randn(3, 4, 8))


def test_weight_reused_twice_in_one_forward():
    # a layer called twice: per-sample gradients of both calls are summed (materialized route)
    torch.manual_seed(0)
    lin = nn.Linear(3, 3)

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = lin

        def forward(self, x):
            return self.lin(torch.tanh(self.lin(x)))

    check(Twice(), torch.randn(4, 3))


def test_ghost_and_materialized_routes_agree():
    # the hybrid rule picks a route by size; force each and compare on the same capture
    torch.manual_seed(0)
    layer = nn.Linear(6, 5)
    a, g = torch.randn(4, 3, 6), torch.randn(4, 3, 5)
    rule = rule_for(layer)
    gs = rule.grad_sample(layer, a, g)
    ghost = rule.sq_norm(layer, a, g)
    assert set(ghost) == set(gs)
    for n in gs:
        torch.testing.assert_close(ghost[n], gs[n].reshape(4, -1).square().sum(1))


def test_registry_one_file_per_layer_and_no_duplicates():
    # one rule per layer type: the rule for X lives in grads/rules/<file>.py and re-registering
    # raises
    files = {t: inspect.getfile(type(r)).rsplit("/", 1)[-1] for t, r in RULES.items()}
    assert files[nn.Linear] == "linear.py" and files[nn.Conv2d] == "conv.py"
    assert files[nn.Embedding] == "embedding.py" and files[nn.LayerNorm] == "layernorm.py"
    assert files[nn.GroupNorm] == "groupnorm.py"
    with pytest.raises(ValueError, match="already registered"):
        register_rule(nn.Linear)(type("Again", (LayerRule,), {}))


def test_subclass_is_not_silently_treated_as_parent():
    class MyLinear(nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2

    assert rule_for(MyLinear(2, 2)) is None
    torch.manual_seed(0)
    check(MyLinear(3, 2), torch.randn(3, 3))  # correct through the vmap route


@pytest.mark.parametrize("on_device_path", [False, True])
def test_embedding_of_empty_sequences_has_a_zero_norm(on_device_path):
    """Ids of shape (B, 0) read no embedding row: each example's gradient is 0. The device path
    once built its slot offsets with ``arange(0, B·T, T)``, whose step 0 torch refuses."""
    from dpfy.grads.rules.embedding import EmbeddingRule

    layer = nn.Embedding(4, 3)
    x, g = torch.zeros(2, 0, dtype=torch.long), torch.zeros(2, 0, 3)
    with device_path(on_device_path):
        sq = EmbeddingRule().sq_norm(layer, x, g)["weight"]
    assert torch.equal(sq, torch.zeros(2))
