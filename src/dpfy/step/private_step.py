"""The private step, in one place: one logical batch of units in, one noisy release out.

It reads top to bottom like this (docs/architecture.md):

1. plan:      P_t = method.plan(state, StepPlan(t, q, σ, C))      public / released inputs only
2. take:      the physical batch the sampler drew (the loader's cursor); its rows' units
3. norms:     n_u = ‖Σ_{i∈u} ∂ℓ_i/∂θ‖ per unit of privacy (and per parameter)   sensitive
4. clipping:  (w_u, Δ) = method.clipping(...) or the clipping policy; asserted ‖w_u g_u‖ ≤ Δ
5. extras:    v_u = spec.values(norms) per declared release;        asserted ‖v_u‖ ≤ Δ_r
6. sums:      S = Σ_u w_u g_u, R_r = Σ_u v_u, over every physical batch of the logical batch
7. guard:     the ε guard (and each privacy group's) refuses a release that would exceed it
8. noise:     the noise mechanism's generator: S̃ = S + N(0, (σ_t Δ)² I), R̃_r = R_r + noise
9. ledger:    the mechanism's record of this step (:func:`dpfy.privacy.releases.step_releases`)
10. probes:   post-release loss probes at θ + offsets(S̃/b), noised (declared up front)
11. optimizer: p.grad = postprocess(S̃/b); the inner optimizer steps at lr × plan.lr_scale
12. update:   state = method.update(state, StepOutcome(...)) — released values only

Individualized budgets (:mod:`dpfy.step.individual`), data-parallel all-reduce
(:mod:`dpfy.step.distributed`), loss probes (:mod:`dpfy.step.probes`), the sums
(:mod:`dpfy.step.sums`) and the refusals of a misused step (:mod:`dpfy.step.refusals`) are
pieces it calls. :class:`dpfy.optim.DPOptimizer` is only the
torch facade around it.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import torch

from dpfy._require import require
from dpfy.adaptive.base import Method, method_name
from dpfy.buffers import guard_of
from dpfy.clipping import ClippingPolicy
from dpfy.errors import PrivacyRefusal
from dpfy.grads import GradEngine
from dpfy.grads.held import frozen_since
from dpfy.grads.loss_contract import LossContract
from dpfy.noise import NoiseMechanism
from dpfy.privacy import Ledger
from dpfy.sampling import BatchCursor
from dpfy.sampling.sampler import Sampler
from dpfy.step.distributed import Collective
from dpfy.step.guard import EpsilonGuard
from dpfy.step.individual import IndividualBudgets
from dpfy.step.probes import post_release, probe_losses
from dpfy.step.refusals import (
    LossFn,
    checked_plan,
    repeated_step_message,
    require_loss_fn,
    split_batch_refusal,
)
from dpfy.step.sums import (
    StepSums,
    WeightSets,
    contract,
    outcome,
    released_gradient,
    stacked_sum,
)
from dpfy.types import Clip, Norms, ReleaseSpec, StepPlan

__all__ = ["PrivateStep", "require_loss_fn", "split_batch_refusal"]


class PrivateStep:
    """Runs the private step for each batch the private loader yields.

    Attributes:
      ledger: every release so far (one ``record`` per logical batch).
      step_count: logical steps taken.
      method, method_state: the adaptive method (or None) and its state.
      guard: the :class:`~dpfy.step.guard.EpsilonGuard` (horizon and ε cap).
      last_step_info: the last step's plan, plus ``batch_size`` (realized) and
        ``mean_grad_norm_nonprivate``: debug statistics that are NOT private and are never
        fed back into training.
    """

    def __init__(
        self,
        inner: torch.optim.Optimizer,
        *,
        grads: GradEngine,
        clipping: ClippingPolicy,
        mechanism: NoiseMechanism,
        sampler: Sampler,
        cursor: BatchCursor,
        noise_multiplier: float | None,
        method: Method | None,
        ledger: Ledger,
        guard: EpsilonGuard,
        model: torch.nn.Module,
        loss_fn: LossFn | None = None,
        collective: Collective | None = None,
        individual: IndividualBudgets | None = None,
    ) -> None:
        self.inner, self.grads, self.clipping, self.mechanism = inner, grads, clipping, mechanism
        self.sampler, self.cursor = sampler, cursor

        # the batch guard: every captured layer must hold the rows of the batch just yielded
        def rows() -> int | None:
            if not cursor.pending:
                return None
            assert cursor.indices is not None, "a pending batch has its indices"
            return len(cursor.indices)

        grads.bind_batch(rows)
        # the loss contract, read at the first step (grads/loss_contract.py)
        self.contract: LossContract | None = LossContract(model, rows, grads.loss_reduction)
        self.noise_multiplier, self.method = noise_multiplier, method
        self.method_state = method.init() if method is not None else None
        self.ledger, self.guard = ledger, guard
        self.model, self.loss_fn = model, loss_fn
        self.collective, self.individual = collective, individual
        self.step_count = 0
        self.updated = False  # the last batch taken ended a logical batch
        self.last_step_info: dict[str, Any] = {}
        self.params = dict(grads.named_params)
        self.covered = frozenset(id(p) for p in self.params.values())
        self.clip_groups = tuple(layer.param_names for layer in grads.layers)  # per layer
        self.sums: StepSums | None = None  # sensitive: the logical batch being summed
        self._logical = 0  # cursor.logical of that batch

    # -- 1. plan ------------------------------------------------------------------------------
    def plan(self) -> StepPlan:
        """This step's plan: the run's σ and C, then the method's; checked against ``sets``."""
        t = self.step_count
        self.guard.check_step(t)
        sigma = self.noise_multiplier if self.noise_multiplier is not None else 0.0
        plan = StepPlan(
            step=t,
            sample_rate=self.sampler.sample_rate,
            noise_multiplier=sigma,
            clip=self.clipping.default_clip(),
        )
        if self.method is not None:
            plan = checked_plan(self.method, plan, self.method.plan(self.method_state, plan))
        if plan.noise_multiplier == 0 and self.noise_multiplier != 0:
            raise ValueError(
                f"noise_multiplier must be > 0 at step {t}, got noise_multiplier = 0 from "
                f"{'the method' if self.method is not None else 'no source'}. Pass "
                f"noise_multiplier= or target_epsilon= to make_private, or a method that sets "
                f"σ (noise_multiplier=0 is allowed only when passed explicitly, for debugging)"
            )
        return plan

    # -- 2. take the batch --------------------------------------------------------------------
    def take_batch(self) -> None:
        """Check, accumulate and (at a logical batch's end) release the batch just yielded.

        The loader's position moves (``cursor.pending = 0``) only once the batch is taken: in
        the sum for a physical batch inside a logical one, or recorded in the ledger at its end.
        A batch refused before that is yielded again, so no example is used without a ledger step.
        """
        self.updated = False
        try:
            self._take()
        except Exception:
            self.cursor.discard_pending()  # not taken: the loader yields it again
            raise

    def _take(self) -> None:
        self._refuse_frozen_since()
        self._check_loss_contract()
        pending = self.cursor.pending
        # a batch the private loader did not yield (or yielded for an earlier step) is one
        # whose sampling dpfy did not do: it cannot be accounted
        if pending == 0 and self.cursor.taken:
            raise PrivacyRefusal(repeated_step_message(self.cursor.last))
        require(
            pending >= 1,
            "the batch",
            "not from the private loader",
            "one yielded by the loader make_private returned",
            "Iterate the loader returned by make_private; each of its batches allows one "
            "optimizer.step()",
            error=PrivacyRefusal,
        )
        # Two batches before one step would pair example i of one with example i of the other
        # in the per-sample gradients (sensitivity 2C, not C): refuse.
        require(
            pending == 1,
            "batches per optimizer.step()",
            pending,
            "exactly 1",
            "Call optimizer.step() after every batch of the private loader; to accumulate "
            "gradients over a large logical batch use max_physical_batch_size=",
            error=PrivacyRefusal,
        )
        if self.sums is None:
            plan = self.plan()
            specs = self.method.releases(self.method_state, plan) if self.method is not None else {}
            self._check_specs(specs)
            self.sums = StepSums(plan=plan, specs=dict(specs))
            self._logical = self.cursor.logical
        elif self._logical != self.cursor.logical:
            self._discard()
            raise ValueError(
                "a logical batch must be finished before the next one starts, got a new one "
                "while the previous was cut into physical batches and not all were stepped. "
                "Step on every physical batch of the loader (do not break out mid-batch); "
                "nothing of the unfinished batch was released"
            )
        try:
            self._accumulate(self.sums)
        except Exception:
            self._discard()  # a refused batch poisons its logical step
            raise
        if not self.cursor.last:
            for p in self.params.values():
                p.grad = None
            self.cursor.pending = 0
            return
        sums, self.sums = self.sums, None
        self._release(sums)

    def _refuse_frozen_since(self) -> None:
        """A parameter frozen after ``make_private`` (``requires_grad_(False)``) is refused here,
        at the next step, rather than trained on: the step's layers, clipping groups and ledger
        were built for the parameters trainable at ``make_private``."""
        frozen = frozen_since(self.params)
        if frozen:
            raise PrivacyRefusal(
                f"parameters {frozen} must stay trainable while the model is private, got "
                f"requires_grad_(False) after make_private: the private step covers the "
                f"parameters trainable at make_private and would go on training them. Freeze "
                f"them before make_private (a new private run for the new set of parameters), "
                f"or set requires_grad_(True) again to keep training them; nothing of this step "
                f"was released"
            )

    def _check_loss_contract(self) -> None:
        """At the first step: refuse a loss that is not what the engine reads per example
        (its reduction, an extra term, a divisor that depends on the batch), naming the fix.
        A refused first step is watched again at the next forward, to check the fix."""
        if self.contract is None:
            return
        found = self.contract.problems()
        if found:
            self.contract.rearm()
            raise PrivacyRefusal("; ".join(found) + "; nothing of this step was released")
        self.contract.remove()
        self.contract = None

    def _discard(self) -> None:
        self.sums = None  # sensitive: dropped, nothing released
        self.grads.clear()

    def _check_specs(self, specs: Mapping[str, ReleaseSpec]) -> None:
        """Refuse declared releases the step cannot evaluate correctly (before any sum)."""
        require_loss_fn(specs, self.loss_fn, _name(self.method))
        if not post_release(specs):
            return
        if not self.cursor.last:
            raise split_batch_refusal(_name(self.method))
        if self.method is None or not self.method.implements("postprocess"):
            raise PrivacyRefusal(
                f"a method that declares post-release probes must implement postprocess, got "
                f"method {_name(self.method)!r} which does not: the probes' selection would "
                f"be dropped. Implement postprocess(state, gradient, plan, probed, b)"
            )

    # -- 3–6. norms, clipping, extras, sums ---------------------------------------------------
    def _accumulate(self, sums: StepSums) -> None:
        """Add one physical batch to ``sums``: norms → clipping → extra values → sums."""
        plan, method, state = sums.plan, self.method, self.method_state
        state_guard = guard_of(self.model)
        if state_guard is not None:  # the model's state as the forward left it (buffers/guard.py)
            state_guard.defer = True  # its comparisons on a device: read in check_bound
            state_guard.check_settled()
        unit_of_row = self.sampler.units_of(self.cursor.indices)  # None: each row is a unit
        scale = None  # (U,) what a unit's gradient sum is multiplied by before clipping
        if unit_of_row is not None:
            if self.params:  # the engine's device (the ids are read on the CPU)
                unit_of_row = unit_of_row.to(next(iter(self.params.values())).device)
            unit_scale = getattr(self.sampler.units, "unit_scale", None)  # absent: the sum
            scale = unit_scale(unit_of_row) if unit_scale is not None else None
        if method is not None and method.implements("transform"):
            require(
                unit_of_row is None,
                "the unit of privacy",
                self.sampler.units.name,
                f"one example per row for method {_name(method)!r}",
                "Its per-sample transform acts on rows; group rows into units without it",
            )
            hooks: Any = method  # transform: an optional hook, found by implements()
            per_sample = hooks.transform(state, self.grads.per_sample_grads(), plan)  # sensitive
            sq = {n: g.flatten(1).square().sum(1) for n, g in per_sample.items()}  # (B,) each
            weighted_sums = contract(per_sample)
        else:
            sq = (
                self.grads.per_sample_sq_norms()
                if unit_of_row is None
                else self.grads.per_unit_sq_norms(unit_of_row)
            )  # name -> (U,) sensitive
            weighted_sums = self.grads.weighted_sums_many
        if scale is not None:  # the unit's gradient is s_u Σ_{i∈u} g_i (e.g. a user's mean)
            sq = {n: s * scale.to(s).square() for n, s in sq.items()}
        if unit_of_row is not None:  # Σ_u w_u s_u Σ_{i∈u} g_i = Σ_i w_{u(i)} s_{u(i)} g_i
            weighted_sums = _rows_weighted(weighted_sums, unit_of_row, scale)
        norms = Norms(
            # ‖g_i‖ = sqrt(Σ_k ‖g_ik‖²), one stacked sum. The order of the adds is torch's:
            # for K nonnegative terms any order has relative error ≤ (K − 1)u (Higham, Accuracy
            # and Stability §4.2), the bound the Python loop had; clipping reads this same n_i,
            # so ‖w_i g_i‖ = min(1, C/n_i)·n_i ≤ C up to rounding, checked in StepSums.add
            total=stacked_sum(list(sq.values()), next(iter(sq.values()))).sqrt(),
            per_parameter_sq=sq,
            clip_groups=self.clip_groups,
            indices=self.cursor.indices,
        )  # sensitive
        clip = method.clipping(state, norms, plan) if method is not None else None
        if clip is None:
            weights = self.clipping.weights(
                sq, plan.clip, index=self.cursor.indices, norm=norms.total
            )
            clip = Clip(weights, self.clipping.sensitivity(plan.clip))
        values = {
            name: spec.values(norms) for name, spec in sums.specs.items() if spec.values is not None
        }  # sensitive
        values.update(
            probe_losses(
                sums.specs,
                model=self.model,
                loss_fn=self.loss_fn,
                params=self.params,
                batch=self.cursor.batch,
                rows=norms.total.shape[0],
            )
        )
        owner = (
            f"method {_name(method)!r}"
            if method is not None
            else f"clipping policy {self.clipping.name!r}"
        )
        fractions = None
        if self.individual is not None:
            assert self.cursor.indices is not None, "a batch is being accumulated"
            fractions = self.individual.clip_fractions(self.cursor.indices)
        sums.add(
            weighted_sums,
            norms,
            clip,
            values,
            owner,
            clip_fractions=fractions,
            pending=state_guard.pending if state_guard is not None else None,
        )
        self.grads.clear()
        if state_guard is not None:
            state_guard.forget_settled()  # the loss probes' forwards are the step's own
        del sq, norms, clip, values

    # -- 7–12. guard, noise, ledger, probes, optimizer, update --------------------------------
    def _release(self, sums: StepSums) -> None:
        """Guard, noise, ledger, post-release probes, inner step, method update — in order."""
        self._refuse_uncovered_grads()
        plan = sums.plan
        record = self.mechanism.record_for(plan, sums.specs)
        self.guard.check(self.ledger, record)
        group_releases = (
            self.individual.check(plan, sums.specs, record.sampling)
            if self.individual is not None
            else None
        )
        b = self.sampler.normalizer
        # data-parallel: rank 0 adds the one noise draw; the all-reduce sums the ranks' shares
        noise, reduce = self.mechanism.generator(), None
        if self.collective is not None:
            noise, reduce = self.collective.noise_source(noise), self.collective.sum_
        extras = sums.release(noise, self.params, b, reduce=reduce)
        noisy = released_gradient(self.params)  # the release itself
        record.record(self.ledger)
        if group_releases is not None:
            assert self.individual is not None, "group releases come from the individual budgets"
            self.individual.record(group_releases, record.sampling)
        if self.method is not None:  # post-processing of the released values only
            probed = (
                self._post_release_probes(sums, noisy, noise, reduce)
                if post_release(sums.specs)
                else {}
            )
            extras.update(probed)
            if self.method.implements("postprocess"):
                hooks: Any = self.method  # postprocess: an optional hook, found by implements()
                mapped = hooks.postprocess(self.method_state, dict(noisy), plan, probed, b)
                for n, p in self.params.items():
                    p.grad = mapped[n].to(p.dtype)
        self.cursor.pending = 0  # taken: released and recorded
        state_guard = guard_of(self.model)
        if state_guard is not None:
            state_guard.forget_settled()  # the post-release probes' forwards are the step's
        self._inner_step(plan.lr_scale)
        if self.method is not None:
            self.method_state = self.method.update(
                self.method_state, outcome(sums, extras, b, self.params, noisy)
            )
        clip = plan.clip
        self.last_step_info = {
            "step": plan.step,
            "noise_multiplier": float(plan.noise_multiplier),
            "clip": clip.tolist() if torch.is_tensor(clip) else float(clip),
            "sample_rate": plan.sample_rate,
            "lr_scale": plan.lr_scale,
            "batch_size": sums.rows,
            # a host read of the debug sum, once per logical step (docs/guide/gpu.md)
            "mean_grad_norm_nonprivate": (
                float(sums.norm_sum) / sums.rows if sums.rows else math.nan
            ),
        }
        self.step_count += 1
        self.updated = True

    def _inner_step(self, lr_scale: float) -> None:
        """The inner optimizer's step on the released gradient, at lr × ``lr_scale``."""
        groups = self.inner.param_groups
        lrs = [g["lr"] for g in groups]
        if lr_scale != 1.0:
            for g in groups:
                g["lr"] = g["lr"] * lr_scale
        try:
            self.inner.step()
        finally:
            for g, lr in zip(groups, lrs):
                g["lr"] = lr

    def _post_release_probes(
        self, sums: StepSums, noisy: dict[str, torch.Tensor], noise: Any, reduce: Any
    ) -> dict[str, float]:
        """The post-release probes on this (unsplit) batch at offsets(g̃), noised: released."""
        losses = probe_losses(
            sums.specs,
            model=self.model,
            loss_fn=self.loss_fn,
            params=self.params,
            batch=self.cursor.batch,
            rows=sums.rows,
            released_gradient={n: g.detach().clone() for n, g in noisy.items()},
        )  # sensitive
        self.grads.clear()
        return sums.release_probes(losses, noise, f"method {_name(self.method)!r}", reduce=reduce)

    def _refuse_uncovered_grads(self) -> None:
        """No parameter of the inner optimizer outside the private step may carry a gradient:
        the inner step would apply it raw (a parameter unfrozen after ``make_private``, or one
        added to the inner optimizer directly). Checked before every release."""
        leaked = [
            p
            for g in self.inner.param_groups
            for p in g["params"]
            if id(p) not in self.covered and p.grad is not None
        ]
        if leaked:
            raise PrivacyRefusal(
                f"parameters {self.names_of(leaked)} reach the optimizer with a gradient but "
                f"are not covered by the private step (frozen or absent at make_private): "
                f"their gradient was computed without clipping or noise. Set requires_grad "
                f"before make_private, and zero their .grad"
            )

    def names_of(self, params: list[Any]) -> list[str]:
        """The model's names for ``params`` (``<not in the model>`` for a foreign tensor)."""
        names = {id(p): n for n, p in self.grads.model.named_parameters()}
        return [names.get(id(p), "<not in the model>") for p in params]


def _name(method: Method | None) -> str:
    """:func:`dpfy.adaptive.base.method_name`, or "" for a run without a method."""
    return "" if method is None else method_name(method)


def _rows_weighted(
    weighted_sums: Callable[[WeightSets], WeightSets],
    unit_of_row: torch.Tensor,
    scale: torch.Tensor | None = None,
) -> Callable[[WeightSets], WeightSets]:
    """Weighted sums over rows from per-unit weights: row i takes its unit's weight w_{u(i)}
    (times s_{u(i)}, the unit's scale, when the clipped quantity is s_u Σ_{i∈u} g_i)."""

    def row(w: torch.Tensor) -> torch.Tensor:
        w = w if scale is None else w * scale.to(w)
        return w[unit_of_row]

    def sums(weight_sets: WeightSets) -> WeightSets:
        return weighted_sums([{n: row(w) for n, w in ws.items()} for ws in weight_sets])

    return sums
