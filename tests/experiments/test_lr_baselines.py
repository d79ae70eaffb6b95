"""DP-hyper's budget (Bu & Liu 2025, §5): 15 % of ε to k composed selection runs and 85 % to the
final run. The selection σ is checked against dp_accounting's PLD of the k runs composed, and
the total ε dpfy reports against dp_accounting's PLD of all k + 1 runs composed (the final run's
σ found here by bisection on dp_accounting's RDP, an upper bound of PLD, so it spends ≤ 85 %)."""

from __future__ import annotations

import dp_accounting
import pytest

from experiments.lr_fmnist.baselines import dp_hyper_epsilon, dp_hyper_plan
from dpfy.privacy.ledger import Ledger

EPS, DELTA, Q, STEPS, N = 2.0, 1e-5, 0.05, 40, 2000


def _pld(parts: list[tuple[float, int]]) -> float:
    """dp_accounting PLD ε of runs (σ, count): each STEPS Poisson-subsampled Gaussians at Q."""
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_accounting.ComposedDpEvent([dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(s)), STEPS * k)
        for s, k in parts]))
    return acc.get_epsilon(DELTA)


def _rdp(sigma: float) -> float:
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(sigma)),
                STEPS)
    return acc.get_epsilon(DELTA)


def _sigma_for(target: float) -> float:
    lo, hi = 0.3, 30.0
    for _ in range(30):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if _rdp(mid) > target else (lo, mid)
    return hi


@pytest.fixture(scope="module")
def plan():
    return dp_hyper_plan(epsilon=EPS, delta=DELTA, sample_rate=Q, steps=STEPS, dataset_size=N)


def test_selection_runs_composed_spend_fifteen_percent(plan):
    k = len(plan.grid)
    assert plan.select_epsilon == pytest.approx(0.15 * EPS)
    assert plan.final_epsilon == pytest.approx(0.85 * EPS)
    spent = _pld([(plan.select_noise_multiplier, k)])
    assert spent <= 0.15 * EPS * (1 + 2e-3)
    # tight: 1 % less noise would overspend
    assert _pld([(plan.select_noise_multiplier * 0.99, k)]) > 0.15 * EPS


def test_total_epsilon_is_all_ledgers_composed(plan):
    k = len(plan.grid)
    sigma_final = _sigma_for(plan.final_epsilon)
    one = dict(sample_rate=Q, steps=STEPS, dataset_size=N)
    ledgers = [Ledger.homogeneous(noise_multiplier=plan.select_noise_multiplier, **one)
               for _ in range(k)] + [Ledger.homogeneous(noise_multiplier=sigma_final, **one)]
    expected = _pld([(plan.select_noise_multiplier, k), (sigma_final, 1)])
    got = dp_hyper_epsilon(ledgers, DELTA)
    assert got == pytest.approx(expected, rel=5e-3)
    # composition by PLD is within the 15 % + 85 % split (never above the target)
    assert got <= EPS * (1 + 5e-3)


def test_infinite_epsilon_rows_keep_the_method_and_its_clipping():
    """Regression: the ε = ∞ rows must differ from the private ones only by σ = 0 (the ADADP
    row once ran as plain SGD because the method was dropped with the noise)."""
    from torch import nn

    from dpfy.adaptive.adadp import ADADP
    from experiments.lr_fmnist.baselines import SGD_CLIP, setup
    from experiments.lr_fmnist.spec import LrSpec

    s = setup(LrSpec(comparison="004", method="adadp"), nn.Linear(3, 2))
    assert isinstance(s.engine["method"], ADADP)
    assert s.engine["noise_multiplier"] == 0.0 and s.engine["max_grad_norm"] == SGD_CLIP
    assert "target_epsilon" not in s.engine
