"""The private optimizer: wraps any torch.optim optimizer; one ledger step per logical batch.

One logical step t (DESIGN.md steps 1–3, one screen):

1. plan:    P_t = schedule.plan(state, StepPlan(t, q, σ, C))       public / privatized inputs only
2. norms:   n_i = ‖∂ℓ_i/∂θ‖ from the per-sample engine               (B,)  sensitive
3. weights: w_i = schedule.weights(n, P_t) or clipping policy        (B,)  sensitive
4. sum:     S = Σ_{physical batches} Σ_i w_i ∂ℓ_i/∂θ                 accumulated over the logical batch
5. release: S̃ = S + N(0, (σ_t·Δ(C_t))² I);  ledger.record_step(q, [Release("gradient", σ_t)])
6. update:  p.grad = S̃ / b, where b is the sampler's public normalizer (b = qN, the expected
            batch size, for Poisson sampling; the batch size for shuffled batches); the inner
            optimizer steps with its learning rate × P_t.lr_scale.

So with SGD(lr=1), no momentum and σ = 0 a step moves θ by exactly −Σ_i clip(g_i)/b.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, Callable

import torch

from dpfy._validate import require
from dpfy.adaptive.base import AdaptiveMethod, Released
from dpfy.clipping import ClippingPolicy, total_norm
from dpfy.grads import GradEngine
from dpfy.noise import NoiseSource, NoisySum
from dpfy.plan import StepPlan
from dpfy.privacy import Ledger, Release, epsilon as ledger_epsilon
from dpfy.privacy.calibration import last_passing
from dpfy.privacy.running import RunningEpsilon
from dpfy.sampling import BatchCursor, PoissonSampler, ShuffleSampler

__all__ = ["DPOptimizer"]

FORMAT = "dpfy-optimizer/1"


class DPOptimizer(torch.optim.Optimizer):
    """A private view of ``optimizer``; build it with :func:`dpfy.make_private`.

    Attributes:
      ledger: every release so far (one ``record_step`` per logical batch).
      step_count: logical steps taken.
      max_steps: the budget guard's T (None: unbounded); step T+1 raises. Setting a larger
        value is an explicit re-plan.
      epsilon_cap: optional hard cap; a step whose release would push ε(target_delta) above it
        raises instead.
      last_step_info: ``step, noise_multiplier, clip, sample_rate, lr_scale`` of the last step,
        plus ``batch_size`` (the realized size) and ``mean_grad_norm_nonprivate`` (the mean raw
        per-sample gradient norm): debug statistics that are NOT private and are never fed back
        into training.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, grads: GradEngine,
                 clipping: ClippingPolicy, noise: NoiseSource,
                 sampler: PoissonSampler | ShuffleSampler, cursor: BatchCursor,
                 noise_multiplier: float | None, schedule: AdaptiveMethod | None,
                 ledger: Ledger, accountant: str, seed: int, max_steps: int | None = None,
                 epsilon_cap: float | None = None, target_delta: float | None = None) -> None:
        # Not calling Optimizer.__init__: parameter groups and state are the inner optimizer's.
        self.original_optimizer = optimizer
        for hooks in ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks",
                      "_optimizer_state_dict_pre_hooks", "_optimizer_state_dict_post_hooks",
                      "_optimizer_load_state_dict_pre_hooks",
                      "_optimizer_load_state_dict_post_hooks"):
            setattr(self, hooks, OrderedDict())
        self.grads, self.clipping, self.noise = grads, clipping, noise
        self.sampler, self.cursor = sampler, cursor
        self.noise_multiplier, self.schedule = noise_multiplier, schedule
        self.schedule_state = schedule.init() if schedule is not None else None
        self.ledger, self.accountant, self.seed = ledger, accountant, seed
        self.max_steps, self.epsilon_cap, self.target_delta = max_steps, epsilon_cap, target_delta
        self.step_count = 0
        self.last_step_info: dict[str, Any] = {}
        self._names = [n for n, _ in grads.named_params]
        self._params = dict(grads.named_params)
        self._plan: StepPlan | None = None      # fixed at the first physical batch of a step
        self._logical = 0                       # cursor.logical of the batch being summed
        self._acc: dict[str, torch.Tensor] | None = None  # sensitive: Σ w_i g_i so far
        self._extra: dict[str, tuple[torch.Tensor, float, float]] = {}  # name -> (Σ values, Δ, std)
        self._norm_sum, self._rows = 0.0, 0
        self._cap_cache: tuple[tuple, int, int] | None = None
        self._running: RunningEpsilon | None = None  # incremental ε for the cap

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

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear parameter gradients and the captured activations (not the logical-batch sum)."""
        self.original_optimizer.zero_grad(set_to_none=set_to_none)
        self.grads.clear()

    def __repr__(self) -> str:
        return f"DPOptimizer({self.original_optimizer!r})"

    # -- privacy ----------------------------------------------------------------------------
    def epsilon(self, delta: float, accountant: str | None = None) -> float:
        """ε(δ) of everything released so far, read from the ledger."""
        return ledger_epsilon(self.ledger, delta=delta, accountant=accountant or self.accountant)

    def _plan_step(self) -> StepPlan:
        t = self.step_count
        if self.max_steps is not None and t >= self.max_steps:
            raise ValueError(
                f"step must be < max_steps = {self.max_steps} (the budget the run was planned "
                f"for), got step = {t}. Stop training, or re-plan explicitly by setting "
                f"optimizer.max_steps to a larger value, knowing ε will exceed the target")
        sigma = self.noise_multiplier if self.noise_multiplier is not None else 0.0
        plan = StepPlan(step=t, sample_rate=self.sampler.sample_rate, noise_multiplier=sigma,
                        clip=self.clipping.default_clip())
        if self.schedule is not None:
            plan = self.schedule.plan(self.schedule_state, plan)
            require(plan.sample_rate == self.sampler.sample_rate, "plan.sample_rate",
                    plan.sample_rate, f"the sampler's rate {self.sampler.sample_rate}",
                    "The sample rate is a fact of the sampler; a schedule may not change it")
        if plan.noise_multiplier == 0 and self.noise_multiplier != 0:
            raise ValueError(
                f"noise_multiplier must be > 0 at step {t}, got noise_multiplier = 0 from "
                f"{'the schedule' if self.schedule is not None else 'no source'}. Pass "
                f"noise_multiplier= or target_epsilon= to make_private, or a schedule that sets "
                f"σ (noise_multiplier=0 is allowed only when passed explicitly, for debugging)")
        return plan

    def _releases(self, plan: StepPlan) -> list[Release]:
        """The gradient release and every extra release the method declared this step."""
        return [Release("gradient", float(plan.noise_multiplier))] + [
            Release(name, std / sens) for name, (_, sens, std) in self._extra.items()]

    def _check_cap(self, plan: StepPlan) -> None:
        """Refuse a step whose releases would take ε(target_delta) above ``epsilon_cap``.

        Called just before the noise is drawn, when the step's releases are all known.

        To avoid an accountant call per step, we search once how many more steps of the same
        kind fit under the cap and count down; a new kind of step, or a count that ran out,
        searches again (and only a search that finds 0 refuses).
        """
        if self.epsilon_cap is None:
            return
        kind = (self.sampler.sampling, self.sampler.sample_rate, tuple(self._releases(plan)))
        cache = self._cap_cache
        if (cache is None or cache[0] != kind
                or self.ledger.num_steps - cache[1] >= cache[2]):  # new kind, or counted down
            self._cap_cache = cache = (kind, self.ledger.num_steps, self._steps_under_cap(plan))
        if cache[2] == 0:
            raise ValueError(
                f"epsilon must stay <= epsilon_cap = {self.epsilon_cap} at delta = "
                f"{self.target_delta}, got {self.ledger.num_steps} steps taken and the next "
                f"would exceed it. Training must stop here (raise epsilon_cap only if your "
                f"privacy budget allows it)")

    def _steps_under_cap(self, plan: StepPlan) -> int:
        """How many more steps like ``plan`` fit under the cap.

        Counted with the incremental bound (the ledger so far is composed once; each trial adds
        only its k steps; coarser PLD, so an upper bound and conservative). When that bound says
        not even one more step fits, ``dpfy.privacy.epsilon`` — the function calibration uses —
        has the final word on the next step, so a run calibrated to exactly the cap is not
        stopped early, at the cost of at most one full accounting per such step.
        """
        if self._running is None:
            self._running = RunningEpsilon(delta=self.target_delta, accountant=self.accountant)

        def extra(k: int) -> Ledger:
            out = Ledger(self.ledger.dataset_size)
            out.record_step(sampling=self.sampler.sampling, sample_rate=self.sampler.sample_rate,
                            releases=self._releases(plan), count=k)
            return out

        def fits(k: int) -> bool:
            return self._running.with_extra(self.ledger, extra(k)) <= self.epsilon_cap

        if not fits(1):
            exact = ledger_epsilon(self.ledger.followed_by(extra(1)), delta=self.target_delta,
                                   accountant=self.accountant)
            return 1 if exact <= self.epsilon_cap else 0
        lo, hi = 1, 2
        while hi < 10**7 and fits(hi):
            lo, hi = hi, hi * 2
        return last_passing(fits, lo, hi)

    # -- the step ---------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Clip, accumulate; at the end of a logical batch add noise, record, update."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        pending, self.cursor.pending = self.cursor.pending, 0
        require(pending >= 1, "the batch", "not from the private loader",
                "one yielded by the loader make_private returned",
                "Iterate the loader returned by make_private; each of its batches allows one "
                "optimizer.step()")
        # Two batches before one step would pair example i of one with example i of the other
        # in the per-sample gradients (sensitivity 2C, not C): refuse.
        require(pending == 1, "batches per optimizer.step()", pending, "exactly 1",
                "Call optimizer.step() after every batch of the private loader; to accumulate "
                "gradients over a large logical batch use max_physical_batch_size=")
        if self._plan is None:
            self._plan = self._plan_step()
            self._logical = self.cursor.logical
        elif self._logical != self.cursor.logical:
            self._plan, self._acc, self._extra = None, None, {}  # sensitive: discard
            self.grads.clear()
            raise ValueError(
                "a logical batch must be finished before the next one starts, got a new one "
                "while the previous was cut into physical batches and not all were stepped. "
                "Step on every physical batch of the loader (do not break out mid-batch); "
                "nothing of the unfinished batch was released")
        self._accumulate(self._plan)
        if not self.cursor.last:
            for p in self._params.values():
                p.grad = None
            return loss
        self._release(self._plan)
        self._plan, self._acc, self._norm_sum, self._rows = None, None, 0.0, 0
        return loss

    def _accumulate(self, plan: StepPlan) -> None:
        sq = self.grads.per_sample_sq_norms()  # name -> (B,) sensitive
        norms = total_norm(sq)  # (B,) sensitive
        w = self.schedule.weights(norms, plan) if self.schedule is not None else None
        if w is not None:
            weights = {n: w for n in sq}
        else:
            weights = self.clipping.weights(sq, plan.clip, index=self.cursor.indices, norm=norms)
        self._accumulate_extra(norms, plan)
        sums = self.grads.weighted_sums(weights)  # name -> θ-shaped, sensitive
        if self._acc is None:
            self._acc = sums
        else:
            for n, s in sums.items():
                self._acc[n].add_(s)
        self._norm_sum += norms.sum()  # debug only: NOT private (read once per logical step)
        self._rows += norms.shape[0]
        self.grads.clear()
        del sq, norms, w, weights, sums

    def _accumulate_extra(self, norms: torch.Tensor, plan: StepPlan) -> None:
        """Sum the extra releases a method declares (``method.sums``) over the logical batch."""
        declare = getattr(self.schedule, "sums", None)
        if declare is None:
            return
        for name, ns in declare(norms, plan).items():
            require(isinstance(ns, NoisySum), f"sums[{name!r}]", type(ns).__name__,
                    "a dpfy.noise.NoisySum", "Declare extra releases as NoisySum objects")
            require(name != "gradient", "an extra release name", name, "not 'gradient'")
            total = ns.values.sum(0)  # sensitive: Σ_i values_i
            if name in self._extra:
                prev, sens, std = self._extra[name]
                require((sens, std) == (ns.sensitivity, ns.noise_std), f"sums[{name!r}]",
                        (ns.sensitivity, ns.noise_std), f"the same within a step, {(sens, std)}")
                total = prev + total
            self._extra[name] = (total, ns.sensitivity, ns.noise_std)

    def _release(self, plan: StepPlan) -> None:
        try:
            self._check_cap(plan)  # before any noise is drawn: a refused step releases nothing
        except ValueError:
            self._plan, self._acc, self._extra = None, None, {}  # sensitive: discard
            raise
        sigma = float(plan.noise_multiplier)
        std = sigma * self.clipping.sensitivity(plan.clip)
        b = self.sampler.normalizer
        for n in self._names:  # one parameter at a time: peak = Σθ + max θ
            p = self._params[n]
            p.grad = self.noise.noisy_mean(self._acc.pop(n), std, b).to(p.dtype)  # released
        released_sums: dict[str, Any] = {}
        for name, (total, _, std) in self._extra.items():
            noisy = self.noise.add_gaussian_(total.double().reshape(-1).clone(), std)
            released_sums[name] = float(noisy) if total.dim() == 0 else noisy.reshape(total.shape)
        self.ledger.record_step(sampling=self.sampler.sampling,
                                sample_rate=self.sampler.sample_rate,
                                releases=self._releases(plan))
        self._extra = {}
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
        if self.schedule is not None:
            self.schedule_state = self.schedule.update(
                self.schedule_state, Released(plan=plan, expected_batch_size=b,
                                              sums=released_sums))
        clip = plan.clip
        self.last_step_info = {
            "step": plan.step, "noise_multiplier": sigma,
            "clip": clip.tolist() if torch.is_tensor(clip) else float(clip),
            "sample_rate": plan.sample_rate, "lr_scale": plan.lr_scale,
            "batch_size": self._rows,
            "mean_grad_norm_nonprivate": (float(self._norm_sum) / self._rows if self._rows
                                          else math.nan),
        }
        self.step_count += 1

    # -- checkpoints ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume bit-identically (the model's weights are the model's)."""
        return {
            "format": FORMAT, "seed": self.seed, "step_count": self.step_count,
            "optimizer": self.original_optimizer.state_dict(),
            "ledger": self.ledger.to_dict(), "noise": self.noise.state_dict(),
            "sampler": self.sampler.state_dict(), "max_steps": self.max_steps,
            "schedule_state": (self.schedule.state_dict(self.schedule_state)
                               if self.schedule is not None else None),
            "pending": None if self._plan is None else {
                "plan": self._plan, "sum": self._acc, "extra": self._extra,
                "norm_sum": self._norm_sum, "rows": self._rows},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        require(state.get("format") == FORMAT, "format", state.get("format"), repr(FORMAT),
                "This is not a dpfy optimizer checkpoint")
        self.original_optimizer.load_state_dict(state["optimizer"])
        self.ledger.groups[:] = Ledger.from_dict(state["ledger"]).groups
        self.noise.load_state_dict(state["noise"])
        self.sampler.load_state_dict(state["sampler"])
        self.seed, self.step_count = state["seed"], state["step_count"]
        self.max_steps = state["max_steps"]
        saved = state["schedule_state"]
        restore = getattr(self.schedule, "load_state_dict", None)  # inverse of state_dict, if any
        self.schedule_state = restore(saved) if restore is not None else saved
        pending = state["pending"]
        self._plan = pending["plan"] if pending else None
        self._acc = pending["sum"] if pending else None
        self._extra = pending["extra"] if pending else {}
        self._norm_sum = pending["norm_sum"] if pending else 0.0
        self._rows = pending["rows"] if pending else 0
        self._cap_cache = None
        self._running = None  # the ledger was replaced: compose it afresh
