"""``dpfy.validate``: meaningful BatchNorm replacements (issue 10 §4) and buffer problems (§1.3).

Reference normalizations are written out in the tests from the definition
y = (x − mean) / sqrt(var + eps) · γ + β over each example's group (biased variance), with γ, β
the original BatchNorm's affine parameters.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy


def normalized(x: torch.Tensor, groups: int, weight, bias, eps: float) -> torch.Tensor:
    """x (B, C, *) normalized over each (example, group of C/groups channels × positions)."""
    b, c = x.shape[:2]
    z = x.reshape(b, groups, -1)
    z = (z - z.mean(-1, keepdim=True)) / torch.sqrt(z.var(-1, unbiased=False, keepdim=True) + eps)
    shape = (1, c) + (1,) * (x.dim() - 2)
    return z.reshape(x.shape) * weight.reshape(shape) + bias.reshape(shape)


def with_affine(bn: nn.Module) -> nn.Module:
    """Give a BatchNorm non-trivial (learnt-looking) affine parameters."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        bn.weight.copy_(torch.rand(bn.num_features, generator=g) + 0.5)
        bn.bias.copy_(torch.randn(bn.num_features, generator=g))
    return bn


def test_batchnorm1d_after_a_linear_becomes_a_layer_that_depends_on_its_input():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), with_affine(nn.BatchNorm1d(32)), nn.ReLU(),
                          nn.Linear(32, 2))
    fixed = dpfy.validate(model, fix=True)
    x1, x2 = torch.randn(2, 5, 8).unbind(0)
    # GroupNorm(32, 32) made every output the same up to rounding (≈ 1e-5 apart)
    assert (fixed(x1) - fixed(x2)).abs().max() > 0.05
    h = fixed[0](x1)  # (5, 32)
    bn = model[1]
    # LayerNorm over the 32 features of each example, with BatchNorm's γ, β
    ref = ((h - h.mean(1, keepdim=True)) / torch.sqrt(h.var(1, unbiased=False, keepdim=True)
                                                       + bn.eps)) * bn.weight + bn.bias
    torch.testing.assert_close(fixed[1](h), ref)
    assert fixed[1].weight.requires_grad and fixed[1].bias.requires_grad


def test_batchnorm1d_on_sequences_normalizes_each_example_over_channels_and_positions():
    bn = with_affine(nn.BatchNorm1d(4, eps=1e-3))
    gn = dpfy.validate(nn.Sequential(bn), fix=True)[0]
    x = torch.randn(3, 4, 6)  # (B, C, L)
    torch.testing.assert_close(gn(x), normalized(x, 1, bn.weight, bn.bias, 1e-3))


def test_spatial_batchnorm_uses_gcd_32_groups():
    bn = with_affine(nn.BatchNorm2d(48))
    gn = dpfy.validate(nn.Sequential(bn), fix=True)[0]
    assert gn.num_groups == 16  # gcd(32, 48): groups of 3 channels × H × W
    x = torch.randn(2, 48, 3, 3)
    torch.testing.assert_close(gn(x), normalized(x, 16, bn.weight, bn.bias, bn.eps))
    plain = dpfy.validate(nn.BatchNorm3d(6, affine=False), fix=True)
    assert plain.num_groups == 2 and plain.weight is None


def test_a_single_channel_batchnorm1d_is_refused_with_the_fix():
    model = nn.Sequential(nn.Linear(3, 1), nn.BatchNorm1d(1))
    with pytest.raises(ValueError, match=r"1\.num_features must be >= 2.*got 1\.num_features = "
                       r"1\. A single channel.*constant.*nn\.GroupNorm\(1, 1\)"):
        dpfy.validate(model, fix=True)


def loader(n=32, d=8):
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(n, d, generator=g),
                                    torch.randint(0, 2, (n,), generator=g)), batch_size=8)


def train_privately(model, steps=2, **kw):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, dl = dpfy.make_private(model, opt, loader(), noise_multiplier=1.0,
                                       max_grad_norm=1.0, seed=0, **kw)
    it = iter(dl)
    for _ in range(steps):
        x, y = next(it)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return opt


def test_the_replacement_has_a_layer_rule():
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
    fixed = dpfy.validate(model, fix=True, route="ghost")
    assert train_privately(fixed, route="ghost").step_count == 2  # ghost: rules only


def instancenorm_model():
    return nn.Sequential(nn.Unflatten(1, (2, 2, 2)), nn.InstanceNorm2d(2, affine=True,
                                                                       track_running_stats=True),
                         nn.Flatten(), nn.Linear(8, 2))


def test_instancenorm_tracking_is_reported_and_turned_off_by_fix():
    model = instancenorm_model()
    problems = dpfy.validate(model)
    assert len(problems) == 1 and problems[0].startswith("1: InstanceNorm2d has "
                                                         "track_running_stats=True")
    fixed = dpfy.validate(model, fix=True)
    norm = fixed[1]
    assert not norm.track_running_stats and norm.running_mean is None
    assert model[1].track_running_stats  # the original is untouched
    assert train_privately(fixed).step_count == 2
    x = torch.randn(3, 2, 2, 2)
    fixed.eval()  # eval now normalizes each example by its own statistics, as training does
    # one group per channel: each (example, channel) over its 2 × 2 positions
    torch.testing.assert_close(norm(x), normalized(x, 2, norm.weight, norm.bias, norm.eps))


class Tracker(nn.Module):
    """A user module with a statistic of the data in a buffer (no track_running_stats)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 2)
        self.register_buffer("seen", torch.zeros(8))

    def forward(self, x):
        self.seen.mul_(0.9).add_(0.1 * x.mean(0))
        return self.lin(x)


def test_example_input_reports_buffers_a_training_forward_changes():
    model = nn.Sequential(nn.Identity(), Tracker())
    x = torch.randn(4, 8)
    assert dpfy.validate(model) == []  # invisible without running it
    problems = dpfy.validate(model, example_input=x)
    assert len(problems) == 1
    assert problems[0].startswith("buffer '1.seen' of module '1' (Tracker) must not change in a "
                                  "training forward, got it modified in place")
    assert "compute it beforehand from public data" in problems[0]
    assert torch.equal(model[1].seen, torch.zeros(8))  # a copy ran, not the model
    with pytest.raises(ValueError, match=r"unfixable problems.*1\.seen"):
        dpfy.validate(model, fix=True, example_input=x)
    # constant buffers and fixed layers pass the same check
    fixed = dpfy.validate(instancenorm_model(), fix=True, example_input=torch.randn(4, 8))
    assert dpfy.validate(fixed, example_input=torch.randn(4, 8)) == []
    # a private model's hooks would capture the example: validate before make_private
    opt = torch.optim.SGD(fixed.parameters(), lr=0.1)
    dpfy.make_private(fixed, opt, loader(), noise_multiplier=1.0, seed=0)
    with pytest.raises(ValueError, match="model must be not yet private.*before make_private"):
        dpfy.validate(fixed, example_input=torch.randn(4, 8))
