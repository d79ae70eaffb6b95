"""Loss probes: per-example losses at perturbed parameters on the step's batch (sensitive)."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from dpfy._require import require
from dpfy.types import ReleaseSpec

__all__ = ["post_release", "probe_losses"]


def post_release(specs: Mapping[str, ReleaseSpec]) -> list[str]:
    """Names of the post-release probes among ``specs`` (offsets a function of the released
    gradient): evaluated after the gradient's noise, on the same batch."""
    return [name for name, spec in specs.items() if spec.after_release]


def probe_losses(
    specs: Mapping[str, ReleaseSpec],
    *,
    model: torch.nn.Module,
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor] | None,
    params: Mapping[str, torch.nn.Parameter],
    batch: Any,
    rows: int,
    released_gradient: Mapping[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Per-example losses at θ + offsets on ``batch`` for every ``kind="loss"`` spec, (B,).

    Without ``released_gradient``: the probes with fixed offsets (evaluated before the
    release). With it: the post-release probes, at offsets(released_gradient).

    Each probe runs ``loss_fn(model, batch)`` (the caller holds no_grad) with the named
    parameters' data replaced by θ + Δθ (new tensors: θ itself is never modified, so no rounding
    drift), then restores them; losses are clipped to ±Δ. Sensitive: they are summed and
    noised like every release.
    """
    after = released_gradient is not None
    probes = {n: s for n, s in specs.items() if s.kind == "loss" and s.after_release == after}
    if not probes:
        return {}
    require(
        loss_fn is not None,
        "loss_fn",
        None,
        "given for loss probes",
        "Pass make_private(..., loss_fn=fn) with fn(model, batch) -> (B,) losses",
    )
    assert loss_fn is not None, "required above"
    out: dict[str, torch.Tensor] = {}
    for name, spec in probes.items():
        offsets = spec.offsets
        if callable(offsets):  # a post-release probe (after): offsets(released gradient)
            assert released_gradient is not None, "post-release probes get the release"
            offsets = offsets(released_gradient)
        assert offsets is not None, "a loss probe has offsets (ReleaseSpec checks it)"
        unknown = sorted(set(offsets) - set(params))
        require(not unknown, f"offsets of probe {name!r}", unknown, "names of trainable parameters")
        saved = {n: params[n].data for n in offsets}
        try:
            for n, d in offsets.items():
                params[n].data = saved[n] + d.to(saved[n])
            losses = torch.as_tensor(loss_fn(model, batch))  # (B,) sensitive
        finally:
            for n, t in saved.items():
                params[n].data = t
        require(
            losses.shape == (rows,),
            f"loss_fn output for probe {name!r}",
            tuple(losses.shape),
            f"one loss per example, shape ({rows},)",
            "Return per-example losses (reduction='none')",
        )
        require(
            bool(torch.isfinite(losses).all()),
            f"loss_fn output for probe {name!r}",
            "non-finite",
            "finite",
            "Clip or fix the loss",
        )
        out[name] = losses.double().clamp(-spec.sensitivity, spec.sensitivity)
    return out
