"""A module that tracks running statistics is refused by ``make_private`` itself (issue 10 §1.3).

"Refused before training (the validator names the module and the fix)": the refusal comes when
the engine attaches, before any forward, naming the module's qualified name, its class and the
fix. The general check (any buffer a training forward changes) stays the BufferGuard's, at the
first training forward (tests/grads/test_buffer_guard.py).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.errors import PrivacyRefusal


class OwnNorm(nn.Module):
    """A user's own layer that says it tracks running statistics (not an InstanceNorm)."""

    def __init__(self) -> None:
        super().__init__()
        self.track_running_stats = True
        self.register_buffer("running_mean", torch.zeros(4))
        self.lin = nn.Linear(4, 2)

    def forward(self, x):
        self.running_mean.mul_(0.9).add_(0.1 * x.mean(0).detach())
        return self.lin(x - self.running_mean)


def instancenorm_model() -> nn.Module:
    return nn.Sequential(nn.Unflatten(1, (1, 2, 2)), nn.Conv2d(1, 3, 1),
                         nn.Sequential(nn.InstanceNorm2d(3, track_running_stats=True)),
                         nn.Flatten(), nn.Linear(12, 2))


def make_private(model: nn.Module, **kw):
    data = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return dpfy.make_private(model, opt, DataLoader(data, batch_size=8), noise_multiplier=1.0,
                             max_grad_norm=1.0, seed=0, **kw)


def no_hooks(model: nn.Module) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


@pytest.mark.parametrize("route", ["auto", "vmap"])
def test_make_private_refuses_instancenorm_tracking_before_any_forward(route):
    model = instancenorm_model()
    calls = []
    model.register_forward_pre_hook(lambda m, a: calls.append(1))
    with pytest.raises(PrivacyRefusal, match=r"module '2\.0' must not track running statistics, "
                       r"got module '2\.0' = InstanceNorm2d\(track_running_stats=True\).*"
                       r"track_running_stats=False.*dpfy\.validate\(model, fix=True\)"):
        make_private(model, route=route)
    assert calls == []                                         # nothing ran
    assert torch.equal(model[2][0].running_mean, torch.zeros(3))
    model._forward_pre_hooks.clear()
    assert no_hooks(model)                                     # dpfy attached nothing


def test_any_module_tracking_running_stats_is_refused_by_attribute_not_by_class():
    with pytest.raises(PrivacyRefusal, match=r"module '1' must not track running statistics, "
                       r"got module '1' = OwnNorm\(track_running_stats=True\).*"
                       r"Build the OwnNorm with track_running_stats=False"):
        make_private(nn.Sequential(nn.Identity(), OwnNorm()))


def test_batchnorm_is_refused_there_too_as_a_privacy_refusal():
    with pytest.raises(PrivacyRefusal, match=r"module '1' must not be a BatchNorm1d.*"
                       r"dpfy\.validate\(model, fix=True\)"):
        make_private(nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2)))


def test_the_fixed_model_is_accepted_and_trains():
    model, opt, dl = make_private(dpfy.validate(instancenorm_model(), fix=True))
    x, y = next(iter(dl))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    assert opt.step_count == 1


def test_tracking_switched_off_after_construction_still_reaches_the_guard():
    # The attribute says False, but the buffers built with True are still passed to
    # F.instance_norm, which updates them in training mode (torch's behaviour, checked below):
    # the attribute check lets it through, the general BufferGuard refuses at the first forward.
    norm = nn.InstanceNorm2d(3, track_running_stats=True)
    norm.track_running_stats = False
    norm(torch.randn(2, 3, 2, 2) + 5.0)
    assert not torch.equal(norm.running_mean, torch.zeros(3))  # torch writes it
    model = instancenorm_model()
    model[2][0].track_running_stats = False
    model, opt, dl = make_private(model)
    x, _ = next(iter(dl))
    with pytest.raises(PrivacyRefusal, match=r"buffer '2\.0\.running_mean' of module '2\.0'"):
        model(x)
    assert opt.step_count == 0
