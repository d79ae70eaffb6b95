"""The output of a first layer (constant once the parameters are frozen) is tapped, not made a
leaf: in-place activations after it work, and nothing accumulates a ``.grad`` anywhere."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import oracles
from dpfy.grads import GradEngine


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


@pytest.mark.parametrize("route", ["auto", "ghost"])
def test_inplace_relu_after_the_first_layer_matches_the_loop(route):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 4, 3), nn.ReLU(inplace=True), nn.Flatten(),
                          nn.Linear(4 * 4 * 4, 8), nn.ReLU(inplace=True), nn.Linear(8, 3)).double()
    x, y = torch.randn(6, 2, 6, 6, dtype=torch.float64), torch.randint(0, 3, (6,))
    ref = oracles.per_example_grads(model, x, y, F.cross_entropy)
    eng = GradEngine(model, route=route)
    try:
        F.cross_entropy(model(x), y).backward()
        sq = eng.per_sample_sq_norms()
        w = torch.rand(6, dtype=torch.float64)
        sums = eng.weighted_sums({n: w for n in sq})
        anchor = eng._capture.anchor
    finally:
        eng.detach()
    norms = torch.sqrt(sum(sq.values()))
    assert rel(norms, oracles.per_example_norms(ref)) < 1e-9
    for n, g in ref.items():
        assert rel(sums[n], torch.einsum("b,b...->...", w, g)) < 1e-9, n
    assert anchor.grad is None and all(p.grad is None for p in model.parameters())


def test_input_modified_in_place_after_the_layer_is_refused():
    # with frozen weights autograd no longer saves a Linear's input, so only the engine can
    # notice that its captured input changed before backward (it would give wrong gradients)
    class InPlace(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)

        def forward(self, x):
            h = self.a(x) * 2.0  # nothing saves h for backward
            out = self.b(h)
            h.add_(1.0)  # h is b's input: changed after b ran
            return out

    model = InPlace()
    eng = GradEngine(model)
    try:
        F.cross_entropy(model(torch.randn(5, 4)), torch.randint(0, 2, (5,))).backward()
        with pytest.raises(ValueError, match=r"input of layer 'b'.*modified in place.*x = x \+"):
            eng.per_sample_sq_norms()
    finally:
        eng.detach()


def test_input_changed_after_its_per_sample_gradients_were_formed_is_fine():
    # a LayerNorm's per-sample gradients are formed in the backward hook; changing its input
    # afterwards (here: the user's batch, reused as a buffer) must not be refused
    model = nn.Sequential(nn.LayerNorm(4), nn.Linear(4, 2))
    eng = GradEngine(model)
    x = torch.randn(5, 4)
    try:
        F.cross_entropy(model(x), torch.randint(0, 2, (5,))).backward()
        x.add_(1.0)
        sq = eng.per_sample_sq_norms()
        assert set(sq) == {"0.weight", "0.bias", "1.weight", "1.bias"}
    finally:
        eng.detach()


def test_bfloat16_autocast_norms_and_sums_are_float32_and_match_a_per_example_loop():
    # under autocast the captured activations and gradients are bfloat16; rule layers work on
    # float32 copies, so norms (which decide the clipping) and sums are float32, and they match
    # a per-example loop run under the same autocast to bfloat16 accuracy
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(48, 8),
                          nn.LayerNorm(8), nn.Linear(8, 2))
    x, y = torch.randn(6, 1, 6, 6), torch.randint(0, 2, (6,))
    ref = []
    for i in range(6):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x[i:i + 1]), y[i:i + 1])
        loss.backward()
        ref.append(torch.sqrt(sum(p.grad.float().square().sum() for p in model.parameters())))
    model.zero_grad(set_to_none=True)
    eng = GradEngine(model, loss_reduction="sum")
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y, reduction="sum")
        loss.backward()
        sq = eng.per_sample_sq_norms()
        sums = eng.weighted_sums({n: torch.ones(6) for n in sq})
    finally:
        eng.detach()
    assert all(t.dtype == torch.float32 for t in sq.values())
    assert all(t.dtype == torch.float32 for t in sums.values())
    err = rel(torch.sqrt(sum(sq.values())), torch.stack(ref))
    assert err < 5e-3  # observed 3e-4
