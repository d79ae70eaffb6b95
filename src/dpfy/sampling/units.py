"""The unit of privacy: which rows of a batch belong to one protected unit.

Differential privacy protects a *unit*: adding or removing one unit changes a release by at
most the clipping threshold. Today a unit is one example (one row); the seam is here so that
a user (all of their rows: user-level DP) or an example's augmented copies can be one unit.

A sampler holds its units (``sampler.units``) and says, for the dataset indices of a physical
batch, which unit each row belongs to (:meth:`ExampleUnits.units_of`): ``None`` when every row
is its own unit, else a (B,) tensor of unit positions 0..U−1. The private step then asks the
gradient engine for per-unit norms ‖Σ_{i∈u} g_i‖, clips per unit, and forms the weighted sum
with row weights w_{u(i)}; the report states the unit (:attr:`ExampleUnits.description`).
"""

from __future__ import annotations

import torch

__all__ = ["ExampleUnits"]


class ExampleUnits:
    """Each example (one row of the training set) is one unit of privacy."""

    name = "example"
    description = "one example"   # the privacy report's wording
    adjacency_note = "add or remove one example"

    def units_of(self, indices: torch.Tensor | None) -> torch.Tensor | None:
        """Every row is its own unit: None (the step's per-row fast path)."""
        return None
