"""The fused ghost-norm kernel (dpfy/native/ghost_norm.c) against the definition.

The reference forms each example's per-sample gradient of a Linear layer explicitly in float64,
G_i = Σ_t g_t a_tᵀ and Σ_t g_t, and takes their squared norms: no Gram matrix, so a wrong tile,
a wrong diagonal weight, a dropped padding row or a mis-strided load in the kernel shows up as a
mismatch. Shapes cover T and d below, at and across the kernel's 16-wide blocks and its 8-row
tiles, and strided inputs; the engine's norms of a whole sequence model go through the kernel
(torch on one thread) and are checked against the float64 per-example loop.
"""

from __future__ import annotations

from typing import Iterator

import pytest
import torch
from torch import nn

import oracles
from dpfy.grads import GradEngine
from dpfy.grads.rules import linear as linear_rule
from dpfy.grads.rules.base import rule_for
from dpfy.native.ghost_norm import (fused_ghost_available, kernel_available,
                                    linear_ghost_sq_norms)

pytestmark = pytest.mark.skipif(not kernel_available(),
                                reason="the fused ghost-norm kernel needs a C compiler and an "
                                       "AVX-512 CPU")

RTOL = 2e-5  # float32 Gram entries against a float64 reference


@pytest.fixture
def kernel_calls(monkeypatch) -> list[int]:
    """Grows by one entry each time the Linear rule calls the kernel."""
    calls: list[int] = []
    real = linear_rule.linear_ghost_sq_norms
    monkeypatch.setattr(linear_rule, "linear_ghost_sq_norms",
                        lambda *xs: calls.append(1) or real(*xs))
    return calls


@pytest.fixture
def one_thread() -> Iterator[None]:
    """The rule uses the (single-threaded) kernel only while torch runs on one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def reference(a: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a, g = a.double(), g.double()
    per_sample = torch.einsum("btd,bte->bde", g, a)  # (B, d_g, d_a): the definition
    return per_sample.square().sum((1, 2)), g.sum(1).square().sum(1)


@pytest.mark.parametrize("b,t,da,dg", [
    (3, 2, 1, 1), (5, 7, 5, 3), (4, 16, 16, 16), (6, 17, 33, 40), (2, 50, 300, 20),
    (3, 33, 16, 17), (7, 8, 48, 16), (9, 31, 64, 192), (1, 100, 7, 130)])
def test_matches_the_per_sample_gradients(b: int, t: int, da: int, dg: int):
    gen = torch.Generator().manual_seed(b * 1000 + t)
    a = torch.randn(b, t, da, generator=gen)
    g = torch.randn(b, t, dg, generator=gen) * torch.rand(b, 1, 1, generator=gen)
    w, bias = linear_ghost_sq_norms(a, g)
    ref_w, ref_b = reference(a, g)
    torch.testing.assert_close(w.double(), ref_w, rtol=RTOL, atol=0)
    torch.testing.assert_close(bias.double(), ref_b, rtol=RTOL, atol=1e-9)


def test_strided_inputs():
    gen = torch.Generator().manual_seed(0)
    wide = torch.randn(40, 19, 70, generator=gen)
    a = wide[:, :, 3:53]  # row stride 70, not 50
    g = torch.randn(19, 40, 24, generator=gen).transpose(0, 1)  # batch stride 24, time 960
    assert a.stride(-1) == 1 and g.stride(-1) == 1 and not a.is_contiguous()
    w, bias = linear_ghost_sq_norms(a, g)
    ref_w, ref_b = reference(a, g)
    torch.testing.assert_close(w.double(), ref_w, rtol=RTOL, atol=0)
    torch.testing.assert_close(bias.double(), ref_b, rtol=RTOL, atol=1e-9)


def test_engine_norms_of_a_sequence_model_match_the_loop(one_thread, kernel_calls):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 48), nn.Tanh(), nn.Linear(48, 36), nn.Tanh(),
                          nn.Linear(36, 5))
    x, y = torch.randn(11, 13, 20), torch.arange(11) % 5

    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # per-example sum over time
        return nn.functional.cross_entropy(out.mean(1), y, reduction="sum")

    ref = oracles.per_example_grads(model.double(), x.double(), y, loss)  # float64, (B, *θ)
    model.float()
    eng = GradEngine(model, route="ghost", loss_reduction="sum")
    try:
        loss(model(x), y).backward()
        sq = eng.per_sample_sq_norms()
    finally:
        eng.detach()
    assert len(kernel_calls) == 3  # every Linear took the kernel
    for name, per_example in ref.items():
        expected = per_example.flatten(1).square().sum(1)
        torch.testing.assert_close(sq[name].double(), expected, rtol=1e-5, atol=1e-12)


def test_more_torch_threads_keep_torch_matmuls():
    a = torch.zeros(4, 3, 2)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert not fused_ghost_available(a, a)
        torch.set_num_threads(1)
        assert fused_ghost_available(a, a)
    finally:
        torch.set_num_threads(before)


def test_linear_rule_uses_it_and_agrees_with_the_matmul_route(one_thread, kernel_calls,
                                                              monkeypatch):
    layer = nn.Linear(24, 40)
    gen = torch.Generator().manual_seed(1)
    a, g = torch.randn(12, 9, 24, generator=gen), torch.randn(12, 9, 40, generator=gen)
    fused = rule_for(layer).sq_norm(layer, a, g)
    assert kernel_calls == [1]
    monkeypatch.setattr(linear_rule, "fused_ghost_available", lambda *xs: False)
    matmul = rule_for(layer).sq_norm(layer, a, g)
    assert kernel_calls == [1]
    for name in ("weight", "bias"):
        torch.testing.assert_close(fused[name], matmul[name], rtol=RTOL, atol=0)


def test_refuses_what_it_cannot_read():
    with pytest.raises(ValueError, match="contiguous"):
        linear_ghost_sq_norms(torch.zeros(2, 3, 4).transpose(1, 2), torch.zeros(2, 4, 3))
    with pytest.raises(ValueError, match="float32"):
        linear_ghost_sq_norms(torch.zeros(2, 3, 4, dtype=torch.float64), torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="same"):
        linear_ghost_sq_norms(torch.zeros(2, 3, 4), torch.zeros(2, 5, 4))
    assert not fused_ghost_available(torch.zeros(1, 2, 1, dtype=torch.float64),
                                     torch.zeros(1, 2, 1, dtype=torch.float64))
