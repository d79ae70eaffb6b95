"""The convolution rule's fast paths against the float64 per-example loop (tests/oracles.py).

Each rule entry point (``sq_norm``, ``grad_sample``, ``weighted_sum``) is called directly on a
captured (input, output gradient) pair, whatever route ``prefers_ghost`` would pick, and compared
with the gradient of each example's loss computed alone. Shapes cover the layers a fast path
takes (stride dividing the kernel, one input channel per group) and the ones it must leave to
the general path (dilation, stride not dividing the kernel, groups, padding modes, Conv1d).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import oracles
from dpfy.grads import rule_for
from dpfy.grads.rules import base, conv

RTOL = 1e-9  # float64 throughout: only summation order differs from the loop


def loss_sum(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # Σ_i ℓ_i with a non-trivial output gradient for any output shape
    w = torch.linspace(-1, 1, out.shape[1:].numel(), dtype=out.dtype).reshape(out.shape[1:])
    return ((out * w).sum(tuple(range(1, out.dim()))) ** 2 * (1 + y.to(out.dtype))).sum()


def captured(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The output gradient the engine would capture: row i is ∂ℓ_i/∂(layer output)_i."""
    x = x.detach()
    out = layer(x).detach().requires_grad_(True)
    loss_sum(out, torch.arange(x.shape[0]) % 2).backward()
    return out.grad


def check_rule(layer: nn.Module, x: torch.Tensor) -> None:
    """Ghost norms, per-sample gradients and a weighted sum of the conv rule equal the loop."""
    layer, x = layer.double(), x.double()
    b = x.shape[0]
    ref = oracles.per_example_grads(layer, x, torch.arange(b) % 2, loss_sum)  # (B, *θ) each
    rule = rule_for(layer)
    g = captured(layer.requires_grad_(False), x)  # (B, C_out, *spatial) sensitive
    with torch.no_grad():
        sq = rule.sq_norm(layer, x, g)
        gs = rule.grad_sample(layer, x, g)
        w = torch.linspace(0.1, 1.0, b, dtype=torch.float64)
        sums = rule.weighted_sum(layer, x, g, {n: w for n in ref})
    for n, want in ref.items():
        torch.testing.assert_close(sq[n], want.reshape(b, -1).square().sum(1),
                                   rtol=RTOL, atol=1e-12)
        torch.testing.assert_close(gs[n], want, rtol=RTOL, atol=1e-12)
        torch.testing.assert_close(sums[n], torch.einsum("b,b...->...", w, want),
                                   rtol=RTOL, atol=1e-12)


def check_superpixels(layer: nn.Module, x: torch.Tensor) -> None:
    """The super-pixel ghost norm, called whatever the cost guard says, equals the loop."""
    layer, x = layer.double(), x.double()
    b = x.shape[0]
    want = oracles.per_example_grads(layer, x, torch.arange(b) % 2, loss_sum)["weight"]
    g = captured(layer.requires_grad_(False), x)
    (kh, kw), (sh, sw), _ = conv._geometry(layer)
    with torch.no_grad():
        sq = conv._weight_sq_norm_by_superpixels(layer, x, g, kh // sh, kw // sw)
    torch.testing.assert_close(sq, want.reshape(b, -1).square().sum(1), rtol=RTOL, atol=1e-12)


# (layer, input shape, whether the super-pixel ghost norm applies: no dilation, stride | kernel)
CASES = [
    (lambda: nn.Conv2d(16, 32, 4, stride=2), (3, 16, 13, 13), True),  # Tramèr & Boneh conv2
    (lambda: nn.Conv2d(3, 4, 4, stride=2, padding=1), (2, 3, 9, 8), True),
    (lambda: nn.Conv2d(3, 4, (4, 3), stride=(2, 1), padding=(1, 2)), (2, 3, 9, 7), True),
    (lambda: nn.Conv2d(2, 3, (2, 6), stride=(2, 3)), (3, 2, 7, 11), True),
    (lambda: nn.Conv2d(2, 3, 3, stride=1, padding=1), (2, 2, 6, 5), True),
    (lambda: nn.Conv2d(2, 3, 2, stride=2), (2, 2, 6, 7), True),  # kernel = stride
    (lambda: nn.Conv2d(4, 6, 4, stride=2, groups=2), (2, 4, 10, 10), True),
    (lambda: nn.Conv2d(2, 3, 4, stride=2, padding=2, padding_mode="reflect"), (2, 2, 8, 9), True),
    (lambda: nn.Conv2d(2, 3, 4, stride=2, padding=1, padding_mode="circular"), (2, 2, 8, 8), True),
    (lambda: nn.Conv2d(2, 3, 3, padding="same", bias=False), (2, 2, 5, 6), True),
    (lambda: nn.Conv2d(2, 3, (4, 2), padding="same"), (1, 2, 6, 5), True),  # asymmetric pad
    (lambda: nn.Conv2d(2, 3, 4, stride=2), (2, 2, 11, 12), True),  # last rows/cols unread
    (lambda: nn.Conv2d(1, 4, 8, stride=2, padding=3), (2, 1, 28, 28), True),  # T&B conv1
    (lambda: nn.Conv1d(3, 4, 4, stride=2, padding=1), (2, 3, 11), True),
    (lambda: nn.Conv1d(3, 4, 3, stride=1), (2, 3, 9), True),
    (lambda: nn.Conv1d(2, 4, 6, stride=3, padding=2, padding_mode="reflect", groups=2),
     (2, 2, 14), True),
    (lambda: nn.Conv2d(2, 3, 3, stride=2), (2, 2, 9, 9), False),  # stride ∤ kernel
    (lambda: nn.Conv2d(2, 3, 4, stride=2, dilation=2), (2, 2, 12, 12), False),
    (lambda: nn.Conv1d(3, 4, 3, stride=2), (2, 3, 9), False),
    (lambda: nn.Conv2d(3, 3, 3, stride=2, padding=1, groups=3), (2, 3, 7, 7), False),
]


@pytest.mark.parametrize("on_device_path", [False, True])
@pytest.mark.parametrize("make, shape, covered", CASES)
def test_conv_rule_matches_loop(make, shape, covered, on_device_path, monkeypatch):
    # the device path sums the super-pixel Gram's shifted blocks in one reduction, the CPU's
    # in a loop of adds
    monkeypatch.setattr(base, "FORCE_DEVICE_PATH", on_device_path)
    torch.manual_seed(0)
    layer = make()
    check_rule(layer, torch.randn(shape))  # whichever paths the guards pick
    if covered:
        check_superpixels(layer, torch.randn(shape))
    else:
        g = captured(layer, torch.randn(shape, dtype=torch.float64))
        assert conv._superpixel_ratio(layer, g) is None


@pytest.mark.parametrize("make, shape, chosen", [
    (lambda: nn.Conv2d(16, 32, 4, stride=2), (2, 16, 13, 13), True),  # 4× fewer Gram flops
    (lambda: nn.Conv2d(64, 8, 3, padding=1), (2, 64, 8, 8), True),
    (lambda: nn.Conv2d(8, 8, 3, padding=1), (2, 8, 16, 16), False),  # 1.3× the memory
    (lambda: nn.Conv2d(2, 3, 5), (2, 2, 6, 6), False),  # 36² super-pixel Gram vs 2² patch Gram
])
def test_superpixel_cost_guard(make, shape, chosen):
    layer = make()
    g = captured(layer, torch.randn(shape))
    assert (conv._superpixel_ratio(layer, g) is not None) == chosen


@pytest.mark.parametrize("on_device_path", [False, True])
@pytest.mark.parametrize("layout", ["channels_last", "offset"])
def test_superpixels_read_any_input_layout(layout, on_device_path, monkeypatch):
    """The super-pixels are a strided view built from the input's own strides and offset: a
    channels-last input and one that starts inside its storage give the loop's norms."""
    monkeypatch.setattr(base, "FORCE_DEVICE_PATH", on_device_path)
    torch.manual_seed(0)
    layer = nn.Conv2d(4, 6, 4, stride=2, groups=2)
    x = torch.randn(4, 4, 10, 11, dtype=torch.float64)  # float64: check_superpixels keeps it
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    else:
        x = x[1:]  # storage offset 4·10·11
    check_superpixels(layer, x)


def test_conv_rule_empty_batch():
    layer = nn.Conv2d(3, 4, 4, stride=2).double()
    x = torch.zeros(0, 3, 9, 9, dtype=torch.float64)
    g = torch.zeros(0, 4, 3, 3, dtype=torch.float64)
    sq = rule_for(layer).sq_norm(layer, x, g)
    assert all(t.shape == (0,) for t in sq.values())
