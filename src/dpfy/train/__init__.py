"""Private training runs: configuration, the training loop, outputs and resume.

``train(TrainConfig(...), out="runs/x")`` or ``dpfy train --out runs/x``.

The names load on first use (PEP 562, :func:`dpfy._lazy.lazy_attributes`): ``dpfy train
--help`` reads :class:`TrainConfig`'s fields without importing the training loop (torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpfy._lazy import by_module, lazy_attributes

__all__ = ["TrainConfig", "TrainResult", "load_config_file", "train", "resume"]

_LAZY = by_module(
    {
        "dpfy.train.config": ("TrainConfig", "load_config_file"),
        "dpfy.train.trainer": ("TrainResult", "train", "resume"),
    }
)

if TYPE_CHECKING:
    from dpfy.train.config import TrainConfig, load_config_file
    from dpfy.train.trainer import TrainResult, resume, train

__getattr__, __dir__ = lazy_attributes("dpfy.train", _LAZY, globals())
