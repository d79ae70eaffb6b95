"""The adaptive-method interface (STYLE.md §8): plan, weights, extra sums, update.

A method overrides only what it changes. ``plan`` may read only public values and the method's
state (itself built only from privatized releases); ``update`` receives only a :class:`Released`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, Mapping, TypeVar

import torch

from dpfy.plan import StepPlan

__all__ = ["AdaptiveMethod", "Released", "REGISTRY", "register"]

S = TypeVar("S")

REGISTRY: dict[str, type] = {}


def register(name: str):
    """Class decorator: make a method available by ``name`` (same word as its file, R1)."""
    def deco(cls: type) -> type:
        if name in REGISTRY:
            raise ValueError(f"adaptive method {name!r} is already registered by {REGISTRY[name]}")
        REGISTRY[name] = cls
        cls.registry_name = name
        return cls
    return deco


@dataclass(frozen=True)
class Released:
    """Everything a controller may read after a step: the plan and privatized values."""

    plan: StepPlan
    expected_batch_size: float            # q_t · N, public
    sums: Mapping[str, float] = field(default_factory=dict)


class AdaptiveMethod(Generic[S]):
    """No-op defaults; subclasses override what they change."""

    registry_name: str = ""

    def init(self) -> S | None:
        return None

    def plan(self, state: S, plan: StepPlan) -> StepPlan:
        return plan

    def weights(self, norms: torch.Tensor, plan: StepPlan) -> torch.Tensor | None:
        return None

    def update(self, state: S, released: Released) -> S:
        return state

    def state_dict(self, state: S) -> Any:
        return state
