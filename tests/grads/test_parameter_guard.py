"""Parameters that a training forward writes are refused, like buffers (dpfy/buffers/).

An adversarial review found an ActNorm-style data-dependent initialization (a plain Python
``initialized`` flag, the parameters set from the first batch's mean and std inside forward)
trained silently: the saved model held the private batch's exact mean while the report
claimed the run's ε. Each module below writes a parameter in a way the test knows.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.buffers import BufferGuard
from dpfy.errors import PrivacyRefusal


class ActNorm(nn.Module):
    """Glow's ActNorm with its initialization from the first training batch, in place."""

    def __init__(self) -> None:
        super().__init__()
        self.loc = nn.Parameter(torch.zeros(4))
        self.lin = nn.Linear(4, 2)
        self.initialized = False

    def init_from(self, x: torch.Tensor) -> None:
        with torch.no_grad():
            self.loc.copy_(-x.mean(0))

    def forward(self, x):
        if self.training and not self.initialized:
            self.init_from(x)
            self.initialized = True
        return self.lin(x + self.loc)


class ThroughData(ActNorm):
    """The same initialization through ``.data`` (no version bump: seen by the values)."""

    def init_from(self, x: torch.Tensor) -> None:
        self.loc.data.copy_(-x.mean(0))


class Replaced(ActNorm):
    """The same statistic as a new Parameter under the old name."""

    def init_from(self, x: torch.Tensor) -> None:
        self.loc = nn.Parameter(-x.mean(0).detach())


def _private(model):
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(32, 4, generator=g), torch.randint(0, 2, (32,), generator=g))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    return dpfy.make_private(model, opt, DataLoader(data, batch_size=8), noise_multiplier=1.0,
                             max_grad_norm=1.0, seed=0)


@pytest.mark.parametrize("cls, how", [(ActNorm, "modified in place"),
                                      (ThroughData, "without a version bump"),
                                      (Replaced, "replaced by another tensor")])
def test_a_parameter_written_in_a_training_forward_is_refused(cls, how):
    model, opt, loader = _private(cls())
    x, y = next((x, y) for x, y in loader if len(x) > 0)
    with pytest.raises(PrivacyRefusal, match=rf"parameter 'loc' of module '\(root\)' "
                       rf"\({cls.__name__}\).*{how}.*before make_private"):
        F.cross_entropy(model(x), y).backward()
    assert opt.step_count == 0 and opt.ledger.num_steps == 0


def test_parameters_set_outside_forward_and_evaluation_keep_working():
    model = ActNorm()
    model.init_from(torch.randn(16, 4))      # before make_private, e.g. from public data
    model.initialized = True
    model, opt, loader = _private(model)
    for x, y in loader:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()                          # the optimizer changing parameters is fine
    model.eval()
    with torch.no_grad():                    # the evaluation idiom is not a training forward
        model.initialized = False
        model.train(False)
        model(torch.randn(3, 4))
    assert opt.step_count == len(loader)


def test_collect_mode_lists_a_parameter_the_forward_writes():
    guard = BufferGuard(ActNorm(), collect=True)
    model = guard._model()
    model(torch.randn(8, 4))
    assert [(p.what, p.buffer, p.how) for p in guard.problems] == [
        ("parameter", "loc", "modified in place")]
    guard.detach()


class Late(nn.Module):
    """Writes its parameter only from the second training forward on (the cheap check's
    path: the first forward's full snapshot has passed)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.loc = nn.Parameter(torch.zeros(4))
        self.lin = nn.Linear(4, 2)
        self.how, self.calls = how, 0

    def forward(self, x):
        self.calls += 1
        if self.calls == 2:
            with torch.no_grad():
                if self.how == "modified in place":
                    self.loc.add_(x.mean(0))
                elif self.how == "replaced by another tensor":
                    self.loc = nn.Parameter(x.mean(0).detach())
                elif self.how == "given new storage":
                    self.loc.data = x.mean(0).clone()
                else:
                    self.extra = nn.Parameter(x.mean(0).detach())
        return self.lin(x + self.loc)


@pytest.mark.parametrize("how", ["modified in place", "replaced by another tensor",
                                 "given new storage", "registered during the forward"])
def test_a_parameter_written_in_a_later_forward_is_refused(how):
    guard = BufferGuard(Late(how), collect=True)
    model = guard._model()
    model(torch.randn(8, 4))
    assert guard.problems == []
    model(torch.randn(8, 4))
    assert [(p.what, p.how.split(" (")[0]) for p in guard.problems] == [("parameter", how)]
    guard.detach()
