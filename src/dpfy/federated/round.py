"""One DP-FedAvg round's public values, the server's checks of what users send, and the round's
release on the private step's pieces.

A round is one logical batch whose units are users (:mod:`dpfy.federated.server`): its
:class:`RoundPlan` is fixed before any user trains, each reply is a :class:`Contribution`
checked by :func:`check_contributions` (who sent it), and :func:`round_release` adds the
replies to the step's sums (:class:`dpfy.step.sums.StepSums`), whose
:func:`~dpfy.step.sums.check_bound` asserts every user's ‖Δ̃_u‖ ≤ C_t (and each extra release's
bound) before anything is summed, and noises each sum once at the release. The sum over users
is one flat buffer on the parameters' device (:class:`FlatLayout`), so its noise is one draw
by the mechanism's generator where the parameters live (``NoiseSource.generator_for``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from dpfy._require import require
from dpfy.adaptive.base import Method, method_name
from dpfy.errors import PrivacyRefusal
from dpfy.noise.mechanism import StepNoise
from dpfy.step.sums import StepSums
from dpfy.types import Clip, Norms, ReleaseSpec, StepPlan

__all__ = [
    "RoundPlan",
    "Contribution",
    "RoundResult",
    "check_method",
    "check_release_kind",
    "check_contributions",
    "FlatLayout",
    "round_release",
    "sum_dtype",
]

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
    about who sets C.

    These are the server's own refusals, run before :func:`dpfy.spec.check`: the checker has
    no declaration for a post-processing or observing hook, a clipping rule's shape, or who
    sets C. Its one overlap, the ``uls`` × per-row declaration, also refuses a per-sample
    transform, but with ``make_private``'s fix (``user_sampling='els'``), which DP-FedAvg has
    no counterpart of; this message comes first and names the fix that applies here."""
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
    name = method_name(method)
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


def check_release_kind(name: str, spec: ReleaseSpec) -> None:
    """A round releases values of the users' delta norms only (the quantile method's count):
    refuse a release of another kind (a loss probe, a weighted sum of the deltas)."""
    require(
        spec.kind == "values",
        f"release {name!r}",
        spec.kind,
        "of kind 'values' in DP-FedAvg (a function of the users' delta norms)",
        "Use a method whose releases read only the users' delta norms (quantile)",
    )


def check_contributions(
    rp: RoundPlan, contributions: Sequence[Contribution], params: Mapping[str, torch.Tensor]
) -> None:
    """Each reply is from a sampled user, once, for the model's parameters in their shapes,
    with a finite norm. The bound ‖Δ̃_u‖ ≤ C_t is the step's check (:func:`round_release`)."""
    sampled, seen = set(rp.users), set()
    names = set(params)
    for c in contributions:
        if c.user not in sampled or c.user in seen:
            raise PrivacyRefusal(
                f"a contribution must come from a user sampled for round {rp.round}, once, "
                f"got user = {c.user} ({'repeated' if c.user in seen else 'not sampled'}). "
                f"Only dpfy's sampler decides who takes part; anything else is unaccounted"
            )
        seen.add(c.user)
        require(
            set(c.clipped) == names,
            "a contribution's parameters",
            sorted(c.clipped),
            f"the model's trainable parameters {sorted(names)}",
        )
        # a tensor that broadcasts (shape (1,) for a matrix) would add more than its norm
        wrong = sorted(n for n, t in c.clipped.items() if t.shape != params[n].shape)
        require(
            not wrong,
            "a contribution's tensors",
            {n: tuple(c.clipped[n].shape) for n in wrong},
            f"shaped as the parameters ({ {n: tuple(params[n].shape) for n in wrong} })",
        )
        require(
            math.isfinite(c.norm) and c.norm >= 0,
            "a contribution's norm",
            c.norm,
            "finite and >= 0",
        )


def sum_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a round sums (and noises) parameters of ``dtype`` in: float32 at least.

    A sum in bfloat16 or float16 is not within C of its neighbour's: a partial sum of 256 in
    bfloat16 moves by 2 when a user adds 1 + 2⁻⁷ (its grid there is spaced 2), nearly twice
    C. Summed in float32, neighbouring sums differ by C up to float32's rounding (the
    check's slack); the noisy sum is then cast to the parameters' dtype (post-processing)."""
    return torch.promote_types(dtype, torch.float32)


class FlatLayout:
    """The trainable parameters as flat buffers: one per (device, summing dtype), so one for a
    model on one device in one dtype. A round's sum over users is one buffer each, and its
    noise one draw over each, on the parameters' device, in float32 at least
    (:func:`sum_dtype`)."""

    def __init__(self, params: Mapping[str, torch.Tensor]) -> None:
        self.params = dict(params)
        self.buffers: dict[str, tuple[str, ...]] = {}
        for name, p in self.params.items():
            key = f"{p.device}/{sum_dtype(p.dtype)}"
            self.buffers[key] = self.buffers.get(key, ()) + (name,)

    def like(self, key: str) -> torch.Tensor:
        """A parameter of buffer ``key``: its device is the buffer's."""
        return self.params[self.buffers[key][0]]

    def dtype(self, key: str) -> torch.dtype:
        """The dtype buffer ``key`` sums and noises in."""
        return sum_dtype(self.like(key).dtype)

    def size(self, key: str) -> int:
        return sum(self.params[n].numel() for n in self.buffers[key])

    def views(self, flats: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """{parameter name: its view of its flat buffer}, in the parameters' order."""
        views: dict[str, torch.Tensor] = {}
        for key, names in self.buffers.items():
            parts = flats[key].split([self.params[n].numel() for n in names])
            views.update({n: part.view_as(self.params[n]) for n, part in zip(names, parts)})
        return {n: views[n] for n in self.params}

    def zeros(self, key: str) -> torch.Tensor:
        """A zero flat buffer ``key``: on its device, in its dtype."""
        return torch.zeros(self.size(key), device=self.like(key).device, dtype=self.dtype(key))

    def holders(self) -> dict[str, nn.Parameter]:
        """One (size,) stand-in per buffer for :meth:`StepSums.release` to set ``.grad`` on: an
        expanded zero, so it allocates nothing (the release's gradient is its own buffer)."""
        out = {}
        for key in self.buffers:
            where, dtype = self.like(key).device, self.dtype(key)
            zero = torch.zeros((), device=where, dtype=dtype).expand(self.size(key))
            out[key] = nn.Parameter(zero, requires_grad=False)
        return out


def round_release(
    rp: RoundPlan,
    contributions: Sequence[Contribution],
    layout: FlatLayout,
    specs: Mapping[str, ReleaseSpec],
    noise: StepNoise,
    normalizer: float,
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The round as one logical batch of the private step whose units are users: the step's
    sums (:class:`~dpfy.step.sums.StepSums`) assert every user's ‖Δ̃_u‖ ≤ C_t and each extra
    release's bound (:func:`~dpfy.step.sums.check_bound`) before anything is summed, then noise
    each sum once: S̃ = Σ_u Δ̃_u + N(0, (σC_t)² I), over one flat buffer per
    :class:`FlatLayout` buffer. Returns the released mean delta {name: S̃/b}
    (in the parameters' dtypes) and extras.

    A round with no replies still releases (noise only): its sensitivity is C_t all the same.
    """
    for name, spec in specs.items():
        check_release_kind(name, spec)
    sums = StepSums(plan=rp.plan, specs=specs, sensitivity=rp.clip)
    if contributions:
        _add_users(sums, rp, contributions, layout)
    holders = layout.holders()
    extras = sums.release(noise, holders, normalizer)  # noised: released
    flats = {}
    for key, h in holders.items():
        assert h.grad is not None, "the release set every buffer's gradient"
        flats[key] = h.grad
    mean = layout.views(flats)  # noised: the cast to the parameters' dtypes is post-processing
    return {n: m.to(layout.params[n].dtype) for n, m in mean.items()}, extras


def _add_users(
    sums: StepSums, rp: RoundPlan, contributions: Sequence[Contribution], layout: FlatLayout
) -> None:
    """The users' clipped deltas as the step's units: weight 1 each (clipped on the client),
    their norms measured here, the extras' values from the norms the clients reported."""
    keys = list(layout.buffers)
    first = layout.like(keys[0]).device

    sq = {  # ‖Δ̃_u‖² over each buffer's parameters, (U,) float64 on ``first``: sensitive
        k: torch.stack([_sq_norm(c.clipped, names, layout.dtype(k), first) for c in contributions])
        for k, names in layout.buffers.items()
    }
    total = torch.stack(list(sq.values())).sum(0).sqrt()  # ‖Δ̃_u‖, measured here
    reported = Norms(  # ‖Δ_u‖ before clipping, as the clients sent it: the methods' values
        total=torch.tensor([c.norm for c in contributions], dtype=torch.float64),
        per_parameter_sq={},
        clip_groups=(),
    )
    values = {name: spec.values(reported) for name, spec in sums.specs.items() if spec.values}

    def weighted_sums(weight_sets: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
        (weights,) = weight_sets  # DP-FedAvg's extras are values: no weighted deltas besides
        flats = {k: layout.zeros(k) for k in keys}
        views = layout.views(flats)
        for key, names in layout.buffers.items():
            w = weights[key].to(flats[key])
            for u, c in enumerate(contributions):
                for n in names:  # Σ_u w_u Δ̃_u straight into the flat buffer's views
                    views[n].addcmul_(c.clipped[n].detach().to(views[n]), w[u])
        return [flats]

    ones = torch.ones(len(contributions), dtype=torch.float64, device=first)
    try:
        sums.add(
            weighted_sums,
            Norms(total=total, per_parameter_sq=sq, clip_groups=()),
            Clip(weights=ones, sensitivity=rp.clip),
            values,
            owner=f"the {len(contributions)} users of round {rp.round}",
        )
    except PrivacyRefusal as err:
        worst = int(total.argmax())  # the refusal's path only: which user, for the message
        norm = float(total[worst])
        if norm <= rp.clip:  # the step refused an extra release, not a delta
            raise
        raise PrivacyRefusal(
            f"user {contributions[worst].user}'s delta in round {rp.round} must be clipped "
            f"to C_t = {rp.clip:.6g}, got norm = {norm:.6g}. Clip it on the client with "
            f"dpfy.federated.clip_delta(delta, config['clip']) (the step's check: {err})"
        ) from err


def _sq_norm(
    tensors: Mapping[str, torch.Tensor],
    names: tuple[str, ...],
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """Σ_k ‖t_k‖² over ``names``: a float64 scalar on ``device``, each norm accumulated in
    float64 where its tensor lives (a reply on the host is not copied to the device for it),
    of the tensor as the sum adds it: in the buffer's ``dtype`` (no copy where it is the
    reply's), so no conversion after the check can lengthen it."""
    norms = [
        torch.linalg.vector_norm(tensors[n].detach().to(dtype), dtype=torch.float64).to(device)
        for n in names
    ]
    return torch.stack(norms).square().sum()
