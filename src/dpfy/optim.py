"""The private optimizer: the torch facade around the private step (``dpfy.step``).

It keeps the ``torch.optim.Optimizer`` surface (param_groups, zero_grad, step, state_dict) and
drives one logical step per batch of the private loader: plan → norms → clipping → extra
values → sums (over the physical batches of a logical batch) → budget guard → release (noise,
ledger) → inner optimizer step → ``method.update``. See :mod:`dpfy.step` for the step on one
screen, :mod:`dpfy.step.guard` for the guard and :mod:`dpfy.adaptive.base` for the method interface.

So with SGD(lr=1), no momentum and σ = 0 a step moves θ by exactly −Σ_i clip(g_i)/b.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, Callable

import torch

from dpfy._require import require
from dpfy.types import Clip, Norms
from dpfy.adaptive.base import Method
from dpfy.step.guard import BudgetGuard, GroupBudgetGuard
from dpfy.clipping import ClippingPolicy, total_norm
from dpfy.step.distributed import Collective
from dpfy.errors import PrivacyRefusal
from dpfy.grads import GradEngine
from dpfy.noise import NoiseSource
from dpfy.types.plan import StepPlan
from dpfy.privacy import Ledger, epsilon as ledger_epsilon
from dpfy.privacy.group_ledger import GroupLedgers
from dpfy.sampling import BatchCursor, PoissonSampler, ShuffleSampler
from dpfy.step.sums import StepSums, contract, outcome as released
from dpfy.privacy.releases import group_step_releases, step_releases
from dpfy.step.probes import post_release, probe_losses

__all__ = ["DPOptimizer"]

FORMAT = "dpfy-optimizer/2"


class DPOptimizer(torch.optim.Optimizer):
    """A private view of ``optimizer``; build it with :func:`dpfy.make_private`.

    Attributes:
      ledger: every release so far (one ``record_step`` per logical batch).
      step_count: logical steps taken.
      updated: whether the last ``step()`` call was a real update (it ended a logical batch:
        noise added, ledger step recorded, inner optimizer stepped). With
        ``max_physical_batch_size`` the loader yields several physical batches per update;
        step a per-update LR scheduler only ``if optimizer.updated``.
      collective: the data-parallel ranks (:mod:`dpfy.step.distributed`), or None.
      method, method_state: the adaptive method (or None) and its state.
      budget: the :class:`dpfy.step.guard.BudgetGuard` (``max_steps`` and ``epsilon_cap`` are
        shortcuts to it).
      last_step_info: ``step, noise_multiplier, clip, sample_rate, lr_scale`` of the last step,
        plus ``batch_size`` (the realized size) and ``mean_grad_norm_nonprivate`` (the mean raw
        per-sample gradient norm): debug statistics that are NOT private and are never fed back
        into training.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, grads: GradEngine,
                 clipping: ClippingPolicy, noise: NoiseSource,
                 sampler: PoissonSampler | ShuffleSampler, cursor: BatchCursor,
                 noise_multiplier: float | None, method: Method | None,
                 ledger: Ledger, accountant: str, seed: int | None, budget: BudgetGuard,
                 model: torch.nn.Module | None = None,
                 loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor] | None = None,
                 collective: Collective | None = None,
                 groups: GroupLedgers | None = None,
                 group_budget: GroupBudgetGuard | None = None,
                 group_of: torch.Tensor | None = None) -> None:
        # Not calling Optimizer.__init__: parameter groups and state are the inner optimizer's.
        self.original_optimizer = optimizer
        for hooks in ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks",
                      "_optimizer_state_dict_pre_hooks", "_optimizer_state_dict_post_hooks",
                      "_optimizer_load_state_dict_pre_hooks",
                      "_optimizer_load_state_dict_post_hooks"):
            setattr(self, hooks, OrderedDict())
        self.grads, self.clipping, self.noise = grads, clipping, noise
        self.sampler, self.cursor = sampler, cursor
        # the batch guard: every captured layer must hold the rows of the batch just yielded
        grads.bind_batch(lambda: len(cursor.indices) if cursor.pending else None)
        self.noise_multiplier, self.method = noise_multiplier, method
        self.method_state = method.init() if method is not None else None
        self.ledger, self.accountant, self.seed, self.budget = ledger, accountant, seed, budget
        self.model, self.loss_fn = model, loss_fn
        self.collective = collective  # data-parallel ranks (dpfy.step.distributed), or None
        self.updated = False          # the last step() call ended a logical batch
        # Individualized budgets: one ledger and one ε cap per privacy group; group_of (N,) is
        # each example's group index (public: the budget assignment is not private data).
        self.groups, self.group_budget, self.group_of = groups, group_budget, group_of
        self.step_count = 0
        self.last_step_info: dict[str, Any] = {}
        self._params = dict(grads.named_params)
        self._covered = frozenset(id(p) for p in self._params.values())  # the private step's
        self._groups = tuple(tuple(u.qualified(r) for r in u.params) for u in grads.units)
        self._sums: StepSums | None = None      # sensitive: the logical batch being summed
        self._logical = 0                       # cursor.logical of that batch

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
            f"add_param_group after make_private: {self._names_of(params) or 'parameters'} "
            f"would be trained on their raw gradient, without clipping or noise. Set "
            f"requires_grad and build the optimizer over every parameter to train before "
            f"calling make_private (a new private run for a new set of parameters)")

    def _names_of(self, params: list[Any]) -> list[str]:
        """The model's names for ``params`` (``<not in the model>`` for a foreign tensor)."""
        names = {id(p): n for n, p in self.grads.model.named_parameters()}
        return [names.get(id(p), "<not in the model>") for p in params]

    def _refuse_uncovered_grads(self) -> None:
        """No parameter of the inner optimizer outside the private step may carry a gradient:
        the inner step would apply it raw (a parameter unfrozen after ``make_private``, or one
        added to the inner optimizer directly). Checked before every release."""
        leaked = [p for g in self.original_optimizer.param_groups for p in g["params"]
                  if id(p) not in self._covered and p.grad is not None]
        if leaked:
            raise PrivacyRefusal(
                f"parameters {self._names_of(leaked)} reach the optimizer with a gradient but "
                f"are not covered by the private step (frozen or absent at make_private): "
                f"their gradient was computed without clipping or noise. Set requires_grad "
                f"before make_private, and zero their .grad")

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear parameter gradients and the captured activations (not the logical-batch sum)."""
        self.original_optimizer.zero_grad(set_to_none=set_to_none)
        self.grads.clear()

    def __repr__(self) -> str:
        return f"DPOptimizer({self.original_optimizer!r})"

    # -- shortcuts and earlier names ---------------------------------------------------------
    @property
    def max_steps(self) -> int | None:
        return self.budget.max_steps

    @max_steps.setter
    def max_steps(self, value: int | None) -> None:
        self.budget.max_steps = value

    @property
    def epsilon_cap(self) -> float | None:
        return self.budget.epsilon_cap

    @property
    def target_delta(self) -> float | None:
        return self.budget.delta

    @property
    def schedule(self) -> Method | None:
        """The earlier name of :attr:`method`."""
        return self.method

    @property
    def schedule_state(self) -> Any:
        """The earlier name of :attr:`method_state`."""
        return self.method_state

    @schedule_state.setter
    def schedule_state(self, value: Any) -> None:
        self.method_state = value

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
        """Feed a validation result to a method that declared ``needs.validation``."""
        require(self.method is not None and self.method.needs.validation is not None,
                "the method", getattr(self.method, "registry_name", None),
                "one that declares needs.validation", "Only such methods read a metric")
        self.method_state = self.method.observe(self.method_state, val_metric=val_metric)

    def _plan_step(self) -> StepPlan:
        t = self.step_count
        self.budget.check_step(t)
        sigma = self.noise_multiplier if self.noise_multiplier is not None else 0.0
        plan = StepPlan(step=t, sample_rate=self.sampler.sample_rate, noise_multiplier=sigma,
                        clip=self.clipping.default_clip())
        if self.method is not None:
            plan = self.method.plan(self.method_state, plan)
            require(plan.sample_rate == self.sampler.sample_rate, "plan.sample_rate",
                    plan.sample_rate, f"the sampler's rate {self.sampler.sample_rate}",
                    "The sample rate is a fact of the sampler; a method may not change it")
        if plan.noise_multiplier == 0 and self.noise_multiplier != 0:
            raise ValueError(
                f"noise_multiplier must be > 0 at step {t}, got noise_multiplier = 0 from "
                f"{'the method' if self.method is not None else 'no source'}. Pass "
                f"noise_multiplier= or target_epsilon= to make_private, or a method that sets "
                f"σ (noise_multiplier=0 is allowed only when passed explicitly, for debugging)")
        return plan

    # -- the step ---------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Clip, accumulate; at the end of a logical batch add noise, record, update."""
        loss, self.updated = None, False
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        try:
            self._take_batch()
        except Exception:
            self.cursor.discard_pending()  # not taken: the loader yields it again
            raise
        return loss

    def _take_batch(self) -> None:
        """Check, accumulate and (at a logical batch's end) release the batch just yielded.

        The loader's position moves (``cursor.pending = 0``) only once the batch is taken: in
        the sum for a physical batch inside a logical one, or recorded in the ledger at its end.
        A batch refused before that is yielded again, so no example is used without a ledger step.
        """
        pending = self.cursor.pending
        require(pending >= 1, "the batch", "not from the private loader",
                "one yielded by the loader make_private returned",
                "Iterate the loader returned by make_private; each of its batches allows one "
                "optimizer.step()")
        # Two batches before one step would pair example i of one with example i of the other
        # in the per-sample gradients (sensitivity 2C, not C): refuse.
        require(pending == 1, "batches per optimizer.step()", pending, "exactly 1",
                "Call optimizer.step() after every batch of the private loader; to accumulate "
                "gradients over a large logical batch use max_physical_batch_size=")
        if self._sums is None:
            plan = self._plan_step()
            specs = (self.method.releases(self.method_state, plan)
                     if self.method is not None else {})
            self._check_post_release(specs)
            self._sums = StepSums(plan=plan, specs=dict(specs))
            self._logical = self.cursor.logical
        elif self._logical != self.cursor.logical:
            self._sums = None  # sensitive: discard
            self.grads.clear()
            raise ValueError(
                "a logical batch must be finished before the next one starts, got a new one "
                "while the previous was cut into physical batches and not all were stepped. "
                "Step on every physical batch of the loader (do not break out mid-batch); "
                "nothing of the unfinished batch was released")
        try:
            self._accumulate(self._sums)
        except Exception:
            self._sums = None  # sensitive: a refused batch poisons its logical step
            self.grads.clear()
            raise
        if not self.cursor.last:
            for p in self._params.values():
                p.grad = None
            self.cursor.pending = 0
            return
        sums, self._sums = self._sums, None
        self._release(sums)

    def _check_post_release(self, specs: Any) -> None:
        """Refuse post-release probes the step cannot evaluate correctly (before any sum)."""
        if not post_release(specs):
            return
        name = self.method.registry_name or type(self.method).__name__
        if not self.cursor.last:
            raise PrivacyRefusal(
                f"a logical batch must be one physical batch for method {name!r}, got a logical "
                f"batch split over several physical batches: its post-release loss probes need "
                f"the whole batch again after the gradient is released. Make the physical batch "
                f"as large as the logical one (drop max_physical_batch_size=, or raise it above "
                f"the largest logical batch); nothing of this step was released")
        if type(self.method).postprocess_probed is Method.postprocess_probed:
            raise PrivacyRefusal(
                f"a method that declares post-release probes must override postprocess_probed, "
                f"got method {name!r} which does not (e.g. a chain: its members' selections "
                f"would be dropped). Use the probing method on its own")

    def _accumulate(self, sums: StepSums) -> None:
        """Add one physical batch to ``sums``: norms → clipping → extra values → sums."""
        plan, method, state = sums.plan, self.method, self.method_state
        if method is not None and method.needs.per_sample_grads:
            per_sample = method.transform(state, self.grads.per_sample_grads(), plan)  # sensitive
            sq = {n: g.flatten(1).square().sum(1) for n, g in per_sample.items()}  # (B,) each
            weighted_sums = contract(per_sample)
        else:
            sq = self.grads.per_sample_sq_norms()  # name -> (B,) sensitive
            weighted_sums = self.grads.weighted_sums_many
        norms = Norms(total=total_norm(sq), per_parameter_sq=sq, groups=self._groups,
                      indices=self.cursor.indices)  # sensitive
        clip = method.clipping(state, norms, plan) if method is not None else None
        if clip is None:
            weights = self.clipping.weights(sq, plan.clip, index=self.cursor.indices,
                                            norm=norms.total)
            clip = Clip(weights, self.clipping.sensitivity(plan.clip))
        values = dict(method.release_values(state, norms, plan)) if sums.specs else {}
        values.update(probe_losses(sums.specs, model=self.model, loss_fn=self.loss_fn,
                                   params=self._params, batch=self.cursor.batch,
                                   rows=norms.total.shape[0]))
        owner = (f"method {method.registry_name or type(method).__name__!r}"
                 if method is not None else f"clipping policy {self.clipping.name!r}")
        fractions = None
        if self.groups is not None and min(self.groups.clip_fractions) < 1:
            f = torch.tensor(self.groups.clip_fractions, dtype=torch.float64)   # (P,) public
            fractions = f[self.group_of[self.cursor.indices.cpu()]]             # (B,) public
        sums.add(weighted_sums, norms, clip, values, owner, clip_fractions=fractions)
        self.grads.clear()
        del sq, norms, clip, values

    def _release(self, sums: StepSums) -> None:
        """Guard, noise, ledger, inner step, method update — in that order."""
        self._refuse_uncovered_grads()
        plan = sums.plan
        releases = step_releases(plan, sums.specs)
        self.budget.check_release(self.ledger, sampling=self.sampler.sampling,
                                  sample_rate=self.sampler.sample_rate, releases=releases)
        group_releases = (group_step_releases(plan, sums.specs, self.groups.clip_fractions)
                          if self.groups is not None else None)
        if group_releases is not None and self.group_budget is not None:
            self.group_budget.check_release(self.groups, sampling=self.sampler.sampling,
                                            releases=group_releases)
        b = self.sampler.normalizer
        # rank 0 adds the one noise draw; the all-reduce sums the ranks' shares
        noise, reduce = ((self.noise, None) if self.collective is None else
                         (self.collective.noise_source(self.noise), self.collective.sum_))
        extras = sums.release(noise, self._params, b, reduce=reduce)
        noisy = {n: p.grad for n, p in self._params.items()}   # the release itself
        self.ledger.record_step(sampling=self.sampler.sampling,
                                sample_rate=self.sampler.sample_rate, releases=releases)
        if group_releases is not None:
            self.groups.record_step(sampling=self.sampler.sampling, releases=group_releases)
        if self.method is not None:   # post-processing of the released gradient only
            if post_release(sums.specs):
                probed = self._post_release_probes(sums, noisy, noise, reduce)
                extras.update(probed)
                mapped = self.method.postprocess_probed(self.method_state, dict(noisy), plan,
                                                        probed, b)
            else:
                mapped = self.method.postprocess(self.method_state, dict(noisy), plan)
            for n, p in self._params.items():
                p.grad = mapped[n].to(p.dtype)
        self.cursor.pending = 0   # taken: released and recorded
        groups = self.original_optimizer.param_groups
        lrs = [g["lr"] for g in groups]
        if plan.lr_scale != 1.0:
            for g in groups:
                g["lr"] = g["lr"] * plan.lr_scale
        try:
            self.original_optimizer.step()
        finally:
            for g, lr in zip(groups, lrs):
                g["lr"] = lr
        if self.method is not None:
            self.method_state = self.method.update(self.method_state,
                                                   released(sums, extras, b, self._params,
                                                            noisy))
        clip = plan.clip
        self.last_step_info = {
            "step": plan.step, "noise_multiplier": float(plan.noise_multiplier),
            "clip": clip.tolist() if torch.is_tensor(clip) else float(clip),
            "sample_rate": plan.sample_rate, "lr_scale": plan.lr_scale,
            "batch_size": sums.rows,
            "mean_grad_norm_nonprivate": (sums.norm_sum / sums.rows if sums.rows
                                          else math.nan),
        }
        self.step_count += 1
        self.updated = True

    def _post_release_probes(self, sums: StepSums, noisy: dict[str, torch.Tensor], noise: Any,
                             reduce: Any) -> dict[str, float]:
        """The post-release probes on this (unsplit) batch at offsets(g̃), noised: released."""
        owner = f"method {self.method.registry_name or type(self.method).__name__!r}"
        losses = probe_losses(sums.specs, model=self.model, loss_fn=self.loss_fn,
                              params=self._params, batch=self.cursor.batch, rows=sums.rows,
                              released_gradient={n: g.detach().clone()
                                                 for n, g in noisy.items()})  # sensitive
        self.grads.clear()
        return sums.release_probes(losses, noise, owner, reduce=reduce)

    # -- checkpoints ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume bit-identically (the model's weights are the model's).

        Holds the seed and generator states: a checkpoint is secret, never part of a release.
        Only at a logical-batch boundary: between the physical batches of a logical batch the
        optimizer holds the un-noised sums of clipped gradients, which must never reach a file,
        so a call there raises :class:`~dpfy.errors.PrivacyRefusal`.
        """
        if self._sums is not None:
            raise PrivacyRefusal(
                "state_dict() must be called at a logical-batch boundary, got a call while "
                "a logical batch is being summed (its un-noised sum of clipped gradients "
                "would be written). Call it after optimizer.step() completes a logical batch "
                "(the private loader's cursor.last is True)")
        return {
            "format": FORMAT, "seed": self.seed, "step_count": self.step_count,
            "optimizer": self.original_optimizer.state_dict(),
            "ledger": self.ledger.to_dict(), "noise": self.noise.state_dict(),
            "sampler": self.sampler.state_dict(), "max_steps": self.max_steps,
            "method_state": (self.method.state_dict(self.method_state)
                             if self.method is not None else None),
            "groups": self.groups.to_dict() if self.groups is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        require(state.get("format") == FORMAT, "format", state.get("format"), repr(FORMAT),
                "This is not a dpfy optimizer checkpoint of this version")
        if state.get("pending") is not None:   # written by dpfy before the boundary rule
            raise PrivacyRefusal(
                "the optimizer checkpoint must be from a logical-batch boundary, got one that "
                "holds an un-noised pending sum of clipped gradients (delete that file: it is "
                "sensitive). Resume from a checkpoint written after optimizer.step() completed "
                "a logical batch")
        self.original_optimizer.load_state_dict(state["optimizer"])
        self.ledger.groups[:] = Ledger.from_dict(state["ledger"]).groups
        self.noise.load_state_dict(state["noise"])
        self.sampler.load_state_dict(state["sampler"])
        self.seed, self.step_count = state["seed"], state["step_count"]
        self.max_steps = state["max_steps"]
        saved = state["method_state"]
        self.method_state = (self.method.load_state_dict(saved) if self.method is not None
                             else saved)
        self._sums = None
        self.budget.reset()  # the ledger was replaced: compose it afresh
        if self.groups is not None:
            require(state.get("groups") is not None, "the checkpoint's group ledgers", None,
                    "saved (this run has individualized budgets)",
                    "Resume from a checkpoint of the same individualized run")
            self.groups.ledgers = GroupLedgers.from_dict(state["groups"]).ledgers
            if self.group_budget is not None:
                self.group_budget.reset()
