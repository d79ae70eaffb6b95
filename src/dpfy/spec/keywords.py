"""``make_private``'s keywords as a run spec: the one mapping every entry point can share.

:func:`from_keywords` validates each keyword's own value (a name in its list, an integer where
one is needed, a flag given without the feature it belongs to) and builds the
:class:`~dpfy.spec.RunSpec` and :class:`~dpfy.spec.PerformanceOptions`; what cannot be combined
is :func:`dpfy.spec.check`'s business, not this module's.
"""

from __future__ import annotations

import warnings
from typing import Any

from dpfy._require import require
from dpfy.layers.batchnorm_setup import DEFAULT_SHARE, check_batchnorm_arguments
from dpfy.privacy.accountants import check_accountant
from dpfy.privacy.events import Poisson, Shuffled
from dpfy.sampling import USER_SAMPLINGS
from dpfy.sampling.augmult import check_augmult
from dpfy.sampling.microbatch import check_microbatch
from dpfy.spec.performance import PerformanceOptions
from dpfy.spec.run import (
    NOISES,
    AccountingSpec,
    BandMF,
    BatchNormStatistics,
    ClippingSpec,
    ExampleUnit,
    IndividualBudgets,
    Mechanism,
    RunSpec,
    SamplingSpec,
    Unit,
    UserUnit,
)
from dpfy.step.arguments import check_numbers

__all__ = ["from_keywords"]


def _noise(noise: str, bands: int | None, noise_multiplier: float | None) -> Mechanism:
    """``noise=`` and ``bands=`` as a mechanism."""
    require(noise in NOISES, "noise", noise, "'gaussian', 'tree' or 'bandmf'")
    kind = NOISES[noise]
    require(
        bands is None or kind is BandMF,
        "bands",
        bands,
        "None unless noise='bandmf'",
        "Pass noise='bandmf' with bands=b, or drop bands=",
    )
    if kind is BandMF:
        return BandMF(noise_multiplier=noise_multiplier, bands=bands)
    return kind(noise_multiplier=noise_multiplier)


def _unit(
    user_ids: Any,
    user_sampling: str | None,
    max_examples_per_user: int | None,
    user_reduction: str,
    augmult: int,
    augment: Any,
) -> Unit:
    """The unit of privacy: a user (with ``user_ids``) or an example with its K rows."""
    check_augmult(augmult, augment)  # the combinations: dpfy.spec.check
    if user_ids is None:
        require(
            user_sampling is None and max_examples_per_user is None and user_reduction == "mean",
            "user_ids",
            None,
            "given with user_sampling / max_examples_per_user / user_reduction",
            "Pass user_ids= (one user id per example) to make the unit of privacy the user",
        )
        return ExampleUnit(augmult=augmult)
    require(
        user_sampling in USER_SAMPLINGS,
        "user_sampling",
        user_sampling,
        f"one of {list(USER_SAMPLINGS)} with user_ids",
        "'uls' samples users and clips each one's rows together; 'els' caps every user at "
        "k examples and samples examples (pass max_examples_per_user=k)",
    )
    require(
        max_examples_per_user is None
        or (
            isinstance(max_examples_per_user, int)
            and not isinstance(max_examples_per_user, bool)
            and max_examples_per_user >= 1
        ),
        "max_examples_per_user",
        max_examples_per_user,
        "None or an integer >= 1",
    )
    require(
        user_sampling != "els" or max_examples_per_user is not None,
        "max_examples_per_user",
        None,
        "an integer k >= 1 with user_sampling='els'",
        "ELS's user-level accounting needs k, the most examples a user keeps",
    )
    assert user_sampling is not None  # required above
    return UserUnit(user_sampling, max_examples_per_user, user_reduction, augmult)


def _accounting(kw: dict[str, Any]) -> AccountingSpec:
    """The accountant, δ, the target ε, the cap, the run's length, individual budgets."""
    sigma, max_steps = kw["noise_multiplier"], kw["max_steps"]
    if sigma is not None:
        require(sigma >= 0, "noise_multiplier", sigma, ">= 0")
        if sigma == 0:
            warnings.warn(
                "noise_multiplier=0: no noise is added; training is NOT private "
                "(use only for debugging)",
                stacklevel=4,  # make_private's caller
            )
    check_accountant(kw["accountant"])
    if max_steps is not None:
        require(isinstance(max_steps, int) and max_steps >= 1, "max_steps", max_steps, ">= 1")
    individual = None
    if kw["budgets"] is not None or kw["individual"] is not None:
        individual = IndividualBudgets(kw["budgets"], kw["individual"])
    return AccountingSpec(
        accountant=kw["accountant"],
        delta=kw["target_delta"],
        target_epsilon=kw["target_epsilon"],
        epsilon_cap=kw["epsilon_cap"],
        epochs=kw["epochs"],
        max_steps=max_steps,
        individual=individual,
    )


def _batchnorm(kw: dict[str, Any]) -> BatchNormStatistics | None:
    """``batchnorm=`` and its arguments as the spec's BatchNorm statistics (the public data
    by its name; the share defaulted when neither it nor σ_bn is declared)."""
    kind, share, sigma = kw.get("batchnorm"), kw.get("bn_share"), kw.get("bn_noise_multiplier")
    name = kw.get("public_description")
    check_batchnorm_arguments(
        kind,
        public_data=kw.get("public_data") is not None,
        bn_bound=kw.get("bn_bound"),
        bn_noise_multiplier=sigma,
        bn_share=share,
        extra=("public_description",) if name is not None else (),
    )
    if kind is None:
        return None
    if kind == "public":
        return BatchNormStatistics("public", public_data=name or "public data")
    if share is None and sigma is None:
        share = DEFAULT_SHARE
    return BatchNormStatistics("privatized", kw["bn_bound"], share, sigma)


def from_keywords(*, world_size: int = 1, **kw: Any) -> tuple[RunSpec, PerformanceOptions]:
    """The spec and performance options of ``make_private``'s keywords (the same names).

    ``world_size``: the data-parallel ranks this process trains with (1: one process).
    ``user_ids``, ``augment`` and ``public_data`` are read for their presence only (they are
    data and code, handed to the builder separately); the BatchNorm keywords may be left out.
    """
    max_grad_norm = kw["max_grad_norm"]  # a float or K floats; a string is refused here
    check_numbers(
        noise_multiplier=kw["noise_multiplier"],
        target_epsilon=kw["target_epsilon"],
        target_delta=kw["target_delta"],
        epochs=kw["epochs"],
        epsilon_cap=kw["epsilon_cap"],
        max_grad_norm=max_grad_norm if isinstance(max_grad_norm, str) else None,
    )
    unit = _unit(
        kw["user_ids"],
        kw["user_sampling"],
        kw["max_examples_per_user"],
        kw["user_reduction"],
        kw["augmult"],
        kw["augment"],
    )
    noise = _noise(kw["noise"], kw["bands"], kw["noise_multiplier"])
    # the clipping's own values (its combinations: dpfy.spec.check; Poisson: its proof's)
    check_microbatch(
        kw["clipping"],
        kw["microbatch_size"],
        poisson_sampling=kw["poisson_sampling"],
    )
    spec = RunSpec(
        sampling=SamplingSpec(
            kind=Poisson if kw["poisson_sampling"] else Shuffled,
            sample_rates=kw["sample_rates"],
            world_size=world_size,
        ),
        unit=unit,
        noise=noise,
        clipping=ClippingSpec(kw["clipping"], kw["max_grad_norm"], kw["microbatch_size"]),
        accounting=_accounting(kw),
        method=kw["method"],
        batchnorm=_batchnorm(kw),
    )
    performance = PerformanceOptions(
        route=kw["route"],
        max_physical_batch_size=kw["max_physical_batch_size"],
        memory_limit=kw["memory_limit"],
    )
    return spec, performance
