"""The fused Triton noise kernel (issue 36 §1), run on the CPU by Triton's interpreter
(``TRITON_INTERPRET=1``, set here for every test), and its wiring behind ``NoiseSource``.

Where the expected numbers come from:
- ChaCha20: RFC 8439's test vectors (§2.3.2, appendix A.1; copied in test_device_chacha.py from
  the RFC text) and two independent implementations, dpfy's compiled C sampler and its torch
  one, on random keys across the 32-bit and 64-bit counter carries: bit-equal words;
- the transform: test_device_chacha.py's float64 rendering of gaussian.c's float32 formulas,
  and the radius √(−2 ln u1) at chosen u1, derived here;
- the law: N(0, 1)'s moments, tail masses (scipy) and a KS test, on a fixed key (deterministic),
  each tolerance five standard errors of the estimate it bounds.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

pytest.importorskip("triton")

import dpfy.noise.generator  # noqa: E402
import dpfy.noise.triton_noise as tn  # noqa: E402
from dpfy.native.gaussian import BLOCK, ChaChaGaussian  # noqa: E402
from dpfy.native.gaussian import chacha20_keystream as c_keystream  # noqa: E402
from dpfy.noise import NoiseSource  # noqa: E402
from dpfy.noise.chacha20 import chacha20_blocks, key_words  # noqa: E402
from dpfy.noise.device_gaussian import DeviceChaChaGaussian  # noqa: E402
from test_device_chacha import (  # noqa: E402
    KEY,
    MAX_RADIUS,
    RFC_2_3_2,
    RFC_A_1,
    assert_standard_normal,
    le32,
    random_words,
    reference_transform,
    ulps,
)

SAMPLER_CHACHA_BLOCKS = 48  # ChaCha20 blocks per 512 normals (device_gaussian's layout)


@pytest.fixture(autouse=True)
def _interpreted(monkeypatch):
    """Kernels run on the CPU: the module re-decorates them when the variable changes."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def serialized(words: torch.Tensor) -> bytes:
    return words.cpu().numpy().astype("<i4").tobytes()


# ------------------------------------------------------------------ ChaCha20


def test_block_function_matches_rfc8439_2_3_2_and_a_1():
    counter = 1 | le32("00000009") << 32  # RFC counter 1 and nonce word n0 (64-bit counter)
    nonce = le32("0000004a") | le32("00000000") << 32
    assert serialized(tn.chacha_words(key_words(KEY), counter, nonce, 1)) == RFC_2_3_2
    assert serialized(tn.chacha_words(key_words(bytes(32)), 0, 0, 2)) == RFC_A_1


@pytest.mark.parametrize("counter", [2**32 - 7, 2**64 - 5, 12345])
def test_words_equal_the_compiled_and_torch_chacha20_across_the_counter_carries(counter):
    key, nonce = os.urandom(32), int.from_bytes(os.urandom(8), "little")
    got = tn.chacha_words(key_words(key), counter, nonce, 37)
    assert serialized(got) == c_keystream(key, counter, nonce, 37)
    assert torch.equal(got, chacha20_blocks(key_words(key), counter, nonce, 37).t())


# ------------------------------------------------------------------ the transform


def test_transform_is_gaussian_c_up_to_the_last_bits_of_float32_math():
    """On chosen words, against the exact-function reference (float64 log, sin, cos, rounded
    where gaussian.c rounds): the interpreter takes log, sin and cos from numpy's float32
    functions (≤ 4 ulps each on x86 SIMD builds, numpy's documented bound) and an exact square
    root; the radius carries ≤ 4·½ + ½ ulp (√ halves log's relative error), the product ≤ 2.5 +
    4 + ½ = 7 ulps, one more for whole-ulp rounding: 8."""
    words = random_words(64, seed=3)
    got = tn.gaussian_from_words(words)
    reference = torch.from_numpy(reference_transform(words.numpy()))
    assert int(ulps(got, reference).max()) <= 8


def test_tails_reach_9_sigma_with_the_exact_radius():
    """Pair 0's r = hi·2³² + lo at chosen values, angle 0: z = √(−2 ln((r + ½)·2⁻⁶⁴)), from
    √(130 ln 2) ≈ 9.4926 at r = 0 down to 0 at r = 2⁶⁴ − 1; the sine output exactly 0. u1 is
    float32 with 2⁻²³ relative precision at every scale, so the radius is within 1e-6
    relative (plus the float32 log's error, 1e-3 absolute near u1 = 1 where it is ~0)."""
    rs = [0, 1, 2**10, 2**31, 2**32, 2**40, 2**50, 2**63, 2**64 - 1]
    words = torch.zeros(len(rs), 3, BLOCK, dtype=torch.int32)
    for g, r in enumerate(rs):
        words[g, 0, 0] = (r >> 32) - (1 << 32 if r >> 63 else 0)  # as int32 bits
        words[g, 1, 0] = (r & 0xFFFFFFFF) - (1 << 32 if r & 0x80000000 else 0)
    z = tn.gaussian_from_words(words)
    for g, r in enumerate(rs):
        expected = math.sqrt(max(-2 * math.log((r + 0.5) * 2.0**-64), 0.0))
        assert abs(float(z[g, 0]) - expected) <= 1e-6 * expected + 1e-3, (r, float(z[g, 0]))
        assert float(z[g, BLOCK]) == 0.0
    assert float(z[0, 0]) > 9 and abs(float(z[0, 0]) - MAX_RADIUS) < 1e-5 * MAX_RADIUS


def test_stream_normals_are_the_compiled_and_torch_samplers_to_the_last_bits():
    """Same key, counter and nonce: the same normals in the same order (the layout is the
    compiled sampler's, across a call that ends mid-block), within 16 ulps of the C code (its
    -ffast-math functions, test_device_chacha.py) and of torch's; any wrong word would be off
    by the whole scale of a normal."""
    key, counter = os.urandom(32), 2**32 - 100  # the counter crosses 2³² inside the call
    n = 7 * 2 * BLOCK + 100
    got = tn.TritonChaChaGaussian("cpu", key, counter, 5).normal(n)
    c = ChaChaGaussian(key, counter, 5).axpy_(torch.empty(n), 0.0, 1.0)
    d = DeviceChaChaGaussian("cpu", key, counter, 5).normal(n)
    assert got.dtype == torch.float32 and got.shape == (n,)
    assert int(ulps(got, c).max()) <= 16 and int(ulps(got, d).max()) <= 16


# ------------------------------------------------------------------ the law

N = 1 << 18


def test_draws_are_standard_normal_on_a_fixed_key():
    z = tn.TritonChaChaGaussian("cpu", KEY).normal(N)  # fixed key and counter: deterministic
    assert_standard_normal(z)
    assert abs(float(torch.corrcoef(torch.stack([z[:-1], z[1:]]).double())[0, 1])) < 5 / N**0.5


# ------------------------------------------------------------------ counters and the fused update


def test_counter_advances_by_the_blocks_consumed_and_is_never_reused():
    stream = tn.TritonChaChaGaussian("cpu", KEY, counter=10)
    first = stream.normal(1000)  # ⌈1000/512⌉ = 2 sampler blocks: 96 ChaCha20 blocks
    assert stream._counter == 10 + 2 * SAMPLER_CHACHA_BLOCKS
    x = torch.ones(513)
    stream.axpy_(x, 1.0, 1.0)  # 2 more sampler blocks
    assert stream._counter == 10 + 4 * SAMPLER_CHACHA_BLOCKS
    # the second call's noise is the stream's next blocks, not the first call's again
    ahead = tn.TritonChaChaGaussian("cpu", KEY, counter=10).normal(4 * 2 * BLOCK)
    torch.testing.assert_close(first, ahead[:1000], rtol=0, atol=0)
    later = ahead[2 * 2 * BLOCK : 2 * 2 * BLOCK + 513]
    # x = 1 + z: two float32 roundings of numbers below 12 (|z| < 9.5): ≤ 2 ulp(16) = 2⁻¹⁹
    torch.testing.assert_close(x, 1 + later, rtol=0, atol=2.0**-19)
    assert not torch.allclose(x - 1, first[:513])


def test_threads_reserve_disjoint_counter_ranges():
    """Each call reserves its blocks under the stream's lock before launching: 8 threads × 50
    reservations of different sizes tile the counter with no overlap and no gap."""
    import threading

    stream = tn.TritonChaChaGaussian("cpu", KEY, counter=2**64 - 1000)  # wraps past 2⁶⁴ too
    got: list[tuple[int, int]] = []
    lock = threading.Lock()

    def work(size: int) -> None:
        for _ in range(50):
            start = stream._reserve(size)
            with lock:
                got.append((start, size))

    threads = [threading.Thread(target=work, args=(48 * (k + 1),)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    blocks = sorted((start - (2**64 - 1000)) % 2**64 for start, size in got for start in
                    range(start, start + size))  # fmt: skip
    assert blocks == list(range(50 * 48 * 36))  # 36 = 1 + … + 8


def test_a_draw_split_over_launches_is_the_same_stream(monkeypatch):
    """Above 2²⁴ sampler blocks a draw is split over launches (the kernel's counter offset is
    32 bits); each launch starts at its own counter, so the values are the one launch's."""
    whole = tn.TritonChaChaGaussian("cpu", KEY, counter=2**32 - 60).normal(3 * 512 + 7)
    monkeypatch.setattr(tn, "_MAX_BLOCKS_PER_LAUNCH", 2)
    split = tn.TritonChaChaGaussian("cpu", KEY, counter=2**32 - 60).normal(3 * 512 + 7)
    assert torch.equal(split, whole)


def test_fused_update_is_total_over_b_plus_scaled_noise_in_one_pass():
    """x ← a·x + s·z, float32 and bfloat16 in place: float32 has three roundings (a·x, s·z,
    the sum), each ≤ ½ ulp of a value below 2·max|result|; bfloat16 (computed in float32)
    adds the conversion of the result to 8 significant bits: ≤ 2⁻⁸ relative when rounded to
    nearest (a GPU), < 2⁻⁷ when truncated (Triton's interpreter truncates)."""
    total = torch.linspace(-50, 50, 3001)
    z = tn.TritonChaChaGaussian("cpu", KEY, counter=7).normal(3001).double()
    out = total.clone()
    assert tn.TritonChaChaGaussian("cpu", KEY, counter=7).axpy_(out, 0.25, 0.5) is out
    expected = total.double() / 4 + 0.5 * z
    bound = 3 * 2.0**-24 * 2 * float(expected.abs().max())
    assert float((out.double() - expected).abs().max()) <= bound
    half = total.to(torch.bfloat16)
    expected = half.double() / 4 + 0.5 * z  # from the bfloat16 inputs
    tn.TritonChaChaGaussian("cpu", KEY, counter=7).axpy_(half, 0.25, 0.5)
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.double(), expected, rtol=2.0**-7, atol=bound)


# ------------------------------------------------------------------ behind NoiseSource


def test_the_triton_backend_draws_every_devices_noise_with_the_kernel(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the host sampler was used")

    monkeypatch.setattr(ChaChaGaussian, "axpy_", refuse)
    launches = []
    real = tn.chacha_axpy_
    monkeypatch.setattr(tn, "chacha_axpy_", lambda *a, **k: launches.append(1) or real(*a, **k))
    src = NoiseSource(backend="triton")
    assert src.secure and src.generator_for("cpu") == "triton-chacha20"
    flat = torch.full((3000,), 8.0)  # one flat buffer: every parameter's sum
    out = src.noisy_mean(flat, std=6.0, normalizer=2.0)
    assert out is flat and len(launches) == 1  # one launch for the whole buffer
    n = out.numel()
    assert abs(float(out.double().mean()) - 4.0) < 5 * 3.0 / math.sqrt(n)
    assert abs(float(out.double().std()) - 3.0) < 5 * 3.0 * math.sqrt(0.5 / n)
    t = torch.zeros(700, dtype=torch.float64)  # not a fused dtype: drawn, then added
    assert src.add_gaussian_(t, 2.0) is t and float(t.std()) > 1
    assert isinstance(src._devices[torch.device("cpu")], tn.TritonChaChaGaussian)


def test_auto_uses_the_kernel_on_a_gpu_and_keeps_the_compiled_sampler_on_the_cpu():
    secure, seeded = NoiseSource(), NoiseSource(3)
    assert secure.generator_for("cpu") == "chacha20" and seeded.generator_for("cpu") == "xoshiro"
    assert secure.generator_for("cuda") == "triton-chacha20"  # interpreted here: "available"
    assert seeded.generator_for("cuda") == "triton-chacha20-seeded"
    assert NoiseSource(3, backend="torch").generator_for("cuda") == "torch-device"  # asked for


def test_a_secure_checkpoint_holds_no_key_and_resumes_rekeyed():
    a = NoiseSource(backend="triton")
    x = a.gaussian(torch.zeros(2000), 1.0)
    state = a.state_dict()
    assert state == {"reproducible": False, "backend": "chacha20", "device_noise": "triton"}
    resumed = [NoiseSource(7), NoiseSource()]
    for r in resumed:
        r.load_state_dict(state)
        assert r.secure and r.generator_for("cpu") == "triton-chacha20"
    y, z = (r.gaussian(torch.zeros(2000), 1.0) for r in resumed)
    assert not torch.equal(y, z) and not torch.equal(y, x)


def test_a_forked_child_rekeys(monkeypatch):
    a = NoiseSource(backend="triton")
    a.gaussian(torch.zeros(10), 1.0)
    (stream,) = a._devices.values()
    twin = NoiseSource(backend="triton")
    twin._devices[torch.device("cpu")] = tn.TritonChaChaGaussian("cpu")
    twin._devices[torch.device("cpu")]._key = stream._key.clone()  # the same key and counter
    twin._devices[torch.device("cpu")]._counter = stream._counter
    monkeypatch.setattr(dpfy.noise.generator.os, "getpid", lambda: -12345)  # as in a child
    assert not torch.equal(a.gaussian(torch.zeros(500), 1.0), twin.gaussian(torch.zeros(500), 1.0))


def test_seeded_noise_is_reproducible_and_resumes_bit_identically():
    a, b = NoiseSource(5, backend="triton"), NoiseSource(5, backend="triton")
    assert a.generator_for("cpu") == "triton-chacha20-seeded"
    assert torch.equal(a.gaussian(torch.zeros(1000), 1.0), b.gaussian(torch.zeros(1000), 1.0))
    assert not torch.equal(
        NoiseSource(6, backend="triton").gaussian(torch.zeros(1000), 1.0),
        b.gaussian(torch.zeros(1000), 1.0),
    )
    state = a.state_dict()
    assert state["device_generators"]["cpu"].dtype == torch.int64  # (key, counter, nonce)
    x = a.noisy_mean(torch.ones(1500), 2.0, 4.0)
    resumed = NoiseSource(99)
    resumed.load_state_dict(state)
    assert resumed.generator_for("cpu") == "triton-chacha20-seeded"
    assert torch.equal(resumed.noisy_mean(torch.ones(1500), 2.0, 4.0), x)


def test_a_seeded_checkpoint_continues_in_torch_operations_where_triton_cannot_run(monkeypatch):
    """The words are the same ChaCha20 stream; the normals agree to float32 ulps (16, as the
    stream test above), so the continuation is the same noise up to float rounding."""
    a = NoiseSource(5, backend="triton")
    a.gaussian(torch.zeros(100), 1.0)
    state = a.state_dict()
    x = a.gaussian(torch.zeros(1500), 1.0)
    monkeypatch.setattr(tn, "triton_available", lambda device: False)
    resumed = NoiseSource(0)
    resumed.load_state_dict(state)
    resumed._choice = "auto"  # as on a machine where the kernel is not used
    monkeypatch.setattr(NoiseSource, "_on_device", lambda self, device: True)
    y = resumed.gaussian(torch.zeros(1500), 1.0)
    assert int(ulps(x, y).max()) <= 16


def test_without_triton_the_backend_names_the_extra(monkeypatch):
    import sys

    from dpfy._require import MissingExtra

    monkeypatch.setitem(sys.modules, "triton", None)  # as if not installed
    with pytest.raises(MissingExtra, match=r"dpfy\[gpu\]"):
        NoiseSource(backend="triton")


def test_a_kernel_that_cannot_compile_falls_back_to_torch_ops_on_the_same_key(monkeypatch):
    """First launch fails (as where Triton cannot compile for a device): one warning, the
    torch ChaCha20 on the same key draws instead, past the failed call's counter range."""

    def broken(*args, **kwargs):
        raise RuntimeError("no compiler for this device")

    monkeypatch.setattr(tn, "chacha_axpy_", broken)
    stream = tn.TritonChaChaGaussian("cpu", KEY, counter=0)
    x = torch.zeros(600)
    with pytest.warns(RuntimeWarning, match="torch operations"):
        stream.axpy_(x, 1.0, 1.0)
    assert stream.torch_ops and stream._counter == 4 * SAMPLER_CHACHA_BLOCKS  # 2 reserved + 2 drawn
    ahead = DeviceChaChaGaussian("cpu", KEY, counter=2 * SAMPLER_CHACHA_BLOCKS).normal(600)
    assert torch.equal(x, ahead)  # 0·1 + z: the torch stream's own normals, exactly


def test_the_kernel_compiles_for_a_gpu_with_accurate_math(monkeypatch, tmp_path):
    """No GPU needed: Triton lowers the kernel to PTX for an sm_90 target (an H100/H200) with
    its bundled toolchain (seconds: the 10 double rounds are a loop, not unrolled). The GPU
    build takes log, sin and cos from libdevice and a correctly rounded square root, never the
    approximate instructions (lg2.approx: 2⁻²² absolute error near u1 = 1; sin/cos.approx),
    which is what the tail and ulp claims rest on."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # compiled here, not read back
    mod = tn._kernels()
    assert not mod.INTERPRETED
    signature = {
        "x_ptr": "*fp32",
        "key_ptr": "*i32",
        "c_lo": "i32",
        "c_hi": "i32",
        "n_lo": "i32",
        "n_hi": "i32",
        "n": "i32",
        "a": "fp32",
        "s": "fp32",
        "BLOCK_SIZE": "constexpr",
        "WRITE_ONLY": "constexpr",
        "ACCURATE": "constexpr",
    }
    source = ASTSource(
        fn=mod.chacha_gaussian_kernel,
        signature=signature,
        constexprs={"BLOCK_SIZE": 128, "WRITE_ONLY": False, "ACCURATE": True},
    )
    ptx = compile(
        source, target=GPUTarget("cuda", 90, 32), options={"enable_fp_fusion": False}
    ).asm["ptx"]
    assert "sqrt.rn.f32" in ptx
    for approximate in ("lg2.approx", "sin.approx", "cos.approx", "ex2.approx"):
        assert approximate not in ptx, approximate


class _DeviceState(torch.Tensor):
    """A state tensor as one loaded with ``map_location="cuda"`` behaves towards numpy:
    refused until ``.cpu()`` ("can't convert cuda:0 device type tensor to numpy")."""

    def numpy(self, *args, **kwargs):
        raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu()")

    def cpu(self, *args, **kwargs):
        return self.as_subclass(torch.Tensor)


def test_a_seeded_stream_resumes_from_a_state_loaded_onto_the_device():
    """A checkpoint's generator state may come back on the GPU (``torch.load(...,
    map_location="cuda")``); resuming from it must continue the same stream."""
    a = tn.seeded_stream(bytes(range(32)), torch.device("cpu"))
    state = a.get_state()
    x = a.normal(1000)
    b = tn.seeded_stream(None, torch.device("cpu"), state=state.clone().as_subclass(_DeviceState))
    assert torch.equal(b.normal(1000), x)
