"""DP-FTRL's tree aggregation (Kairouz et al. 2021), released as noisy-prefix-sum residuals.

The honest binary tree over the steps of one pass: node [s, t] (a dyadic interval) holds the
sum of the gradient sums of steps s..t plus N(0, (σΔ)²). The noisy prefix sum after step t
(1-based within the tree) adds the nodes of t's binary decomposition, so its noise is the sum of
popcount(t) independent node noises. A node is drawn once, when it completes and is first
used, and never redrawn.

The step releases the *residual* of consecutive noisy prefix sums, S_t + σΔ·(N_t − N_{t−1})
(N_t: the prefix noise), so any optimizer can step on it; with plain SGD at a constant learning
rate the iterate is θ_t = θ_0 − η·(noisy prefix sum of the clipped gradient sums)/b, the
paper's DP-FTRL model, and momentum (heavy ball on the residuals) is the paper's DP-FTRLM.
Going from t − 1 to t, the k = trailing-zeros(t) lowest nodes of t − 1 leave the decomposition
and one node of level k enters, so N_t − N_{t−1} = z_new − Σ(those k nodes): the mechanism keeps
the nodes of the current decomposition, **at most ⌈log2(P + 1)⌉ vectors of the trainable
parameters' size** for a tree of P leaves.

The tree restarts at every pass of the shuffled sampler (``period`` P = its steps per pass), so
an example takes part at most once per tree; the accounting is in :mod:`dpfy.privacy.correlated`
(each tree: one Gaussian at σ/√depth, depth = ⌈log2(P + 1)⌉; dp_accounting's
``SingleEpochTreeAggregationDpEvent``). This is the honest tree, not the "tree completion"
variant.
"""

from __future__ import annotations

from typing import Any, Unpack

import torch

from dpfy._require import require
from dpfy.noise.correlated import CorrelatedArgs, CorrelatedMechanism
from dpfy.noise.generator import NoiseSource
from dpfy.types import Sampling

__all__ = ["TreeMechanism", "trailing_zeros"]


def trailing_zeros(t: int) -> int:
    """The number of trailing zero bits of t ≥ 1 (the level of the node that completes at t)."""
    return (t & -t).bit_length() - 1


class TreeMechanism(CorrelatedMechanism):
    """Tree aggregation with a restart every ``period`` steps (one shuffled pass).

    Args:
      source: the node noises (secure by default, or seeded).
      period: P, steps per tree (the sampler's steps per pass).
      noise_multiplier: σ per tree node; sample_rate, sampler_position: see
        :class:`CorrelatedMechanism` (the position is the batch's index within its pass).
    """

    name = "tree"
    samplings: tuple[Sampling, ...] = (Sampling.SHUFFLE,)

    def __init__(
        self,
        source: NoiseSource,
        *,
        period: int,
        **stream: Unpack[CorrelatedArgs],
    ) -> None:
        require(isinstance(period, int) and period >= 1, "period", period, "an integer >= 1")
        super().__init__(source, sampling=Sampling.SHUFFLE, **stream)
        self._period = period
        self.levels: list[list[int]] = []  # per slot: the levels of its buffered nodes

    @property
    def period(self) -> int:
        return self._period

    def expected_position(self) -> int:
        """The batch's index within its pass (the leaf's index within the tree, 0-based)."""
        return self.position % self._period

    def memory_vectors(self) -> int:
        """Most node vectors buffered per parameter: ⌈log2(P + 1)⌉."""
        return self._period.bit_length()

    def _start_step(self) -> None:
        if self.position % self._period == 0:  # a new tree: the prefix starts from zero
            self.buffers, self.levels = [], []

    def _next_unit(self, slot: int, like: torch.Tensor) -> torch.Tensor:
        """N_t − N_{t−1} of parameter ``slot``: the new node minus the nodes it replaces."""
        nodes = self._slot_buffers(slot)  # lowest level last
        if slot == len(self.levels):
            self.levels.append([])
        levels = self.levels[slot]
        leaf = (self.position - 1) % self._period + 1  # t, 1-based (position already moved)
        level = trailing_zeros(leaf)
        node = self._fresh(like)
        x = node.clone()
        for _ in range(level):  # the k lowest nodes of t − 1
            require(
                bool(levels) and levels[-1] < level,
                "tree state",
                levels,
                f"nodes below level {level}",
                "Resume from an unmodified checkpoint",
            )
            x.sub_(nodes.pop())
            levels.pop()
        nodes.append(node)
        levels.append(level)
        return x

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "levels": [list(lvl) for lvl in self.levels],
            "period": self._period,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        require(
            state.get("period") == self._period,
            "the checkpoint's tree period",
            state.get("period"),
            f"{self._period} (this run's steps per pass)",
            "Resume with the same dataset size and batch size",
        )
        super().load_state_dict(state)
        self.levels = [list(lvl) for lvl in state["levels"]]
