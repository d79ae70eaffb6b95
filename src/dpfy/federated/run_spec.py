"""DP-FedAvg's run as a :class:`~dpfy.spec.RunSpec`: the value every entry point builds.

A DP-FedAvg run is DP-SGD's run with users as the units of a logical batch
(:mod:`dpfy.federated.server`), so its guarantee is made of the same five parts, and the
server states them with the same value ``make_private`` does:

- **sampling**: Poisson (:class:`~dpfy.privacy.events.Poisson`), refined by the unit into
  user-level sampling; once the server's sampler exists, its facts as
  :class:`~dpfy.privacy.events.UserLevelSampling` (q_u, N_users), set with
  :meth:`RunSpec.with_sampling`;
- **unit of privacy**: one user (:class:`~dpfy.spec.UserUnit` with ``"uls"``); its
  ``reduction`` is nominal here, since the client reduces its rows by local training (a mean
  loss in Algorithm 2) and sends the delta, which the server clips as one unit;
- **noise**: :class:`~dpfy.spec.Gaussian` with σ, given or calibrated
  (:meth:`RunSpec.with_noise_multiplier`);
- **clipping**: ``"flat``, one threshold C on the whole delta (None when the method sets C: the
  quantile method's C_0 is its ``initial_clip``);
- **accounting**: the accountant, δ, the target ε, and the run's length ``max_steps`` = the
  planned rounds. No ε cap: the server's guard stops at the planned rounds (as it always has).

:func:`asked_spec` builds the spec the server's keywords ask for and runs
:func:`dpfy.spec.check` on it, so DP-FedAvg meets the refusals every entry point meets;
:func:`check_declarations` runs the checker's second pass on the calibrated method's
declarations. What the checker cannot express (a round's replies, a method's hooks that read
sensitive values outside the round's releases) stays the server's own
(:func:`dpfy.federated.round.check_method`).
"""

from __future__ import annotations

from typing import Any, cast

from dpfy.adaptive.base import Method
from dpfy.federated.round import check_release_kind
from dpfy.privacy import Sampling
from dpfy.privacy.accountants import check_accountant
from dpfy.privacy.events import Poisson, sampling_kind
from dpfy.sampling import PoissonSampler
from dpfy.spec import (
    AccountingSpec,
    ClippingSpec,
    Gaussian,
    RunSpec,
    SamplingSpec,
    UserUnit,
    check,
    declare_method,
)
from dpfy.spec.facts import run_facts as spec_run_facts
from dpfy.types import RunFacts, StepPlan

__all__ = ["asked_spec", "with_sampler", "run_facts", "check_declarations"]


def asked_spec(
    *,
    clip: float | None,
    noise_multiplier: float | None,
    target_epsilon: float | None,
    delta: float,
    rounds: int | None,
    accountant: str,
    method: Method | None,
) -> RunSpec:
    """The spec of a DP-FedAvg run as its keywords ask for it (σ as given), checked by
    :func:`dpfy.spec.check` before anything is built."""
    check_accountant(accountant)
    spec = RunSpec(
        sampling=SamplingSpec(Poisson),
        unit=UserUnit("uls"),
        noise=Gaussian(noise_multiplier),
        clipping=ClippingSpec("flat", None if clip is None else float(clip)),
        accounting=AccountingSpec(
            accountant=accountant, delta=delta, target_epsilon=target_epsilon, max_steps=rounds
        ),
        method=method,
    )
    check(spec)
    return spec


def with_sampler(spec: RunSpec, sampler: PoissonSampler) -> RunSpec:
    """The spec with the server's sampler's facts: user-level sampling at q_u over N_users
    (the ledger's sampling, ``Sampling.ULS``, as ``make_private``'s ULS run records it)."""
    kind = sampling_kind(Sampling.ULS, sampler.sample_rate, dataset_size=sampler.dataset_size)
    return spec.with_sampling(kind)


def run_facts(spec: RunSpec, sampler: PoissonSampler, **optimizer: Any) -> RunFacts:
    """The run's facts, read from the spec (its sampler's facts filled in) and the server's
    sampler (steps per epoch, the normalizer q_u·N_users): what calibration and a method's
    ``calibrate`` read. ``optimizer``: the server SGD's hyperparameters (lr, momentum)."""
    resolved = spec.sampling.resolved
    assert resolved is not None, "with_sampler filled in the sampler's facts"
    clip = cast("float | None", spec.clipping.max_grad_norm)  # one float, or None (asked_spec)
    return spec_run_facts(
        spec,
        resolved,
        steps=spec.accounting.max_steps,
        steps_per_epoch=sampler.steps_per_epoch,
        normalizer=sampler.normalizer,
        max_grad_norm=clip,
        optimizer="SGD",
        hyperparameters=optimizer,
    )


def check_declarations(asked: RunSpec, method: Method, plan: StepPlan) -> None:
    """The checker's second pass: the calibrated ``method``'s declarations at the first
    round's ``plan``, against the spec as it was asked. A round releases values of the users'
    delta norms only, so a release of another kind (a loss probe) is refused here, before
    the checker's per-example message (which speaks of ``make_private``'s options)."""
    declared = declare_method(method, plan)
    for name, release in declared.releases.items():
        check_release_kind(name, release)
    # no loss_fn: DP-FedAvg computes no loss on the server, and its loss probes were refused
    check(asked, method=declared)
