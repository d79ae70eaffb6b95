"""The step's sums (``dpfy.step.sums``) in the arithmetic that bounds an example's contribution.

:func:`contract` forms Σ_i w_i g_i from materialized per-example gradients (the path of a
method that transforms them, AdaClip): an ``einsum``, i.e. a matrix product, which a GPU
computes in TF32 when the user allows it (``torch.backends.cuda.matmul.allow_tf32``,
``torch.set_float32_matmul_precision("high")``). Its clip factors come from norms summed in
float32, so the sum must be float32 too (issue 36; ``dpfy.grads.arithmetic``, point 2).
TF32 is emulated here as a GPU computes it: the operands of the product rounded to a 10-bit
mantissa while the flags allow it (``round_to_tf32``).
"""

from __future__ import annotations

import pytest
import torch

from dpfy.grads.arithmetic import round_to_tf32, tf32_in_effect
from dpfy.step.sums import contract


@pytest.fixture
def tf32_as_on_a_gpu(monkeypatch):
    """TF32 allowed (as a user with allow_tf32 has it), and ``torch.einsum`` computing as a GPU
    does under the flags in effect at the call: float32 operands rounded to TF32."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    exact = torch.einsum

    def einsum(equation, *operands):
        if tf32_in_effect():
            operands = tuple(round_to_tf32(t) if t.dtype == torch.float32 else t for t in operands)
        return exact(equation, *operands)

    monkeypatch.setattr(torch, "einsum", einsum)
    yield
    torch.set_float32_matmul_precision(before)


def test_a_contracted_sum_keeps_a_clipped_contribution_within_c(tf32_as_on_a_gpu):
    # one example whose every coordinate rounds up in TF32: 1 + 2^-11 + 2^-22 lies above the
    # midpoint between 1 and 1 + 2^-10, the next TF32 value, so it rounds to 1 + 2^-10
    p, clip = 1000, 1.0
    g = torch.full((1, p), 1 + 2.0**-11 + 2.0**-22)
    norm = g.square().sum(1).sqrt()  # float32, as the step's norms (elementwise: no TF32)
    w = clip / norm  # its clip factor: the contribution w·‖g‖ = C up to float32 rounding
    (total,) = contract({"p": g})([{"p": w}])
    # derivation: float32 sums of p = 1000 positive terms err by ≤ γ_p ≈ p·u relative (Higham
    # §3.1), the square root halves it, and the product w·g adds u: ‖S‖ ≤ C·(1 + (p/2 + 2)·u).
    # In TF32 each coordinate becomes (1 + 2^-10)/(1 + 2^-11 + 2^-22) = 1 + 4.9e-4 times
    # larger, and ‖S‖ with it: 16 times beyond this bound.
    u = 2.0**-24
    got = float(total["p"].double().norm())
    assert got <= clip * (1 + (p / 2 + 2) * u), got
