"""The server of DP-FedAvg: user sampling, the clipping check, the noise, the ledger, the update.

DP-FedAvg (McMahan et al. 2018, "Learning differentially private recurrent language models";
Algorithm 2 of Ponomareva et al. 2023) makes DP-SGD's step at the level of users. Each round t:

1. **plan**: dpfy's :class:`~dpfy.sampling.PoissonSampler`, over the N_users users, draws the
   round's users (each independently with probability q_u); the plan (σ, C_t, lr scale) is
   fixed from public values and earlier releases only (an adaptive method's ``plan``);
2. each sampled user trains locally from the global model and returns their model delta
   clipped to ‖Δ̃_u‖ ≤ C_t (:mod:`dpfy.federated.local`); the round is one logical batch of
   the private step whose units are users: the step's sums (:class:`dpfy.step.sums.StepSums`)
   **check** the bound for every contribution (``check_bound``) and refuse one above it;
3. **noise, once**: S̃ = Σ_u Δ̃_u + N(0, (σ·C_t)² I), one draw over one flat buffer on the
   parameters' device by the mechanism's generator (secure ChaCha20 keyed from the OS unless
   a seed is given), and divided by the expected number of users q_u·N_users (public, unlike
   the realised count);
4. **ledger**: the round is one Poisson-subsampled Gaussian at the user level
   (``Sampling.ULS`` at rate q_u: user-level sampling, accounted as ULS steps are), recorded
   by the same :class:`~dpfy.noise.GaussianMechanism` record as a DP-SGD step (with each
   extra release of an adaptive method beside it); the unit of privacy is one user, with all
   of their examples, under add-or-remove-one-user adjacency;
5. **update**: θ ← θ − η_s·(Δ̄ + momentum), the server optimizer being SGD with learning
   rate η_s (times the plan's lr scale) and optional momentum; the method's ``update`` then
   reads only released values.

Adaptive clipping (Andrew et al. 2021, "Differentially private learning with adaptive
clipping", the quantile method, designed for exactly this) is dpfy's ``quantile`` method
itself: its release is the centred count Σ_u (1[‖Δ_u‖ ≤ C_t] − ½) over the round's users,
computed from each user's delta norm before clipping, noised with σ_b (expected users / 20
by default, as in the paper) and recorded; C moves geometrically towards the γ-quantile.

The run is stated as a :class:`dpfy.spec.RunSpec` (``server.spec``, built and checked by
:mod:`dpfy.federated.run_spec`), the same value ``make_private`` builds for a user-level ULS run.

Dropped users (sampled, no reply) contribute nothing; a missing contribution is the zero
vector, which is within the bound, so the accounting (sampling at q_u, sensitivity C_t) holds.
"""

from __future__ import annotations

import warnings
from typing import Mapping, Sequence, cast

import torch
from torch import nn

from dpfy._require import require
from dpfy.adaptive.base import Method, calibrate_for_run, check_plan, method_name
from dpfy.noise import GaussianMechanism, NoiseSource
from dpfy.noise.seeds import derive_seeds
from dpfy.privacy import Ledger, PrivacyReport, epsilon
from dpfy.privacy.calibration import calibrate_run_noise_multiplier
from dpfy.privacy.user_level import USER_UNIT
from dpfy.sampling import PoissonSampler, UserUnits
from dpfy.privacy.delta_check import check_delta
from dpfy.federated.run_spec import asked_spec, check_declarations, run_facts, with_sampler
from dpfy.federated.round import (
    Contribution,
    FlatLayout,
    RoundPlan,
    RoundResult,
    check_contributions,
    check_method,
    round_release,
)
from dpfy.step.guard import EpsilonGuard
from dpfy.types import StepOutcome, StepPlan

__all__ = [
    "USER_UNIT",
    "USER_ADJACENCY",
    "RoundPlan",
    "Contribution",
    "RoundResult",
    "DPFedAvgServer",
]

USER_ADJACENCY = UserUnits.adjacency_note  # "add or remove one user (all of their examples)"


class DPFedAvgServer:
    """DP-FedAvg's server: holds the global model, the sampler, the noise, the ledger.

    Use :meth:`begin_round` (the users to ask and the clip they apply), then
    :meth:`finish_round` with their :class:`Contribution` s. :func:`dpfy.federated.run_dp_fedavg`
    drives it in process; :class:`dpfy.federated.flower.DPFedAvgStrategy` drives it from Flower.

    ``spec`` is the run as a :class:`dpfy.spec.RunSpec` (:mod:`dpfy.federated.run_spec`): one
    user as the unit, user-level sampling at q_u over N_users, Gaussian σ (given or
    calibrated), one C on the whole delta, the accountant, δ and the planned rounds; checked
    by :func:`dpfy.spec.check` as ``make_private``'s is, and the one source of the sampler's,
    the mechanism's, the ledger's and the guard's facts.

    Args:
      model: the global model; its trainable parameters are what the rounds update.
      num_users: N_users, the population the sampler draws from (public).
      user_sample_rate: q_u, each user's probability of joining a round.
      clip: C, the bound on each user's delta (with the quantile method: its initial_clip
        decides C_0 instead, and ``clip`` must be None).
      noise_multiplier: σ (noise std σ·C on the sum); or None with ``target_epsilon``.
      target_epsilon: calibrate σ so that ``rounds`` rounds spend this user-level ε at
        ``delta`` (by ``accountant``, PLD by default), by the calibration ``make_private``
        uses for a ULS run (:func:`dpfy.privacy.calibration.calibrate_run_noise_multiplier`).
      delta: δ of the statements; default 1/N_users^1.1.
      rounds: T, the planned number of rounds (needed to calibrate; the server refuses round
        T+1, since ε would exceed what was planned).
      server_lr, server_momentum: η_s and the momentum of the server's SGD on the mean delta.
      method: an adaptive method from ``dpfy.adaptive`` (``make("quantile", ...)``); the
        server calibrates it for the run's facts (expected users per round as its batch size).
      accountant: ``"pld"`` (default) or ``"rdp"``.
      seed: None (default): users are sampled and noise drawn from the OS CSPRNG (ChaCha20);
        an int makes both reproducible (the sampler's and the noise's seeds derived from it as
        ``make_private`` derives them, :func:`dpfy.noise.seeds.derive_seeds`), and the report
        warns that anyone with the seed can undo the privacy.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        num_users: int,
        user_sample_rate: float,
        clip: float | None = None,
        noise_multiplier: float | None = None,
        target_epsilon: float | None = None,
        delta: float | None = None,
        rounds: int | None = None,
        server_lr: float = 1.0,
        server_momentum: float = 0.0,
        method: Method | None = None,
        accountant: str = "pld",
        seed: int | None = None,
    ) -> None:
        require(
            isinstance(num_users, int) and num_users >= 1, "num_users", num_users, "an integer >= 1"
        )
        require(
            0 < user_sample_rate <= 1,
            "user_sample_rate",
            user_sample_rate,
            "in (0, 1]",
            "Use the expected users per round / num_users",
        )
        require(
            (noise_multiplier is None) != (target_epsilon is None),
            "noise_multiplier / target_epsilon",
            (noise_multiplier, target_epsilon),
            "exactly one given",
            "Give σ, or the user-level ε to calibrate it for",
        )
        require(
            rounds is None or (isinstance(rounds, int) and rounds >= 1),
            "rounds",
            rounds,
            "None or an integer >= 1",
        )
        require(
            target_epsilon is None or rounds is not None,
            "rounds",
            rounds,
            "given with target_epsilon",
            "σ is calibrated for a number of rounds",
        )
        require(server_lr > 0, "server_lr", server_lr, "> 0")
        require(0 <= server_momentum < 1, "server_momentum", server_momentum, "in [0, 1)")
        check_method(method, clip)  # what the spec's checker cannot say about a round
        self.model, self.num_users = model, num_users
        delta = float(num_users**-1.1 if delta is None else delta)
        require(0 < delta < 1, "delta", delta, "in (0, 1)")
        check_delta(delta, num_users, "users", name="delta")  # δ ≪ 1/N, as make_private asks
        # the run as a spec, checked as every entry point's is, before anything is built
        asked = asked_spec(
            clip=clip,
            noise_multiplier=noise_multiplier,
            target_epsilon=target_epsilon,
            delta=delta,
            rounds=rounds,
            accountant=accountant,
            method=method,
        )
        self.seed = seed
        # make_private's seed rule: one run seed gives the sampler's and the noise's
        sampling_seed, noise_seed = derive_seeds(seed) if seed is not None else (None, None)
        self.sampler = PoissonSampler(
            num_users, sample_rate=float(user_sample_rate), seed=sampling_seed
        )
        spec = with_sampler(asked, self.sampler)
        self.facts = run_facts(spec, self.sampler, lr=server_lr, momentum=server_momentum)
        if noise_multiplier is None:
            # the requires above: target_epsilon is given, and with it rounds; a round is a
            # ULS step at the user rate, calibrated as make_private calibrates its run's σ
            noise_multiplier = calibrate_run_noise_multiplier(self.facts)
        require(noise_multiplier >= 0, "noise_multiplier", noise_multiplier, ">= 0")
        if noise_multiplier == 0:
            warnings.warn(
                "noise_multiplier=0: no noise is added to the users' deltas; "
                "DP-FedAvg is NOT private (use only for debugging)",
                UserWarning,
                stacklevel=2,
            )
        self.spec = spec.with_noise_multiplier(float(noise_multiplier))
        self.method = None if method is None else calibrate_for_run(method, self.facts)
        if self.method is not None:  # the checker's second pass: the method's declarations
            check_declarations(asked, self.method, self._base_plan(0))
        self.method_state = None if self.method is None else self.method.init()
        # the step's pieces, each from the spec's values (one source of the run's facts)
        resolved, acc = self.spec.sampling.resolved, self.spec.accounting
        assert resolved is not None  # with_sampler filled it in
        self.mechanism = GaussianMechanism(
            NoiseSource(noise_seed), sampling=resolved.sampling, sample_rate=resolved.sample_rate
        )
        self.ledger = Ledger(dataset_size=resolved.dataset_size)
        self.guard = EpsilonGuard(
            max_steps=acc.max_steps,
            epsilon_cap=acc.epsilon_cap,
            delta=acc.delta,
            accountant=acc.accountant,
        )
        self.params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self.layout = FlatLayout(self.params)
        self.optimizer = torch.optim.SGD(
            list(self.params.values()), lr=server_lr, momentum=server_momentum
        )
        self.server_lr = float(server_lr)
        self._pending: RoundPlan | None = None
        self._last_plan: StepPlan | None = None

    # -- facts: read from the spec ---------------------------------------------------------
    @property
    def expected_users(self) -> float:
        """q_u·N_users: the public normalizer of the noisy sum (not the realised count)."""
        return self.sampler.normalizer

    # the run's values, each read from ``spec`` (filled in when the server was built)
    @property
    def user_sample_rate(self) -> float:
        """q_u, each user's probability of joining a round."""
        return float(self.spec.sampling.resolved.sample_rate)  # type: ignore[union-attr]

    @property
    def noise_multiplier(self) -> float:
        """σ, given or calibrated."""
        return float(self.spec.noise.noise_multiplier)  # type: ignore[arg-type]

    @property
    def clip(self) -> float | None:
        """C, or None when the method sets C (one float: ``asked_spec``)."""
        return cast("float | None", self.spec.clipping.max_grad_norm)

    @property
    def delta(self) -> float:
        """δ of the user-level statements (1/N_users^1.1 unless given)."""
        return float(self.spec.accounting.delta)  # type: ignore[arg-type]

    @property
    def accountant(self) -> str:
        return self.spec.accounting.accountant

    @property
    def rounds(self) -> int | None:
        """T, the planned rounds (the spec's ``max_steps``)."""
        return self.spec.accounting.max_steps

    @property
    def target_epsilon(self) -> float | None:
        return self.spec.accounting.target_epsilon

    @property
    def rounds_done(self) -> int:
        return self.ledger.num_steps

    # -- a round --------------------------------------------------------------------------
    def begin_round(self) -> RoundPlan:
        """Sample this round's users and fix its plan (public values only)."""
        require(
            self._pending is None,
            "the previous round",
            "unfinished",
            "finished (finish_round) before the next one begins",
            "Every sampled round is one release in the ledger, even with no replies",
        )
        t = self.rounds_done
        self.guard.check_step(
            t,
            names=("round", "rounds", "server"),
            replan="server.guard.max_steps to a larger value",
        )
        base = plan = self._base_plan(t)
        if self.method is not None:
            plan = self.method.plan(self.method_state, base)
            check_plan(self.method, base, plan)
        require(
            not torch.is_tensor(plan.clip),
            "the round's clip",
            plan.clip,
            "one threshold for the whole delta",
        )
        users = tuple(int(u) for u in self.sampler.draw().tolist())
        self._pending = RoundPlan(round=t, users=users, plan=plan)
        return self._pending

    def _base_plan(self, t: int) -> StepPlan:
        """Round ``t``'s plan before the method's: the spec's q_u, σ and C (1 when the method
        sets C: its ``plan`` replaces it)."""
        return StepPlan(
            step=t,
            sample_rate=self.user_sample_rate,
            noise_multiplier=self.noise_multiplier,
            clip=1.0 if self.clip is None else float(self.clip),
            lr_scale=1.0,
        )

    def finish_round(self, contributions: Sequence[Contribution]) -> RoundResult:
        """Check, sum and noise (once) on the step's sums, record, apply the round's mean delta."""
        rp = self._pending
        require(rp is not None, "a round", None, "begun (begin_round) before it is finished")
        assert rp is not None  # the require above refused None
        check_contributions(rp, contributions, self.params)
        plan = rp.plan
        specs = {} if self.method is None else dict(self.method.releases(self.method_state, plan))
        record = self.mechanism.record_for(plan, specs)
        b = self.expected_users
        noise = self.mechanism.generator()
        mean, extras = round_release(rp, contributions, self.layout, specs, noise, b)
        record.record(self.ledger)
        self._pending, self._last_plan = None, plan
        self._apply(mean, plan.lr_scale)
        if self.method is not None:
            self.method_state = self.method.update(
                self.method_state,
                StepOutcome(
                    plan=plan,
                    expected_batch_size=b,
                    sums=extras,
                    gradient=mean,
                    parameters={n: p.detach() for n, p in self.params.items()},
                    noisy_gradient=mean,
                ),
            )
        return RoundResult(
            round=rp.round,
            num_users=len(contributions),
            clip=rp.clip,
            noise_multiplier=plan.noise_multiplier,
            mean_delta=mean,
            extras=extras,
        )

    def _apply(self, mean: Mapping[str, torch.Tensor], lr_scale: float) -> None:
        """θ ← θ − η_s·lr_scale·(mean delta, with momentum): the server optimizer's step."""
        for group in self.optimizer.param_groups:
            group["lr"] = self.server_lr * lr_scale
        for name, p in self.params.items():
            p.grad = mean[name].clone()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    # -- privacy --------------------------------------------------------------------------
    def epsilon(self, delta: float | None = None, accountant: str | None = None) -> float:
        """The user-level ε(δ) of the rounds so far, read from the ledger."""
        return epsilon(
            self.ledger,
            delta=self.delta if delta is None else delta,
            accountant=accountant or self.accountant,
        )

    def privacy_report(self, **context) -> PrivacyReport:
        """The privacy report of the rounds so far; its unit is one user, with all of their
        examples. ``context`` goes to :meth:`PrivacyReport.from_ledger` (e.g. ``released``)."""
        warnings = list(context.pop("warnings", ()))
        if self.seed is not None:
            warnings.append(
                "A fixed seed made this run's user sampling and noise reproducible: "
                "anyone who knows the seed can undo the privacy. Never release a "
                "model trained with a seed"
            )
        methods = (
            ()
            if self.method is None or self._last_plan is None
            else (
                {
                    "name": method_name(self.method),
                    "releases": "; ".join(
                        spec.label
                        for spec in self.method.releases(
                            self.method_state, self._last_plan
                        ).values()
                    ),
                },
            )
        )
        context.setdefault(
            "released",
            "the final global model (the guarantee also covers every round's noisy mean delta)",
        )
        context.setdefault(
            "sampling_note",
            (
                f"DP-FedAvg: each of the {self.num_users} users joined each round independently "
                f"with probability q_u = {self.user_sample_rate:g} (dpfy's Poisson sampler over "
                f"users); each sampled user's model delta after local training was clipped to "
                f"the round's C and the noise N(0, (σC)²) was added once to the sum over users, "
                f"divided by the expected number of users {self.expected_users:g}. Adjacency: "
                f"{USER_ADJACENCY}."
            ),
        )
        return PrivacyReport.from_ledger(
            self.ledger,
            delta=self.delta,
            accountant=self.accountant,
            unit_of_privacy=USER_UNIT,
            dataset_size=self.num_users,
            warnings=warnings,
            methods=methods,
            **context,
        )
