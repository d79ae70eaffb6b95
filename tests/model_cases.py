"""Small models and data for the engine tests (a plain module: `conftest` names collide)."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpfy.models import build_model
from dpfy.models.tiny_encoder import TinyEncoder


def tanh_cnn() -> nn.Module:
    """Tramèr & Boneh's CNN (the benchmark model), 28×28 inputs."""
    return build_model("tanh_cnn", input_shape=(1, 28, 28), num_classes=10)


def mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 16), nn.ReLU(), nn.Linear(16, 10))


def encoder() -> nn.Module:
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


def loader(ds, batch_size: int = 8) -> DataLoader:
    return DataLoader(ds, batch_size=batch_size)
