"""The method interface's data paths against the float64 per-example loop (tests/oracles.py):

- a parameter-shaped extra release (OSO's threshold gradient Σ_i 1[‖g_i‖ > C] g_i/‖g_i‖, Galli
  et al. 2024, Algorithm 1) is formed by the engine's book-keeping next to the clipped gradient,
  noised once, recorded, and handed to ``update``;
- a coordinate-wise transform of per-sample gradients (AdaClip's shape, Pichapati et al. 2019) is
  applied before the norms and the clipping, and refused on the ghost route (the step derives
  the route from ``implements("transform")``: no flag to declare);
- ``postprocess`` maps the released gradient before the inner optimizer steps on it.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.adaptive import Method
from dpfy.types import ReleaseSpec
import oracles

C = 0.5
SUM = lambda o, t: F.cross_entropy(o, t, reduction="sum")  # noqa: E731


def _toy():
    torch.manual_seed(0)
    ds = TensorDataset(torch.randn(40, 5), torch.randint(0, 3, (40,)))
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    ref = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    ref.load_state_dict(model.state_dict())
    return ds, model, ref


def _private(model, ds, method, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")        # σ = 0 warns: this test wants exact sums
        return dpfy.make_private(model, torch.optim.SGD(model.parameters(), lr=0.0),
                                 DataLoader(ds, batch_size=10), noise_multiplier=0.0,
                                 max_grad_norm=C, method=method, seed=0, **kw)


class ThresholdGradient(Method):
    """Releases q̃ = Σ_i 1[‖g_i‖ > C] g_i/‖g_i‖ (each term has norm ≤ 1: sensitivity 1)."""

    def __init__(self):
        self.seen = []

    def releases(self, state, plan):
        clip = plan.clip
        return {"threshold_gradient": ReleaseSpec(
            1.0, 1e-9, kind="gradient", label="Σ_i 1[‖g_i‖ > C] g_i/‖g_i‖",
            values=lambda norms: (norms.total > clip).double() / norms.total)}

    def update(self, state, released):
        self.seen.append((released.sums["threshold_gradient"], released.gradient))
        return state


def test_parameter_shaped_release_matches_the_loop():
    ds, model, ref = _toy()
    method = ThresholdGradient()
    model, opt, dl = _private(model, ds, method, max_physical_batch_size=4)
    want = []
    acc = None
    for x, y in dl:
        g = oracles.per_example_grads(ref, x, y, SUM)                  # float64 (B, *θ)
        n = oracles.per_example_norms(g)
        w = (n > C).double() / n
        part = {k: torch.einsum("b,b...->...", w, v) for k, v in g.items()}
        acc = part if acc is None else {k: acc[k] + part[k] for k in acc}
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        if dl.cursor.last:
            want.append(acc)
            acc = None
    assert len(method.seen) == len(want) == opt.step_count
    for (got, _), exp in zip(method.seen, want):
        for (name, _), k in zip(model.named_parameters(), exp):
            assert torch.allclose(got[name].double(), exp[k], atol=1e-4)
    (group,) = list(opt.ledger)
    assert [r.mechanism for r in group.releases] == ["gradient", "threshold_gradient"]


class HalveFirstLayer(Method):
    """Multiplies every per-sample gradient of the first layer's weight by ½ (coordinate-wise)."""

    def __init__(self):
        self.grads = []

    def transform(self, state, per_sample, plan):
        return {n: g * 0.5 if n == "0.weight" else g for n, g in per_sample.items()}

    def update(self, state, released):
        self.grads.append({n: t.clone() for n, t in released.gradient.items()})
        return state


def test_coordinate_transform_comes_before_norms_and_clipping():
    ds, model, ref = _toy()
    method = HalveFirstLayer()
    model, opt, dl = _private(model, ds, method)
    for step, (x, y) in enumerate(dl):
        g = oracles.per_example_grads(ref, x, y, SUM)
        g["0.weight"] = g["0.weight"] * 0.5
        clipped = oracles.clipped_sum(g, C)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        b = opt.sampler.normalizer
        for (name, _), k in zip(model.named_parameters(), clipped):
            assert torch.allclose(method.grads[step][name].double(), clipped[k] / b, atol=1e-5)
        if step == 2:
            break


def test_coordinate_transform_is_refused_on_the_ghost_route():
    ds, model, _ = _toy()
    assert HalveFirstLayer().implements("transform") and not Method().implements("transform")
    with pytest.raises(ValueError, match="route must be 'auto' or 'vmap'.*HalveFirstLayer"):
        _private(model, ds, HalveFirstLayer(), route="ghost")


class Doubled(Method):
    """Post-processes the released gradient: the optimizer steps on 2·(S̃/b)."""

    def __init__(self):
        self.released = []

    def postprocess(self, state, gradient, plan, probed, expected_batch_size):
        assert probed == {}                       # no post-release probes in this step
        return {n: 2 * g for n, g in gradient.items()}

    def update(self, state, released):
        self.released.append({n: g.clone() for n, g in released.gradient.items()})
        return state


def test_postprocess_maps_the_released_gradient_before_the_optimizer_steps():
    ds, model, ref = _toy()
    method = Doubled()
    model, opt, dl = _private(model, ds, method)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt.original_optimizer.param_groups[0]["lr"] = 1.0
    x, y = next(iter(dl))
    g = oracles.per_example_grads(ref, x, y, SUM)
    clipped = oracles.clipped_sum(g, C)
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()
    b = opt.sampler.normalizer
    for (name, p), k in zip(model.named_parameters(), clipped):
        want = 2 * clipped[k] / b                               # σ = 0: S̃/b, doubled
        assert torch.allclose(method.released[0][name].double(), want, atol=1e-5)
        assert torch.allclose((before[name] - p.detach()).double(), want, atol=1e-5)
