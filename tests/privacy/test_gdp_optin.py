"""Issue 10 §1.4: calibration never uses the GDP CLT approximation unless asked to.

Every calibration function refuses ``accountant="gdp"`` without ``approximate=True``. The
command line's side (``dpfy calibrate --accountant gdp`` refuses without ``--approximate``;
reading ε with GDP stays available and labelled) is tests/cli/test_gdp_optin_cli.py.
"""

import pytest

from dpfy.privacy.calibration import (calibrate_noise_multiplier, calibrate_sample_rate,
                                      calibrate_schedule_scale, calibrate_steps,
                                      hyfree_noise_split)

Q, T, D = 0.01, 1000, 1e-5
CALLS = {
    "noise_multiplier": lambda **kw: calibrate_noise_multiplier(
        target_epsilon=3, delta=D, sample_rate=Q, steps=T, **kw),
    "sample_rate": lambda **kw: calibrate_sample_rate(
        target_epsilon=3, delta=D, noise_multiplier=1.0, steps=T, **kw),
    "steps": lambda **kw: calibrate_steps(
        target_epsilon=3, delta=D, noise_multiplier=1.0, sample_rate=Q, **kw),
    "schedule_scale": lambda **kw: calibrate_schedule_scale(
        shape=[1.0, 0.9, 0.8], target_epsilon=3, delta=D, sample_rate=Q, **kw),
    "hyfree": lambda **kw: hyfree_noise_split(
        target_epsilon=3, delta=D, sample_rate=Q, steps=100, probe_every=10, **kw),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_every_calibration_refuses_gdp_without_the_opt_in(name):
    with pytest.raises(ValueError, match="accountant must be 'pld' or 'rdp' for a calibration"):
        CALLS[name](accountant="gdp")
    assert CALLS[name](accountant="gdp", approximate=True) is not None
