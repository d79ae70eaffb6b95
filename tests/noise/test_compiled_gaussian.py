"""The compiled Gaussian sampler's seeded generator (dpfy/native, xoshiro256++): its law, its
independence, its resumability, and that NoiseSource falls back (with a warning) or refuses
exactly as documented, in both modes. (ChaCha20 and the tails: test_secure_noise.py.)

The expected numbers are the standard normal's own: tail masses 2·Φ(−k) from scipy, moments 0,
1, 3, and zero correlation between distinct draws. Draws are seeded, so the tests are
deterministic; every tolerance is ≥ 5 standard errors of the estimate it bounds.
"""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from dpfy.native import build
from dpfy.native.gaussian import BLOCK, XoshiroGaussian
from dpfy.noise import NoiseSource

N = 2_000_000


def draws(seed: int = 3, n: int = N) -> torch.Tensor:
    return XoshiroGaussian(seed).axpy_(torch.empty(n), 0.0, 1.0).double()


def test_law_is_standard_normal():
    z = draws()
    assert abs(float(z.mean())) < 5 / math.sqrt(N)
    assert abs(float(z.var()) - 1) < 5 * math.sqrt(2 / N)
    assert abs(float(z.pow(4).mean()) - 3) < 5 * math.sqrt(96 / N)  # Var(z⁴) = 105 − 9
    assert stats.kstest(z[:200_000].numpy(), "norm").pvalue > 1e-3
    for k in (1.0, 2.0, 3.0, 4.0, 4.5):  # two-sided tail masses, incl. the far tail
        p = 2 * stats.norm.sf(k)
        freq = float((z.abs() > k).double().mean())
        assert abs(freq - p) < 5 * math.sqrt(p * (1 - p) / N) + 1 / N, (k, freq, p)


def test_draws_are_uncorrelated():
    z = draws(seed=11)
    block = BLOCK  # gaussian.c: first BLOCK outputs of a block are r·cos, the next BLOCK r·sin
    pairs = z[: (N // (2 * block)) * 2 * block].view(-1, 2, block)
    cos_part, sin_part = pairs[:, 0].reshape(-1), pairs[:, 1].reshape(-1)
    bound = 5 / math.sqrt(cos_part.numel())

    def corr(a: torch.Tensor, b: torch.Tensor) -> float:
        return float(torch.corrcoef(torch.stack([a, b]))[0, 1])

    assert abs(corr(z[:-1], z[1:])) < 5 / math.sqrt(N)  # neighbours
    assert abs(corr(z[:-16], z[16:])) < 5 / math.sqrt(N)  # the same lane, next round
    assert abs(corr(z[:-BLOCK], z[BLOCK:])) < 5 / math.sqrt(N)  # a pair's cos and sin
    assert abs(corr(cos_part, sin_part)) < bound  # the two halves of a Box–Muller pair
    assert abs(corr(cos_part ** 2, sin_part ** 2)) < bound  # ... are independent, not only
    # uncorrelated: a shared radius with a wrong law would correlate their squares


def test_seeds_streams_and_resume():
    a, b, c = XoshiroGaussian(5), XoshiroGaussian(5), XoshiroGaussian(6)
    x = a.axpy_(torch.empty(1000), 0.0, 1.0)
    assert torch.equal(x, b.axpy_(torch.empty(1000), 0.0, 1.0))
    assert not torch.equal(x, c.axpy_(torch.empty(1000), 0.0, 1.0))
    state = a.get_state()
    y = a.axpy_(torch.empty(777), 0.0, 1.0)
    assert not torch.equal(y, x[:777])  # the stream moved on
    a.set_state(state)
    assert torch.equal(a.axpy_(torch.empty(777), 0.0, 1.0), y)


def test_axpy_is_scale_and_add_of_the_same_draws():
    base = torch.randn(5000)
    a, b = XoshiroGaussian(9), XoshiroGaussian(9)
    z = a.axpy_(torch.empty(5000), 0.0, 1.0)
    out = b.axpy_(base.clone(), 0.25, 3.0)
    torch.testing.assert_close(out, 0.25 * base + 3.0 * z, rtol=1e-6, atol=1e-6)


def test_bad_buffers_are_refused_with_the_fix():
    g = XoshiroGaussian(0)
    with pytest.raises(ValueError, match="float32 buffer"):
        g.axpy_(torch.empty(10, dtype=torch.float64), 0.0, 1.0)
    with pytest.raises(ValueError, match="float32 buffer"):
        g.axpy_(torch.empty(4, 4).t(), 0.0, 1.0)
    with pytest.raises(ValueError, match="get_state"):
        g.set_state(torch.zeros(3, dtype=torch.int64))


def test_loading_the_kernel_keeps_denormals():
    XoshiroGaussian(0)  # the library is loaded; it must not switch the process to FTZ/DAZ
    tiny = torch.tensor(1e-38) / 1000
    assert float(tiny) > 0


def test_noise_source_backends_resume_each_other():
    compiled = NoiseSource(1)
    assert compiled.backend == "xoshiro" and compiled.reproducible
    state = compiled.state_dict()
    x = compiled.gaussian(torch.zeros(300, dtype=torch.float64), 2.0)
    other = NoiseSource(99, backend="torch")
    other.load_state_dict(state)  # switches to the backend that drew the checkpoint
    assert other.backend == "xoshiro"
    assert torch.equal(other.gaussian(torch.zeros(300, dtype=torch.float64), 2.0), x)

    t = NoiseSource(1, backend="torch")
    t_state = t.state_dict()
    y = t.gaussian(torch.zeros(300), 1.0)
    compiled.load_state_dict(t_state)
    assert compiled.backend == "torch" and torch.equal(compiled.gaussian(torch.zeros(300), 1.0), y)
    with pytest.raises(ValueError, match="backend"):
        NoiseSource(1, backend="fast")


def test_noisy_mean_has_the_documented_law_for_every_layout():
    """float32 in one fused pass, float64 through the chunked float32 buffer; each backend."""
    for src in (NoiseSource(4), NoiseSource(), NoiseSource(4, backend="torch"),
                NoiseSource(backend="urandom")):
        for total in (torch.full((400, 500), 8.0),
                      torch.full((400, 500), 8.0, dtype=torch.float64)):
            out = src.noisy_mean(total, std=6.0, normalizer=2.0, chunk=1 << 12)
            assert out is total
            n = out.numel()
            assert abs(float(out.double().mean()) - 4.0) < 5 * 3.0 / math.sqrt(n), src.backend
            assert abs(float(out.double().std()) - 3.0) < 5 * 3.0 * math.sqrt(0.5 / n), src.backend


def test_add_gaussian_adds_the_same_draws_as_gaussian():
    """add_gaussian_ and gaussian consume the stream alike: t + gaussian(t) from a twin."""
    for make in (lambda: NoiseSource(8), lambda: NoiseSource(8, backend="torch")):
        a, b = make(), make()
        t = torch.randn(3000)
        expected = t + b.gaussian(t, 0.5)
        torch.testing.assert_close(a.add_gaussian_(t.clone(), 0.5), expected, rtol=0, atol=1e-6)


def test_without_a_compiler_auto_warns_and_compiled_refuses(no_compiler):
    with pytest.warns(RuntimeWarning, match="torch's generator"):
        src = NoiseSource(2)
    assert src.backend == "torch" and src.reproducible
    assert src.gaussian(torch.zeros(10), 1.0).std() > 0
    with pytest.warns(RuntimeWarning, match="os.urandom"):
        secure = NoiseSource()
    assert secure.backend == "urandom" and not secure.reproducible
    assert secure.gaussian(torch.zeros(10), 1.0).std() > 0
    for seed in (2, None):
        with pytest.raises(build.NativeUnavailable, match="no C compiler"):
            NoiseSource(seed, backend="compiled")
    with pytest.raises(RuntimeError, match="compiled sampler"):
        src.load_state_dict({"reproducible": True, "backend": "xoshiro",
                             "state": torch.zeros(64, dtype=torch.int64)})
    # a secure ChaCha20 checkpoint continues with fresh OS noise: still secure, said so
    with pytest.warns(RuntimeWarning, match="still secure"):
        src.load_state_dict({"reproducible": False, "backend": "chacha20",
                             "state": torch.zeros(6, dtype=torch.int64)})
    assert src.backend == "urandom" and not src.reproducible
