"""``chain(a, b, ...)``: several methods in one step (noise decay + quantile clipping, say).

References: optax's ``chain`` (STYLE.md R6).

- plans fold left to right (each member sees the plan the previous one wrote);
- two members that set the same plan field (``Method.sets``) are refused when the chain is built;
- at most one member may supply the clipping;
- extra releases merge by name, and a duplicate name is refused;
- every member's ``update`` reads the same :class:`StepOutcome`; states are kept per member,
  keyed by registry name;
- ``calibrate(facts)`` calibrates each member for the same facts, in order.

Releases per step: the union of the members' releases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from dpfy.types import Clip, Norms, StepOutcome, ReleaseSpec, RunFacts
from dpfy.adaptive.base import Method, Needs, bind_facts, prepare
from dpfy.types.plan import StepPlan

__all__ = ["Chain", "chain"]

_NORM_ORDER = ("total", "per_group", "per_parameter")


def _overrides(method: Method, hook: str) -> bool:
    return getattr(type(method), hook) is not getattr(Method, hook)


def _name(m: Method) -> str:
    return m.registry_name or type(m).__name__


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
                raise ValueError(f"chain members must be dpfy methods, got {type(m).__name__}. "
                                 f"Build them with dpfy.adaptive.make(name, ...)")
        seen: dict[str, str] = {}
        for m in self.members:
            for f in m.sets:
                if f in seen:
                    raise ValueError(
                        f"chain members must set different plan fields, got {f!r} set by both "
                        f"{seen[f]!r} and {_name(m)!r}. Keep one of them (e.g. one noise "
                        f"schedule), or fold both rules into one method")
                seen[f] = _name(m)
        clippers = [_name(m) for m in self.members if _overrides(m, "clipping")]
        if len(clippers) > 1:
            raise ValueError(f"chain members must include at most one clipping, got {clippers}. "
                             f"Keep one adaptive clipping method")
        keys = [self._key(i) for i in range(len(self.members))]
        if len(set(keys)) != len(keys):
            raise ValueError(f"chain members must be distinct methods, got {keys}. "
                             f"Use each method once")
        needs = [m.needs for m in self.members]
        object.__setattr__(self, "needs", Needs(
            norms=max((n.norms for n in needs), key=_NORM_ORDER.index),
            per_sample_grads=any(n.per_sample_grads for n in needs),
            validation=next((n.validation for n in needs if n.validation), None),
            indices=any(n.indices for n in needs),
            probes=any(n.probes for n in needs),
            whole_batch=any(n.whole_batch for n in needs)))
        object.__setattr__(self, "sets", frozenset(seen))
        object.__setattr__(self, "ledger_depends_on_data",
                           any(m.ledger_depends_on_data for m in self.members))
        object.__setattr__(self, "registry_name", "+".join(keys))

    def _key(self, i: int) -> str:
        return _name(self.members[i])

    def init(self) -> dict[str, Any]:
        return {self._key(i): m.init() for i, m in enumerate(self.members)}

    def _states(self, state: Mapping[str, Any]):
        return ((m, state[self._key(i)]) for i, m in enumerate(self.members))

    def plan(self, state: Mapping[str, Any], plan: StepPlan) -> StepPlan:
        for m, s in self._states(state):
            plan = m.plan(s, plan)
        return plan

    def clipping(self, state: Mapping[str, Any], norms: Norms, plan: StepPlan) -> Clip | None:
        for m, s in self._states(state):
            clip = m.clipping(s, norms, plan)
            if clip is not None:
                return clip
        return None

    def transform(self, state: Mapping[str, Any], per_sample: Mapping[str, torch.Tensor],
                  plan: StepPlan) -> Mapping[str, torch.Tensor]:
        for m, s in self._states(state):
            per_sample = m.transform(s, per_sample, plan)
        return per_sample

    def postprocess(self, state: Mapping[str, Any], gradient: Mapping[str, torch.Tensor],
                    plan: StepPlan) -> Mapping[str, torch.Tensor]:
        for m, s in self._states(state):
            gradient = m.postprocess(s, gradient, plan)
        return gradient

    def postprocess_probed(self, state: Mapping[str, Any], gradient: Mapping[str, torch.Tensor],
                           plan: StepPlan, probed: Mapping[str, float],
                           expected_batch_size: float) -> Mapping[str, torch.Tensor]:
        """Each member's post-release mapping in order (a member without post-release probes
        falls back to its ``postprocess``)."""
        for m, s in self._states(state):
            gradient = m.postprocess_probed(s, gradient, plan, probed, expected_batch_size)
        return gradient

    def supplies_clipping(self) -> bool:
        return any(m.supplies_clipping() for m in self.members)

    def releases(self, state: Mapping[str, Any], plan: StepPlan) -> dict[str, ReleaseSpec]:
        out: dict[str, ReleaseSpec] = {}
        for m, s in self._states(state):
            for name, spec in m.releases(s, plan).items():
                if name in out:
                    raise ValueError(f"release names in a chain must be unique, got {name!r} "
                                     f"twice (again from {_name(m)!r}). Rename one release")
                out[name] = spec
        return out

    def release_values(self, state: Mapping[str, Any], norms: Norms, plan: StepPlan
                       ) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for m, s in self._states(state):
            out.update(m.release_values(s, norms, plan))
        return out

    def update(self, state: Mapping[str, Any], released: StepOutcome) -> dict[str, Any]:
        return {self._key(i): m.update(s, released)
                for i, (m, s) in enumerate(self._states(state))}

    def observe(self, state: Mapping[str, Any], *, val_metric: float) -> dict[str, Any]:
        return {self._key(i): (m.observe(s, val_metric=val_metric) if m.needs.validation else s)
                for i, (m, s) in enumerate(self._states(state))}

    def calibrate(self, facts: RunFacts) -> "Chain":
        return bind_facts(Chain(tuple(prepare(m, facts) for m in self.members)), facts)

    def state_dict(self, state: Mapping[str, Any]) -> dict[str, Any]:
        return {k: m.state_dict(s) for k, (m, s) in
                zip((self._key(i) for i in range(len(self.members))), self._states(state))}

    def load_state_dict(self, saved: Mapping[str, Any]) -> dict[str, Any]:
        return {self._key(i): m.load_state_dict(saved[self._key(i)])
                for i, m in enumerate(self.members)}
