"""Per-epoch metrics, written as CSV (for spreadsheets) and JSON (for programs).

Columns ending in ``_nonprivate`` are computed from raw training examples (the training loss
and accuracy of the Poisson batches); they are diagnostics for the person training, are not
covered by the DP guarantee, and never feed back into training (CONTRIBUTING.md, privacy rule 4).
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpfy.train.rundir import write_atomic

__all__ = ["MetricsLog", "COLUMNS", "EMA_COLUMNS"]

COLUMNS = (
    "epoch",
    "step",
    "epsilon",
    "noise_multiplier",
    "clip",
    "lr",
    "train_loss_nonprivate",
    "train_acc_nonprivate",
    "test_loss",
    "test_acc",
    "wall_time_s",
)
# Present only in runs with parameter averaging (dpfy train --ema): the averaged model's
# test metrics (dpfy.train.averaging).
EMA_COLUMNS = ("test_loss_ema", "test_acc_ema")


@dataclass
class MetricsLog:
    """An append-only list of epoch rows with the :data:`COLUMNS` keys."""

    rows: list[dict[str, Any]] = field(default_factory=list)

    def append(self, **row: Any) -> None:
        missing = set(COLUMNS) - set(row)
        if missing:
            raise KeyError(f"metrics row is missing {sorted(missing)}")
        self.rows.append({k: row[k] for k in COLUMNS + EMA_COLUMNS if k in row})

    def last(self) -> dict[str, Any]:
        return self.rows[-1]

    def to_csv(self) -> str:
        buf = io.StringIO()
        extra = tuple(k for k in EMA_COLUMNS if self.rows and k in self.rows[0])
        writer = csv.DictWriter(buf, fieldnames=COLUMNS + extra, lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows)
        return buf.getvalue()

    def write(self, directory: Path) -> None:
        write_atomic(directory / "metrics.csv", self.to_csv())
        write_atomic(directory / "metrics.json", json.dumps(self.rows, indent=2))
