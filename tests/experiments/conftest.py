"""Shared fixtures of the experiment-harness tests."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset


@pytest.fixture(scope="session")
def tiny_images():
    """A factory: (train, test) of random 1×28×28 images and 10-class labels, n train and 32
    test rows, the same draws every call (stands in for Fashion-MNIST)."""
    def make(n: int) -> tuple[TensorDataset, TensorDataset]:
        g = torch.Generator().manual_seed(0)
        return (TensorDataset(torch.randn(n, 1, 28, 28, generator=g),
                              torch.randint(0, 10, (n,), generator=g)),
                TensorDataset(torch.randn(32, 1, 28, 28, generator=g),
                              torch.randint(0, 10, (32,), generator=g)))
    return make
