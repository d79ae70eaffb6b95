"""Layer rules for InstanceNorm1d/2d/3d, RMSNorm and Conv3d against the float64 per-example loop.

``test_rules.check`` compares the engine's per-example squared norms and a weighted sum with the
loop (``oracles``), run in float64; shapes are drawn by hypothesis, ragged (odd, unequal spatial
sizes, B = 0 included where torch's own kernel allows it). Each layer must take its rule, not
the vmap fallback.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch import nn

from dpfy.grads import GradEngine, rule_for
from dpfy.grads.rules.conv import ConvRule
from test_rules import check

B = st.integers(0, 3)


def routes(model: nn.Module, x: torch.Tensor) -> dict[str, str]:
    """{module: route} after one forward/backward (the engine's explain rows)."""
    eng = GradEngine(model.double(), loss_reduction="sum")
    try:
        model(x.double()).square().sum().backward()
        return {r["module"]: r["route"] for r in eng.explain()}
    finally:
        eng.detach()


def randomized(norm: nn.Module) -> nn.Module:
    """Affine parameters away from their (1, 0) initialization."""
    with torch.no_grad():
        for p in norm.parameters():
            p.uniform_(0.5, 1.5)
    return norm


@settings(max_examples=8, deadline=None)
@given(b=st.integers(1, 3),  # torch's instance_norm kernel itself refuses B = 0
       dims=st.sampled_from([1, 2, 3]), size=st.integers(1, 4), bias=st.booleans())
def test_instancenorm(b, dims, size, bias):
    torch.manual_seed(0)
    norm = randomized({1: nn.InstanceNorm1d, 2: nn.InstanceNorm2d, 3: nn.InstanceNorm3d}[dims](
        3, affine=True))
    if not bias:
        norm.bias = None
    spatial = tuple(size + 1 + k for k in range(dims))  # ragged: unequal sizes, ≥ 2 values
    model = nn.Sequential(nn.Linear(spatial[-1], spatial[-1]), norm)
    check(model, torch.randn(b, 3, *spatial))


@settings(max_examples=10, deadline=None)
@given(b=B, t=st.integers(1, 3), shape=st.sampled_from([(5,), (2, 3)]),
       eps=st.sampled_from([None, 1e-3]))
def test_rmsnorm(b, t, shape, eps):
    torch.manual_seed(0)
    norm = randomized(nn.RMSNorm(shape, eps=eps))
    model = nn.Sequential(nn.Linear(shape[-1], shape[-1]), norm)
    check(model, torch.randn(b, t, *shape))


@pytest.mark.parametrize("route", ["ghost", "per-sample"])
@settings(max_examples=8, deadline=None)
@given(b=B, groups=st.sampled_from([1, 2]), k=st.sampled_from([1, 2, (1, 2, 3)]),
       stride=st.sampled_from([1, 2, (2, 1, 1)]), pad=st.integers(0, 1),
       dil=st.integers(1, 2), mode=st.sampled_from(["zeros", "reflect", "circular"]),
       bias=st.booleans())
def test_conv3d(route, b, groups, k, stride, pad, dil, mode, bias):
    torch.manual_seed(0)
    layer = nn.Conv3d(2, 2 * groups, k, stride=stride, padding=pad, dilation=dil,
                      groups=groups, padding_mode=mode, bias=bias)
    with pytest.MonkeyPatch.context() as mp:  # force the route the size would not pick
        mp.setattr(ConvRule, "prefers_ghost", lambda self, *a: route == "ghost")
        check(layer, torch.randn(b, 2, 5, 6, 7))


def test_conv3d_same_padding():
    torch.manual_seed(0)
    check(nn.Conv3d(2, 3, 3, padding="same"), torch.randn(2, 2, 4, 5, 3))


def test_layers_take_their_rule_not_vmap():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv3d(2, 3, 2), nn.InstanceNorm3d(3, affine=True), nn.Flatten(),
                          nn.Unflatten(1, (3, 4, 4, 4)), nn.Flatten(2), nn.RMSNorm(64))
    got = routes(model, torch.randn(2, 2, 5, 5, 5))
    assert got["0"] in ("ghost", "per-sample") and got["1"] == "per-sample"
    assert got["5"] == "per-sample"
    for m in (nn.Conv3d(1, 1, 1), nn.InstanceNorm1d(1, affine=True), nn.RMSNorm(3)):
        assert rule_for(m) is not None
