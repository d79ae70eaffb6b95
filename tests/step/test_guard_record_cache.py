"""The ε guard's cached count of steps under the cap is keyed on the step's record, so that
record must not change after the search: a StepRecord holds its releases as a tuple even when a
mechanism hands it a list (that list may be changed afterwards, and a record sharing it would
then still compare equal to the record the count was searched for)."""

from __future__ import annotations

import pytest

from dpfy.errors import BudgetExhausted
from dpfy.noise import StepRecord
from dpfy.privacy import Ledger, Release, Sampling
from dpfy.step.guard import EpsilonGuard


def test_a_release_list_changed_after_the_search_is_searched_again():
    # One Poisson step at q = 0.5: σ = 20 spends ε ≈ 0.1 at δ = 1e-5 (so many steps fit under
    # ε ≤ 1), σ = 0.05 alone spends ε > 50 (the Gaussian's ε at δ = 1e-5 is ≈ 4.8/σ ≈ 97,
    # amplified by q = 0.5 to ≈ 97 + ln 0.5): the guard must refuse the second record.
    guard = EpsilonGuard(max_steps=None, epsilon_cap=1.0, delta=1e-5, accountant="rdp")
    ledger = Ledger()
    releases = [Release("gradient", 20.0)]  # a custom mechanism's own, reused list
    first = StepRecord(Sampling.POISSON, 0.5, releases)  # type: ignore[arg-type]
    guard.check(ledger, first)
    first.record(ledger)
    releases[0] = Release("gradient", 0.05)  # the mechanism changes σ in its list
    second = StepRecord(Sampling.POISSON, 0.5, releases)  # type: ignore[arg-type]
    with pytest.raises(BudgetExhausted, match="epsilon_cap = 1.0"):
        guard.check(ledger, second)
