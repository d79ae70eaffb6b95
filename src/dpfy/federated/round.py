"""One DP-FedAvg round's public values and the server's checks of what users send.

A round is one logical batch whose units are users (:mod:`dpfy.federated.server`): its
:class:`RoundPlan` is fixed before any user trains, each reply is a :class:`Contribution`
checked by :func:`check_contributions` before anything is summed, and the noisy sum over the
round's users (:func:`noisy_round_mean`) is drawn on the parameters' device, as a DP-SGD step's
noise is (:class:`dpfy.noise.NoiseSource` draws where the tensor lives).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import torch

from dpfy._require import require
from dpfy.adaptive.base import Method
from dpfy.errors import PrivacyRefusal
from dpfy.noise.mechanism import StepNoise
from dpfy.types import StepPlan

__all__ = [
    "RoundPlan",
    "Contribution",
    "RoundResult",
    "check_method",
    "check_contributions",
    "noisy_round_mean",
]

# The clipping check's slack: a float32 delta scaled by C/‖Δ‖ lands within a few ulps of C.
_CLIP_SLACK = 1e-5
# Adaptive methods whose clipping is one threshold on the whole delta, min(1, C_t/‖Δ_u‖),
# which is what the client applies; other methods' clippings are refused (module docstring).
_SCALAR_CLIP_METHODS = ("quantile",)


@dataclass(frozen=True)
class RoundPlan:
    """What round ``round`` does, fixed before any user trains: public.

    ``users`` are the sampled users' indices 0..N_users−1 (sorted); ``plan.clip`` is the C_t
    each of them clips their delta to.
    """

    round: int
    users: tuple[int, ...]
    plan: StepPlan

    @property
    def clip(self) -> float:
        return float(self.plan.clip)


@dataclass(frozen=True)
class Contribution:
    """One sampled user's reply: the clipped delta Δ̃_u and ‖Δ_u‖ before clipping.

    The norm is what the quantile method's count needs (1[‖Δ_u‖ ≤ C_t]); the server is the
    trusted curator of central DP and never releases it un-noised.
    """

    user: int
    clipped: Mapping[str, torch.Tensor]
    norm: float


@dataclass(frozen=True)
class RoundResult:
    """What a round released (public): the noisy mean delta and each extra release."""

    round: int
    num_users: int  # contributions received (public in FL: who replied)
    clip: float
    noise_multiplier: float
    mean_delta: Mapping[str, torch.Tensor]
    extras: Mapping[str, float | torch.Tensor] = field(default_factory=dict)


def check_method(method: Method | None, clip: float | None) -> None:
    """Refuse a method DP-FedAvg cannot account: one that transforms or observes sensitive
    values, clips other than by one threshold on the whole delta, or disagrees with ``clip``
    about who sets C."""
    if method is None:
        require(
            clip is not None and clip > 0,
            "clip",
            clip,
            "> 0",
            "Give C, the bound on each user's model delta (it depends on the local "
            "epochs and learning rate), or method=make('quantile') to adapt it",
        )
        return
    name = method.registry_name or type(method).__name__
    for hook in ("transform", "postprocess", "observe"):
        if method.implements(hook):
            raise PrivacyRefusal(
                f"a DP-FedAvg method must act on the round's plan and its releases only, "
                f"got method = {name!r} implementing {hook!r}. Use it with make_private "
                f"(DP-SGD), or a method without it (quantile, noise decay)"
            )
    if method.implements("clipping") and name not in _SCALAR_CLIP_METHODS:
        raise PrivacyRefusal(
            f"a DP-FedAvg method's clipping must be one threshold on the whole delta, got "
            f"method = {name!r}. Clients clip Δ to min(1, C_t/‖Δ‖); use one of "
            f"{list(_SCALAR_CLIP_METHODS)} or a method that leaves clipping alone"
        )
    sets_clip = "clip" in method.sets
    require(
        sets_clip == (clip is None),
        "clip",
        clip,
        "None when the method sets C (its initial_clip is C_0), else > 0",
        f"method {name!r} {'sets' if sets_clip else 'does not set'} the clip",
    )


def check_contributions(
    rp: RoundPlan, contributions: Sequence[Contribution], params: Iterable[str]
) -> None:
    """The clipping check: each reply is from a sampled user, once, within C_t."""
    sampled, seen = set(rp.users), set()
    for c in contributions:
        if c.user not in sampled or c.user in seen:
            raise PrivacyRefusal(
                f"a contribution must come from a user sampled for round {rp.round}, once, "
                f"got user = {c.user} ({'repeated' if c.user in seen else 'not sampled'}). "
                f"Only dpfy's sampler decides who takes part; anything else is unaccounted"
            )
        seen.add(c.user)
        norm = math.sqrt(sum(float(t.double().square().sum()) for t in c.clipped.values()))
        if not norm <= rp.clip * (1 + _CLIP_SLACK):
            raise PrivacyRefusal(
                f"a user's delta must be clipped to C_t = {rp.clip:.6g}, got norm = "
                f"{norm:.6g} from user {c.user} in round {rp.round}. Clip it on the client "
                f"with dpfy.federated.clip_delta(delta, config['clip'])"
            )
        require(
            set(c.clipped) == set(params),
            "a contribution's parameters",
            sorted(c.clipped),
            f"the model's trainable parameters {sorted(params)}",
        )
        require(
            math.isfinite(c.norm) and c.norm >= 0,
            "a contribution's norm",
            c.norm,
            "finite and >= 0",
        )


def noisy_round_mean(
    params: Mapping[str, torch.Tensor],
    contributions: Sequence[Contribution],
    std: float,
    normalizer: float,
    noise: StepNoise,
) -> dict[str, torch.Tensor]:
    """(Σ_u Δ̃_u + N(0, std² I)) / normalizer per parameter, summed and noised on the
    parameter's device: no sum or noise crosses the host–device bus (on the CPU, the sums in
    the order of the contributions and the draws in the order of the parameters, as before)."""
    mean: dict[str, torch.Tensor] = {}
    for name, p in params.items():  # noise on the sum, once
        total = torch.zeros_like(p)
        for c in contributions:
            total += c.clipped[name].detach().to(total)
        mean[name] = noise.noisy_mean(total, std, normalizer)
    return mean
