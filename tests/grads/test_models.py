"""Whole models (CNN, MLP, small transformer encoder): dpfy's per-sample norms and clipped sums
equal the per-example float64 loop and Opacus 1.6 (a test-only peer), to 1e-5 relative.

Opacus reference: ``GradSampleModule(model, batch_first=True, loss_reduction="mean")`` fills
``p.grad_sample`` (B, *θ) with per-example gradients in its "hooks" mode; we clip those with the
textbook rule min(1, C/‖g_i‖) ourselves.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import oracles
from model_cases import MODELS, make_data, make_model
from dpfy.grads import GradEngine

CLIP = 0.5


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def dpfy_norms_and_sum(model, x, y, route):
    eng = GradEngine(model, route=route)  # loss_reduction="mean"
    try:
        F.cross_entropy(model(x), y).backward()
        sq = eng.per_sample_sq_norms()
        norms = torch.sqrt(sum(sq.values()))  # (B,)
        w = torch.clamp(CLIP / norms, max=1.0)
        return norms, eng.weighted_sums({n: w for n in sq})
    finally:
        eng.detach()


def opacus_grads(model, x, y):
    from opacus import GradSampleModule
    gsm = GradSampleModule(copy.deepcopy(model), batch_first=True, loss_reduction="mean")
    F.cross_entropy(gsm(x), y).backward()
    return {n: p.grad_sample.detach() for n, p in gsm._module.named_parameters()}


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("route", ["auto", "vmap"])
def test_model_matches_loop_and_opacus(name, route):
    model = make_model(name)
    x, y = make_data(name, 6, seed=1).tensors
    ref = oracles.per_example_grads(model, x, y, F.cross_entropy)  # float64 loop
    ref_norms = oracles.per_example_norms(ref)
    ref_sum = oracles.clipped_sum(ref, CLIP)
    op = opacus_grads(model, x, y)
    op_norms = oracles.per_example_norms(op)
    op_sum = oracles.clipped_sum(op, CLIP)

    norms, sums = dpfy_norms_and_sum(model, x, y, route)
    assert rel(norms, ref_norms) < 1e-5
    assert rel(norms, op_norms) < 1e-5
    for n in ref_sum:
        assert rel(sums[n], ref_sum[n]) < 1e-5, n
        assert rel(sums[n], op_sum[n]) < 1e-5, n


LAYERS = {
    # every layer type with a dpfy rule, in a model Opacus' hooks also support
    "linear_seq": (lambda: torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Flatten()),
                   lambda g: torch.randn(6, 3, 5, generator=g)),
    "conv1d": (lambda: torch.nn.Sequential(torch.nn.Conv1d(3, 4, 3, stride=2, padding=1),
                                           torch.nn.Flatten()),
               lambda g: torch.randn(6, 3, 9, generator=g)),
    "conv2d_groups": (lambda: torch.nn.Sequential(torch.nn.Conv2d(4, 6, 3, groups=2, dilation=2),
                                                  torch.nn.Flatten()),
                      lambda g: torch.randn(6, 4, 8, 8, generator=g)),
    "embedding": (lambda: torch.nn.Sequential(torch.nn.Embedding(7, 4), torch.nn.Flatten()),
                  lambda g: torch.randint(0, 7, (6, 5), generator=g)),
    "layernorm": (lambda: torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4),
                                              torch.nn.Flatten()),
                  lambda g: torch.randn(6, 3, 4, generator=g)),
    "groupnorm": (lambda: torch.nn.Sequential(torch.nn.Conv2d(2, 4, 2), torch.nn.GroupNorm(2, 4),
                                              torch.nn.Flatten()),
                  lambda g: torch.randn(6, 2, 5, 5, generator=g)),
}


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_each_layer_matches_opacus(layer):
    factory, make_x = LAYERS[layer]
    torch.manual_seed(0)
    model = factory()
    for p in model.parameters():  # non-trivial affine parameters for the norms
        torch.nn.init.normal_(p, std=0.5) if p.dim() == 1 else None
    x = make_x(torch.Generator().manual_seed(1))
    with torch.no_grad():
        classes = model(x).shape[1]
    y = torch.arange(6) % classes
    op = opacus_grads(model, x, y)
    norms, sums = dpfy_norms_and_sum(model, x, y, "ghost")
    assert rel(norms, oracles.per_example_norms(op)) < 1e-5
    for n, s in oracles.clipped_sum(op, CLIP).items():
        assert rel(sums[n], s) < 1e-5, n
