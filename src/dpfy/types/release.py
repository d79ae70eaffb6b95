"""What a step releases beyond the gradient (a spec declared from public values), and the
step's outcome: everything a method's ``update`` may read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

import torch

from dpfy._require import require
from dpfy.types.clip import Norms
from dpfy.types.plan import StepPlan

__all__ = ["RELEASE_KINDS", "Offsets", "Values", "ReleaseSpec", "StepOutcome"]


RELEASE_KINDS = ("values", "gradient", "loss")
# How a release's per-unit values are formed from the step's norms: (U,) or (U, d) values, or
# (U,) weights on the per-unit gradients (kind "gradient"). Sensitive in and out.
Values = Callable[[Norms], torch.Tensor]
# A loss probe's offsets: fixed {name: Δθ}, or a function of the step's released gradient.
Offsets = (
    Mapping[str, torch.Tensor] | Callable[[Mapping[str, torch.Tensor]], Mapping[str, torch.Tensor]]
)


@dataclass(frozen=True)
class ReleaseSpec:
    """An extra release declared from public values: Σ_i v_i + N(0, noise_std²).

    Args:
      sensitivity: Δ, the L2 bound on one example's v_i (add/remove one), > 0; asserted.
      noise_std: standard deviation of the Gaussian on the sum, > 0.
      kind: ``"values"`` (v_i is a scalar or a vector, ``values(norms)``),
        ``"gradient"`` (v_i = w_i g_i, per-unit gradients weighted by w = ``values(norms)``: a
        parameter-shaped release formed by the engine's book-keeping), or ``"loss"`` (a
        **probe**: v_i = clip(ℓ_i(θ + offsets), −Δ, Δ), example i's loss on the same batch at
        perturbed parameters, from ``make_private(loss_fn=...)``; HyFreeDP, ADADP, line
        searches). Loss probes are released like any other value and recorded in the ledger.
      offsets: for ``kind="loss"``: {parameter name: Δθ} (public: from the method's state,
        itself built from released values); parameters not named stay at θ. Or a callable
        ``released_gradient -> {name: Δθ}``: a **post-release probe**, evaluated after this
        step's gradient is released (noise added), at offsets that are a function of that
        released gradient {name: S̃/b} only (post-processing; see ``Method.postprocess``).
      values: for ``kind="values"`` and ``"gradient"``: how the per-unit values are formed,
        ``values(norms) -> (U,) | (U, d)`` (a function of the step's per-unit norms and of
        public values the method closed over). The step calls it, asserts each unit's bound
        ‖v_u‖ ≤ Δ, sums and noises; the method never sees the sum un-noised.
      label: a few words saying what the release holds (``dpfy methods`` and the privacy
        report print it beside the release's name, kind, sensitivity and noise multiplier).
    """

    sensitivity: float
    noise_std: float
    kind: Literal["values", "gradient", "loss"] = "values"
    offsets: Offsets | None = None
    values: Values | None = None
    label: str = ""

    def __post_init__(self) -> None:
        require(self.sensitivity > 0, "sensitivity", self.sensitivity, "> 0")
        require(
            self.noise_std > 0,
            "noise_std",
            self.noise_std,
            "> 0",
            "An extra release without noise is not private",
        )
        require(self.kind in RELEASE_KINDS, "kind", self.kind, f"one of {list(RELEASE_KINDS)}")
        require(
            (self.offsets is not None) == (self.kind == "loss"),
            "offsets",
            "given" if self.offsets is not None else None,
            "given exactly for kind='loss'",
            "A loss probe says where to evaluate: offsets {parameter name: Δθ}",
        )
        require(
            (self.values is not None) == (self.kind != "loss"),
            "values",
            "given" if self.values is not None else None,
            "given exactly for kind='values' or 'gradient'",
            "Say how each unit's value is formed: values=lambda norms: ... (U,)",
        )

    @property
    def noise_multiplier(self) -> float:
        return self.noise_std / self.sensitivity

    @property
    def after_release(self) -> bool:
        """True for a post-release probe (``offsets`` a function of the released gradient)."""
        return self.kind == "loss" and callable(self.offsets)


@dataclass(frozen=True)
class StepOutcome:
    """Everything ``update`` may read after a step: the plan and privatized values only.

    ``gradient`` is the released update direction {name: (Σ_i w_i g_i + noise)/b}; ``sums``
    holds each extra release, noisy (a float for a scalar, a tensor otherwise).
    ``noisy_gradient`` is the gradient exactly as released, before ``postprocess``
    (``gradient`` is what the optimizer stepped on; the two are the same without postprocess).
    ``parameters`` are the trainable parameters after the inner optimizer's step
    {name: θ_{t+1}} (read-only views: copy what you keep). They are public — a function of
    the released values and the data-independent initialization — so a method may read the
    update the optimizer actually applied (θ_{t+1} − θ_t: momentum, Adam's preconditioning and
    weight decay included) without re-running the optimizer (HyFreeDP's probe direction).
    """

    plan: StepPlan
    expected_batch_size: float  # b, public
    sums: Mapping[str, Any] = field(default_factory=dict)
    gradient: Mapping[str, torch.Tensor] = field(default_factory=dict)
    parameters: Mapping[str, torch.Tensor] = field(default_factory=dict)
    noisy_gradient: Mapping[str, torch.Tensor] = field(default_factory=dict)
