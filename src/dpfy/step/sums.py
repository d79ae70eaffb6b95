"""The sensitive sums of one logical step, with the per-unit bound checks that guard them.

:class:`StepSums` accumulates Σ_u w_u g_u and each declared extra release over the physical
batches of a logical batch, asserting every unit's contribution against its declared
sensitivity (:func:`check_bound`) before it is added, and noises each sum once at the release.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from dpfy._deferred import PendingChecks
from dpfy._require import require
from dpfy.errors import PrivacyRefusal
from dpfy.grads.arithmetic import in_full_precision
from dpfy.noise import NoiseSource
from dpfy.noise.release import noisy_means
from dpfy.noise.triton_noise import FUSED_DTYPES
from dpfy.step.probes import post_release
from dpfy.types import Clip, Norms, ReleaseSpec, StepOutcome, StepPlan

__all__ = [
    "StepSums",
    "check_bound",
    "contract",
    "outcome",
    "release_into_grads",
    "released_gradient",
    "stacked_sum",
]

WeightSets = list[dict[str, torch.Tensor]]
WeightedSums = Callable[[WeightSets], WeightSets]
# Relative slack of the per-step sensitivity assertion: float32 norms make min(1, C/n)·n
# exceed C by a few ulps (≈ 1e-7); a method's real excess is far larger.
_SLACK = 1e-5


def check_bound(
    sq_contrib: torch.Tensor,
    bound: float,
    *,
    what: str,
    owner: str,
    pending: PendingChecks | None = None,
) -> None:
    """Refuse unless every example's contribution has L2 norm ≤ ``bound``.

    ``sq_contrib`` is ‖contribution_i‖², (B,), sensitive. Costs one max over B values and one
    host read, which also reads ``pending`` (the model-state guard's comparisons left on the
    device, :mod:`dpfy._deferred`) and refuses a change they found first.
    """
    flags = pending.tensors() if pending is not None else []
    if sq_contrib.numel() == 0 or any(f.device != sq_contrib.device for f in flags):
        if pending is not None:
            pending.flush()
        if sq_contrib.numel() == 0:
            return
        flags = []
    top = sq_contrib.max().sqrt()
    if flags:
        assert pending is not None, "flags come from pending"
        read = torch.cat([top.reshape(1), *flags]).tolist()  # one host read for both
        pending.settle(read[1:])
        worst = float(read[0])
    else:
        worst = float(top)
    if not math.isfinite(worst):
        raise PrivacyRefusal(
            f"{what} got an example's contribution of norm {worst} from {owner}: the "
            f"per-example gradients or weights are not finite, usually because the model "
            f"diverged (a learning rate too large) or a layer produced NaN/inf. Lower the "
            f"learning rate or fix the model (nothing of this step was released)"
        )
    if not worst <= bound * (1 + _SLACK):
        raise PrivacyRefusal(
            f"{what} must have every example's contribution within its declared sensitivity "
            f"{bound:.6g}, got a contribution of norm {worst:.6g} from {owner}. The ledger "
            f"would under-count this release: fix the method's weights or declare the true "
            f"sensitivity (nothing of this step was released)"
        )


@dataclass
class StepSums:
    """The sensitive sums of one logical step, accumulated over its physical batches.

    Discard (drop the object) if the step is abandoned; nothing in it is released until
    :meth:`release`.
    """

    plan: StepPlan
    specs: Mapping[str, ReleaseSpec]
    sensitivity: float | None = None  # Δ of the gradient sum
    gradient: dict[str, torch.Tensor] | None = None  # sensitive: Σ w_i g_i
    extras: dict[str, Any] = field(default_factory=dict)  # sensitive: Σ v_i ({name: Σ}: shaped)
    rows: int = 0
    # debug only, NOT private: Σ of the rows' norms, kept on the norms' device (adding it is no
    # host synchronization); the step reads it once, at the release
    norm_sum: float | torch.Tensor = 0.0

    def add(
        self,
        weighted_sums: WeightedSums,
        norms: Norms,
        clip: Clip,
        values: Mapping[str, torch.Tensor],
        owner: str,
        clip_fractions: torch.Tensor | None = None,
        pending: PendingChecks | None = None,
    ) -> None:
        """Add one physical batch: check every bound, then form and add the weighted sums.

        ``weighted_sums`` maps weight sets [{name: (B,)}, ...] to their sums Σ_i w_i g_i
        (the engine's book-keeping, or a contraction of materialized per-sample gradients).
        ``clip_fractions`` (B,), public: each example's share f_i of Δ under individualized
        thresholds; its contribution is then checked against f_i·Δ (its group's sensitivity).
        ``pending``: the model-state guard's comparisons, read with the first bound's check.
        """
        names = list(norms.per_parameter_sq)
        w = clip.weights
        weights = {n: w for n in names} if torch.is_tensor(w) else dict(w)
        if set(weights) != set(names):
            raise PrivacyRefusal(
                f"clipping weights must cover every trainable parameter, got "
                f"{sorted(set(names) ^ set(weights))} from {owner}. Return "
                f"one (B,) tensor or one per parameter"
            )
        if self.sensitivity is None:
            self.sensitivity = clip.sensitivity
        elif clip.sensitivity != self.sensitivity:
            raise PrivacyRefusal(
                f"the clipping sensitivity must be the same for every physical "
                f"batch of a step, got {clip.sensitivity} after "
                f"{self.sensitivity} from {owner}"
            )
        one = w if torch.is_tensor(w) else _one_weight(weights)
        if one is not None:  # one weight per example: ‖w_i g_i‖ = |w_i|·‖g_i‖
            contrib = (one * norms.total).square()  # (B,)
        else:  # per parameter: ‖Σ_k w_ik g_ik‖² = Σ_k w_ik² ‖g_ik‖², stacked: one sum
            contrib = stacked_sum(
                [weights[n].square() * norms.per_parameter_sq[n] for n in names], norms.total
            )
        check_bound(
            contrib if names else norms.total.new_zeros(0),
            clip.sensitivity,
            what="the clipped gradient sum",
            owner=owner,
            pending=pending,
        )
        if clip_fractions is not None and names:  # ‖w_i g_i‖ ≤ f_i·Δ ⇔ ‖w_i g_i‖/f_i ≤ Δ
            check_bound(
                contrib / clip_fractions.to(contrib).square(),
                clip.sensitivity,
                what="the clipped gradient sum (relative to each example's group threshold)",
                owner=owner,
            )
        extra_weights: list[dict[str, torch.Tensor]] = []
        extra_names: list[str] = []
        for name, spec in self.specs.items():
            if spec.after_release:  # evaluated after the release: release_probes()
                continue
            if name not in values:
                raise PrivacyRefusal(
                    f"every declared release must have per-unit values (its "
                    f"spec's values(norms)), got none for {name!r} from "
                    f"{owner}"
                )
            v = values[name]  # sensitive
            if spec.kind == "gradient":  # parameter-shaped: weights on the per-sample gradients
                v = v.to(norms.total.dtype)  # the sums (and their noise) in the gradients' dtype
                check_bound(
                    v.square() * norms.total.square(),
                    spec.sensitivity,
                    what=f"release {name!r}",
                    owner=owner,
                )
                extra_weights.append({n: v for n in names})
                extra_names.append(name)
            else:
                self._add_extra(name, _checked_sum(name, spec, v, owner))
        unexpected = sorted(set(values) - {n for n, s in self.specs.items() if not s.after_release})
        if unexpected:
            raise PrivacyRefusal(
                f"per-unit values must belong to declared releases, got "
                f"{unexpected} from {owner}. Declare them in releases()"
            )
        sums = weighted_sums([weights] + extra_weights)  # sensitive
        self._add_gradient(sums[0])
        for name, s in zip(extra_names, sums[1:]):
            self._add_extra(name, s)
        self.rows += int(norms.total.shape[0])
        self.norm_sum = self.norm_sum + norms.total.detach().sum()

    def _add_gradient(self, sums: dict[str, torch.Tensor]) -> None:
        if self.gradient is None:
            self.gradient = sums
        else:
            for n, s in sums.items():
                self.gradient[n].add_(s)

    def _add_extra(self, name: str, total: Any) -> None:
        prev = self.extras.get(name)
        if prev is None:
            self.extras[name] = total
        elif isinstance(total, dict):
            for n, s in total.items():
                prev[n].add_(s)
        else:
            self.extras[name] = prev + total

    def release(
        self,
        noise: Any,
        params: Mapping[str, torch.nn.Parameter],
        normalizer: float,
        reduce: Callable[[list[torch.Tensor]], None] | None = None,
    ) -> dict[str, Any]:
        """Noise every sum once; set ``p.grad`` = S̃/b; return the released extras.

        One parameter at a time, so peak memory stays Σθ + max θ. ``reduce`` (data-parallel
        training, :mod:`dpfy.step.distributed`) sums the noised tensors over the ranks in place
        before anything is returned: each rank's ``noise`` then holds its share of the one
        Gaussian draw (rank 0 the whole draw, the others none).
        """
        std = float(self.plan.noise_multiplier) * float(self.sensitivity or 0.0)
        totals = [
            self.gradient.pop(n) if self.gradient is not None else torch.zeros_like(p)
            for n, p in params.items()
        ]  # sensitive
        released = release_into_grads(noise, totals, list(params.values()), std, normalizer)
        del totals
        out: dict[str, Any] = {}
        for name, spec in self.specs.items():
            if spec.after_release:  # noised by release_probes(), once they are evaluated
                continue
            total = self.extras.pop(name, None)
            if isinstance(total, dict):  # parameter-shaped
                out[name] = {
                    n: noise.add_gaussian_(t.clone(), spec.noise_std) for n, t in total.items()
                }
                continue
            where = total.device if torch.is_tensor(total) else torch.device("cpu")
            t = torch.as_tensor(0.0 if total is None else total, dtype=torch.float64, device=where)
            out[name] = noise.add_gaussian_(t.reshape(-1).clone(), spec.noise_std).reshape(t.shape)
        if reduce is not None:
            reduce(
                released
                + [t for v in out.values() for t in (v.values() if isinstance(v, dict) else [v])]
            )
        return {
            name: float(v) if torch.is_tensor(v) and v.dim() == 0 else v for name, v in out.items()
        }

    def release_probes(
        self,
        values: Mapping[str, torch.Tensor],
        noise: Any,
        owner: str,
        reduce: Callable[[list[torch.Tensor]], None] | None = None,
    ) -> dict[str, float]:
        """Check, sum and noise the post-release probes' per-example losses (B,) each, once.

        Called after :meth:`release`, on the same (whole, unsplit) batch; ``values`` must hold
        exactly the post-release probes. Returns their noisy sums (released).
        """
        names = post_release(self.specs)
        require(
            sorted(values) == sorted(names),
            "post-release probe values",
            sorted(values),
            f"exactly the declared post-release probes {sorted(names)}",
        )
        out = {
            name: noise.add_gaussian_(
                _checked_sum(name, self.specs[name], values[name], owner).reshape(-1).clone(),
                self.specs[name].noise_std,
            )
            for name in names
        }
        if reduce is not None:
            reduce(list(out.values()))
        return {name: float(v.reshape(())) for name, v in out.items()}


def _one_weight(weights: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
    """The weight tensor when every parameter has the same one (flat clipping), else None."""
    first = next(iter(weights.values()), None)
    return first if first is not None and all(w is first for w in weights.values()) else None


def stacked_sum(terms: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """Σ_k terms[k], (B,) each: one stacked sum where the dtypes agree (two ops, not K)."""
    if not terms:
        return like.new_zeros(0)
    if len(terms) > 1 and all(t.dtype == terms[0].dtype for t in terms):
        return torch.stack(terms).sum(0)
    return sum(terms[1:], start=terms[0])


def release_into_grads(
    noise: Any,
    totals: list[torch.Tensor],
    params: list[torch.nn.Parameter],
    std: float,
    normalizer: float,
) -> list[torch.Tensor]:
    """Set every ``p.grad`` = (S + N(0, std² I))/b from its sum S (sensitive); the released
    gradients. The noise of each parameter tensor is what one call of the generator per
    tensor, in the parameters' order, draws (a call's last block is not carried over), so a
    seeded run's noise, and its parameters, stay the same; on a device one call serves a group
    of tensors (:func:`dpfy.noise.release.noisy_means`; torch's CUDA Philox generator, which
    offsets each call by its own rule, then draws other noise than one call per tensor would).
    Where the fused Triton kernel draws the noise (a GPU), the sums are laid out in one flat
    buffer and the whole step's noise is one launch; each ``p.grad`` is then a view of that
    buffer."""
    out = []
    if _one_launch(noise, totals):
        flat = torch.cat([t.reshape(-1) for t in totals])  # (Σ numel,) sensitive until noised
        noise.noisy_mean(flat, std, normalizer)  # released
        for part, p in zip(flat.split([t.numel() for t in totals]), params):
            p.grad = grad = part.view_as(p).to(p.dtype)
            out.append(grad)
        return out
    if isinstance(noise, NoiseSource):  # the same draws, the arithmetic as foreach ops
        totals = noisy_means(noise, totals, std, normalizer)  # released
    else:  # a mechanism with state per call (correlated noise): one call per tensor
        totals = [noise.noisy_mean(total, std, normalizer) for total in totals]  # released
    for total, p in zip(totals, params):
        p.grad = grad = total.to(p.dtype)
        out.append(grad)
    return out


def _one_launch(noise: Any, totals: list[torch.Tensor]) -> bool:
    """Whether one fused launch can noise every sum: an independent Gaussian source whose Triton
    kernel serves the sums' one device and dtype. A correlated mechanism keeps state per
    parameter, and the CPU's compiled sampler is already one pass per tensor: one call each."""
    if not totals or not isinstance(noise, NoiseSource):
        return False
    device, dtype = totals[0].device, totals[0].dtype
    same = all(t.device == device and t.dtype == dtype for t in totals)
    return same and dtype in FUSED_DTYPES and noise.generator_for(device).startswith("triton")


def _checked_sum(name: str, spec: ReleaseSpec, v: torch.Tensor, owner: str) -> torch.Tensor:
    """Σ_i v_i of a scalar- or vector-valued release, after asserting ‖v_i‖ ≤ Δ (sensitive)."""
    rows = v.reshape(v.shape[0], -1) if v.dim() else v.reshape(1, 1)
    check_bound(
        rows.double().square().sum(1), spec.sensitivity, what=f"release {name!r}", owner=owner
    )
    return v.double().sum(0)


def contract(per_sample: Mapping[str, torch.Tensor]) -> WeightedSums:
    """Σ_i w_i g_i over materialized per-sample gradients {name: (B, *θ)} (sensitive), in full
    float32 as the clip factors' norms (a matrix product: TF32 on a GPU would let a clipped
    contribution exceed C by its rounding; ``dpfy.grads.arithmetic``, point 2)."""

    @in_full_precision
    def sums(weight_sets: WeightSets) -> WeightSets:
        return [
            {n: torch.einsum("b,b...->...", ws[n].to(g.dtype), g) for n, g in per_sample.items()}
            for ws in weight_sets
        ]

    return sums


def released_gradient(params: Mapping[str, torch.nn.Parameter]) -> dict[str, torch.Tensor]:
    """{name: p.grad} after :meth:`StepSums.release` set every parameter's gradient."""
    out: dict[str, torch.Tensor] = {}
    for n, p in params.items():
        assert p.grad is not None, f"the release set {n}'s gradient"
        out[n] = p.grad
    return out


def outcome(
    sums: StepSums,
    extras: Mapping[str, Any],
    normalizer: float,
    params: Mapping[str, torch.nn.Parameter],
    noisy: Mapping[str, torch.Tensor] | None = None,
) -> StepOutcome:
    """What ``method.update`` reads: the plan, the released gradient (as released, ``noisy``,
    and as the optimizer stepped on it after ``postprocess``), the extras and the parameters."""
    gradient = released_gradient(params)
    return StepOutcome(
        plan=sums.plan,
        expected_batch_size=normalizer,
        sums=dict(extras),
        gradient=gradient,
        noisy_gradient=dict(noisy or gradient),
        parameters={n: p.detach() for n, p in params.items()},
    )
