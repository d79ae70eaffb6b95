"""A one-hidden-layer tanh MLP on flattened inputs."""

from __future__ import annotations

import math

from torch import nn

__all__ = ["mlp"]

HIDDEN = 128  # small: DP noise grows with the number of parameters


def mlp(input_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    """Flatten → Linear(d, 128) → tanh → Linear(128, classes)."""
    d = math.prod(input_shape)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(d, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, num_classes)
    )
