"""The model-state guard's comparisons left on the device (``dpfy._deferred``) still refuse.

On a GPU the guard does not compare values with ``torch.equal`` (a device synchronization
each) once the private step reads its flags: they are read with the sensitivity check's own
host read, before anything of the batch is released. ``FORCE_ON_CPU`` takes that path here.
Each silent write the guard refuses in the forward is then refused by ``optimizer.step()``,
with the same message and no ledger entry for the batch; a write read by nothing else is
refused before ``state_dict()`` and after ``LIMIT`` unchecked forwards.
"""

from __future__ import annotations

import copy
import io
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy import _deferred
from dpfy.errors import PrivacyRefusal


class _Writer(nn.Module):
    """Writes its state without a version bump once ``armed`` (after the first step)."""

    def __init__(self, what: str) -> None:
        super().__init__()
        self.l = nn.Linear(10, 3)
        self.register_buffer("mean", torch.zeros(10))
        self.what, self.armed = what, False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.l(x - self.mean)
        if self.armed and self.what == "parameter in forward":
            self.l.bias.data.add_(x.detach().mean())
        if self.armed and self.what == "buffer in forward":
            self.mean.data.copy_(x.detach().mean(0))
        if self.armed and self.what == "buffer in backward":
            out.register_hook(self.note)
        return out

    def note(self, g: torch.Tensor) -> None:
        self.mean.data.add_(g.abs().mean())


def _private(what: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(_deferred, "FORCE_ON_CPU", True)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64, 10, generator=g), torch.randint(0, 3, (64,), generator=g))
    torch.manual_seed(0)
    model = _Writer(what)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return dpfy.make_private(
        model,
        opt,
        DataLoader(data, batch_size=16),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        seed=0,
        poisson_sampling=False,
    )


@pytest.mark.parametrize(
    "what,message",
    [
        (
            "parameter in forward",
            "parameter 'l.bias'.*in a training forward.*without a version bump",
        ),
        ("buffer in forward", "buffer 'mean'.*in a training forward.*without a version bump"),
        ("buffer in backward", "buffer 'mean'.*after the training forward.*without a version bump"),
        ("parameter before step", "parameter 'l.weight'.*after the training forward"),
    ],
)
def test_a_silent_write_is_refused_by_the_step_before_its_release(what, message, monkeypatch):
    model, opt, loader = _private(what, monkeypatch)
    batches = iter(loader)
    x, y = next(batches)
    F.cross_entropy(model(x), y).backward()
    opt.step()  # the first step turns the deferral on; nothing is armed yet
    model.armed = True
    x, y = next(batches)
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)  # no refusal here: the comparison waits on the device
    loss.backward()
    if what == "parameter before step":
        model.l.weight.data[0, 0] += 1.0
    with pytest.raises(PrivacyRefusal, match=message):
        opt.step()
    assert opt.private_step.ledger.num_steps == 1  # the refused batch was not released


def test_a_pending_write_is_refused_before_the_state_is_saved(monkeypatch):
    model, _, _ = _written_without_a_step(monkeypatch)
    with pytest.raises(PrivacyRefusal, match="parameter 'l.bias'"):
        model.state_dict()


def test_forwards_without_a_step_are_read_after_the_limit(monkeypatch):
    model, opt, loader = _private("parameter in forward", monkeypatch)
    x, y = next(iter(loader))
    F.cross_entropy(model(x), y).backward()
    opt.step()
    model.armed = True
    with torch.no_grad(), pytest.raises(PrivacyRefusal, match="parameter 'l.bias'"):
        for _ in range(_deferred.LIMIT + 1):
            model(x)


def _written_without_a_step(monkeypatch):
    """A private model whose last training forward wrote its bias silently, with no step after."""
    model, opt, loader = _private("parameter in forward", monkeypatch)
    x, y = next(iter(loader))
    F.cross_entropy(model(x), y).backward()
    opt.step()
    model.armed = True
    with torch.no_grad():
        model(x)  # a training-mode forward with no step after it: its flag waits
    return model, opt, loader


@pytest.mark.parametrize(
    "save",
    [
        lambda m: torch.save(m, io.BytesIO()),  # the whole model pickled: model.pt
        lambda m: copy.deepcopy(m),  # a best-model snapshot, an EMA
        lambda m: m.l.state_dict(),  # a part of the model saved on its own
        lambda m: torch.save(m.l, io.BytesIO()),
    ],
    ids=["torch.save(model)", "deepcopy", "submodule.state_dict", "torch.save(submodule)"],
)
def test_a_pending_write_is_refused_before_the_model_is_copied(save, monkeypatch):
    model, _, _ = _written_without_a_step(monkeypatch)
    with pytest.raises(PrivacyRefusal, match="parameter 'l.bias'"):
        save(model)


def test_a_step_refused_for_another_reason_reads_the_pending_write(monkeypatch):
    # the horizon refuses the step before its sensitivity check (which reads the flags): the
    # write is refused there all the same, so no code after the refusal finds it unnoticed
    model, opt, loader = _written_without_a_step(monkeypatch)
    opt.max_steps = 1
    x, y = next(iter(loader))
    model.armed = False
    F.cross_entropy(model(x), y).backward()
    with pytest.raises(PrivacyRefusal, match="parameter 'l.bias'"):
        opt.step()
    assert opt.private_step.ledger.num_steps == 1


class _WritesThenRaises(_Writer):
    """Writes its bias silently in the forward, then fails (a shape error, an OOM)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        if self.armed:
            raise RuntimeError("the forward failed after its write")
        return out


@pytest.mark.parametrize(
    "force, limit", [(False, _deferred.LIMIT), (True, _deferred.LIMIT), (True, 0)]
)
def test_a_write_in_a_forward_that_raises_is_refused_later(force, limit, monkeypatch):
    # torch only warns of a forward hook's error while the forward's own error propagates, so
    # the guard cannot refuse there: the write must stay pending (CPU and device alike, and
    # also when the limit of pending comparisons is reached in that forward) and be refused
    # before the model is saved or stepped, not forgotten with the warning
    monkeypatch.setattr(_deferred, "FORCE_ON_CPU", force)
    monkeypatch.setattr(_deferred, "LIMIT", limit)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(32, 10, generator=g), torch.randint(0, 3, (32,), generator=g))
    model = _WritesThenRaises("parameter in forward")
    model, opt, loader = dpfy.make_private(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        DataLoader(data, batch_size=16),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        seed=0,
        poisson_sampling=False,
    )
    batches = iter(loader)
    x, y = next(batches)
    F.cross_entropy(model(x), y).backward()
    opt.step()
    model.armed = True
    x, y = next(batches)
    with warnings.catch_warnings(), pytest.raises(RuntimeError, match="failed after"):
        warnings.simplefilter("ignore")  # torch's note of a hook error it silenced
        model(x)
    with pytest.raises(PrivacyRefusal, match="parameter 'l.bias'"):
        model.state_dict()


def test_a_pending_write_is_refused_before_an_evaluation_forward(monkeypatch):
    """A model used in memory after training forwards with no step (evaluated, served) is
    refused at its first evaluation forward, as the CPU refuses the write in the forward."""
    model, _, loader = _written_without_a_step(monkeypatch)
    x, _ = next(iter(loader))
    model.eval()
    with torch.no_grad():  # an evaluation forward (``is_training_forward``: eval and no grad)
        with pytest.raises(PrivacyRefusal, match="parameter 'l.bias'"):
            model(x)
        model.armed = False
        assert model(x).shape == (16, 3)  # read once: the next evaluation forward runs
