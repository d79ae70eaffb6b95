"""Buffers that a training forward changes are refused (issue 10 §1.3), generally, by the guard.

The changes are made by hand in small modules, so each test knows exactly what happened to
which buffer; the numbers checked are torch's own (a running mean moves, a copy stays equal).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.buffers import BufferGuard, guard_of
from dpfy.errors import PrivacyRefusal


class InPlace(nn.Module):
    """Accumulates the batch mean into a registered buffer, in place."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, x):
        self.seen += x.mean()
        return self.lin(x)


class Reassigned(InPlace):
    """The same statistic, written by assigning a new tensor to the buffer's name."""

    def forward(self, x):
        self.seen = self.seen + x.mean()
        return self.lin(x)


class ThroughData(InPlace):
    """The same statistic, written through ``.data`` (no version bump)."""

    def forward(self, x):
        self.seen.data.add_(x.mean())
        return self.lin(x)


class Positional(nn.Module):
    """A constant table that forward only reads (positional-encoding style)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.linspace(-1, 1, 4))
        self.lin = nn.Linear(4, 2)

    def forward(self, x):
        return self.lin(x + self.table)


def norm_model(**kw) -> nn.Module:
    return nn.Sequential(nn.Unflatten(1, (1, 2, 2)), nn.Conv2d(1, 3, 1),
                         nn.InstanceNorm2d(3, **kw), nn.Flatten(), nn.Linear(12, 2))


def loader(n=32, d=4):
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(n, d, generator=g),
                                    torch.randint(0, 2, (n,), generator=g)), batch_size=8)


def private(model, **kw):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return dpfy.make_private(model, opt, loader(), noise_multiplier=1.0, max_grad_norm=1.0,
                             seed=0, **kw)


def train(model, opt, dl, steps):
    it = iter(dl)
    for _ in range(steps):
        x, y = next(it)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


# -- through make_private (fail without the guard) --------------------------------------------

def test_instancenorm_running_stats_are_refused_before_training():
    # make_private itself refuses (grads/layers.py::check_model); the guard's own first-forward
    # refusal of the same buffers is tested below (test_no_grad_..., test_collect_mode_...) and
    # in tests/grads/test_buffer_refusal_early.py.
    model = norm_model(track_running_stats=True)
    before = {n: p.clone() for n, p in model.named_parameters()}
    with pytest.raises(PrivacyRefusal, match=r"module '2' .*InstanceNorm2d"
                       r"\(track_running_stats=True\).*track_running_stats=False"):
        private(model)
    assert torch.equal(model[2].running_mean, torch.zeros(3))  # nothing ran, nothing released
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_instancenorm_running_stats_are_refused_by_the_guard_at_the_first_training_forward():
    model = norm_model(track_running_stats=True)
    guard = BufferGuard(model)
    with pytest.raises(PrivacyRefusal, match=r"buffer '2\.running_mean' of module '2' "
                       r"\(InstanceNorm2d\).*modified in place.*track_running_stats=False"):
        model(torch.randn(8, 4))
    guard.detach()


@pytest.mark.parametrize("cls, how", [(InPlace, "modified in place"),
                                      (Reassigned, "replaced by another tensor"),
                                      (ThroughData, "without a version bump")])
def test_a_user_buffer_that_learns_in_forward_is_refused(cls, how):
    model, opt, dl = private(cls())
    with pytest.raises(PrivacyRefusal, match=rf"buffer 'seen' of module '\(root\)' "
                       rf"\({cls.__name__}\).*{how}.*compute it beforehand from public data"):
        train(model, opt, dl, 1)
    assert opt.step_count == 0


def test_constant_buffers_and_evaluation_keep_working():
    model, opt, dl = private(Positional())
    table = model.table.clone()
    train(model, opt, dl, 2)
    assert opt.step_count == 2 and torch.equal(model.table, table)
    # evaluation of a model whose buffers *would* learn in training mode: eval() leaves them
    norm = norm_model(track_running_stats=True)  # make_private refuses it: guard it alone
    BufferGuard(norm)
    x, _ = next(iter(dl))
    norm.eval()
    norm(x)  # autograd on, eval mode: checked, and InstanceNorm reads its stats only
    with torch.no_grad():
        norm(x)
    assert torch.equal(norm[2].running_mean, torch.zeros(3))


def test_a_constant_buffer_inside_a_vmap_unit_trains():
    model, opt, dl = private(Positional(), route="vmap")
    train(model, opt, dl, 2)
    assert opt.step_count == 2


# -- the guard itself ---------------------------------------------------------------------------

def test_no_grad_in_training_mode_is_still_a_training_forward():
    model = norm_model(track_running_stats=True)
    BufferGuard(model)
    with torch.no_grad(), pytest.raises(PrivacyRefusal, match="running_mean"):
        model(torch.randn(2, 4))  # running statistics learn in train mode, grad or not


def test_a_submodule_called_directly_is_named_by_its_own_name():
    model = nn.ModuleDict({"enc": nn.Linear(4, 4), "stat": InPlace()})
    BufferGuard(model)
    with pytest.raises(PrivacyRefusal, match=r"buffer 'stat\.seen' of module 'stat' \(InPlace\)"):
        model["stat"](torch.randn(2, 4))


class Parent(nn.Module):
    """Writes into its child's buffer, and registers a buffer lazily: only the root sees these."""

    def __init__(self, lazy: bool) -> None:
        super().__init__()
        self.child = Positional()
        self.lazy = lazy

    def forward(self, x):
        if self.lazy:
            self.register_buffer("first_mean", x.mean().detach())
        else:
            self.child.table[0] = x.mean().detach()
        return self.child(x)


@pytest.mark.parametrize("lazy, match", [
    (False, r"buffer 'child\.table' of module 'child' \(Positional\).*modified in place"),
    (True, r"buffer 'first_mean' of module '\(root\)' \(Parent\).*registered during")])
def test_changes_made_by_another_module_are_seen_from_the_root(lazy, match):
    model = Parent(lazy)
    BufferGuard(model)
    with pytest.raises(PrivacyRefusal, match=match):
        model(torch.randn(2, 4))


class Forgetting(InPlace):
    """Drops its buffer in forward (a change of what the saved model holds, too)."""

    def forward(self, x):
        del self.seen
        return self.lin(x)


def test_a_deleted_buffer_is_a_change():
    model = Forgetting()
    BufferGuard(model)
    with pytest.raises(PrivacyRefusal, match=r"buffer 'seen'.*deleted during the forward"):
        model(torch.randn(2, 4))


def test_buffers_without_a_version_counter_are_still_watched():
    model = Positional()
    with torch.inference_mode():
        model.table = torch.linspace(-1, 1, 4)  # an inference tensor: no version counter
    BufferGuard(model)
    model(torch.randn(2, 4))  # read only: fine
    model.forward = lambda x: setattr(model, "table", model.table + 1) or x
    with pytest.raises(PrivacyRefusal, match=r"buffer 'table'.*replaced by another tensor"):
        model(torch.randn(2, 4))


def test_one_refusal_per_forward_and_no_hook_left_behind():
    model = norm_model(track_running_stats=True)
    guard = BufferGuard(model)
    assert guard_of(model) is guard
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an outer hook re-raising the inner refusal would warn
        with pytest.raises(PrivacyRefusal):
            model(torch.randn(2, 4))
    guard.detach()
    guard.detach()  # idempotent
    assert guard_of(model) is None
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    model(torch.randn(2, 4))  # unguarded again


def test_collect_mode_lists_each_change_once():
    model = norm_model(track_running_stats=True)
    guard = BufferGuard(model, collect=True)
    model(torch.randn(2, 4))  # seen by the module's own hooks and the root's: reported once
    assert sorted(c.buffer for c in guard.problems) == ["running_mean", "running_var"]
    assert {c.module for c in guard.problems} == {"2"}


def test_a_deep_copy_is_not_guarded_by_the_original_guard():
    model = Positional()
    BufferGuard(model)
    clone = copy.deepcopy(model)
    clone.table.add_(1.0)  # outside a forward: not the guard's business
    clone(torch.randn(2, 4))
    assert guard_of(clone) is None

