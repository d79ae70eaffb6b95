"""A small CNN with BatchNorm, for the BatchNorm options of DP training (docs/guide/batchnorm.md).

Two stride-2 3×3 convolutions (16 and 32 channels), each followed by BatchNorm and ReLU, then
global average pooling and a linear layer: the model of ``experiments/batchnorm``. Its
BatchNorms are refused by the private engine as they are (they mix the examples of a batch);
train it with ``--batchnorm public`` or ``--batchnorm privatized``, or swap them for GroupNorm
(``dpfy.validate(model, fix=True)``).
"""

from __future__ import annotations

from torch import nn

__all__ = ["batchnorm_cnn"]


def batchnorm_cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    """conv(3×3, stride 2) → BatchNorm → ReLU, twice (16, 32 channels) → avgpool → linear."""
    return nn.Sequential(
        nn.Conv2d(input_shape[0], 16, 3, stride=2, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, num_classes),
    )
