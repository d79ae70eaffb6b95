"""BandMF's streamed noise: x = C⁻¹z equals a dense solve, its covariance is C⁻¹C⁻ᵀ, the
released prefix sums are A·G + σΔ·(A C⁻¹)z, and a checkpoint continues the stream."""

import pytest
import torch

from dpfy.errors import PrivacyRefusal
from dpfy.noise import BandMFMechanism, NoiseSource
from dpfy.noise.toeplitz import banded_matrix
from dpfy.types import StepPlan

C4 = torch.tensor([0.8, 0.45, 0.3, 0.25], dtype=torch.float64)
C4 = C4 / C4.norm()


def _mechanism(seed=3, c=C4, **kw):
    return BandMFMechanism(NoiseSource(seed, backend="torch"), coefficients=c,
                           noise_multiplier=1.0, sample_rate=0.1, **kw)


def _unit_noise(mech, likes):
    """One step's unit-scale noise for each parameter (released on zero sums, std 1, b 1)."""
    noise = mech.generator()
    return [noise.noisy_mean(torch.zeros_like(t), 1.0, 1.0) for t in likes]


def _fresh_draws(seed, steps, likes):
    """The z's the mechanism draws: one N(0, 1) tensor per parameter per step, in order."""
    src = NoiseSource(seed, backend="torch")
    return [[src.gaussian(t.float(), 1.0).double() for t in likes] for _ in range(steps)]


def test_streaming_equals_dense_solve():
    likes, T = [torch.zeros(3, 2), torch.zeros(5)], 11
    mech = _mechanism()
    xs = [_unit_noise(mech, likes) for _ in range(T)]
    z = _fresh_draws(3, T, likes)
    C = banded_matrix(C4, T)
    for p in range(len(likes)):
        Z = torch.stack([z[t][p].flatten() for t in range(T)])            # (T, d)
        X = torch.linalg.solve_triangular(C, Z, upper=False)               # C X = Z
        got = torch.stack([xs[t][p].flatten().double() for t in range(T)])
        assert torch.allclose(got, X, atol=1e-5)


def test_released_prefix_sums_are_workload_plus_B_z():
    T, d, sigma, delta, b = 9, 4, 1.7, 0.5, 12.0
    mech = BandMFMechanism(NoiseSource(5, backend="torch"), coefficients=C4,
                           noise_multiplier=sigma, sample_rate=0.1)
    G = torch.randn(T, d, generator=torch.Generator().manual_seed(0))
    released = torch.stack([mech.generator().noisy_mean(G[t].clone().float(), sigma * delta, b)
                            for t in range(T)]).double() * b
    z = torch.stack([zz[0] for zz in _fresh_draws(5, T, [torch.zeros(d)])])
    A = torch.tril(torch.ones(T, T, dtype=torch.float64))
    B = A @ torch.linalg.inv(banded_matrix(C4, T))
    assert torch.allclose(A @ released, A @ G.double() + sigma * delta * (B @ z), atol=1e-4)


def test_noise_covariance_is_C_inverse_C_inverse_transpose():
    # 40,000 i.i.d. coordinates play the role of many seeds: each is one run of T steps
    T, d = 6, 40_000
    mech = _mechanism(seed=11)
    X = torch.stack([_unit_noise(mech, [torch.zeros(d)])[0].double() for _ in range(T)])
    Ci = torch.linalg.inv(banded_matrix(C4, T))
    expected = Ci @ Ci.T
    empirical = X @ X.T / d
    # each entry's standard error is below √(2/d)·max variance ≈ 0.007·max
    assert torch.allclose(empirical, expected, atol=0.05 * float(expected.abs().max()))


def test_one_band_is_independent_gaussian_noise():
    mech = _mechanism(c=torch.ones(1, dtype=torch.float64))
    likes = [torch.zeros(7)]
    xs = [_unit_noise(mech, likes)[0] for _ in range(3)]
    z = _fresh_draws(3, 3, likes)
    for t in range(3):
        assert torch.equal(xs[t].double(), z[t][0])
    assert mech.buffers == [[]]   # nothing buffered: DP-SGD's memory
    assert mech.memory_floats(1000) == 0 and _mechanism().memory_floats(1000) == 3000


def test_checkpoint_resume_continues_the_stream_exactly():
    likes = [torch.zeros(6), torch.zeros(2, 2)]
    whole = _mechanism(seed=9)
    full = [_unit_noise(whole, likes) for _ in range(8)]
    first = _mechanism(seed=9)
    for _ in range(5):
        _unit_noise(first, likes)
    state = first.state_dict()
    resumed = _mechanism(seed=1234)      # a different seed: the checkpoint decides
    resumed.load_state_dict(state)
    for t in range(5, 8):
        for a, b in zip(_unit_noise(resumed, likes), full[t]):
            assert torch.equal(a, b)


def test_secure_resume_never_repeats_noise():
    likes = [torch.zeros(64)]
    mech = BandMFMechanism(NoiseSource(), coefficients=C4, noise_multiplier=1.0,
                           sample_rate=0.1)
    before = [_unit_noise(mech, likes)[0] for _ in range(4)]
    resumed = BandMFMechanism(NoiseSource(), coefficients=C4, noise_multiplier=1.0,
                              sample_rate=0.1)
    resumed.load_state_dict(mech.state_dict())
    after = [_unit_noise(resumed, likes)[0] for _ in range(4)]
    for a in after:
        assert all(not torch.allclose(a, b) for b in before)
    # the buffer came along: the resumed step is correlated with the saved history
    assert resumed.position == 8 and len(resumed.buffers[0]) == 3


def test_refusals_at_the_release():
    mech = _mechanism(sampler_position=lambda: 1)
    plan = StepPlan(step=0, sample_rate=0.1, noise_multiplier=1.0, clip=1.0)
    with pytest.raises(PrivacyRefusal, match="sampler's batch 0"):
        mech.record_for(plan, {})
    ok = _mechanism(sampler_position=lambda: 0)
    record = ok.record_for(plan, {})
    assert record.releases[0].noise == "bandmf" and record.releases[0].period == 4
    with pytest.raises(PrivacyRefusal, match="must stay 1.0"):
        ok.record_for(StepPlan(step=0, sample_rate=0.1, noise_multiplier=2.0, clip=1.0), {})
    with pytest.raises(PrivacyRefusal, match="only the gradient sum"):
        ok.record_for(plan, {"count": object()})
    with pytest.raises(PrivacyRefusal, match="extra noisy release"):
        ok.generator().add_gaussian_(torch.zeros(2), 1.0)
    other = _mechanism(c=torch.tensor([1.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="coefficients"):
        other.load_state_dict(ok.state_dict())
