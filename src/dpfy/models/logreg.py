"""Multinomial logistic regression: one linear layer on flattened inputs (a convex baseline)."""

from __future__ import annotations

import math

from torch import nn

__all__ = ["logreg"]


def logreg(input_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    """Flatten → Linear(d, classes); trained with cross-entropy this is softmax regression."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))
