"""Per-unit norms as the step sees them, and a clipping: weights with their sensitivity."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from dpfy._renamed import renamed_attribute
from dpfy._require import require

__all__ = ["Norms", "Clip"]


@dataclass(frozen=True)
class Norms:
    """Per-example gradient norms of one physical batch. Sensitive: never leaves the step.

    ``per_parameter`` maps each trainable parameter name to ‖∂ℓ_i/∂θ_k‖² (B,);
    ``total`` is ‖∂ℓ_i/∂θ‖ (B,); ``clip_groups`` lists the parameter names of each clipping
    group (one per layer: per-layer thresholds clip each to its own C_k), not to be confused
    with the privacy groups of individualized budgets (``DPOptimizer.privacy_groups``).
    """

    total: torch.Tensor  # (B,) sensitive
    per_parameter_sq: Mapping[str, torch.Tensor]  # name -> (B,) sensitive
    clip_groups: tuple[tuple[str, ...], ...]
    indices: torch.Tensor | None = None  # (B,) dataset indices, public

    groups = renamed_attribute("Norms.groups", "clip_groups", "Norms.clip_groups")

    def per_group(self) -> torch.Tensor:
        """‖g_ik‖ for each group k, (B, K). Sensitive."""
        cols = [
            torch.sqrt(
                sum((self.per_parameter_sq[n] for n in g[1:]), start=self.per_parameter_sq[g[0]])
            )
            for g in self.clip_groups
        ]
        return torch.stack(cols, dim=1) if cols else self.total.new_zeros(len(self.total), 0)


@dataclass(frozen=True)
class Clip:
    """A method's clipping: per-example weights and the sensitivity they guarantee.

    ``weights`` is (B,) (one weight per example for all parameters) or {parameter name: (B,)}.
    ``sensitivity`` is Δ: the step asserts ‖Σ_k w_ik g_ik‖ ≤ Δ for every example i and adds
    noise N(0, (σ·Δ)²) to the weighted sum.
    """

    weights: torch.Tensor | Mapping[str, torch.Tensor]  # sensitive
    sensitivity: float

    def __post_init__(self) -> None:
        require(self.sensitivity > 0, "Clip.sensitivity", self.sensitivity, "> 0")
