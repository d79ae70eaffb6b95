"""The model-state guard where the parameters have no fingerprints (dpfy/buffers/marks.py
gives none for parameters on several devices): their values are compared bit for bit with a
copy at every checked forward and before the step, so a write without a version bump is seen
there too. Before, only identity, version and storage were compared after the first forward.
"""

from __future__ import annotations

import torch
from torch import nn

from dpfy.buffers import BufferGuard


class Split(nn.Module):
    """Parameters on two devices (a model split across GPUs; here the CPU and ``meta``, the
    one other device a CPU-only machine has), the CPU weight written without a version bump
    from the second training forward on."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)
        self.far = nn.Parameter(torch.zeros(3, device="meta"))
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls == 2:
            self.lin.weight.data[0, 0] += 1.0
        return self.lin(x)


def test_a_silent_write_into_a_model_on_several_devices_is_refused():
    """No one tensor of fingerprints holds parameters of several devices: before, they got
    none and only identity, version and storage were compared after the first forward."""
    guard = BufferGuard(Split(), collect=True)
    model = guard._model()
    model(torch.randn(8, 4))
    assert guard.problems == []
    model(torch.randn(8, 4))
    assert [(p.buffer, p.how.split(" (")[0]) for p in guard.problems] == [
        ("weight", "given new values without a version bump")
    ]
    guard.detach()


def test_a_silent_write_before_the_step_into_a_model_on_several_devices_is_refused():
    guard = BufferGuard(Split(), collect=True)
    model = guard._model()
    model.calls = 2  # no write in forward
    model(torch.randn(8, 4))
    model.lin.bias.data[1] -= 1.0  # between backward and step
    guard.check_settled()
    assert [(p.buffer, p.after) for p in guard.problems] == [("bias", True)]
    guard.detach()


class Moves(nn.Module):
    """Replaces its bias by one on another device in its second training forward."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls == 2:
            self.lin.bias = nn.Parameter(self.lin.bias.detach().to("meta"))
            return self.lin.weight.sum() * x
        return self.lin(x)


def test_a_parameter_moved_to_another_device_in_a_forward_is_named_as_such():
    """Fingerprints before, none after (several devices now): the marks still say what
    happened, and to which parameter (not every parameter 'deleted')."""
    guard = BufferGuard(Moves(), collect=True)
    model = guard._model()
    model(torch.randn(8, 4))
    model(torch.randn(8, 4))
    assert [(p.buffer, p.how) for p in guard.problems] == [("bias", "replaced by another tensor")]
    guard.detach()
