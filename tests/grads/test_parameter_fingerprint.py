"""The parameter fingerprint (dpfy.buffers) sees a silent write to any one element.

The guard sums each parameter's bits as integers through a view kept between forwards: 64-bit
words where the parameter's bytes allow, else words of its element size. A write that bypasses
the version counter (``p.data[i] = v``) changes one word, so the wrapping sum: checked here at
the first and the last element, on both word sizes, and for a sign flip of zero (equal as
floats, different bits).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpfy.buffers.marks import marks_changed, param_marks
from dpfy.buffers.prints import PrintCache


class _Two(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(n))  # odd n: 4-byte words; even n: 8-byte words
        self.b = nn.Parameter(torch.ones(3, 2))


@pytest.mark.parametrize("n", [7, 8])
@pytest.mark.parametrize("where", [0, -1])
def test_a_silent_write_to_one_element_is_seen(n, where):
    m = _Two(n)
    owners = [("", m)]
    views = PrintCache()
    before = param_marks(owners, views)
    assert before is not None and marks_changed(before, param_marks(owners, views)) == []
    m.w.data[where] = -0.0  # == 0.0 as a float, a different bit pattern
    changed = marks_changed(before, param_marks(owners, views))
    assert [key for key, _ in changed] == [(0, "w")]
    assert "without a version bump" in changed[0][1]


def test_new_storage_is_read_after_a_data_assignment():
    m = _Two(8)
    owners = [("", m)]
    views = PrintCache()
    param_marks(owners, views)
    m.w.data = torch.ones(8)  # new storage: the kept view must not be read any more
    after = param_marks(owners, views)
    m.w.data[3] = 2.0
    changed = marks_changed(after, param_marks(owners, views))
    assert [key for key, _ in changed] == [(0, "w")]


def test_parameters_iterated_in_another_order_are_not_compared_across():
    """A parameter registered anew (same tensor, same storage) is iterated last: the entries
    are in another order, and a silent write to another parameter must still be seen."""
    m = nn.Linear(4, 4)
    owners = [("", m)]
    views = PrintCache()
    before = param_marks(owners, views)
    m._parameters["weight"] = m._parameters.pop("weight")
    m.bias.data[0] += 1.0  # a silent write
    changed = marks_changed(before, param_marks(owners, views))
    assert (0, "bias") in [k for k, _ in changed]
