"""Clipping policies: the update equals the policy's weighted sum, computed from the float64
per-example loop with the policy's formula written out here (clipping variants as reviewed by
Monir, Fauzan & Ghinita 2023, §4; Bu et al. 2023 for automatic clipping)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
import oracles
from dpfy.clipping import AutomaticClipping, FlatClipping, PerLayerClipping, make_clipping


def ds():
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(32, 5, generator=g), torch.randint(0, 3, (32,), generator=g))


def net():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 3))


def step_and_reference(clipping, max_grad_norm, weights_fn):
    """One σ=0, SGD(lr=1) step; return (actual Δθ, expected −Σ w_i g_i / b)."""
    model = net()
    ref_model = net()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt, dl = dpfy.make_private(model, opt, DataLoader(ds(), batch_size=8),
                                           noise_multiplier=0.0, clipping=clipping,
                                           max_grad_norm=max_grad_norm, seed=4)
    for x, y in dl:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        idx = dl.cursor.indices
        break
    g = oracles.per_example_grads(ref_model, x, y,
                                  lambda o, t: F.cross_entropy(o, t, reduction="sum"))
    w = weights_fn(g, idx)  # name -> (B,)
    b = 8.0  # qN
    for n, p in model.named_parameters():
        want = before[n].double() - torch.einsum("b,b...->...", w[n], g[n]) / b
        torch.testing.assert_close(p.detach().double(), want, rtol=1e-6, atol=1e-7)


def test_automatic_clipping_weights():
    gamma, c = 0.01, 2.0

    def weights(g, idx):
        w = c / (oracles.per_example_norms(g) + gamma)  # Bu et al.: C·g/(‖g‖+γ)
        return {n: w for n in g}

    step_and_reference("automatic", c, weights)
    assert AutomaticClipping(c).sensitivity(c) == c


def test_per_layer_clipping_weights_and_sensitivity():
    clips = [0.05, 0.2]  # layer "0" (weight, bias), layer "2" (weight, bias)

    def weights(g, idx):
        out = {}
        for layer, c in zip(("0", "2"), clips):
            names = [f"{layer}.weight", f"{layer}.bias"]
            norm = oracles.per_example_norms({n: g[n] for n in names})
            out.update({n: torch.clamp(c / norm, max=1.0) for n in names})
        return out

    step_and_reference("per_layer", clips, weights)
    policy = make_clipping("per_layer", clips, [["0.weight", "0.bias"], ["2.weight", "2.bias"]])
    assert abs(policy.sensitivity(policy.default_clip()) - math.hypot(*clips)) < 1e-12
    even = make_clipping("per_layer", 1.0, [["a"], ["b"], ["c"], ["d"]])
    assert isinstance(even, PerLayerClipping) and even.clips == (0.5,) * 4  # C/√K


def test_individual_thresholds_per_example():
    clips = torch.linspace(0.01, 0.5, 32, dtype=torch.float64)  # C_i for example i

    def weights(g, idx):
        w = torch.clamp(clips[idx] / oracles.per_example_norms(g), max=1.0)
        return {n: w for n in g}

    step_and_reference("individual", clips.tolist(), weights)
    policy = make_clipping("individual", clips.tolist(), [], dataset_size=32)
    assert policy.sensitivity(policy.default_clip()) == pytest.approx(0.5)  # max C_i


def test_flat_clipping_keeps_zero_gradients_exactly():
    sq = {"w": torch.tensor([0.0, 4.0, 0.25])}  # norms 0, 2, 0.5
    w = FlatClipping(1.0).weights(sq, 1.0)["w"]
    assert w.tolist() == [1.0, 0.5, 1.0]


def test_per_layer_scalar_clip_from_a_schedule_is_split_equally():
    policy = make_clipping("per_layer", [1.0, 1.0], [["a"], ["b"]])
    sq = {"a": torch.tensor([4.0]), "b": torch.tensor([0.01])}  # norms 2 and 0.1
    w = policy.weights(sq, 2.0)  # C = 2 -> C_k = 2/√2 = √2 each
    assert w["a"].item() == pytest.approx(math.sqrt(2) / 2) and w["b"].item() == 1.0
    assert policy.sensitivity(2.0) == pytest.approx(2.0)
