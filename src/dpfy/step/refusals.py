"""The private step's refusals of how it is used, before anything of a batch is released: a
second ``optimizer.step()`` on the same batch, a method that probes losses without a loss
function or over a logical batch split into physical ones, and a method's plan that changes
what it may not (the sample rate, or a field it does not declare). :mod:`dpfy.spec.check`
gives the same refusals before the run is built."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from dpfy._require import require
from dpfy.adaptive.base import Method, check_plan
from dpfy.errors import PrivacyRefusal
from dpfy.types import ReleaseSpec, StepPlan

__all__ = [
    "LossFn",
    "checked_plan",
    "repeated_step_message",
    "require_loss_fn",
    "split_batch_refusal",
]

LossFn = Callable[[torch.nn.Module, Any], torch.Tensor]


def repeated_step_message(released: bool) -> str:
    """optimizer.step() called again before the loader yielded another batch."""
    what = (
        "its logical batch was already released (noised and recorded in the ledger)"
        if released
        else "its clipped gradients were already added to the current logical batch"
    )
    return (
        "optimizer.step() must be called once per batch of the private loader, got a second "
        f"optimizer.step() for the same batch: {what}, and stepping on it again would use its "
        "examples twice without accounting for it. Draw the next batch from the loader "
        "(and call loss.backward() on it) before calling optimizer.step() again"
    )


def require_loss_fn(specs: Mapping[str, ReleaseSpec], loss_fn: LossFn | None, name: str) -> None:
    """Loss-probe releases need the per-example loss function; refuse without one."""
    if any(spec.kind == "loss" for spec in specs.values()):
        require(
            callable(loss_fn),
            "loss_fn",
            loss_fn,
            f"a callable for method {name!r}",
            "It probes per-example losses: pass make_private(..., loss_fn=fn) with "
            "fn(model, batch) -> (B,) losses (reduction='none')",
        )


def split_batch_refusal(name: str) -> PrivacyRefusal:
    """The refusal of a logical batch split into physical ones under post-release probes."""
    return PrivacyRefusal(
        f"a logical batch must be one physical batch for method {name!r}, got a logical "
        f"batch split over several physical batches (max_physical_batch_size): its "
        f"post-release loss probes need the whole batch again after the gradient is released. "
        f"Make the physical batch as large as the logical one (drop max_physical_batch_size=, "
        f"or raise it above the largest logical batch); nothing of this step was released"
    )


def checked_plan(method: Method, before: StepPlan, after: StepPlan) -> StepPlan:
    """``after``, refused if the method changed q or a plan field it does not declare."""
    require(
        after.sample_rate == before.sample_rate,
        "plan.sample_rate",
        after.sample_rate,
        f"the sampler's rate {before.sample_rate}",
        "The sample rate is a fact of the sampler; a method may not change it",
    )
    check_plan(method, before, after)
    return after
