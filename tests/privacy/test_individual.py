"""IDP-SGD calibration (Boenisch et al. 2024, Sample and Scale, as reviewed by Monir, Fauzan &
Ghinita 2023, §5 and §6.2): the review's MNIST Case 1 values, and
each group's ε recomputed here with dp_accounting directly from (q_p, σ_p, steps)."""

import math

import dp_accounting
import pytest

from dpfy.privacy import calibrate_individual

# MNIST setting inferred by reproducing the review's §6.2 numbers (the review does not state it):
# q = 512/60000, 30 epochs = 3515 steps, δ = 1e-5, c = 0.2, RDP.
CASE1 = dict(budgets=[1.0, 2.0, 3.0], fractions=[0.34, 0.43, 0.23], sample_rate=512 / 60000,
             steps=3515, delta=1e-5, max_grad_norm=0.2, accountant="rdp")


def rdp_epsilon(q: float, sigma: float, steps: int, delta: float) -> float:
    """ε of ``steps`` Poisson-subsampled Gaussian steps, by dp_accounting's RDP accountant."""
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)),
                steps)
    return acc.get_epsilon(delta)


@pytest.fixture(scope="module")
def sample():
    return calibrate_individual(variant="sample", **CASE1)


@pytest.fixture(scope="module")
def scale():
    return calibrate_individual(variant="scale", **CASE1)


def test_sample_matches_paper(sample):
    # review §6.2: σ_sample = 1.368 (an independent re-derivation gives 1.371), within 0.5 %.
    assert sample.noise_multiplier == pytest.approx(1.368, rel=5e-3)
    # review §6.2: q_p = {0.005, 0.009, 0.013} as printed (3 decimals).
    assert [round(q, 3) for q in sample.sample_rates] == [0.005, 0.009, 0.013]
    # an independent RDP re-derivation (integer orders 2–255, improved conversion of Balle et al.
    # 2020) in the inferred setting gives {0.00481, 0.00906, 0.01305}.
    assert sample.sample_rates == pytest.approx([0.00481, 0.00906, 0.01305], rel=5e-3)
    # The ratio-weighted mean rate comes down to the uniform q (IDP-SGD Sample's stopping rule).
    mean = math.fsum(r * q for r, q in zip(CASE1["fractions"], sample.sample_rates))
    assert CASE1["sample_rate"] * 0.995 <= mean <= CASE1["sample_rate"]


def test_sample_group_epsilons_by_dp_accounting(sample):
    for budget, q, reported in zip(CASE1["budgets"], sample.sample_rates, sample.epsilons):
        eps = rdp_epsilon(q, sample.noise_multiplier, CASE1["steps"], CASE1["delta"])
        assert eps <= budget
        assert eps == pytest.approx(budget, rel=5e-3)      # the rate is not wasted
        assert reported == pytest.approx(eps, rel=1e-9)    # what dpfy reports


def test_scale_matches_paper(scale):
    # review §6.2: σ_scale = 1.545 (re-derived 1.549) and c_p = {0.141, 0.236, 0.299}.
    assert scale.noise_multiplier == pytest.approx(1.545, rel=5e-3)
    assert scale.clips == pytest.approx([0.141, 0.236, 0.299], rel=5e-3)
    # the same re-derivation: per-group σ_p ≈ {2.195, 1.313, 1.033}; σ_scale is their
    # ratio-weighted mean.
    assert scale.group_noise_multipliers == pytest.approx([2.195, 1.313, 1.033], rel=2e-3)
    assert scale.noise_multiplier == pytest.approx(
        sum(r * s for r, s in zip(CASE1["fractions"], scale.group_noise_multipliers)))


def test_scale_group_epsilons_by_dp_accounting(scale):
    c, q = CASE1["max_grad_norm"], CASE1["sample_rate"]
    for budget, c_p, reported in zip(CASE1["budgets"], scale.clips, scale.epsilons):
        sigma_p = scale.noise_multiplier * c / c_p   # noise std σ_scale·c over sensitivity c_p
        eps = rdp_epsilon(q, sigma_p, CASE1["steps"], CASE1["delta"])
        assert eps <= budget
        assert reported == pytest.approx(eps, rel=1e-9)


@pytest.mark.parametrize("kwargs, match", [
    (dict(budgets=[0.0, 2.0]), "budget must be > 0"),
    (dict(budgets=[-1.0, 2.0]), "budget must be > 0"),
    (dict(fractions=[0.5, 0.4]), "sum\\(fractions\\) must be 1"),
    (dict(budgets=[2.0, 2.0]), "budgets must be distinct"),
    (dict(accountant="gdp"), "accountant must be one of"),
    (dict(variant="both"), "variant must be one of"),
    (dict(max_grad_norm=None), "max_grad_norm must be > 0"),
])
def test_bad_input_names_the_fix(kwargs, match):
    args = dict(budgets=[1.0, 2.0], fractions=[0.5, 0.5], variant="scale", sample_rate=0.01,
                steps=100, delta=1e-5, max_grad_norm=1.0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        calibrate_individual(**args)


def test_unreachable_budget_names_the_group():
    # Full-batch steps (q = 1), 10⁴ of them: ε = 1e-5 needs σ far above dpfy's 1e4 limit.
    with pytest.raises(ValueError, match="budget ε = 1e-05"):
        calibrate_individual(variant="scale", budgets=[1e-5, 1.0], fractions=[0.5, 0.5],
                             sample_rate=1.0, steps=10_000, delta=1e-5, max_grad_norm=1.0)
