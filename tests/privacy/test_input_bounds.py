"""Issue 10 §4: inputs are bounded before the accountant runs.

Before: `dpfy train --epsilon 1e9` / `--noise-multiplier 1e-4` ended in a TiB allocation,
`--epsilon 1000` hung for minutes leaving a `.partial` directory, and `dpfy account
--noise-multiplier 0.05 --accountant pld` / `dpfy calibrate --target-epsilon 200 --accountant
pld` took over a minute. Now each is a one-line error with the fix and exit code 2, in seconds.
Each case is timed in-process against a wall-clock limit generous for a loaded CI machine.
The command line's cases: tests/cli/test_input_bounds_cli.py.
"""

import math
import time

import pytest
from dp_accounting.pld import privacy_loss_distribution

from dpfy.errors import PrivacyRefusal
from dpfy.privacy import Ledger, epsilon
from dpfy.privacy.accountants import PLD_MAX_GRID_POINTS, pld_min_noise_multiplier
from dpfy.privacy.calibration import calibrate_noise_multiplier, calibrate_schedule_scale

LIMIT_S = 20            # generous for a loaded 2-core CI machine; the errors take < 1 s


def test_rdp_still_reads_any_sigma():
    # RDP has no grid: σ = 0.05 is answered (a huge but honest ε) in milliseconds.
    ledger = Ledger.homogeneous(sample_rate=0.005, noise_multiplier=0.05, steps=20000)
    assert epsilon(ledger, delta=1e-5, accountant="rdp") > 1e5


def test_python_api_is_bounded_too():
    ledger = Ledger.homogeneous(sample_rate=0.005, noise_multiplier=0.05, steps=20000)
    start = time.monotonic()
    with pytest.raises(PrivacyRefusal, match="noise_multiplier must be >= 0.293"):
        epsilon(ledger, delta=1e-5, accountant="pld")
    with pytest.raises(ValueError, match="target_epsilon must be <= 100"):
        calibrate_noise_multiplier(target_epsilon=200, delta=1e-5, sample_rate=0.004,
                                   steps=3000, accountant="pld")
    with pytest.raises(ValueError, match=r"noise multiplier >= 0.293 \(the PLD"):
        # reachable only below the floor (q = 0.5, one step: PLD's σ ≈ 0.1)
        calibrate_noise_multiplier(target_epsilon=90, delta=1e-5, sample_rate=0.5, steps=1,
                                   accountant="pld")
    with pytest.raises(ValueError, match=r"noise multiplier >= 0.293 \(the PLD"):
        calibrate_schedule_scale(shape=[1.0, 0.5], target_epsilon=90, delta=1e-5,
                                 sample_rate=0.5, accountant="pld")
    assert time.monotonic() - start < LIMIT_S


def test_floor_is_the_documented_grid_bound():
    # Derivation: a sampled step's PLD grid spans losses up to ≈ 1/(2σ²) + 10/σ (tails cut at
    # mass e^-50, z = √100 = 10), i.e. (1/(2σ²) + 10/σ)/Δ points; the floor makes that 4e5.
    for disc in (1e-4, 1e-3):
        s = pld_min_noise_multiplier(disc)
        assert (1 / (2 * s * s) + 10 / s) / disc == pytest.approx(PLD_MAX_GRID_POINTS)
    assert pld_min_noise_multiplier(1e-3) == pytest.approx(0.05)   # u²/2 + 10u = 400: u = 20


def test_dp_accountings_grid_at_the_floor_is_within_the_bound():
    # Independent count: dp_accounting's own PLD at the floor (Δ = 1e-3 keeps this fast).
    s = pld_min_noise_multiplier(1e-3)
    pld = privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=s, sampling_prob=0.5, value_discretization_interval=1e-3,
        pessimistic_estimate=True)
    points = max(len(pld._pmf_remove._probs), len(pld._pmf_add._probs))
    assert 0.5 * PLD_MAX_GRID_POINTS < points <= PLD_MAX_GRID_POINTS
    assert math.isfinite(pld.get_epsilon_for_delta(1e-5))
