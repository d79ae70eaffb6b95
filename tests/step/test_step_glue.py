"""The step's glue on the accelerator path (issue 36, "What to build" 2), counted on the CPU.

With the rules' device path forced (``dpfy.grads.rules.base.FORCE_DEVICE_PATH``: what a GPU
takes), a steady-state training step reads the host at most twice beyond what the model's own
forward does: once for the sensitivity check before the release (``check_bound``, which also
reads the model-state guard's comparisons left on the device: ``dpfy._deferred``) and once for
the debug statistic ``mean_grad_norm_nonprivate``. Counts, not times. A host read is
``aten::_local_scalar_dense`` (item, float, bool), ``aten::equal`` (``torch.equal`` answers a
Python bool: on CUDA it waits for the device) or ``Tensor.tolist``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy import _deferred
from dpfy.grads.rules import base
from dpfy.noise import NoiseSource


class _Reads(TorchDispatchMode):
    """Counts host reads (see the module docstring) while active."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in ("_local_scalar_dense", "equal"):
            self.reads += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        tolist, counter = torch.Tensor.tolist, self

        def counted(t):  # reads memory without a dispatch on the CPU
            counter.reads += 1
            return tolist(t)

        self._tolist = tolist
        torch.Tensor.tolist = counted
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)


class _Tagger(nn.Module):
    """Token ids (B, T) with repeated ids and shared position ids: both embedding shortcuts
    (the same ids in every row, no id repeated in a row) would read the ids on the host."""

    def __init__(self) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(11, 6), nn.Embedding(5, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        pos = torch.arange(x.shape[1]).expand_as(x)
        return self.head(torch.tanh(self.tok(x) + self.pos(pos)).mean(1))


def _run(steps: int = 3):
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(
        torch.randint(0, 11, (32, 5), generator=g), torch.randint(0, 3, (32,), generator=g)
    )
    model = _Tagger()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, loader = dpfy.make_private(
        model,
        opt,
        DataLoader(data, batch_size=8),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        seed=0,
        poisson_sampling=False,
    )
    reads = []
    for i, (x, y) in enumerate(loader):
        counter = _Reads()
        with counter:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        reads.append(counter.reads)
        if i + 1 >= steps:
            break
    return opt, reads


def test_a_steady_step_on_the_device_path_reads_the_host_at_most_twice(monkeypatch):
    monkeypatch.setattr(base, "FORCE_DEVICE_PATH", True, raising=False)
    monkeypatch.setattr(_deferred, "FORCE_ON_CPU", True)
    opt, reads = _run()
    assert opt.step_count == 3
    # steady state (the first step also checks the loss contract): the sensitivity check with
    # the guard's comparisons (before: one torch.equal after the forward, one at the step)
    # and the debug statistic, nothing per layer or per parameter
    assert reads[1:] == [2, 2]


@pytest.mark.parametrize("forced", [False, True])
def test_the_device_path_releases_what_the_cpu_path_releases(monkeypatch, forced):
    """The embedding rule's general path (no host-read shortcut) gives the same norms: the
    seeded runs end at the same parameters within float32 rounding of a few sums (1e-5)."""
    monkeypatch.setattr(base, "FORCE_DEVICE_PATH", forced)
    torch.manual_seed(0)
    opt, _ = _run()
    got = [p.detach().clone() for p in opt.private_step.params.values()]
    monkeypatch.setattr(base, "FORCE_DEVICE_PATH", not forced)
    torch.manual_seed(0)
    opt2, _ = _run()
    for a, b in zip(got, opt2.private_step.params.values()):
        torch.testing.assert_close(a, b.detach(), rtol=1e-5, atol=1e-6)


def test_the_noise_is_drawn_per_parameter_tensor_in_order(monkeypatch):
    """A seeded run's noise is its generator's draws per parameter tensor, in the parameters'
    order: the seeded generators drop a call's last block, so one call over all parameters (or
    another order) would change the noise, and a seeded run's parameters, from before."""
    shapes = []
    original = NoiseSource.noisy_mean

    def recorded(self, total, std, normalizer, *args, **kwargs):
        shapes.append(tuple(total.shape))
        return original(self, total, std, normalizer, *args, **kwargs)

    monkeypatch.setattr(NoiseSource, "noisy_mean", recorded)
    opt, _ = _run(steps=2)
    order = [tuple(p.shape) for p in opt.private_step.params.values()]
    assert len(order) == 4 and shapes == order * 2
