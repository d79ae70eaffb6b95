"""The Linear rule's book-keeping sum Σ_i w_i G_iᵀ A_i on a sequence scales the narrower of its
two operands, on the device path too: a widening layer (an untied LM head, d_out = vocabulary)
would otherwise allocate a second tensor of its output gradient's size, B·T·d_out, while the
engine still holds every captured gradient, i.e. about twice the largest capture at the peak."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from dpfy.grads import rule_for
from dpfy.grads.rules import base


class Allocations(TorchDispatchMode):
    """The element counts of the tensors each op allocates (not views of its arguments)."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        held = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
        for o in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() not in held:
                self.sizes.append(o.numel())
        return out


@pytest.mark.parametrize("on_device_path", [False, True])
@pytest.mark.parametrize("shared", [True, False])
def test_widening_layer_allocates_no_copy_of_its_output_gradient(
    on_device_path, shared, monkeypatch
):
    monkeypatch.setattr(base, "FORCE_DEVICE_PATH", on_device_path)
    torch.manual_seed(0)
    b, t, d_in, d_out = 3, 5, 4, 64  # d_out = 16 d_in
    layer = nn.Linear(d_in, d_out).double()
    a = torch.randn(b, t, d_in, dtype=torch.float64)
    g = torch.randn(b, t, d_out, dtype=torch.float64)
    w = torch.linspace(0.1, 1.0, b, dtype=torch.float64)
    wb = w if shared else torch.linspace(1.0, 0.5, b, dtype=torch.float64)
    with torch.no_grad(), Allocations() as seen:
        out = rule_for(layer).weighted_sum(layer, a, g, {"weight": w, "bias": wb})
    # the largest allocation: the (d_out, d_in) result, never a B·T·d_out scaled gradient
    assert max(seen.sizes) == d_out * d_in < b * t * d_out
    # float64, B·T = 15 products per entry: rounding about 15·2⁻⁵³ ≈ 2e-15 relative, under 1e-12
    torch.testing.assert_close(
        out["weight"], torch.einsum("b,bto,bti->oi", w, g, a), rtol=1e-12, atol=1e-12
    )
    torch.testing.assert_close(out["bias"], torch.einsum("b,bto->o", wb, g), rtol=1e-12, atol=1e-12)
