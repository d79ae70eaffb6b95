"""The grid of ``dpfy tune``: which hyperparameters a grid may vary, and its configurations.

:func:`dpfy.train.grid.run_grid` trains every configuration :func:`configurations` builds; a
gridded value never changes a run's ledger shape (q, steps, σ), so the k runs of a grid are k
copies of one calibrated ledger (:data:`GRIDDABLE`).
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Any, Sequence

from dpfy._require import require
from dpfy.privacy.tuning import log_grid
from dpfy.train.config import TrainConfig
from dpfy.train.options import parse_scalar

__all__ = ["GRIDDABLE", "GridAxis", "GridRun", "parse_axis", "configurations"]

# TrainConfig fields a grid may vary: they change what a run computes, never its ledger's shape
# (q, steps, σ), so k runs are k copies of one calibrated ledger. Method options are
# ``method.KEY`` (one method) or ``NAME.KEY`` (one method of a chain).
GRIDDABLE = ("lr", "clip", "momentum", "weight_decay")


@dataclass(frozen=True)
class GridAxis:
    """One gridded hyperparameter: a TrainConfig field or a method option, and its values."""

    name: str
    values: tuple[Any, ...]

    def __post_init__(self) -> None:
        require(
            self.name in GRIDDABLE or "." in self.name,
            "grid name",
            self.name,
            f"one of {list(GRIDDABLE)} or a method option METHOD.KEY",
            "Batch size, epochs and σ fix the ledger of every run and are not gridded",
        )
        require(len(self.values) >= 1, "grid values", self.values, "at least one value")


def parse_axis(text: str) -> GridAxis:
    """``"lr=logspace:-2.5:1.5:7"`` (``np.logspace`` endpoints included, as Galli et al. 2024) or
    ``"clip=0.1,1,10"``, or ``"oso.rule=sign,additive"`` (a method option)."""
    name, sep, spec = text.partition("=")
    require(
        bool(sep and name and spec),
        "grid",
        text,
        "NAME=logspace:LO:HI:K or NAME=V1,V2,...",
        "Write e.g. --grid lr=logspace:-2.5:1.5:7",
    )
    if spec.startswith("logspace:"):
        parts = spec.split(":")[1:]
        require(len(parts) == 3, "grid", text, "NAME=logspace:LO:HI:K (exponents of 10, K values)")
        try:
            lo, hi, num = float(parts[0]), float(parts[1]), int(parts[2])
        except ValueError:
            raise ValueError(
                f"grid must be NAME=logspace:LO:HI:K with numbers, got grid = "
                f"{text!r}. Write e.g. lr=logspace:-2.5:1.5:7"
            ) from None
        return GridAxis(name, tuple(float(v) for v in log_grid(lo, hi, num)))
    return GridAxis(name, tuple(parse_scalar(v) for v in spec.split(",") if v != ""))


def _with(cfg: TrainConfig, name: str, value: Any) -> TrainConfig:
    """``cfg`` with one gridded value set (a field, or a method option)."""
    if "." not in name:
        change: dict[str, Any] = {name: float(value)}
        return dataclasses.replace(cfg, **change)
    require(
        cfg.method is not None,
        "grid",
        name,
        "a method option only with --method",
        "Add --method NAME",
    )
    target, _, key = name.partition(".")
    options = dict(cfg.method_options or {})
    options[key if target == "method" else name] = value
    return dataclasses.replace(cfg, method_options=options)


def configurations(base: TrainConfig, axes: Sequence[GridAxis]) -> list[tuple[dict, TrainConfig]]:
    """Every combination of the axes' values (first axis slowest), as (settings, config)."""
    require(len(axes) >= 1, "grid", [], "at least one axis", "Add --grid NAME=...")
    names = [a.name for a in axes]
    require(len(set(names)) == len(names), "grid", names, "distinct names")
    out = []
    for combo in itertools.product(*(a.values for a in axes)):
        cfg = base
        for name, value in zip(names, combo):
            cfg = _with(cfg, name, value)
        out.append((dict(zip(names, combo)), cfg))
    return out


@dataclass(frozen=True)
class GridRun:
    """One configuration of the grid and what it achieved (metric on the validation data)."""

    index: int
    settings: dict
    metric: float
    epsilon: float  # this run's own ε (its ledger alone)
