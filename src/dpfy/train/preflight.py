"""The refusals ``dpfy train`` and ``dpfy audit`` make before anything runs: a dataset or model
name that is not listed (or not the one passed in), and a fixed σ the PLD accountant cannot
read in bounded time."""

from __future__ import annotations

from torch import nn

from dpfy._require import require
from dpfy.data import DATASETS, DataSplits
from dpfy.models import MODELS
from dpfy.privacy.accountants import PLD_FINE, pld_min_noise_multiplier
from dpfy.train.config import TrainConfig

__all__ = ["check_names", "check_accountable"]


def check_names(cfg: TrainConfig, data: DataSplits | None, model: nn.Module | None) -> None:
    """Refuse a dataset or model name that is not listed (or not the ``data`` passed in)."""
    if data is None:
        require(
            cfg.dataset in DATASETS,
            "dataset",
            cfg.dataset,
            f"one of {sorted(DATASETS)}",
            "Pick a listed name, or pass your own DataSplits through the Python API",
        )
    else:
        require(
            cfg.dataset == data.name,
            "dataset",
            cfg.dataset,
            f"'{data.name}' (the name of the DataSplits passed in)",
            "Set TrainConfig(dataset=data.name)",
        )
    if model is None:
        require(
            cfg.model in MODELS,
            "model",
            cfg.model,
            f"one of {sorted(MODELS)}",
            "Pick a listed name, or pass your own nn.Module through the Python API",
        )


def check_accountable(cfg: TrainConfig) -> None:
    """Refuse a fixed σ the accountant cannot read in bounded time, before anything runs.

    (A target ε is bounded by the calibration itself: ``dpfy.privacy.calibration``.)
    """
    if cfg.noise_multiplier is not None and cfg.accountant == "pld":
        floor = pld_min_noise_multiplier(PLD_FINE)
        require(
            cfg.noise_multiplier >= floor,
            "noise_multiplier",
            cfg.noise_multiplier,
            f">= {floor:.3g} with the PLD accountant (its grid would not fit in memory)",
            "Raise --noise-multiplier, or account with --accountant rdp",
        )
