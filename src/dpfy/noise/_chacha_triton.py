"""The fused Triton kernel: ChaCha20 words and Box–Muller normals in one launch.

Imported only by :mod:`dpfy.noise.triton_noise` (which reloads it when ``TRITON_INTERPRET``
changes, since ``triton.jit`` reads that variable when a function is decorated). Everything
here is Triton; the host side, the layout and the key handling are documented there.

One kernel element is one (sampler block g, lane l) of the compiled sampler's layout
(:mod:`dpfy.noise.device_gaussian`): it computes the three ChaCha20 blocks with counters
counter + 48g + 16j + l (j = 0, 1, 2: u1's high words, u1's low words, the angles), whose word
w is pair 16w + l of sampler block g, and writes that pair's two normals at 512g + 16w + l
(r·cos) and 512g + 256 + 16w + l (r·sin). The words of a ChaCha20 block are computed once and
used whole: nothing is drawn and thrown away.
"""

from __future__ import annotations

import triton
import triton.language as tl

try:  # the accurate device math library (CUDA's libdevice, ROCm's ocml); absent in the interpreter
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - every Triton ≥ 3 has it
    libdevice = None

INTERPRETED = bool(triton.knobs.runtime.interpret)

_TWO_PI_F32: tl.constexpr = tl.constexpr(6.2831854820251465)  # float32(2π), as gaussian.c


@triton.jit
def _quarter(a, b, c, d):
    """RFC 8439 §2.1's quarter round on uint32 tensors. Additions wrap modulo 2³² (the
    cipher's, not an overflow for the interpreter's checker to test); its four lines are
    written out, not one helper called four times, since under the interpreter every call of
    a jit function re-patches the language (with a helper the CPU tests of this kernel took
    21.5 s instead of 16.3 s)."""
    a = tl.add(a, b, sanitize_overflow=False)
    d = d ^ a
    d = (d << 16) | (d >> 16)
    c = tl.add(c, d, sanitize_overflow=False)
    b = b ^ c
    b = (b << 12) | (b >> 20)
    a = tl.add(a, b, sanitize_overflow=False)
    d = d ^ a
    d = (d << 8) | (d >> 24)
    c = tl.add(c, d, sanitize_overflow=False)
    b = b ^ c
    b = (b << 7) | (b >> 25)
    return a, b, c, d


@triton.jit
def _chacha20_block(k0, k1, k2, k3, k4, k5, k6, k7, i12, i13, i14, i15):
    """RFC 8439 §2.3's block function: the 16 output words (uint32 tensors) of the blocks whose
    input words 12–15 are (i12, i13, i14, i15) under the key words k0…k7."""
    x0 = tl.full(i12.shape, 0x61707865, tl.uint32)
    x1 = tl.full(i12.shape, 0x3320646E, tl.uint32)
    x2 = tl.full(i12.shape, 0x79622D32, tl.uint32)
    x3 = tl.full(i12.shape, 0x6B206574, tl.uint32)
    x4 = x0 * 0 + k0
    x5 = x0 * 0 + k1
    x6 = x0 * 0 + k2
    x7 = x0 * 0 + k3
    x8 = x0 * 0 + k4
    x9 = x0 * 0 + k5
    x10 = x0 * 0 + k6
    x11 = x0 * 0 + k7
    x12 = i12
    x13 = i13
    x14 = x0 * 0 + i14
    x15 = x0 * 0 + i15
    for _ in range(10):  # 10 double rounds = 20 rounds (a loop: 1/10 the code to compile)
        x0, x4, x8, x12 = _quarter(x0, x4, x8, x12)  # columns
        x1, x5, x9, x13 = _quarter(x1, x5, x9, x13)
        x2, x6, x10, x14 = _quarter(x2, x6, x10, x14)
        x3, x7, x11, x15 = _quarter(x3, x7, x11, x15)
        x0, x5, x10, x15 = _quarter(x0, x5, x10, x15)  # diagonals
        x1, x6, x11, x12 = _quarter(x1, x6, x11, x12)
        x2, x7, x8, x13 = _quarter(x2, x7, x8, x13)
        x3, x4, x9, x14 = _quarter(x3, x4, x9, x14)
    return (
        x0 + 0x61707865,
        x1 + 0x3320646E,
        x2 + 0x79622D32,
        x3 + 0x6B206574,
        x4 + k0,
        x5 + k1,
        x6 + k2,
        x7 + k3,
        x8 + k4,
        x9 + k5,
        x10 + k6,
        x11 + k7,
        x12 + i12,
        x13 + i13,
        x14 + i14,
        x15 + i15,
    )


@triton.jit
def _block_at(key_ptr, c_lo, c_hi, n_lo, n_hi, offset):
    """The 16 words of the ChaCha20 blocks counter + offset (offset: uint32 tensor < 2³²)."""
    k0 = tl.load(key_ptr + 0).to(tl.uint32, bitcast=True)
    k1 = tl.load(key_ptr + 1).to(tl.uint32, bitcast=True)
    k2 = tl.load(key_ptr + 2).to(tl.uint32, bitcast=True)
    k3 = tl.load(key_ptr + 3).to(tl.uint32, bitcast=True)
    k4 = tl.load(key_ptr + 4).to(tl.uint32, bitcast=True)
    k5 = tl.load(key_ptr + 5).to(tl.uint32, bitcast=True)
    k6 = tl.load(key_ptr + 6).to(tl.uint32, bitcast=True)
    k7 = tl.load(key_ptr + 7).to(tl.uint32, bitcast=True)
    i12 = offset + c_lo  # the 64-bit counter + offset, word 12 carrying into word 13
    i13 = (i12 < c_lo).to(tl.uint32) + c_hi
    return _chacha20_block(k0, k1, k2, k3, k4, k5, k6, k7, i12, i13, n_lo, n_hi)


@triton.jit
def _u1(hi, lo):
    """u1 = hi·2⁻³² + (lo + ½)·2⁻⁶⁴ in float32, as gaussian.c: in [2⁻⁶⁵, 1]."""
    return (
        hi.to(tl.float32) * 2.3283064365386963e-10
        + (lo.to(tl.float32) + 0.5) * 5.421010862427522e-20
    )


@triton.jit
def _radius(hi, lo, ACCURATE: tl.constexpr):
    u1 = _u1(hi, lo)
    if ACCURATE:
        lg = libdevice.log(u1)
    else:
        lg = tl.log(u1)
    return tl.sqrt_rn(tl.maximum(-2.0 * lg, 0.0))


@triton.jit
def _store_pair(
    x_ptr, base, n, radius, angle, a, s, WRITE_ONLY: tl.constexpr, ACCURATE: tl.constexpr
):
    """x[base] ← a·x + s·r·cos θ and x[base + 256] ← a·x + s·r·sin θ, inside the buffer's n."""
    theta = ((angle >> 8).to(tl.float32) * 5.960464477539063e-08) * _TWO_PI_F32
    if ACCURATE:
        zc = radius * libdevice.cos(theta)
        zs = radius * libdevice.sin(theta)
    else:
        zc = radius * tl.cos(theta)
        zs = radius * tl.sin(theta)
    m_c = base < n
    m_s = base + 256 < n
    if WRITE_ONLY:
        tl.store(x_ptr + base, (s * zc).to(x_ptr.dtype.element_ty), mask=m_c)
        tl.store(x_ptr + base + 256, (s * zs).to(x_ptr.dtype.element_ty), mask=m_s)
    else:
        xc = tl.load(x_ptr + base, mask=m_c, other=0.0).to(tl.float32)
        tl.store(x_ptr + base, (a * xc + s * zc).to(x_ptr.dtype.element_ty), mask=m_c)
        xs = tl.load(x_ptr + base + 256, mask=m_s, other=0.0).to(tl.float32)
        tl.store(x_ptr + base + 256, (a * xs + s * zs).to(x_ptr.dtype.element_ty), mask=m_s)


# the counter, the nonce and the sizes vary per call: no compiled variant depends on them (one
# compilation per dtype and mode, ~12k PTX lines each, cached by Triton on disk)
@triton.jit(do_not_specialize=["c_lo", "c_hi", "n_lo", "n_hi", "n", "a", "s"])
def chacha_gaussian_kernel(
    x_ptr,
    key_ptr,
    c_lo,
    c_hi,
    n_lo,
    n_hi,
    n,
    a,
    s,
    BLOCK_SIZE: tl.constexpr,
    WRITE_ONLY: tl.constexpr,
    ACCURATE: tl.constexpr,
):
    """x[:n] ← a·x + s·z (z i.i.d. N(0, 1); with WRITE_ONLY, x ← s·z) from the ChaCha20 stream
    of the key at ``key_ptr`` (8 int32 words), counter c_hi·2³² + c_lo, nonce n_hi·2³² + n_lo
    (int32 bits). One element per (sampler block, lane): see the module docstring."""
    e = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    g = e // 16
    lane = e % 16
    c_lo = c_lo.to(tl.uint32, bitcast=True)
    c_hi = c_hi.to(tl.uint32, bitcast=True)
    n_lo = n_lo.to(tl.uint32, bitcast=True)
    n_hi = n_hi.to(tl.uint32, bitcast=True)
    offset = (g * 48 + lane).to(tl.uint32)  # the host keeps 48g + 47 below 2³²
    hi = _block_at(key_ptr, c_lo, c_hi, n_lo, n_hi, offset)
    lo = _block_at(key_ptr, c_lo, c_hi, n_lo, n_hi, offset + 16)
    ang = _block_at(key_ptr, c_lo, c_hi, n_lo, n_hi, offset + 32)
    start = g * 512 + lane
    for w in tl.static_range(16):
        radius = _radius(hi[w], lo[w], ACCURATE)
        _store_pair(x_ptr, start + 16 * w, n, radius, ang[w], a, s, WRITE_ONLY, ACCURATE)


@triton.jit(do_not_specialize=["c_lo", "c_hi", "n_lo", "n_hi", "nblocks"])
def chacha_words_kernel(
    out_ptr, key_ptr, c_lo, c_hi, n_lo, n_hi, nblocks, BLOCK_SIZE: tl.constexpr
):
    """out[16b + w] ← word w of ChaCha20 block counter + b (int32 bits), b < nblocks: RFC 8439's
    serialization once read as little-endian bytes. The same block function as the noise."""
    b = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = b < nblocks
    words = _block_at(
        key_ptr,
        c_lo.to(tl.uint32, bitcast=True),
        c_hi.to(tl.uint32, bitcast=True),
        n_lo.to(tl.uint32, bitcast=True),
        n_hi.to(tl.uint32, bitcast=True),
        b.to(tl.uint32),
    )
    for w in tl.static_range(16):
        tl.store(out_ptr + 16 * b + w, words[w].to(tl.int32, bitcast=True), mask=mask)


@triton.jit
def gaussian_from_words_kernel(
    words_ptr, out_ptr, nblocks, BLOCK_SIZE: tl.constexpr, ACCURATE: tl.constexpr
):
    """out (G, 512) float32 ← the fused kernel's transform of given words (G, 3, 256) int32
    (u1's high words, low words, angles): the noise kernel's own functions on chosen input."""
    e = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    g = e // 256
    i = e % 256
    mask = g < nblocks
    hi = tl.load(words_ptr + g * 768 + i, mask=mask, other=0).to(tl.uint32, bitcast=True)
    lo = tl.load(words_ptr + g * 768 + 256 + i, mask=mask, other=0).to(tl.uint32, bitcast=True)
    ang = tl.load(words_ptr + g * 768 + 512 + i, mask=mask, other=0).to(tl.uint32, bitcast=True)
    radius = _radius(hi, lo, ACCURATE)
    _store_pair(out_ptr, g * 512 + i, nblocks * 512, radius, ang, 1.0, 1.0, True, ACCURATE)
