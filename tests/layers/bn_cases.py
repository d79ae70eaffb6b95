"""The BatchNorm test model and private-run set-up shared by the BatchNorm layer tests
(test_privatized_batchnorm.py, test_batchnorm_keywords.py, test_public_batchnorm.py)."""

from __future__ import annotations

import warnings

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy


def bn_cnn() -> nn.Module:
    """conv → BatchNorm2d (layer 1) → ReLU → linear → BatchNorm1d (layer 5) → tanh → linear,
    for 1×6×6 inputs and 3 classes."""
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 6 * 6, 8),
        nn.BatchNorm1d(8),
        nn.Tanh(),
        nn.Linear(8, 3),
    )


def make_private_quiet(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, batch_size=20, **kw):
    """``dpfy.make_private`` of ``model`` with SGD (lr 0.1) on batches of (x, y), the seed
    warning silenced; returns what make_private returns."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(x, y), batch_size=batch_size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the seed warning
        return dpfy.make_private(model, opt, loader, **kw)


def train(model: nn.Module, opt, loader, epochs: int = 1) -> None:
    """``epochs`` passes of cross-entropy steps over ``loader``."""
    for _ in range(epochs):
        for xb, yb in loader:
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
            opt.zero_grad()
