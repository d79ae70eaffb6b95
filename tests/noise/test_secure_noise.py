"""Secure noise by default and Gaussian tails to 9σ on every backend (issue 10 §1.1).

Where the expected numbers come from:
- ChaCha20: the RFC 8439 test vectors (§2.3.2 and appendix A.1, copied below) and, where the
  ``openssl`` command exists, OpenSSL's ChaCha20 on a random key across a 32-bit counter carry;
- the largest radius: u1 = (r + ½)·2⁻⁶⁴ is smallest at r = 0, u1 = 2⁻⁶⁵, so the radius
  √(−2 ln u1) reaches √(130 ln 2) ≈ 9.4926 > 9 (derived here, not read from dpfy);
- the law: N(0, 1)'s moments 0, 1, 3 and tail masses 2·Φ(−k) from scipy, tolerances of five
  standard errors derived at each assertion;
- the fallbacks: Box–Muller written out in numpy from the generator's own 64-bit words.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import warnings

import numpy as np
import pytest
import torch
from scipy import stats

import dpfy.noise.generator
from dpfy.native import build
from dpfy.noise import NoiseSource, secure_uniform

SMALLEST_U1 = 0.5 * 2.0 ** -64  # (r + ½)·2⁻⁶⁴ at r = 0
MAX_RADIUS = math.sqrt(-2 * math.log(SMALLEST_U1))  # √(130 ln 2) ≈ 9.4926
N = 1_000_000
KEY = bytes(range(32))

# RFC 8439 §2.3.2: key 00:01:..:1f, nonce 00:00:00:09:00:00:00:4a:00:00:00:00, block count 1
RFC_2_3_2 = bytes.fromhex(
    "10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"
    "d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e")
# RFC 8439 appendix A.1, test vectors #1 and #2: all-zero key and nonce, block counters 0 and 1
RFC_A_1 = bytes.fromhex(
    "76b8e0ada0f13d90405d6ae55386bd28bdd219b8a08ded1aa836efcc8b770dc7"
    "da41597c5157488d7724e03fb8d84a376a43b8f41518a11cc387b669b2ee6586"
    "9f07e7be5551387a98ba977c732d080dcb0f29a048e3656912c6533e32ee7aed"
    "29b721769ce64e43d57133b074d839d531ed1f28510afb45ace10a1f4b794d6f")


def le32(hex_bytes: str) -> int:
    return int.from_bytes(bytes.fromhex(hex_bytes), "little")


def quiet(make):
    """Build a NoiseSource ignoring the warnings the fallback and the deprecated alias give."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make()


# ------------------------------------------------------------------ secure by default

def test_default_noise_is_secure_chacha20_and_not_reproducible():
    a, b = NoiseSource(), NoiseSource()
    assert not a.reproducible and a.secure and a.backend == "chacha20"
    like = torch.zeros(1000)
    assert not torch.equal(a.gaussian(like, 1.0), b.gaussian(like, 1.0))


def test_a_secure_checkpoint_holds_no_key_and_every_resume_draws_fresh_noise():
    """Issue 30 §1: continuing a saved ChaCha20 stream would replay noise (two resumes of one
    checkpoint would add the same noise to different batches); a secure resume is re-keyed."""
    a = NoiseSource()
    state = a.state_dict()
    assert state == {"backend": "chacha20", "reproducible": False}  # no key, no counter
    x = a.gaussian(torch.zeros(3000), 2.0)
    resumed = [NoiseSource(7), NoiseSource(7)]  # the checkpoint decides the mode and backend
    for r in resumed:
        r.load_state_dict(state)
        assert not r.reproducible and r.backend == "chacha20"
    y, z = (r.gaussian(torch.zeros(3000), 2.0) for r in resumed)
    assert not torch.equal(y, z) and not torch.equal(y, x) and not torch.equal(z, x)


def test_a_secure_resume_ignores_a_key_an_older_checkpoint_holds():
    a = NoiseSource()
    old = {**a.state_dict(), "state": a._stream().get_state()}  # what dpfy-optimizer/3 saved
    x = a.gaussian(torch.zeros(3000), 2.0)
    resumed = NoiseSource()
    resumed.load_state_dict(old)
    assert not torch.equal(resumed.gaussian(torch.zeros(3000), 2.0), x)


def test_a_forked_child_rekeys_its_secure_stream(monkeypatch):
    """Parent and child of a fork would otherwise share the key and counter: same noise."""
    a = NoiseSource()
    twin = NoiseSource()
    twin._stream().set_state(a._stream().get_state())  # the same key and counter, as a fork
    monkeypatch.setattr(dpfy.noise.generator.os, "getpid", lambda: -12345)  # as if in a forked child
    assert not torch.equal(a.gaussian(torch.zeros(500), 1.0), twin.gaussian(torch.zeros(500), 1.0))


# ------------------------------------------------------------------ ChaCha20 itself

def test_chacha20_block_function_matches_rfc8439():
    from dpfy.native.gaussian import chacha20_keystream
    # RFC 8439 §2.3.2: counter 1 and nonce words (0x09000000, 0x4a000000, 0) packed into the
    # 64-bit counter (word 12 | word 13 << 32) and nonce (word 14 | word 15 << 32)
    counter = 1 | le32("00000009") << 32
    nonce = le32("0000004a") | le32("00000000") << 32
    assert chacha20_keystream(KEY, counter, nonce, 1) == RFC_2_3_2
    # A.1 #1 and #2: two consecutive blocks, i.e. two SIMD lanes of one call
    assert chacha20_keystream(bytes(32), 0, 0, 2) == RFC_A_1
    assert chacha20_keystream(bytes(32), 1, 0, 1) == RFC_A_1[64:]  # lane 0 at counter 1


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_chacha20_keystream_matches_openssl_across_blocks_and_the_counter_carry():
    from dpfy.native.gaussian import chacha20_keystream
    key, counter, nonce = os.urandom(32), 2 ** 32 - 7, int.from_bytes(os.urandom(8), "little")
    nblocks = 40  # three 16-block calls, the last one partial; the low counter word wraps
    # openssl's 16-byte IV = the four input words 12..15, little-endian
    iv = counter.to_bytes(8, "little") + nonce.to_bytes(8, "little")
    ref = subprocess.run(["openssl", "enc", "-chacha20", "-K", key.hex(), "-iv", iv.hex()],
                         input=bytes(64 * nblocks), capture_output=True, check=True).stdout
    assert chacha20_keystream(key, counter, nonce, nblocks) == ref


def test_secure_words_are_the_chacha20_keystream():
    """The sampler's random words are ChaCha20's keystream, in the order gaussian.c lays out:
    a call of 16 blocks stores word w of block (counter + l) at 16·w + l, and 64-bit word j is
    32-bit words 2j (low half) and 2j + 1 (high half)."""
    from dpfy.native.gaussian import ChaChaGaussian, chacha20_keystream
    calls = 6  # 6·16 blocks = 1536 32-bit words = 2 blocks of the sampler
    ks = np.frombuffer(chacha20_keystream(KEY, 0, 0, 16 * calls), dtype="<u4").reshape(
        calls, 16, 16)  # (call, lane = block in call, word)
    laid_out = ks.transpose(0, 2, 1).reshape(-1)  # (call, word, lane), flattened
    expected = laid_out[0::2].astype(np.uint64) | laid_out[1::2].astype(np.uint64) << np.uint64(32)
    got = ChaChaGaussian(KEY).words(expected.size).numpy().view(np.uint64)
    assert np.array_equal(got, expected)


# ------------------------------------------------------------------ tails to 9σ

def test_the_transform_reaches_9_sigma_with_the_exact_radius():
    """Pair 0's u1 from chosen 64-bit r = hi·2³² + lo: the radius is √(−2 ln((r + ½)·2⁻⁶⁴))
    (float64 here, float32 in dpfy: 1e-6 relative), from r = 0 (9.4926) to r = 2⁶⁴ − 1 (0)."""
    from dpfy.native.gaussian import BLOCK, gaussian_from_words
    rs = [0, 1, 2 ** 10, 2 ** 31, 2 ** 32, 2 ** 40, 2 ** 50, 2 ** 63, 2 ** 64 - 1]
    for r in rs:
        words = torch.zeros(3 * BLOCK, dtype=torch.int32)  # angle 0: z = (radius, 0)
        words[0] = (r >> 32) - (1 << 32 if r >> 63 else 0)  # high half (as int32 bits)
        words[BLOCK] = (r & 0xFFFFFFFF) - (1 << 32 if r & 0x80000000 else 0)  # low half
        z = gaussian_from_words(words)
        expected = math.sqrt(max(-2 * math.log((r + 0.5) * 2.0 ** -64), 0.0))
        assert abs(float(z[0]) - expected) <= 1e-6 * expected + 1e-3, (r, float(z[0]), expected)
        assert float(z[BLOCK]) == 0.0  # sin(0)
    assert MAX_RADIUS > 9


def test_seeded_compiled_sampler_reaches_9_sigma():
    """Regression: a xoshiro output r = 0 used to give u1 = ½·2⁻³¹ (31 bits), radius 6.66.

    Lane 0 with s0 = s3 = 0 outputs rotl(s0 + s3, 23) + s0 = 0 first; that output is pair 0's
    u1, whose cosine and sine are outputs 0 and 256, so their hypot is the radius √(130 ln 2).
    """
    src = NoiseSource(1)
    state = src.state_dict()["state"].clone()  # 4 × 16 words, word-major: s[w·16 + lane]
    state[0] = 0  # s0 of lane 0
    state[48] = 0  # s3 of lane 0 (s1, s2 stay nonzero: a valid xoshiro state)
    src.load_state_dict({"backend": "xoshiro", "state": state, "reproducible": True})
    z = src.gaussian(torch.zeros(512), 1.0)
    radius = math.hypot(float(z[0]), float(z[256]))
    assert radius > 9 and abs(radius - MAX_RADIUS) < 1e-5 * MAX_RADIUS


def test_secure_fallback_without_compiler_reaches_9_sigma(no_compiler, monkeypatch):
    """Regression: os.urandom's all-zero bits used to give u1 = ½·2⁻⁵³, radius 8.65 < 9."""
    src = quiet(lambda: NoiseSource())
    monkeypatch.setattr(os, "urandom", lambda n: bytes(n))
    z = src.gaussian(torch.zeros(4, dtype=torch.float64), 1.0)
    assert float(z[0]) > 9 and abs(float(z[0]) - MAX_RADIUS) < 1e-12 * MAX_RADIUS


def box_muller_from_words(words: np.ndarray) -> np.ndarray:
    """The fallbacks' float64 transform written out: pair i takes u1 = (r + ½)·2⁻⁶⁴ from word i
    and its angle from the top 52 bits of word k + i; the k cosines, then the k sines."""
    u = words.view(np.uint64)
    k = u.size // 2
    u1 = (u[:k] >> np.uint64(12)).astype(np.float64) * 2.0 ** -52 + \
        ((u[:k] & np.uint64(0xFFF)).astype(np.float64) + 0.5) * 2.0 ** -64
    u2 = ((u[k:] >> np.uint64(12)).astype(np.float64) + 0.5) * 2.0 ** -52
    radius = np.sqrt(-2 * np.log(u1))
    return np.concatenate([radius * np.cos(2 * np.pi * u2), radius * np.sin(2 * np.pi * u2)])


def test_torch_backend_is_box_muller_on_64_bit_words():
    """Regression: backend="torch" used torch's normal_ (cut at 5.77σ in float32). It now
    draws 64-bit words from the seeded generator and applies Box–Muller in float64, whose
    radius reaches √(130 ln 2) (checked at r = 0 below)."""
    src = NoiseSource(7, backend="torch")
    z = src.gaussian(torch.zeros(1000, dtype=torch.float64), 1.0).numpy()
    gen = torch.Generator().manual_seed(7)
    words = torch.empty(1000, dtype=torch.int64).random_(-2 ** 63, None, generator=gen).numpy()
    np.testing.assert_allclose(z, box_muller_from_words(words), rtol=1e-12, atol=1e-12)
    assert box_muller_from_words(np.zeros(2, dtype=np.int64))[0] == pytest.approx(MAX_RADIUS,
                                                                                     rel=1e-12)


# ------------------------------------------------------------------ the law, per backend

def assert_standard_normal(z: torch.Tensor) -> None:
    """Moments and tail masses within 5 standard errors; a KS test."""
    z = z.double()
    n = z.numel()
    assert abs(float(z.mean())) < 5 / math.sqrt(n)
    assert abs(float(z.var()) - 1) < 5 * math.sqrt(2 / n)
    assert abs(float(z.pow(4).mean()) - 3) < 5 * math.sqrt(96 / n)  # Var(z⁴) = 105 − 3²
    assert stats.kstest(z[:200_000].numpy(), "norm").pvalue > 1e-3
    for k in (1.0, 2.0, 3.0, 4.0, 4.5):  # two-sided tail masses, incl. the far tail
        p = 2 * stats.norm.sf(k)
        freq = float((z.abs() > k).double().mean())
        assert abs(freq - p) < 5 * math.sqrt(p * (1 - p) / n) + 1 / n, (k, freq, p)


def test_chacha20_draws_are_standard_normal_and_independent():
    from dpfy.native.gaussian import BLOCK, ChaChaGaussian
    z = ChaChaGaussian(KEY).axpy_(torch.empty(N), 0.0, 1.0).double()  # fixed key: deterministic
    assert_standard_normal(z)
    pairs = z[: (N // (2 * BLOCK)) * 2 * BLOCK].view(-1, 2, BLOCK)
    cos_part, sin_part = pairs[:, 0].reshape(-1), pairs[:, 1].reshape(-1)
    bound = 5 / math.sqrt(cos_part.numel())

    def corr(a: torch.Tensor, b: torch.Tensor) -> float:
        return float(torch.corrcoef(torch.stack([a, b]))[0, 1])

    assert abs(corr(z[:-1], z[1:])) < 5 / math.sqrt(N)
    assert abs(corr(cos_part, sin_part)) < bound
    assert abs(corr(cos_part ** 2, sin_part ** 2)) < bound  # independent, not only uncorrelated


def test_fallback_draws_are_standard_normal():
    torch_backend = NoiseSource(3, backend="torch")
    urandom = NoiseSource(backend="urandom")
    for src in (torch_backend, urandom):
        assert_standard_normal(src.gaussian(torch.zeros(N, dtype=torch.float64), 1.0))


# ------------------------------------------------------------------ secure_uniform

def test_secure_uniform_is_open_and_uniform():
    u = secure_uniform(200_000)
    n = u.numel()
    assert u.dtype == torch.float64 and 0 < float(u.min()) and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 5 * math.sqrt(1 / 12 / n)  # Var U(0,1) = 1/12
    assert stats.kstest(u.numpy(), "uniform").pvalue > 1e-6
    assert not torch.equal(secure_uniform(100), secure_uniform(100))


def test_secure_uniform_never_returns_one(no_compiler, monkeypatch):
    """Regression: (top 53 bits + ½)·2⁻⁵³ rounded to 1.0 when all bits were 1 (54 significant
    bits do not fit a double); (top 52 bits + ½)·2⁻⁵² fits exactly."""
    fresh = getattr(dpfy.noise.generator, "_SecureWords", None)  # a stream built with the compiler away
    if fresh is not None:
        monkeypatch.setattr(dpfy.noise.generator, "_secure_words", fresh())
    monkeypatch.setattr(os, "urandom", lambda n: b"\xff" * n)
    assert float(secure_uniform(8).max()) < 1
    monkeypatch.setattr(os, "urandom", lambda n: bytes(n))
    assert float(secure_uniform(8).min()) > 0


@pytest.mark.skipif(not {"avx2", "fma", "bmi2", "movbe"} <= build._cpu_flags(),
                    reason="needs a CPU that runs x86-64-v3 code")
def test_the_avx2_build_draws_the_same_stream(monkeypatch, tmp_path):
    """Machines without AVX-512 get the x86-64-v3 build: the same keystream bit for bit, and
    the same normals up to the vector math's last bits."""
    from dpfy.native import gaussian
    v4 = gaussian.ChaChaGaussian(KEY).axpy_(torch.empty(4096), 0.0, 1.0)
    monkeypatch.setenv("DPFY_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(build, "target_flags", lambda: ["-march=x86-64-v3"])
    build.load.cache_clear()
    try:
        assert gaussian.chacha20_keystream(bytes(32), 0, 0, 2) == RFC_A_1
        v3 = gaussian.ChaChaGaussian(KEY).axpy_(torch.empty(4096), 0.0, 1.0)
        torch.testing.assert_close(v3, v4, rtol=1e-5, atol=1e-5)
    finally:
        build.load.cache_clear()
