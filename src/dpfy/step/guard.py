"""The ε guard: the step horizon, the ε cap, and the running accountant behind it.

Checked before any noise of a step is drawn, so a refused step releases nothing. It raises
:class:`dpfy.errors.BudgetExhausted` (not a ``ValueError``: the input was fine, the budget is
spent). Only rigorous accountants (PLD, RDP) may decide that a step fits.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from dpfy._require import require
from dpfy.errors import BudgetExhausted
from dpfy.privacy import Ledger, Release, Sampling, epsilon as ledger_epsilon
from dpfy.privacy.accountants import RIGOROUS
from dpfy.privacy.calibration import last_passing
from dpfy.privacy.group_ledger import GroupLedgers
from dpfy.privacy.running import RunningEpsilon
from dpfy.noise.mechanism import StepRecord


__all__ = ["EpsilonGuard", "GroupEpsilonGuard", "RIGOROUS"]


class EpsilonGuard:
    """Refuses step ``max_steps`` + 1, and any step whose releases would take ε above the cap.

    Attributes:
      max_steps: T (None: unbounded). Setting a larger value is an explicit re-plan.
      epsilon_cap: hard cap on ε(delta), or None.
      delta, accountant: where and how ε is read for the cap (PLD or RDP only).
    """

    def __init__(
        self,
        *,
        max_steps: int | None,
        epsilon_cap: float | None,
        delta: float | None,
        accountant: str,
    ) -> None:
        if epsilon_cap is not None:
            require(epsilon_cap > 0, "epsilon_cap", epsilon_cap, "> 0")
            require(
                delta is not None,
                "target_delta",
                None,
                "given with epsilon_cap",
                "ε is defined at a δ: pass target_delta=",
            )
            require(
                accountant in RIGOROUS,
                "accountant",
                accountant,
                f"one of {list(RIGOROUS)} for the ε cap",
                "The GDP CLT can under-report ε; cap with 'pld' or 'rdp' and read GDP "
                "afterwards with optimizer.epsilon(delta, accountant='gdp', "
                "approximate=True)",
            )
        self.max_steps, self.epsilon_cap = max_steps, epsilon_cap
        self.delta, self.accountant = delta, accountant
        self._cache: tuple[StepRecord, int, int] | None = None
        self._running: RunningEpsilon | None = None

    def reset(self) -> None:
        """Forget cached counts (after the ledger was replaced, e.g. on resume)."""
        self._cache, self._running = None, None

    def state_dict(self) -> dict[str, Any]:
        """The horizon and the ε cap (with its δ and accountant), saved with the run."""
        return {
            "max_steps": self.max_steps,
            "epsilon_cap": self.epsilon_cap,
            "delta": self.delta,
            "accountant": self.accountant,
        }

    def tightened(self, state: Mapping[str, Any]) -> "EpsilonGuard":
        """This guard and a checkpoint's together: the smaller horizon and the smaller ε cap.

        A load never loosens a guard: a run built for ε = 1 keeps its horizon and cap when it
        loads a checkpoint written without them, and a checkpoint's guard holds in a run built
        without one. Raising a limit stays an explicit act after the load (``optimizer.max_steps
        = T``). Two caps at different δ or accountants cannot be compared and are refused.
        """
        max_steps = min(
            (t for t in (self.max_steps, state.get("max_steps")) if t is not None), default=None
        )
        cap, delta, accountant = self.epsilon_cap, self.delta, self.accountant
        theirs = state.get("epsilon_cap")
        if theirs is not None and cap is None:
            cap, delta, accountant = theirs, state["delta"], state["accountant"]
        elif theirs is not None:
            require(
                (state["delta"], state["accountant"]) == (delta, accountant),
                "the checkpoint's ε cap",
                f"ε ≤ {theirs:g} at δ = {state['delta']:g} ({state['accountant']})",
                f"at this run's δ = {delta:g} ({accountant}), where its cap ε ≤ {cap:g} holds",
                "Build make_private with the checkpoint's target_delta and accountant",
            )
            cap = min(cap, theirs)
        return EpsilonGuard(
            max_steps=max_steps, epsilon_cap=cap, delta=delta, accountant=accountant
        )

    def check_step(
        self,
        step: int,
        *,
        names: tuple[str, str, str] = ("step", "max_steps", "run"),
        replan: str = "optimizer.max_steps to a larger value (and optimizer.epsilon_cap, which "
        "a target ε sets)",
    ) -> None:
        """Refuse a step at or beyond the horizon (before anything is computed for it).

        ``names``: what a step, the horizon and the whole are called where the refusal is read
        (the federated server: a round, its rounds, the server); ``replan``: the setting that
        moves the horizon there."""
        if self.max_steps is not None and step >= self.max_steps:
            what, horizon, whole = names
            raise BudgetExhausted(
                f"{what} must be < {horizon} = {self.max_steps} (the horizon the {whole} was "
                f"planned for), got {what} = {step}. Stop training, or re-plan explicitly by "
                f"setting {replan}, knowing ε will exceed the target"
            )

    def check(self, ledger: Ledger, record: StepRecord) -> None:
        """Refuse a step whose ``record`` would take ε(delta) above ``epsilon_cap``.

        To avoid an accountant call per step, we search once how many more steps of the same
        kind fit under the cap and count down; a new kind of step, or a count that ran out,
        searches again (and only a search that finds 0 refuses).
        """
        if self.epsilon_cap is None:
            return
        cache = self._cache
        if cache is None or cache[0] != record or ledger.num_steps - cache[1] >= cache[2]:
            self._cache = cache = (record, ledger.num_steps, self._steps_under_cap(ledger, record))
        if cache[2] == 0:
            raise BudgetExhausted(
                f"epsilon must stay <= epsilon_cap = {self.epsilon_cap} at delta = "
                f"{self.delta}, got {ledger.num_steps} steps taken and the next would exceed "
                f"it. Training must stop here (raise optimizer.epsilon_cap only if your privacy "
                f"budget allows it)"
            )

    def check_release(
        self,
        ledger: Ledger,
        *,
        sampling: Sampling,
        sample_rate: float,
        releases: Sequence[Release],
        max_examples_per_user: int | None = None,
    ) -> None:
        """:meth:`check` of a step given by its parts (the group guard's steps)."""
        k = max_examples_per_user
        self.check(ledger, StepRecord(sampling, sample_rate, tuple(releases), k))

    def _steps_under_cap(self, ledger: Ledger, record: StepRecord) -> int:
        """How many more steps like ``record`` fit under the cap.

        Counted with the incremental bound (the ledger so far is composed once; each trial adds
        only its k steps; coarser PLD, so an upper bound and conservative). When that bound says
        not even one more step fits, ``dpfy.privacy.epsilon`` — the function calibration uses —
        has the final word on the next step, so a run calibrated to exactly the cap is not
        stopped early, at the cost of at most one full accounting per such step.
        """
        cap, delta = self.epsilon_cap, self.delta
        assert cap is not None and delta is not None, "only a cap is searched; it requires δ"
        if self._running is None:
            self._running = RunningEpsilon(delta=delta, accountant=self.accountant)
        running = self._running

        def extra(k: int) -> Ledger:
            out = Ledger(ledger.dataset_size)
            # StepRecord's own recording: a subclass's record() may commit what it records
            # (StatisticsRecord), which k trial steps must not do
            StepRecord.record(record, out, count=k)
            return out

        def fits(k: int) -> bool:
            return running.with_extra(ledger, extra(k)) <= cap

        if not fits(1):
            exact = ledger_epsilon(
                ledger.followed_by(extra(1)), delta=delta, accountant=self.accountant
            )
            return 1 if exact <= cap else 0
        lo, hi = 1, 2
        while hi < 10**7 and fits(hi):
            lo, hi = hi, hi * 2
        return last_passing(fits, lo, hi)


class GroupEpsilonGuard:
    """The ε cap of every privacy group (individualized budgets): one :class:`EpsilonGuard` per
    group, each on its group's ledger, so training stops before any group would exceed its ε.

    Attributes:
      budgets: ε_p per group, in the order of :class:`dpfy.privacy.group_ledger.GroupLedgers`.
    """

    def __init__(self, budgets: Sequence[float], *, delta: float, accountant: str) -> None:
        self.budgets = tuple(float(b) for b in budgets)
        self.guards = [
            EpsilonGuard(max_steps=None, epsilon_cap=b, delta=delta, accountant=accountant)
            for b in self.budgets
        ]

    def reset(self) -> None:
        """Forget cached counts (after the group ledgers were replaced, e.g. on resume)."""
        for guard in self.guards:
            guard.reset()

    def check_release(
        self, groups: GroupLedgers, *, sampling: Sampling, releases: Sequence[Sequence[Release]]
    ) -> None:
        """Refuse the step if group p's ``releases[p]`` would take its ε above its budget."""
        for p, (guard, group, ledger, rs) in enumerate(
            zip(self.guards, groups.groups, groups.ledgers, releases, strict=True)
        ):
            try:
                guard.check_release(
                    ledger, sampling=sampling, sample_rate=group.sample_rate, releases=rs
                )
            except BudgetExhausted as err:
                raise BudgetExhausted(
                    f"privacy group {p} (budget ε = {group.budget:g}, {group.size} examples): {err}"
                ) from None
