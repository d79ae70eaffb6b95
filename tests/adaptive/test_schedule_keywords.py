"""The planned schedules' shared options are keyword-only (declared once in
``dpfy.adaptive._planned``): a positional argument either lands where it always did (the first
four fields) or is refused with a TypeError, never silently bound to another field.

At 2c4dd75 a fifth positional argument set ``per`` (``pur``, ``noise_decay``) or
``calibration`` (``dynamic``); after the shared fields became keyword-only, without this rule
it would have set ``lr`` or ``mu0``.
"""

from __future__ import annotations

import pytest

from dpfy.adaptive.dynamic import DynamicDPSGD
from dpfy.adaptive.pur import PURSchedule
from dpfy.adaptive.schedules import NoiseDecay


@pytest.mark.parametrize(
    "cls,first_four",
    [
        (PURSchedule, (10.0, "convex", None, "pur")),
        (NoiseDecay, ("exponential", 0.3, None, 0.5)),
        (DynamicDPSGD, ("dynamic", None, None, 2)),
    ],
)
def test_a_fifth_positional_argument_is_refused(cls, first_four):
    cls(*first_four)  # the leading fields stay positional
    with pytest.raises(TypeError, match="positional"):
        cls(*first_four, "epoch")
