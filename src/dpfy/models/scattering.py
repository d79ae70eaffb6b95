"""A fixed 2-D wavelet scattering transform (Mallat 2012; Bruna & Mallat 2013), in torch.

Tramèr & Boneh 2021 ("Differentially private learning needs better features (or much more
data)", §3) train a linear model with DP-SGD on the scattering coefficients of an image: the
transform has no parameters and is chosen before seeing any data, so it costs no privacy, and
its features make a linear model far more accurate at a given ε than an end-to-end CNN.

The transform is the one of the field's library (Andreux et al. 2020, "Kymatio"), defined here
from its mathematical definition; ``tests/models/test_scattering.py`` compares the output with
Kymatio's on a fixed image. For J scales and L orientations, with ψ_{j,θ} Morlet wavelets and
φ_J a Gaussian low-pass at scale 2^J:

    S_0 x = x ⋆ φ_J,   S_1 x = |x ⋆ ψ_{j1,θ1}| ⋆ φ_J,   S_2 x = ||x ⋆ ψ_{j1,θ1}| ⋆ ψ_{j2,θ2}| ⋆ φ_J
    (j2 > j1), each subsampled by 2^J:  1 + JL + L²J(J−1)/2 channels (81 for J = 2, L = 8).

Details that fix the numbers: the image is reflect-padded to a multiple of 2^J with room for
one coefficient on each side (28 → 36 for J = 2), which is cropped at the end; convolutions
are products in the Fourier domain (periodic); a subsampling by 2^r is the mean of the aliased
Fourier coefficients (the transform of taking every 2^r-th sample); every intermediate modulus
is re-transformed. Filters (Fourier transforms, real parts): Morlet ψ_{j,θ} = Gabor minus K
times its Gaussian envelope (K making the mean zero), σ = 0.8·2^j, centre frequency ξ = 3π/4 /
2^j, slant 4/L, angle (L/2 − 1 − θ)π/L; φ_J is the Gabor at ξ = 0 with σ = 0.8·2^(J−1); each
filter is periodized over 5×5 tiles and normalized by 2πσ²/slant; a filter used at a coarser
resolution 2^r keeps its low-frequency band only.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["Scattering2D", "scattering_channels"]


def scattering_channels(J: int, L: int) -> int:
    """1 + JL + L²J(J−1)/2: the number of coefficient maps per input channel."""
    return 1 + J * L + L * L * J * (J - 1) // 2


def _gabor(
    M: int, N: int, sigma: float, theta: float, xi: float, slant: float = 1.0
) -> torch.Tensor:
    """(M, N) complex128: a Gabor filter centred at the origin, periodized over 5×5 tiles."""
    c, s = math.cos(theta), math.sin(theta)
    rot = torch.tensor([[c, -s], [s, c]], dtype=torch.float64)
    curv = rot @ torch.diag(torch.tensor([1.0, slant * slant], dtype=torch.float64)) @ rot.T
    curv = curv / (2 * sigma * sigma)
    out = torch.zeros(M, N, dtype=torch.complex128)
    base_x = torch.arange(M, dtype=torch.float64)[:, None]
    base_y = torch.arange(N, dtype=torch.float64)[None, :]
    for tx in range(-2, 3):
        for ty in range(-2, 3):
            x, y = base_x + tx * M, base_y + ty * N
            quad = curv[0, 0] * x * x + (curv[0, 1] + curv[1, 0]) * x * y + curv[1, 1] * y * y
            out += torch.exp(torch.complex(-quad, xi * (x * c + y * s)))
    return out / (2 * math.pi * sigma * sigma / slant)


def _morlet(M: int, N: int, sigma: float, theta: float, xi: float, slant: float) -> torch.Tensor:
    """A Gabor minus the multiple of its envelope that makes its sum zero."""
    wave = _gabor(M, N, sigma, theta, xi, slant)
    envelope = _gabor(M, N, sigma, theta, 0.0, slant)
    return wave - (wave.sum() / envelope.sum()) * envelope


def _low_band(f: torch.Tensor, res: int) -> torch.Tensor:
    """The filter's Fourier transform on the grid 2^res times coarser: its low band only."""
    out = f
    for dim in (0, 1):
        size = f.shape[dim]
        first = int(size * 2 ** (-res - 1))
        kept = size // 2**res
        index = torch.cat([torch.arange(first), torch.arange(size - (kept - first), size)])
        out = out.index_select(dim, index)
    return out


def _subsample(xf: torch.Tensor, k: int) -> torch.Tensor:
    """Fourier coefficients of the signal subsampled by k (mean of the k×k aliases)."""
    if k == 1:
        return xf
    m, n = xf.shape[-2] // k, xf.shape[-1] // k
    out = xf[..., :m, :n].clone()
    for a in range(k):
        for b in range(k):
            if a or b:
                out += xf[..., a * m : (a + 1) * m, b * n : (b + 1) * n]
    return out / (k * k)


class Scattering2D(nn.Module):
    """The scattering transform of (B, C, H, W) images: (B, C·K, H/2^J, W/2^J), K channels.

    A fixed module: no parameters (the filters are buffers, data-independent constants).

    Args:
      shape: (H, W) of the images, each divisible by 2^J.
      J: number of scales (2 for 28×28 images, as Tramèr & Boneh). L: orientations (8).
    """

    psi: torch.Tensor  # (J·L, M, N) wavelet filters in Fourier space, a buffer

    def __init__(self, shape: tuple[int, int], J: int = 2, L: int = 8) -> None:
        super().__init__()
        H, W = shape
        if H % 2**J or W % 2**J:
            raise ValueError(f"shape must be divisible by 2^J = {2**J}, got {shape}")
        self.J, self.L, self.shape = J, L, (H, W)
        self.pad_h = ((H + 2**J) // 2**J + 1) * 2**J - H  # one coefficient each side
        self.pad_w = ((W + 2**J) // 2**J + 1) * 2**J - W
        M, N = H + self.pad_h, W + self.pad_w
        psi = []
        for j in range(J):
            for t in range(L):
                theta = (int(L - L / 2 - 1) - t) * math.pi / L
                wave = _morlet(M, N, 0.8 * 2**j, theta, 0.75 * math.pi / 2**j, 4.0 / L)
                psi.append(torch.fft.fft2(wave).real)
        phi = torch.fft.fft2(_gabor(M, N, 0.8 * 2 ** (J - 1), 0.0, 0.0)).real
        self.register_buffer("psi", torch.stack(psi).float(), persistent=False)  # (JL, M, N)
        for r in range(J):
            self.register_buffer(f"phi_{r}", _low_band(phi, r).float(), persistent=False)
        self.channels = scattering_channels(J, L)

    def _phi(self, res: int) -> torch.Tensor:
        return getattr(self, f"phi_{res}")

    def _lowpass(self, uf: torch.Tensor, res: int) -> torch.Tensor:
        """Real part of (u ⋆ φ_J) subsampled to scale 2^J, from u's transform at scale 2^res."""
        sf = _subsample(uf * self._phi(res), 2 ** (self.J - res))
        return torch.fft.ifft2(sf).real[..., 1:-1, 1:-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        if (H, W) != self.shape:
            raise ValueError(f"x must be images of shape {self.shape}, got {(H, W)}")
        top, left = self.pad_h // 2, self.pad_w // 2
        x = nn.functional.pad(
            x.reshape(B * C, 1, H, W),
            (left, self.pad_w - left, top, self.pad_h - top),
            mode="reflect",
        )[:, 0]  # (BC, M, N)
        xf = torch.fft.fft2(x.to(self.psi.dtype))
        zeroth = self._lowpass(xf, 0)
        first: list[torch.Tensor] = []
        second: list[torch.Tensor] = []
        L, J = self.L, self.J
        for j1 in range(J):
            u1f = _subsample(xf[:, None] * self.psi[j1 * L : (j1 + 1) * L], 2**j1)  # (BC, L, ..)
            u1f = torch.fft.fft2(torch.fft.ifft2(u1f).abs())
            first.append(self._lowpass(u1f, j1))
            for j2 in range(j1 + 1, J):
                psi2 = _low_band_stack(self.psi[j2 * L : (j2 + 1) * L], j1)  # (L, m, n)
                u2f = _subsample(u1f[:, :, None] * psi2, 2 ** (j2 - j1))  # (BC, L, L, ..)
                u2f = torch.fft.fft2(torch.fft.ifft2(u2f).abs())
                second.append(self._lowpass(u2f, j2).flatten(1, 2))
        out = torch.cat([zeroth[:, None], *first, *second], dim=1)  # (BC, K, h, w)
        return out.reshape(B, C * self.channels, *out.shape[-2:])


def _low_band_stack(filters: torch.Tensor, res: int) -> torch.Tensor:
    """:func:`_low_band` of each filter of an (F, M, N) stack."""
    return torch.stack([_low_band(f, res) for f in filters])
