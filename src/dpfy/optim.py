"""The private optimizer: the ``torch.optim.Optimizer`` facade around the private step.

It keeps the torch surface (param_groups, zero_grad, step, state_dict) and hands every
``step()`` to :class:`dpfy.step.private_step.PrivateStep`, which holds the whole step. With
SGD(lr=1), no momentum and σ = 0 a step moves θ by exactly −Σ_i clip(g_i)/b.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable

import torch

from dpfy._require import require
from dpfy.errors import PrivacyRefusal
from dpfy.privacy import Ledger, epsilon as ledger_epsilon
from dpfy.step.private_step import PrivateStep

__all__ = ["DPOptimizer"]

FORMAT = "dpfy-optimizer/3"
_TORCH_HOOKS = ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks",
                "_optimizer_state_dict_pre_hooks", "_optimizer_state_dict_post_hooks",
                "_optimizer_load_state_dict_pre_hooks", "_optimizer_load_state_dict_post_hooks")


def _step_attribute(name: str, doc: str, settable: bool = False) -> property:
    """A read (or read-write) view of the private step's attribute ``name``."""
    def get(self: "DPOptimizer") -> Any:
        return getattr(self.private_step, name)

    def put(self: "DPOptimizer", value: Any) -> None:
        setattr(self.private_step, name, value)
    return property(get, put if settable else None, doc=doc)


class DPOptimizer(torch.optim.Optimizer):
    """A private view of ``optimizer``; build it with :func:`dpfy.make_private`.

    ``updated`` says whether the last ``step()`` was a real update (it ended a logical batch:
    noise added, ledger step recorded, inner optimizer stepped). With
    ``max_physical_batch_size`` the loader yields several physical batches per update; step a
    per-update LR scheduler only ``if optimizer.updated``. ``last_step_info`` holds the last
    step's plan and debug statistics that are NOT private (never fed back into training).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, private_step: PrivateStep, *,
                 accountant: str, seed: int | None) -> None:
        # Not calling Optimizer.__init__: parameter groups and state are the inner optimizer's.
        self.original_optimizer, self.private_step = optimizer, private_step
        self.accountant, self.seed = accountant, seed
        for hooks in _TORCH_HOOKS:
            setattr(self, hooks, OrderedDict())

    ledger = _step_attribute("ledger", "Every release so far.")
    step_count = _step_attribute("step_count", "Logical steps taken.")
    updated = _step_attribute("updated", "The last step() ended a logical batch.")
    last_step_info = _step_attribute("last_step_info", "The last step's plan (not private).")
    method = _step_attribute("method", "The adaptive method, or None.")
    method_state = _step_attribute("method_state", "The method's state.", settable=True)
    noise_multiplier = _step_attribute("noise_multiplier", "The run's σ (a method may plan σ_t).")
    guard = _step_attribute("guard", "The ε guard: horizon and ε cap.")
    sampler = _step_attribute("sampler", "The sampler: q, b, N, the unit of privacy.")
    grads = _step_attribute("grads", "The per-unit gradient engine.")
    clipping = _step_attribute("clipping", "The clipping policy.")
    mechanism = _step_attribute("mechanism", "The noise mechanism.")
    collective = _step_attribute("collective", "The data-parallel ranks, or None.")
    individual = _step_attribute("individual", "Individualized budgets, or None.")

    @property
    def groups(self) -> Any:
        """The privacy groups' ledgers of an individualized run, or None."""
        return self.private_step.individual.groups if self.private_step.individual else None

    @property
    def max_steps(self) -> int | None:
        return self.guard.max_steps

    @max_steps.setter
    def max_steps(self, value: int | None) -> None:
        self.guard.max_steps = value

    @property
    def epsilon_cap(self) -> float | None:
        return self.guard.epsilon_cap

    @property
    def target_delta(self) -> float | None:
        return self.guard.delta

    # -- torch.optim.Optimizer surface (delegated) ------------------------------------------
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.original_optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.original_optimizer.param_groups = value

    @property
    def state(self) -> Any:
        return self.original_optimizer.state

    @property
    def defaults(self) -> dict[str, Any]:
        return self.original_optimizer.defaults

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Refused: the private step covers the parameters the model had at ``make_private``.

        A parameter added later (the fine-tuning recipe: unfreeze a backbone, then
        ``add_param_group``) would be stepped with its plain autograd gradient, without
        clipping or noise, while the ledger records the private release alone."""
        params = param_group.get("params", []) if isinstance(param_group, dict) else []
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        raise PrivacyRefusal(
            f"add_param_group after make_private: "
            f"{self.private_step.names_of(params) or 'parameters'} would be trained on their "
            f"raw gradient, without clipping or noise. Set requires_grad and build the "
            f"optimizer over every parameter to train before calling make_private (a new "
            f"private run for a new set of parameters)")

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear parameter gradients and the captured activations (not the logical-batch sum)."""
        self.original_optimizer.zero_grad(set_to_none=set_to_none)
        self.grads.clear()

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Clip, accumulate; at the end of a logical batch add noise, record, update."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.private_step.take_batch()
        return loss

    def __repr__(self) -> str:
        return f"DPOptimizer({self.original_optimizer!r})"

    # -- privacy ----------------------------------------------------------------------------
    def epsilon(self, delta: float, accountant: str | None = None) -> float:
        """ε(δ) of everything released so far, read from the ledger."""
        return ledger_epsilon(self.ledger, delta=delta, accountant=accountant or self.accountant)

    def group_epsilons(self, delta: float, accountant: str | None = None) -> list[float]:
        """ε(δ) of each privacy group so far, read from its own ledger (individualized runs)."""
        require(self.groups is not None, "budgets", None, "given to make_private",
                "Per-group ε exists only for runs with individualized budgets")
        return self.groups.epsilons(delta=delta, accountant=accountant or self.accountant)

    def observe(self, *, val_metric: float) -> None:
        """Feed a validation result to a method that reads one (it implements ``observe``)."""
        require(self.method is not None and self.method.implements("observe"), "the method",
                getattr(self.method, "registry_name", None), "one that implements observe",
                "Only such methods read a validation metric")
        self.method_state = self.method.observe(self.method_state, val_metric=val_metric)

    # -- checkpoints ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume bit-identically (the model's weights are the model's).

        Holds the seed and generator states: a checkpoint is secret, never part of a release.
        Only at a logical-batch boundary: between the physical batches of a logical batch the
        step holds the un-noised sums of clipped gradients, which must never reach a file, so a
        call there raises :class:`~dpfy.errors.PrivacyRefusal`.
        """
        step = self.private_step
        if step.sums is not None:
            raise PrivacyRefusal(
                "state_dict() must be called at a logical-batch boundary, got a call while "
                "a logical batch is being summed (its un-noised sum of clipped gradients "
                "would be written). Call it after optimizer.step() completes a logical batch "
                "(the private loader's cursor.last is True)")
        return {
            "format": FORMAT, "seed": self.seed, "step_count": step.step_count,
            "optimizer": self.original_optimizer.state_dict(),
            "ledger": step.ledger.to_dict(), "noise": step.mechanism.state_dict(),
            "sampler": step.sampler.state_dict(), "max_steps": self.max_steps,
            "method_state": step.method_state,
            "groups": step.individual.state_dict() if step.individual is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        require(state.get("format") == FORMAT, "format", state.get("format"), repr(FORMAT),
                "This is not a dpfy optimizer checkpoint of this version")
        step = self.private_step
        # first: the sampler refuses a checkpoint of another unit of privacy (a user-level run
        # resumed as an example-level one) before anything else is replaced
        step.sampler.load_state_dict(state["sampler"])
        self.original_optimizer.load_state_dict(state["optimizer"])
        step.ledger.groups[:] = Ledger.from_dict(state["ledger"]).groups
        step.mechanism.load_state_dict(state["noise"])
        self.seed, step.step_count = state["seed"], state["step_count"]
        self.max_steps = state["max_steps"]
        step.method_state, step.sums = state["method_state"], None
        step.guard.reset()  # the ledger was replaced: compose it afresh
        if step.individual is not None:
            step.individual.load_state_dict(state.get("groups"))
