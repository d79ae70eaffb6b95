"""Tramèr & Boneh's ScatterNet + linear model, on precomputed scattering features.

Input: (81, 7, 7) scattering coefficients of a 28×28 image (``--dataset
fashion_mnist_scattering``, computed once and cached), or the images themselves, which a fixed
:class:`~dpfy.models.scattering.Scattering2D` front end then transforms at every forward (the
same model, slower). The features are normalized per example by a GroupNorm without
learned parameters (27 groups of 3 channels): each example by its own statistics, so the
normalization reads no other example and needs no privacy budget (Tramèr & Boneh 2021, §3,
normalize either this way or with privately estimated dataset statistics, which cost ε; dpfy
does the former). Then one linear layer: the only trained parameters.
"""

from __future__ import annotations

from torch import nn

from dpfy._require import require
from dpfy.models.scattering import Scattering2D, scattering_channels

__all__ = ["scatter_linear", "GROUPS"]

GROUPS = 27


def scatter_linear(input_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    """[Scattering2D(J=2, L=8) for images] → GroupNorm(27, affine=False) → Flatten → Linear."""
    require(
        len(input_shape) == 3,
        "input_shape",
        tuple(input_shape),
        "(C, H, W): scattering features (C a multiple of 81) or images (H, W divisible by 4)",
        "Use --dataset fashion_mnist_scattering with --model scatter_linear",
    )
    front: list[nn.Module] = []
    channels, h, w = input_shape
    k = scattering_channels(2, 8)
    if channels % k:  # images: transform them first
        require(
            h % 4 == 0 and w % 4 == 0,
            "input_shape",
            tuple(input_shape),
            "images with H and W divisible by 4 (J = 2)",
            "Crop or pad the images",
        )
        front = [Scattering2D((h, w), J=2, L=8)]
        channels, h, w = channels * k, h // 4, w // 4
    return nn.Sequential(
        *front,
        nn.GroupNorm(GROUPS, channels, affine=False),
        nn.Flatten(),
        nn.Linear(channels * h * w, num_classes),
    )
