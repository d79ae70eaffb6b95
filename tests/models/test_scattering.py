"""The 2-D scattering transform (Tramèr & Boneh 2021's features) against references.

- Kymatio's 2-D torch frontend (Andreux et al. 2020), the field's library, on a fixed image:
  imported from its submodule (kymatio 0.3.0's top-level import fails on current scipy: its
  3-D transform imports a removed scipy function); skipped when kymatio is not installed.
- Derived here: a constant image has order-0 coefficients equal to the constant (φ has unit
  mass) and order-1 and -2 coefficients 0 (Morlet wavelets have zero mean); the order-0 map of
  any image is its reflect-padded circular convolution with the periodized Gaussian of
  σ = 0.8·2^(J−1), sampled every 2^J pixels and cropped by one sample on each side.
"""

import math

import pytest
import torch

from dpfy.models.scattering import Scattering2D, scattering_channels


def _image() -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    yy, xx = torch.meshgrid(torch.arange(28.0), torch.arange(28.0), indexing="ij")
    shape = ((xx - 14) ** 2 + (yy - 12) ** 2 < 60).float()        # a disc: edges at all angles
    return (shape + 0.3 * torch.rand(28, 28, generator=g))[None, None]   # (1, 1, 28, 28)


def test_shape_channels_and_no_parameters():
    s = Scattering2D((28, 28), J=2, L=8)
    assert scattering_channels(2, 8) == 81 and list(s.parameters()) == []
    assert s(torch.zeros(3, 2, 28, 28)).shape == (3, 162, 7, 7)


def test_matches_kymatio_on_a_fixed_image():
    frontend = pytest.importorskip("kymatio.scattering2d.frontend.torch_frontend")
    x = _image()
    want = frontend.ScatteringTorch2D(J=2, shape=(28, 28), L=8)(x[:, 0])   # (1, 81, 7, 7)
    got = Scattering2D((28, 28), J=2, L=8)(x)
    # float32 throughout; Kymatio normalizes its filters with π ≈ 3.1415 (3e-5 relative)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))


def test_a_constant_image_has_only_its_order_0_coefficients():
    out = Scattering2D((28, 28))(torch.full((1, 1, 28, 28), 0.7))
    torch.testing.assert_close(out[:, 0], torch.full((1, 7, 7), 0.7), rtol=0, atol=1e-5)
    assert float(out[:, 1:].abs().max()) < 1e-5


def test_order_0_is_the_padded_gaussian_lowpass_sampled_every_4_pixels():
    x = _image().double()
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4), mode="reflect")[0, 0]   # (36, 36)
    sigma = 0.8 * 2 ** (2 - 1)
    ax = torch.arange(36, dtype=torch.float64)
    phi = torch.zeros(36, 36, dtype=torch.float64)
    for tx in range(-2, 3):
        for ty in range(-2, 3):
            u, v = ax[:, None] + 36 * tx, ax[None, :] + 36 * ty
            phi += torch.exp(-(u ** 2 + v ** 2) / (2 * sigma ** 2))
    phi /= 2 * math.pi * sigma ** 2
    conv = torch.fft.ifft2(torch.fft.fft2(padded) * torch.fft.fft2(phi)).real
    want = conv[::4, ::4][1:-1, 1:-1]
    got = Scattering2D((28, 28))(x.float())[0, 0].double()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
