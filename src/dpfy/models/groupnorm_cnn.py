"""A small CNN with GroupNorm: normalization that DP-SGD allows.

BatchNorm mixes examples within a batch, so per-example gradients (and the DP guarantee) are
not defined; GroupNorm normalizes each example on its own (Wu & He 2018) and is the usual
substitute in DP training (e.g. Tramèr & Boneh 2021, De et al. 2022).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["groupnorm_cnn"]

GROUPS = 4


def _block(c_in: int, c_out: int) -> list[nn.Module]:
    return [
        nn.Conv2d(c_in, c_out, 3, padding=1),
        nn.GroupNorm(GROUPS, c_out),
        nn.Tanh(),
        nn.AvgPool2d(2),
    ]


def groupnorm_cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    """Two conv(3×3) → GroupNorm(4) → tanh → avgpool(2) blocks (16, 32 channels), then linear."""
    features = nn.Sequential(*_block(input_shape[0], 16), *_block(16, 32), nn.Flatten())
    with torch.no_grad():
        flat = features(torch.zeros(1, *input_shape)).shape[1]  # 32·7·7 for (1, 28, 28)
    return nn.Sequential(*features, nn.Linear(flat, num_classes))
