"""The sampling kinds as values and the one calibration search (issue 37, item 2).

Every expected number comes from dp_accounting directly (its RDP accountant over its default
orders, the orders dpfy's RDP minimises over) or from the event written out by hand here, not
from the code under test.
"""

from __future__ import annotations

from typing import Callable

import dp_accounting
import pytest
from dp_accounting.rdp import RdpAccountant

from dpfy.privacy.calibration import calibrate_steps
from dpfy.privacy.events import (
    CyclicPoisson,
    ExampleLevelSampling,
    FixedSize,
    Poisson,
    Shuffled,
    Unsampled,
    UserLevelSampling,
    sampling_kind,
)
from dpfy.privacy.ledger import Sampling
from dpfy.privacy.search import Search, calibrate


def _rdp_epsilon(event: dp_accounting.DpEvent, delta: float) -> float:
    acc = RdpAccountant()
    acc.compose(event)
    return acc.get_epsilon(delta)


def _poisson_gaussian_epsilon(q: float, steps: int, delta: float) -> Callable[[float], float]:
    """σ ↦ ε(δ) of ``steps`` Poisson-subsampled Gaussian steps at rate q, events built with
    dp_accounting itself (independent of dpfy's event code)."""

    def eps(s: float) -> float:
        step = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(s))
        return _rdp_epsilon(dp_accounting.SelfComposedDpEvent(step, steps), delta)

    return eps


def _assert_smallest_safe(
    eps: Callable[[float], float], sigma: float, target: float, tol: float
) -> None:
    """Safe side: ε(σ) ≤ target; tight: σ shrunk by the search's relative tolerance overspends.
    dp_accounting and dpfy minimise over the same RDP orders, so the two ε agree to float
    rounding (1e-9 relative)."""
    assert eps(sigma) <= target * (1 + 1e-9)
    assert eps(sigma / (1 + tol)) > target


def test_poisson_event_is_the_nested_dp_accounting_event():
    expected = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.1)), 1000
    )
    assert Poisson(0.01).dp_event(1.1, 1000) == expected


def test_cyclic_poisson_records_its_bands():
    (group,) = CyclicPoisson(0.02, bands=4).ledger(1.0, 8).step_groups
    assert group.sampling is Sampling.CYCLIC_POISSON
    assert [(r.noise, r.period) for r in group.releases] == [("bandmf", 4)]


@pytest.mark.parametrize(
    "sampling, kind",
    [
        (Sampling.POISSON, Poisson),
        (Sampling.ULS, UserLevelSampling),
        (Sampling.ELS, ExampleLevelSampling),
        (Sampling.CYCLIC_POISSON, CyclicPoisson),
        (Sampling.SHUFFLE, Shuffled),
        (Sampling.FIXED_SIZE, FixedSize),
        (Sampling.NONE, Unsampled),
    ],
)
def test_every_sampling_has_its_kind(sampling, kind):
    value = sampling_kind(sampling, 0.01, dataset_size=1000, max_examples_per_user=2)
    assert type(value) is kind and value.sampling is sampling


def test_calibrate_finds_the_smallest_safe_sigma():
    q, steps, target, delta, tol = 0.01, 1000, 2.0, 1e-5, 1e-3
    sigma = calibrate(
        lambda s: Poisson(q).ledger(s, steps),
        target,
        delta,
        "rdp",
        search=Search(tol=tol),
        fail=lambda: pytest.fail("bracket"),
    )

    _assert_smallest_safe(
        lambda s: _rdp_epsilon(Poisson(q).dp_event(s, steps), delta), sigma, target, tol
    )


def test_calibrate_steps_never_returns_an_unchecked_cap():
    # Unsampled Gaussian at σ = 2, δ = 1e-5 (dp_accounting RDP): 2 steps spend 3.19, 3 steps
    # 4.01, so a target of 3.6 allows 2. With max_steps = 3 the old doubling jumped from 2 to 4,
    # passed the cap and returned it (3) without accounting it.
    two = _rdp_epsilon(
        dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(2.0), 2), 1e-5
    )
    three = _rdp_epsilon(
        dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(2.0), 3), 1e-5
    )
    assert two <= 3.6 < three
    got = calibrate_steps(
        target_epsilon=3.6, delta=1e-5, noise_multiplier=2.0, sample_rate=1.0, max_steps=3
    )
    assert got == 2


def test_calibrate_sigma_takes_the_sampling_as_one_value():
    # ULS: each user joins with probability q; at the user level one step is a
    # Poisson-subsampled Gaussian (Charles et al. 2024), written out here by hand.
    from dpfy.privacy.calibration import calibrate_sigma

    q, steps, target, delta, tol = 0.02, 300, 3.0, 1e-6, 1e-3
    sigma = calibrate_sigma(
        UserLevelSampling(q),
        steps,
        target_epsilon=target,
        delta=delta,
        tol=tol,
    )

    _assert_smallest_safe(_poisson_gaussian_epsilon(q, steps, delta), sigma, target, tol)


def test_sigma_for_takes_the_target_as_one_value():
    # The one σ search with the sampling and the target as values: the σ it returns spends at
    # most ε on dp_accounting's own RDP accountant, and σ/(1 + tol) overspends.
    from dpfy.privacy.calibration import Target, sigma_for

    q, steps, target, delta, tol = 0.01, 400, 2.0, 1e-5, 1e-3
    sigma = sigma_for(Poisson(q), steps, Target(target, delta, "rdp"), tol=tol)

    _assert_smallest_safe(_poisson_gaussian_epsilon(q, steps, delta), sigma, target, tol)


def test_target_refuses_as_the_keyword_calibrators_do():
    from dpfy.privacy.calibration import Target, calibrate_noise_multiplier

    with pytest.raises(ValueError) as keywords:
        calibrate_noise_multiplier(
            target_epsilon=200.0, delta=1e-5, sample_rate=0.01, steps=10, accountant="rdp"
        )
    with pytest.raises(ValueError) as value:
        Target(200.0, 1e-5, "rdp").check()
    assert str(value.value) == str(keywords.value)
    with pytest.raises(ValueError, match="approximate=True"):
        Target(1.0, 1e-5, "gdp").check()
