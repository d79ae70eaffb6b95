"""Ghost norms per privacy unit: a unit's rows packed into one longer sequence.

For a position-additive layer (``LayerRule.position_tails``: Linear, Embedding and the layers
built on them) example i's gradient is a sum over its positions, G_i = Σ_t φ(a_it, g_it). A
privacy unit u (a user's examples, an example's augmented copies) contributes
Σ_{i∈u} G_i = Σ_{(i,t): i∈u} φ(a_it, g_it): the gradient of *one* example whose positions are
all of the unit's rows' positions. So the rule's own ghost norm on the packed input gives
‖Σ_{i∈u} G_i‖² without forming any per-sample or per-unit gradient, from the same inner
products as the per-row ghost norm (Li et al. 2022), with the unit's positions in place of one
row's. Padding positions are zero in both the input and the output gradient, so they add
nothing to φ (for ids, id 0 with a zero gradient adds nothing either).

Packing costs memory U·m·T·features for U units of at most m rows of T positions; the ghost
norm's cost grows as (m·T)². The caller decides with the rule's own size test
(``prefers_ghost`` on the packed shapes) and falls back to per-sample gradients summed per unit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["UnitPacking"]


@dataclass(frozen=True)
class UnitPacking:
    """Where each row of a batch goes when its unit's rows are packed into one sequence.

    ``unit`` and ``slot`` are (B,) int64: row i becomes slot ``slot[i]`` (0..m−1) of unit
    ``unit[i]``; ``m`` is the largest number of rows a unit has in the batch.
    """

    unit: torch.Tensor
    slot: torch.Tensor
    num_units: int
    m: int

    @classmethod
    def of(cls, unit_of_row: torch.Tensor, num_units: int) -> UnitPacking:
        """The packing of rows with privacy units ``unit_of_row`` (B,) in [0, num_units)."""
        unit = unit_of_row.long()
        b = unit.shape[0]
        order = torch.argsort(unit, stable=True)
        counts = torch.bincount(unit, minlength=num_units)
        starts = torch.cumsum(counts, 0) - counts  # first sorted position of each unit
        slot = torch.empty_like(unit)
        slot[order] = torch.arange(b, device=unit.device) - starts[unit[order]]
        m = int(counts.max()) if b else 0
        return cls(unit=unit, slot=slot, num_units=num_units, m=m)

    def padded_rows(self) -> int:
        """U·m: the rows of the packed batch, padding included."""
        return self.num_units * self.m

    def pack(self, x: torch.Tensor, tail: int) -> torch.Tensor:
        """(B, *positions, *features) → (U, m·T, *features), T = the positions' count.

        ``tail`` is the number of trailing feature dims; the dims between the batch and them
        are positions (none: T = 1). Padding is zero.
        """
        b = x.shape[0]
        feats = tuple(x.shape[x.dim() - tail :]) if tail else ()
        rows = x.reshape(b, -1, *feats)  # (B, T, *features)
        t = rows.shape[1]
        out = rows.new_zeros((self.num_units, self.m) + tuple(rows.shape[1:]))
        out[self.unit, self.slot] = rows  # sensitive
        return out.reshape(self.num_units, self.m * t, *feats)
