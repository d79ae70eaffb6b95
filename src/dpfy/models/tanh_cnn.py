"""The end-to-end CNN of Tramèr & Boneh (ICLR 2021), about 26k parameters on 28×28 inputs.

Conv(16, 8×8, stride 2, pad 3) → tanh → MaxPool(2, stride 1) → Conv(32, 4×4, stride 2) → tanh →
MaxPool(2, stride 1) → Linear(→32) → tanh → Linear(32 → classes). tanh rather than ReLU because
bounded activations keep per-example gradient norms small and stable under clipping (their §3).
The flattened size is 512 for 28×28 inputs; it is computed for other image sizes.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["tanh_cnn"]


def _features(channels: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(channels, 16, 8, stride=2, padding=3),
        nn.Tanh(),
        nn.MaxPool2d(2, 1),
        nn.Conv2d(16, 32, 4, stride=2),
        nn.Tanh(),
        nn.MaxPool2d(2, 1),
        nn.Flatten(),
    )


def tanh_cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    """Tramèr & Boneh's tanh CNN for images of shape (C, H, W), H, W ≥ 14."""
    features = _features(input_shape[0])
    with torch.no_grad():
        flat = features(torch.zeros(1, *input_shape)).shape[1]  # 512 for (1, 28, 28)
    return nn.Sequential(*features, nn.Linear(flat, 32), nn.Tanh(), nn.Linear(32, num_classes))
