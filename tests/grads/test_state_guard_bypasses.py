"""Ordinary code that wrote the model's state past the buffer guard (issue 30 §2), now refused:
running statistics in a plain tensor attribute, a buffer written through ``.data`` after the
first forward, a buffer written in a backward hook, a forward hook registered after
``make_private`` that writes a parameter. Each is armed after the first step (it writes from
the second on), so that the first forward's extra checks (the bitwise copy, the probes' nested
forwards) do not catch it by accident; each test fails on the code before the fix.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.errors import PrivacyRefusal


def data(n: int = 96) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 10, generator=g), torch.randint(0, 3, (n,), generator=g))


def train(model: nn.Module, after_make_private=None, steps: int = 4) -> None:  # noqa: ANN001
    """A few private steps; ``model.armed`` (or the hook's) is set after the first."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, loader = dpfy.make_private(model, opt, DataLoader(data(), batch_size=16),
                                           noise_multiplier=1.0, max_grad_norm=1.0, seed=0,
                                           poisson_sampling=False)
    if after_make_private is not None:
        after_make_private(model)
    for i, (x, y) in enumerate(loader):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        model.armed = True
        if i + 1 >= steps:
            break


class Counting(nn.Module):
    """A Linear model whose state writes start once armed (after the first step)."""

    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(10, 3)
        self.armed = False

    def later(self) -> bool:
        return self.armed and self.training


class PlainAttributeStats(Counting):
    """Running means kept in a plain tensor attribute, read by later forwards."""

    def __init__(self) -> None:
        super().__init__()
        self.running = torch.zeros(10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.l(x - self.running)
        if self.later():
            self.running = 0.9 * self.running + 0.1 * x.detach().mean(0)
        return out


class DataWrittenBuffer(Counting):
    """A buffer written through ``.data`` (no version bump) after the first forward."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.l(x - self.mean)
        if self.later():
            self.mean.data.copy_(x.detach().mean(0))
        return out


class BackwardHookBuffer(Counting):
    """A buffer written in a backward (tensor) hook, from the gradient of the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("shift", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.l(x) - self.shift
        if self.later():
            out.register_hook(self.note)
        return out

    def note(self, g: torch.Tensor) -> None:
        self.shift.mul_(0.9).add_(0.1 * g.abs().mean(0))


@pytest.mark.parametrize("make,what", [
    (PlainAttributeStats, "tensor attribute 'running'"),
    (DataWrittenBuffer, "buffer 'mean'.*without a version bump"),
    (BackwardHookBuffer, "buffer 'shift'.*after the training forward")],
    ids=["plain_attribute", "data_after_first_forward", "backward_hook"])
def test_state_written_past_the_forward_check_is_refused(make, what):
    torch.manual_seed(0)
    with pytest.raises(PrivacyRefusal, match=what):
        train(make())


@pytest.mark.parametrize("via_data", [False, True], ids=["in_place", "through_data"])
def test_a_forward_hook_registered_after_make_private_that_writes_a_parameter(via_data):
    def writer(model: nn.Module) -> None:
        def hook(m: nn.Module, args: tuple, out: torch.Tensor) -> None:
            if getattr(m, "armed", False):
                with torch.no_grad():
                    (m[0].bias.data if via_data else m[0].bias).add_(args[0].mean())
        model.register_forward_hook(hook)

    torch.manual_seed(0)
    with pytest.raises(PrivacyRefusal, match="parameter '0.bias'"):
        train(nn.Sequential(nn.Linear(10, 3)), writer)


def test_state_that_is_only_read_and_a_later_read_only_hook_pass():
    class ReadsConstants(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l = nn.Linear(10, 3)
            self.shift = torch.full((10,), 0.5)        # a constant tensor attribute
            self.register_buffer("scale", torch.ones(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.l(x - self.shift) * self.scale

    def reader(model: nn.Module) -> None:
        model.register_forward_hook(lambda m, a, out: None)
        model.register_forward_pre_hook(lambda m, a: None)

    torch.manual_seed(0)
    train(ReadsConstants(), reader)
