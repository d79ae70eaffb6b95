"""The per-example norm tracker (``dpfy.norm_tracker``) on a model that lives on a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dpfy import norm_tracker
from dpfy.norm_tracker import NormTracker


class _OnDevice(torch.Tensor):
    """A tensor as a CUDA tensor behaves towards numpy: refused until ``.cpu()`` brings it to
    the host (torch: "can't convert cuda:0 device type tensor to numpy")."""

    def numpy(self, *args, **kwargs):
        raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu()")

    def cpu(self, *args, **kwargs):
        return self.as_subclass(torch.Tensor)


class _TorchOnDevice:
    """``torch`` as the tracker sees it, whose ``cat`` (how it gathers the chunks' norms and
    losses) returns tensors that behave as a GPU's."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def cat(tensors, *args, **kwargs):
        return torch.cat(tensors, *args, **kwargs).as_subclass(_OnDevice)


def test_the_norms_of_a_model_on_a_gpu_are_read_to_the_host(monkeypatch):
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    tracker = NormTracker(model, F.cross_entropy, x, y, clip=0.5, refresh_every=1, chunk=4)
    monkeypatch.setattr(norm_tracker, "torch", _TorchOnDevice())
    tracker.before_step()
    monkeypatch.undo()
    # float64 per-example gradients of ℓ_i = CE(W x_i + b, y_i): the clipped-norm ratios
    ratios = []
    m = nn.Linear(4, 3).double()
    m.load_state_dict(model.state_dict())
    for i in range(6):
        m.zero_grad()
        F.cross_entropy(m(x[i : i + 1].double()), y[i : i + 1]).backward()
        norm = torch.cat([p.grad.flatten() for p in m.parameters()]).norm()
        ratios.append(min(float(norm) / 0.5, 1.0))
    # float32 norms of 15 squares: relative error ≤ 15·2^-24 ≈ 1e-6 (γ_15, Higham §3.1)
    np.testing.assert_allclose(tracker.ratios[0], ratios, rtol=1e-5)


def test_the_tracker_moves_its_rows_to_the_models_device():
    """The tracker holds the training rows where the dataset is (the host, when the training set
    does not fit on the GPU) and the model may be on a GPU, where torch refuses host rows. A
    model on ``meta`` stands in for the GPU (torch refuses host tensors there alike: "not on the
    expected device"). Moved, the rows reach the model; the run then stops where meta tensors
    hold no data to read back, which a GPU's do."""
    model = nn.Linear(4, 3).to("meta")
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    tracker = NormTracker(model, F.cross_entropy, x, y, clip=0.5, refresh_every=1, chunk=4)
    with pytest.raises(NotImplementedError, match="meta tensor; no data"):
        tracker.before_step()
