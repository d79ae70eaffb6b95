"""Models by name, each built for a dataset's input shape and number of classes.

``build_model(name, input_shape=..., num_classes=...)``. Image models need inputs (C, H, W);
the error says which model to use instead for vector data.
"""

from __future__ import annotations

from typing import Callable

from torch import nn

from dpfy._require import require
from dpfy.models.batchnorm_cnn import batchnorm_cnn
from dpfy.models.groupnorm_cnn import groupnorm_cnn
from dpfy.models.logreg import logreg
from dpfy.models.mlp import mlp
from dpfy.models.scatter_linear import scatter_linear
from dpfy.models.tanh_cnn import tanh_cnn

__all__ = ["MODELS", "IMAGE_MODELS", "build_model"]

MODELS: dict[str, Callable[[tuple[int, ...], int], nn.Module]] = {
    "tanh_cnn": tanh_cnn,
    "groupnorm_cnn": groupnorm_cnn,
    "batchnorm_cnn": batchnorm_cnn,  # with --batchnorm public|privatized
    "mlp": mlp,
    "logreg": logreg,
    "scatter_linear": scatter_linear,  # on --dataset fashion_mnist_scattering
}
# name -> smallest (H, W) the architecture accepts
IMAGE_MODELS = {"tanh_cnn": 14, "groupnorm_cnn": 4, "batchnorm_cnn": 4}


def build_model(name: str, *, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """A freshly initialized model (initialization uses torch's global RNG: seed it first)."""
    require(name in MODELS, "model", name, f"one of {sorted(MODELS)}", "Pick a listed name")
    if name in IMAGE_MODELS:
        side = IMAGE_MODELS[name]
        require(
            len(input_shape) == 3 and min(input_shape[1:]) >= side,
            "input_shape",
            tuple(input_shape),
            f"(C, H, W) with H, W >= {side} for model '{name}'",
            "Use --model mlp or --model logreg for this dataset",
        )
    return MODELS[name](tuple(input_shape), num_classes)
