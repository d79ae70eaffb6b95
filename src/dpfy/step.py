"""The private step, as pure pieces: what a step releases, and the sums it releases.

One logical step t (DESIGN.md steps 1–3; the optimizer is only the torch facade around this):

1. plan:     P_t = method.plan(state, StepPlan(t, q, σ, C))          public / released inputs
2. norms:    n_i = ‖∂ℓ_i/∂θ‖ (and per parameter)                     (B,)  sensitive
3. clipping: (w_i, Δ) = method.clipping(...) or the clipping policy   assert ‖w_i g_i‖ ≤ Δ
4. extras:   v_i per declared release (values, or weights on g_i)     assert ‖v_i‖ ≤ Δ_r
5. sums:     S = Σ_i w_i g_i, R_r = Σ_i v_i, over every physical batch of the logical batch
6. release:  S̃ = S + N(0, (σ_t Δ)² I), R̃_r = R_r + N(0, std_r²); the ledger records
             :func:`step_releases` (P_t, specs) — the same function calibration uses
6b. post-release probes (specs with callable offsets): ℓ_i at θ + offsets(S̃/b) on the same
             batch, clipped, summed, noised (:meth:`StepSums.release_probes`); the method maps
             the gradient with them (``postprocess_probed``). Declared up front like the rest.
7. update:   p.grad = S̃ / b; the inner optimizer steps; method.update(state, Released(...))

:func:`step_releases` is the one statement of what a step releases. :func:`planned_ledger`
writes, before training, the ledger of a data-independent method's whole run with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

import torch

from dpfy.adaptive.base import Clip, Method, Norms, Released, ReleaseSpec, RunFacts
from dpfy._require import require
from dpfy.errors import PrivacyRefusal
from dpfy.plan import StepPlan
from dpfy.privacy.group_ledger import group_noise_multiplier
from dpfy.privacy.ledger import Ledger, Release

__all__ = ["GRADIENT", "step_releases", "group_step_releases", "planned_ledger", "check_bound",
           "StepSums", "contract", "probe_losses", "post_release", "released"]

GRADIENT = "gradient"
WeightSets = list[dict[str, torch.Tensor]]
WeightedSums = Callable[[WeightSets], WeightSets]
# Relative slack of the per-step sensitivity assertion: float32 norms make min(1, C/n)·n
# exceed C by a few ulps (≈ 1e-7); a method's real excess is far larger.
_SLACK = 1e-5


def step_releases(plan: StepPlan, specs: Mapping[str, ReleaseSpec]) -> tuple[Release, ...]:
    """What one step releases: the gradient sum at σ_t, then each declared extra release.

    The optimizer records exactly this in the ledger, the budget guard checks it, and
    calibration writes it for every planned step: there is no second formula.
    """
    out = [Release(GRADIENT, float(plan.noise_multiplier))]
    for name, spec in specs.items():
        if name == GRADIENT:
            raise ValueError(f"an extra release name must not be {GRADIENT!r}, got "
                             f"{GRADIENT!r}. Name the release after what it holds")
        out.append(Release(name, spec.noise_multiplier))
    return tuple(out)


def group_step_releases(plan: StepPlan, specs: Mapping[str, ReleaseSpec],
                        clip_fractions: Sequence[float]) -> list[tuple[Release, ...]]:
    """What one step releases as seen by each privacy group (individualized privacy).

    Group p's examples are clipped to f_p·Δ (``clip_fractions[p]``), so the gradient sum's noise
    σ_t·Δ is σ_t / f_p relative to their sensitivity (:func:`dpfy.privacy.group_ledger
    .group_noise_multiplier`); extra releases have one sensitivity for everyone and stay as
    they are. This is :func:`step_releases` at the group's σ: the optimizer records it in each
    group's ledger and ``dpfy.privacy.calibrate_individual`` writes it for every planned step.
    """
    return [step_releases(replace(plan, noise_multiplier=group_noise_multiplier(
        plan.noise_multiplier, f)), specs) for f in clip_fractions]


def base_plan(facts: RunFacts, step: int, noise_multiplier: float,
              clip: float | torch.Tensor) -> StepPlan:
    """The plan before any method changes it: the sampler's q, the run's σ and C."""
    return StepPlan(step=step, sample_rate=facts.sample_rate, noise_multiplier=noise_multiplier,
                    clip=clip)


def planned_ledger(method: Method, facts: RunFacts, *, noise_multiplier: float = 0.0,
                   clip: float | torch.Tensor = 1.0, steps: int | None = None) -> Ledger:
    """The ledger a run of ``method`` under ``facts`` will write, built before training.

    Only for data-independent methods (their plans and release specs depend on the step
    alone); others raise, naming the budget guard as the alternative (STYLE.md R9).
    """
    if not method.is_data_independent():
        raise ValueError(
            f"method must be data-independent to write its ledger in advance, got method = "
            f"{method.registry_name or type(method).__name__} (it adapts to released values). "
            f"Give its noise explicitly and let the budget guard (target_epsilon= or "
            f"epsilon_cap=) stop training at the target")
    steps = facts.steps if steps is None else steps
    if steps is None:
        raise ValueError("steps must be known to write a run's ledger, got steps = None. "
                         "Pass epochs= or max_steps= to make_private")
    state = method.init()
    ledger = Ledger(dataset_size=facts.dataset_size)
    for t in range(steps):
        plan = method.plan(state, base_plan(facts, t, noise_multiplier, clip))
        ledger.record_step(sampling=facts.sampling, sample_rate=facts.sample_rate,
                           releases=step_releases(plan, method.releases(state, plan)))
    return ledger


def post_release(specs: Mapping[str, ReleaseSpec]) -> list[str]:
    """Names of the post-release probes among ``specs`` (offsets a function of the released
    gradient): evaluated after the gradient's noise, on the same batch."""
    return [name for name, spec in specs.items() if spec.after_release]


def check_bound(sq_contrib: torch.Tensor, bound: float, *, what: str, owner: str) -> None:
    """Refuse unless every example's contribution has L2 norm ≤ ``bound``.

    ``sq_contrib`` is ‖contribution_i‖², (B,), sensitive. Costs one max over B values.
    """
    if sq_contrib.numel() == 0:
        return
    worst = float(sq_contrib.max().sqrt())
    if not math.isfinite(worst):
        raise PrivacyRefusal(
            f"{what} got an example's contribution of norm {worst} from {owner}: the "
            f"per-example gradients or weights are not finite, usually because the model "
            f"diverged (a learning rate too large) or a layer produced NaN/inf. Lower the "
            f"learning rate or fix the model (nothing of this step was released)")
    if not worst <= bound * (1 + _SLACK):
        raise PrivacyRefusal(
            f"{what} must have every example's contribution within its declared sensitivity "
            f"{bound:.6g}, got a contribution of norm {worst:.6g} from {owner}. The ledger "
            f"would under-count this release: fix the method's weights or declare the true "
            f"sensitivity (nothing of this step was released)")


@dataclass
class StepSums:
    """The sensitive sums of one logical step, accumulated over its physical batches.

    Discard (drop the object) if the step is abandoned; nothing in it is released until
    :meth:`release`.
    """

    plan: StepPlan
    specs: Mapping[str, ReleaseSpec]
    sensitivity: float | None = None                           # Δ of the gradient sum
    gradient: dict[str, torch.Tensor] | None = None            # sensitive: Σ w_i g_i
    extras: dict[str, torch.Tensor] = field(default_factory=dict)  # sensitive: Σ v_i
    rows: int = 0
    norm_sum: float = 0.0                                      # debug only, NOT private

    def add(self, weighted_sums: WeightedSums, norms: Norms, clip: Clip,
            values: Mapping[str, torch.Tensor], owner: str,
            clip_fractions: torch.Tensor | None = None) -> None:
        """Add one physical batch: check every bound, then form and add the weighted sums.

        ``weighted_sums`` maps weight sets [{name: (B,)}, ...] to their sums Σ_i w_i g_i
        (the engine's book-keeping, or a contraction of materialized per-sample gradients).
        ``clip_fractions`` (B,), public: each example's share f_i of Δ under individualized
        thresholds; its contribution is then checked against f_i·Δ (its group's sensitivity).
        """
        names = list(norms.per_parameter_sq)
        w = clip.weights
        weights = {n: w for n in names} if torch.is_tensor(w) else dict(w)
        if set(weights) != set(names):
            raise PrivacyRefusal(f"clipping weights must cover every trainable parameter, got "
                                 f"{sorted(set(names) ^ set(weights))} from {owner}. Return "
                                 f"one (B,) tensor or one per parameter")
        if self.sensitivity is None:
            self.sensitivity = clip.sensitivity
        elif clip.sensitivity != self.sensitivity:
            raise PrivacyRefusal(f"the clipping sensitivity must be the same for every physical "
                                 f"batch of a step, got {clip.sensitivity} after "
                                 f"{self.sensitivity} from {owner}")
        if torch.is_tensor(w):   # one weight per example: ‖w_i g_i‖ = |w_i|·‖g_i‖
            contrib = (w * norms.total).square()                                   # (B,)
        else:                    # per parameter: ‖Σ_k w_ik g_ik‖² = Σ_k w_ik² ‖g_ik‖²
            contrib = sum(weights[n].square() * norms.per_parameter_sq[n] for n in names)
        check_bound(contrib if names else norms.total.new_zeros(0), clip.sensitivity,
                    what="the clipped gradient sum", owner=owner)
        if clip_fractions is not None and names:   # ‖w_i g_i‖ ≤ f_i·Δ ⇔ ‖w_i g_i‖/f_i ≤ Δ
            check_bound(contrib / clip_fractions.to(contrib).square(), clip.sensitivity,
                        what="the clipped gradient sum (relative to each example's group "
                             "threshold)", owner=owner)
        extra_weights: list[dict[str, torch.Tensor]] = []
        extra_names: list[str] = []
        for name, spec in self.specs.items():
            if spec.after_release:   # evaluated after the release: release_probes()
                continue
            if name not in values:
                raise PrivacyRefusal(f"release_values must give a value for every declared "
                                     f"release, got none for {name!r} from {owner}")
            v = values[name]                                      # sensitive
            if spec.kind == "gradient":  # parameter-shaped: weights on the per-sample gradients
                v = v.to(norms.total.dtype)  # the sums (and their noise) in the gradients' dtype
                check_bound(v.square() * norms.total.square(), spec.sensitivity,
                            what=f"release {name!r}", owner=owner)
                extra_weights.append({n: v for n in names})
                extra_names.append(name)
            else:
                self._add_extra(name, _checked_sum(name, spec, v, owner))
        unexpected = sorted(set(values) - {n for n, s in self.specs.items()
                                           if not s.after_release})
        if unexpected:
            raise PrivacyRefusal(f"release_values must only give declared releases, got "
                                 f"{unexpected} from {owner}. Declare them in releases()")
        sums = weighted_sums([weights] + extra_weights)  # sensitive
        self._add_gradient(sums[0])
        for name, s in zip(extra_names, sums[1:]):
            self._add_extra(name, s)
        self.rows += int(norms.total.shape[0])
        self.norm_sum += float(norms.total.sum())

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

    def release(self, noise: Any, params: Mapping[str, torch.nn.Parameter], normalizer: float,
                reduce: Callable[[list[torch.Tensor]], None] | None = None) -> dict[str, Any]:
        """Noise every sum once; set ``p.grad`` = S̃/b; return the released extras.

        One parameter at a time, so peak memory stays Σθ + max θ. ``reduce`` (data-parallel
        training, :mod:`dpfy.distributed`) sums the noised tensors over the ranks in place
        before anything is returned: each rank's ``noise`` then holds its share of the one
        Gaussian draw (rank 0 the whole draw, the others none).
        """
        std = float(self.plan.noise_multiplier) * float(self.sensitivity or 0.0)
        for n, p in params.items():
            total = self.gradient.pop(n) if self.gradient is not None else torch.zeros_like(p)
            p.grad = noise.noisy_mean(total, std, normalizer).to(p.dtype)  # released
        out: dict[str, Any] = {}
        for name, spec in self.specs.items():
            if spec.after_release:   # noised by release_probes(), once they are evaluated
                continue
            total = self.extras.pop(name, None)
            if isinstance(total, dict):      # parameter-shaped
                out[name] = {n: noise.add_gaussian_(t.clone(), spec.noise_std)
                             for n, t in total.items()}
                continue
            t = torch.as_tensor(0.0 if total is None else total, dtype=torch.float64)
            out[name] = noise.add_gaussian_(t.reshape(-1).clone(), spec.noise_std
                                            ).reshape(t.shape)
        if reduce is not None:
            reduce([p.grad for p in params.values()] + [
                t for v in out.values() for t in (v.values() if isinstance(v, dict) else [v])])
        return {name: float(v) if torch.is_tensor(v) and v.dim() == 0 else v
                for name, v in out.items()}

    def release_probes(self, values: Mapping[str, torch.Tensor], noise: Any, owner: str,
                       reduce: Callable[[list[torch.Tensor]], None] | None = None
                       ) -> dict[str, float]:
        """Check, sum and noise the post-release probes' per-example losses (B,) each, once.

        Called after :meth:`release`, on the same (whole, unsplit) batch; ``values`` must hold
        exactly the post-release probes. Returns their noisy sums (released).
        """
        names = post_release(self.specs)
        require(sorted(values) == sorted(names), "post-release probe values", sorted(values),
                f"exactly the declared post-release probes {sorted(names)}")
        out = {name: noise.add_gaussian_(_checked_sum(name, self.specs[name], values[name],
                                                      owner).reshape(-1).clone(),
                                         self.specs[name].noise_std)
               for name in names}
        if reduce is not None:
            reduce(list(out.values()))
        return {name: float(v.reshape(())) for name, v in out.items()}


def _checked_sum(name: str, spec: ReleaseSpec, v: torch.Tensor, owner: str) -> torch.Tensor:
    """Σ_i v_i of a scalar- or vector-valued release, after asserting ‖v_i‖ ≤ Δ (sensitive)."""
    rows = v.reshape(v.shape[0], -1) if v.dim() else v.reshape(1, 1)
    check_bound(rows.double().square().sum(1), spec.sensitivity, what=f"release {name!r}",
                owner=owner)
    return v.double().sum(0)


def contract(per_sample: Mapping[str, torch.Tensor]) -> WeightedSums:
    """Σ_i w_i g_i over materialized per-sample gradients {name: (B, *θ)} (sensitive)."""
    def sums(weight_sets: WeightSets) -> WeightSets:
        return [{n: torch.einsum("b,b...->...", ws[n].to(g.dtype), g)
                 for n, g in per_sample.items()} for ws in weight_sets]
    return sums


def probe_losses(specs: Mapping[str, ReleaseSpec], *, model: torch.nn.Module | None,
                 loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor] | None,
                 params: Mapping[str, torch.nn.Parameter], batch: Any, rows: int,
                 released_gradient: Mapping[str, torch.Tensor] | None = None
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
    require(loss_fn is not None, "loss_fn", None, "given for loss probes",
            "Pass make_private(..., loss_fn=fn) with fn(model, batch) -> (B,) losses")
    out: dict[str, torch.Tensor] = {}
    for name, spec in probes.items():
        offsets = spec.offsets(released_gradient) if after else spec.offsets
        unknown = sorted(set(offsets) - set(params))
        require(not unknown, f"offsets of probe {name!r}", unknown,
                "names of trainable parameters")
        saved = {n: params[n].data for n in offsets}
        try:
            for n, d in offsets.items():
                params[n].data = saved[n] + d.to(saved[n])
            losses = torch.as_tensor(loss_fn(model, batch))                 # (B,) sensitive
        finally:
            for n, t in saved.items():
                params[n].data = t
        require(losses.shape == (rows,), f"loss_fn output for probe {name!r}",
                tuple(losses.shape), f"one loss per example, shape ({rows},)",
                "Return per-example losses (reduction='none')")
        require(bool(torch.isfinite(losses).all()), f"loss_fn output for probe {name!r}",
                "non-finite", "finite", "Clip or fix the loss")
        out[name] = losses.double().clamp(-spec.sensitivity, spec.sensitivity)
    return out


def released(sums: StepSums, extras: Mapping[str, Any], normalizer: float,
             params: Mapping[str, torch.nn.Parameter],
             noisy: Mapping[str, torch.Tensor] | None = None) -> Released:
    """What ``method.update`` reads: the plan, the released gradient (as released, ``noisy``,
    and as the optimizer stepped on it after ``postprocess``), the extras and the parameters."""
    gradient = {n: p.grad for n, p in params.items()}
    return Released(plan=sums.plan, expected_batch_size=normalizer, sums=dict(extras),
                    gradient=gradient, noisy_gradient=dict(noisy or gradient),
                    parameters={n: p.detach() for n, p in params.items()})

