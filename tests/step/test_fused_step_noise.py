"""The whole step's noise in one fused launch where the Triton kernel draws it (a GPU), checked on
the CPU by Triton's interpreter (``backend="triton"`` forces the kernel on every device).

Expected values: the same seeded kernel stream applied to the concatenated sums by a second,
identical source (the definition of "one launch over one flat buffer"), and the launch count
read by wrapping the kernel's one entry point.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import dpfy.noise.triton_noise as tn  # noqa: E402
from dpfy.noise import NoiseSource  # noqa: E402
from dpfy.step.sums import _one_launch, release_into_grads  # noqa: E402

SHAPES = [(5, 3), (5,), (2, 2, 4)]


@pytest.fixture(autouse=True)
def _interpreted(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _sums() -> tuple[list[torch.Tensor], list[torch.nn.Parameter]]:
    g = torch.Generator().manual_seed(0)
    totals = [torch.randn(s, generator=g) for s in SHAPES]
    params = [torch.nn.Parameter(torch.zeros(s)) for s in SHAPES]
    return totals, params


def test_the_steps_noise_is_one_launch_over_one_flat_buffer(monkeypatch):
    launches = []
    axpy = tn.TritonChaChaGaussian.axpy_

    def counted(self, x, a, s):
        launches.append(x.numel())
        return axpy(self, x, a, s)

    monkeypatch.setattr(tn.TritonChaChaGaussian, "axpy_", counted)
    totals, params = _sums()
    flat = torch.cat([t.reshape(-1) for t in totals])  # before the release overwrites totals
    released = release_into_grads(NoiseSource(7, backend="triton"), totals, params, 2.0, 4.0)
    assert launches == [flat.numel()]  # one launch for the whole step
    want = NoiseSource(7, backend="triton").noisy_mean(flat, 2.0, 4.0)
    got = torch.cat([p.grad.reshape(-1) for p in params])
    assert torch.equal(got, want)  # the same stream, laid out in the parameters' order
    assert [tuple(r.shape) for r in released] == SHAPES
    assert all(p.grad.shape == p.shape for p in params)


def test_elsewhere_one_call_per_tensor_keeps_seeded_runs_as_they_were():
    totals, _ = _sums()
    assert not _one_launch(NoiseSource(7), totals)  # the CPU's compiled sampler
    assert not _one_launch(object(), totals)  # a correlated mechanism: state per parameter
    mixed = [totals[0].double(), *totals[1:]]
    assert not _one_launch(NoiseSource(7, backend="triton"), mixed)  # dtypes differ
