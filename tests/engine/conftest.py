"""Shared fixtures for the engine tests: the float64 oracle and small models."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

ROOT = Path(__file__).resolve().parents[2]
for p in (ROOT / "tests", ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))


def tanh_cnn() -> nn.Module:
    """Tramèr & Boneh's CNN (the benchmark model), 28×28 inputs."""
    from dpfy.models import build_model
    return build_model("tanh_cnn", input_shape=(1, 28, 28), num_classes=10)


def mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 16), nn.ReLU(), nn.Linear(16, 10))


def encoder() -> nn.Module:
    from tiny_encoder import TinyEncoder
    return TinyEncoder(vocab=50, seq_len=6, d=8, heads=2, layers=1, ffn=12, classes=4)


MODELS = {
    # name: (factory, input maker(B, generator), classes)
    "cnn": (tanh_cnn, lambda b, g: torch.randn(b, 1, 28, 28, generator=g), 10),
    "mlp": (mlp, lambda b, g: torch.randn(b, 1, 28, 28, generator=g), 10),
    "encoder": (encoder, lambda b, g: torch.randint(0, 50, (b, 6), generator=g), 4),
}


def make_data(name: str, n: int, seed: int = 0) -> TensorDataset:
    _, make_x, classes = MODELS[name]
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(make_x(n, g), torch.randint(0, classes, (n,), generator=g))


def make_model(name: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return MODELS[name][0]()


@pytest.fixture
def toy():
    """A tiny regression-free classification set and MLP (fast end-to-end tests)."""
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(64, 5, generator=g), torch.randint(0, 3, (64,), generator=g))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    return model, ds


def loader(ds, batch_size: int = 8) -> DataLoader:
    return DataLoader(ds, batch_size=batch_size)
