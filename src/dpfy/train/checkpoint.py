"""Checkpoints: everything needed to continue a run exactly where it stopped.

A checkpoint holds the resolved config, the number of finished epochs, the model, the private
optimizer's state (which the engine defines to include the ledger, the sampler's and the
noise's RNG state and any schedule state), the metrics so far and torch's global RNG state.
It is written once per epoch, atomically, so an interrupted run always has a whole one.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dpfy.train.rundir import write_atomic

__all__ = ["Checkpoint", "FORMAT"]

FORMAT = "dpfy-train-checkpoint/1"


@dataclass(frozen=True)
class Checkpoint:
    """The state at the end of epoch ``epoch`` (1-based count of finished epochs)."""

    config: dict[str, Any]
    notes: dict[str, Any]               # e.g. how δ was chosen, for the report
    epoch: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    metrics: list[dict[str, Any]]
    torch_rng: torch.Tensor

    def save(self, path: Path) -> None:
        buf = io.BytesIO()
        torch.save({"format": FORMAT, **self.__dict__}, buf)
        write_atomic(path, buf.getvalue())

    @classmethod
    def load(cls, path: Path) -> "Checkpoint":
        try:
            # weights_only=False: the engine's state holds ledger records and RNG states; the
            # file is one this user's own earlier run wrote.
            raw = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as e:
            raise ValueError(f"checkpoint must be readable, got '{path}' ({e}). The file is "
                             f"damaged; start a new run with --out") from None
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise ValueError(f"checkpoint must have format '{FORMAT}', got '{path}' without it. "
                             f"Point --resume at a directory written by dpfy train")
        raw.pop("format")
        return cls(**raw)
