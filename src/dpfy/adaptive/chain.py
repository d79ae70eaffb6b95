"""``chain(a, b, ...)``: several methods in one step (noise decay + quantile clipping, say).

References: optax's ``chain`` (combine by a chain, not by subclasses: CONTRIBUTING.md).

- plans fold left to right (each member sees the plan the previous one wrote), and each
  member's plan is checked against its own ``sets`` (:func:`~dpfy.adaptive.base.check_plan`);
- two members that set the same plan field (``Method.sets``) are refused when the chain is
  built, and a member that splits σ (``NOISE_SPLIT``) must come after one that sets σ;
- at most one member may supply the clipping;
- extra releases merge by name, and a duplicate name is refused;
- the optional capabilities (``transform``, ``postprocess``, ``observe``) run over the members
  that implement them, in order; the chain implements one when any member does;
- every member's ``update`` reads the same :class:`StepOutcome`; states are kept per member,
  keyed by registry name;
- ``calibrate(facts)`` calibrates each member for the same facts, in order.

Releases per step: the union of the members' releases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from dpfy.adaptive.base import (
    NOISE_SPLIT,
    Method,
    bind_facts,
    calibrate_for_run,
    check_plan,
    method_name,
)
from dpfy.types import Clip, Norms, ReleaseSpec, RunFacts, StepOutcome, StepPlan

__all__ = ["Chain", "chain"]

Tensors = Mapping[str, torch.Tensor]


def chain(*methods: Method) -> "Chain":
    """One method running ``methods`` in order within each step (see the module docstring)."""
    return Chain(tuple(methods))


@dataclass(frozen=True)
class Chain(Method):
    """Methods composed in one step; build with :func:`chain`."""

    members: tuple[Method, ...]

    def __post_init__(self) -> None:
        if len(self.members) < 1:
            raise ValueError("chain must have at least one method, got none. Pass methods")
        for m in self.members:
            if not isinstance(m, Method):
                raise ValueError(
                    f"chain members must be dpfy methods, got {type(m).__name__}. "
                    f"Build them with dpfy.adaptive.make(name, ...)"
                )
        seen: dict[str, str] = {}
        for m in self.members:
            for f in sorted(m.sets):
                if f in seen:
                    raise ValueError(
                        f"chain members must set different plan fields, got {f!r} set by both "
                        f"{seen[f]!r} and {method_name(m)!r}. Keep one of them (e.g. one noise "
                        f"schedule), or fold both rules into one method"
                    )
                seen[f] = method_name(m)
        setter = next((i for i, m in enumerate(self.members) if "noise_multiplier" in m.sets), None)
        splitter = next((i for i, m in enumerate(self.members) if NOISE_SPLIT in m.sets), None)
        if setter is not None and splitter is not None and splitter < setter:
            raise ValueError(
                f"chain members must put a method that sets σ before one that splits it, got "
                f"{method_name(self.members[splitter])!r} (splits σ) before "
                f"{method_name(self.members[setter])!r} (sets σ). Swap them: the split divides the "
                f"σ the schedule sets"
            )
        clippers = [method_name(m) for m in self.members if m.implements("clipping")]
        if len(clippers) > 1:
            raise ValueError(
                f"chain members must include at most one clipping, got {clippers}. "
                f"Keep one adaptive clipping method"
            )
        keys = [method_name(m) for m in self.members]
        if len(set(keys)) != len(keys):
            raise ValueError(
                f"chain members must be distinct methods, got {keys}. Use each method once"
            )
        object.__setattr__(self, "sets", frozenset(f for m in self.members for f in m.sets))
        object.__setattr__(
            self, "ledger_depends_on_data", any(m.ledger_depends_on_data for m in self.members)
        )
        object.__setattr__(self, "registry_name", "+".join(keys))

    def implements(self, hook: str) -> bool:
        """True when any member implements ``hook``."""
        super().implements(hook)  # validates the name
        return any(m.implements(hook) for m in self.members)

    def _states(self, state: Mapping[str, Any]):
        return ((m, state[method_name(m)]) for m in self.members)

    def _with(self, hook: str, state: Mapping[str, Any]):
        return ((m, s) for m, s in self._states(state) if m.implements(hook))

    def init(self) -> dict[str, Any]:
        return {method_name(m): m.init() for m in self.members}

    def plan(self, state: Mapping[str, Any], plan: StepPlan) -> StepPlan:
        for m, s in self._states(state):
            nxt = m.plan(s, plan)
            check_plan(m, plan, nxt)
            plan = nxt
        return plan

    def clipping(self, state: Mapping[str, Any], norms: Norms, plan: StepPlan) -> Clip | None:
        for m, s in self._with("clipping", state):
            return m.clipping(s, norms, plan)
        return None

    def releases(self, state: Mapping[str, Any], plan: StepPlan) -> dict[str, ReleaseSpec]:
        out: dict[str, ReleaseSpec] = {}
        for m, s in self._states(state):
            for name, spec in m.releases(s, plan).items():
                if name in out:
                    raise ValueError(
                        f"release names in a chain must be unique, got {name!r} "
                        f"twice (again from {method_name(m)!r}). Rename one release"
                    )
                out[name] = spec
        return out

    def update(self, state: Mapping[str, Any], outcome: StepOutcome) -> dict[str, Any]:
        return {method_name(m): m.update(s, outcome) for m, s in self._states(state)}

    def calibrate(self, facts: RunFacts) -> "Chain":
        return bind_facts(Chain(tuple(calibrate_for_run(m, facts) for m in self.members)), facts)

    # -- optional capabilities: over the members that implement them --------------------------
    def transform(self, state: Mapping[str, Any], per_sample: Tensors, plan: StepPlan) -> Tensors:
        for m, s in self._with("transform", state):
            per_sample = m.transform(s, per_sample, plan)
        return per_sample

    def postprocess(
        self,
        state: Mapping[str, Any],
        gradient: Tensors,
        plan: StepPlan,
        probed: Mapping[str, float],
        expected_batch_size: float,
    ) -> Tensors:
        for m, s in self._with("postprocess", state):
            gradient = m.postprocess(s, gradient, plan, probed, expected_batch_size)
        return gradient

    def observe(self, state: Mapping[str, Any], *, val_metric: float) -> dict[str, Any]:
        return {
            method_name(m): (m.observe(s, val_metric=val_metric) if m.implements("observe") else s)
            for m, s in self._states(state)
        }
