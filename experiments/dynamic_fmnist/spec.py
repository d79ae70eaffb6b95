"""What one reproduction run is: a frozen, JSON-able spec (configuration is a frozen dataclass).

Everything that decides a run's result is a field here, so a results file names its own
settings and a finished run can be recognized (and skipped) when a grid is resumed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from dpfy._require import require
from dpfy.privacy.accountants import RIGOROUS

__all__ = ["RunSpec", "FMNIST_DELTA", "CALIBRATIONS"]

# How a spec's schedule is calibrated to its ε: a rigorous accountant, or "gdp", the explicit
# opt-in to the paper's Gaussian-DP CLT (an approximation; the record still gives the PLD ε).
CALIBRATIONS = (*RIGOROUS, "gdp")

# Dynamic DP-SGD (anonymous submission, under review), §5.1: δ = 1/(10|X|) with |X| = 60,000
# Fashion-MNIST training images.
FMNIST_DELTA = 1 / 600000


@dataclass(frozen=True)
class RunSpec:
    """One training run on Fashion-MNIST.

    Args:
      experiment: which table the run belongs to (``dynamic-fmnist`` / ``noise-decay-fmnist``).
      schedule: a Dynamic DP-SGD preset (``dpfy.adaptive.dynamic.PRESETS``: method ``dynamic``)
        or a noise-decay rule (``dpfy.adaptive.schedules.KINDS``: method ``noise_decay``).
      target_epsilon: the run's budget at ``delta``; every schedule is calibrated to spend it.
      seed: fixes model init, Poisson sampling and noise.
      epochs: passes over the data; total steps = epochs × the Poisson loader's logical
        batches per pass (``len(loader)``, ⌈N/b⌉).
      options: schedule options (e.g. ρ_μ, ρ_c, decay rate), as sorted (key, value) pairs.
      calibration: accountant that solves the schedule's scale: ``pld`` or ``rdp`` (rigorous;
        the run is then also capped at ``target_epsilon``), or ``gdp``, the paper's CLT (an
        approximation that can under-report ε: the run spends more than ``target_epsilon``
        by PLD, and its record says how much).
    """

    experiment: str
    schedule: str
    target_epsilon: float
    seed: int
    epochs: int = 3
    expected_batch: int = 256           # q = expected_batch / N (Bu et al. 2020: 256)
    model: str = "tanh_cnn"
    lr: float = 0.1
    momentum: float = 0.9
    max_grad_norm: float = 1.0
    delta: float = FMNIST_DELTA
    calibration: str = "pld"
    options: tuple[tuple[str, Any], ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        require(self.epochs >= 1, "epochs", self.epochs, ">= 1")
        require(self.target_epsilon > 0, "target_epsilon", self.target_epsilon, "> 0")
        require(self.calibration in CALIBRATIONS, "calibration", self.calibration,
                f"one of {list(CALIBRATIONS)}")

    def key(self) -> str:
        """A stable id of the settings (for resuming a grid)."""
        text = json.dumps(self.to_dict(), sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()[:12]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["options"] = dict(self.options)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunSpec":
        return cls(**{**d, "options": tuple(sorted(d.get("options", {}).items()))})
