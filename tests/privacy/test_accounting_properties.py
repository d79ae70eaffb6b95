"""Property tests (hypothesis) of the accountants on random heterogeneous Poisson ledgers.

The properties are derivations, not numbers from the code: composition is commutative (order of
steps cannot matter), rounding σ down can only cost privacy (coarsened ε ≥ exact ε), and ε is
monotone in every σ_t.
"""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpfy.privacy import Ledger, epsilon

sigmas = st.lists(st.floats(0.6, 4.0), min_size=1, max_size=8)
rates = st.sampled_from([0.001, 0.01, 0.05])
SETTINGS = settings(max_examples=10, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def _ledger(q, sig, reps=20):
    values = np.repeat(np.asarray(sig), reps)
    return Ledger.from_schedule(sample_rates=[q] * len(values), noise_multipliers=values)


@SETTINGS
@given(rates, sigmas, st.floats(0.005, 0.3))
def test_coarsening_is_an_upper_bound(q, sig, resolution):
    ledger = _ledger(q, sig)
    exact = epsilon(ledger, delta=1e-5, accountant="rdp", sigma_resolution=None)
    coarse = epsilon(ledger, delta=1e-5, accountant="rdp", sigma_resolution=resolution)
    assert coarse >= exact * (1 - 1e-12)


@SETTINGS
@given(rates, sigmas, st.randoms(use_true_random=False))
def test_order_of_steps_does_not_matter(q, sig, rnd):
    shuffled = list(sig)
    rnd.shuffle(shuffled)
    a = epsilon(_ledger(q, sig), delta=1e-5, accountant="rdp", sigma_resolution=None)
    b = epsilon(_ledger(q, shuffled), delta=1e-5, accountant="rdp", sigma_resolution=None)
    assert abs(a - b) <= 1e-9 * max(1.0, a)


@SETTINGS
@given(rates, sigmas, st.integers(0, 7), st.floats(1.01, 2.0))
def test_more_noise_on_any_step_never_costs_more(q, sig, index, factor):
    more = list(sig)
    more[index % len(sig)] *= factor
    for acc in ("rdp", "gdp"):
        assert (epsilon(_ledger(q, more), delta=1e-5, accountant=acc) <=
                epsilon(_ledger(q, sig), delta=1e-5, accountant=acc) * (1 + 1e-12))
