"""ChaCha20 (RFC 8439, 20 rounds) in torch integer tensor operations: on any device.

One ChaCha20 block per counter value, all blocks of a call computed at once: the 16 words of
the state are four (4, n) int32 tensors, the rows a, b, c, d of the RFC's 4 × 4 matrix, so a
column round is one quarter round on whole tensors and a diagonal round the same after rolling
b, c and d by one, two and three rows (the usual SIMD formulation of Bernstein's cipher).

Words are int32 holding the 32-bit words' bits: torch has no uint32 arithmetic on every device,
but int32 addition wraps modulo 2³² (two's complement) on every backend, XOR and the left shift
act on the bits, and the one operation that sees the sign, the right shift, is made logical by
masking the bits it sign-extends. (int64 with masking is also correct, but moves twice the
memory and needs a mask after every addition; on this machine int32 is the faster.)

The input layout is the original ChaCha one that dpfy's compiled sampler uses: words 12–13 a
64-bit block counter, words 14–15 a 64-bit nonce; RFC 8439's 32-bit counter c and 96-bit nonce
(n0, n1, n2) are counter = c | n0 << 32 and nonce = n1 | n2 << 32. The counter wraps modulo
2⁶⁴ across its two words, as in the compiled sampler.
"""

from __future__ import annotations

import torch

__all__ = ["SIGMA", "key_words", "chacha20_blocks", "chacha20_keystream"]

SIGMA = (0x61707865, 0x3320646E, 0x79622D32, 0x6B206574)  # "expand 32-byte k", RFC 8439 §2.3
_MASK32 = 0xFFFFFFFF
_ROTATIONS = (16, 12, 8, 7)  # the quarter round's left rotations, RFC 8439 §2.1


def _as_int32(values: torch.Tensor) -> torch.Tensor:
    """int64 tensor of 32-bit unsigned values → int32 with the same bits (no overflowing cast)."""
    return (((values + 2**31) & _MASK32) - 2**31).to(torch.int32)


def key_words(key: bytes, device: torch.device | str = "cpu") -> torch.Tensor:
    """A 32-byte key as its 8 little-endian 32-bit words (int32 bits) on ``device``."""
    if len(key) != 32:
        raise ValueError(f"key must be 32 bytes, got len(key) = {len(key)}. Pass os.urandom(32)")
    words = torch.frombuffer(bytearray(key), dtype=torch.uint8).view(8, 4).to(torch.int64)
    packed = words[:, 0] | words[:, 1] << 8 | words[:, 2] << 16 | words[:, 3] << 24
    return _as_int32(packed).to(device)


class _Constants:
    """The quarter round's shift amounts and masks as 0-dim int32 tensors on one device (a
    Python-number operand costs torch a slower broadcast path; a tensor one does not)."""

    def __init__(self, device: torch.device) -> None:
        def t(v: int) -> torch.Tensor:
            return torch.tensor(v, dtype=torch.int32, device=device)

        self.left = {k: t(k) for k in _ROTATIONS}
        self.right = {k: t(32 - k) for k in _ROTATIONS}
        self.low = {k: t((1 << k) - 1) for k in _ROTATIONS}


_constants: dict[torch.device, _Constants] = {}


def _rotl_(x: torch.Tensor, k: int, tmp: torch.Tensor, c: _Constants) -> None:
    """x ← x rotated left by k bits, in place (tmp: scratch of x's shape)."""
    torch.bitwise_right_shift(x, c.right[k], out=tmp)
    tmp.bitwise_and_(c.low[k])  # the arithmetic shift's sign bits cleared: a logical shift
    x.bitwise_left_shift_(c.left[k]).bitwise_or_(tmp)


def _quarter_rounds_(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    d: torch.Tensor,
    tmp: torch.Tensor,
    k: _Constants,
) -> None:
    """RFC 8439 §2.1's quarter round on every column of (a, b, c, d) at once, in place: its
    four lines x += y; z ^= x; z <<<= n, in order."""
    for x, y, z, n in ((a, b, d, 16), (c, d, b, 12), (a, b, d, 8), (c, d, b, 7)):
        x.add_(y)
        z.bitwise_xor_(x)
        _rotl_(z, n, tmp, k)


def _input_state(key: torch.Tensor, counter: int, nonce: int, n: int) -> torch.Tensor:
    """(16, n) int32: the input words of the blocks with counters counter, …, counter + n − 1."""
    device = key.device
    counter %= 2**64
    nonce %= 2**64
    low = torch.arange(n, dtype=torch.int64, device=device) + (counter & _MASK32)
    state = torch.empty(16, n, dtype=torch.int32, device=device)
    for w, s in enumerate(SIGMA):  # fill_ with a number: a kernel argument, no host copy
        state[w].fill_(s - 2**32 if s >= 2**31 else s)
    state[4:12] = key.view(8, 1)
    state[12] = _as_int32(low & _MASK32)
    state[13] = _as_int32(((counter >> 32) + (low >> 32)) & _MASK32)  # the carry of word 12
    for w, v in ((14, nonce & _MASK32), (15, nonce >> 32)):
        state[w].fill_(v - 2**32 if v >= 2**31 else v)
    return state


def chacha20_blocks(key: torch.Tensor, counter: int, nonce: int, n: int) -> torch.Tensor:
    """(16, n) int32: word w of the ChaCha20 block with counter ``counter + j`` at [w, j].

    ``key``: the 8 key words (:func:`key_words`); the blocks are computed on its device.
    """
    if key.dtype != torch.int32 or key.shape != (8,):
        raise ValueError(
            f"key must be the 8 int32 key words, got dtype={key.dtype}, "
            f"shape={tuple(key.shape)}. Pass key_words(os.urandom(32), device)"
        )
    consts = _constants.get(key.device)
    if consts is None:
        consts = _constants.setdefault(key.device, _Constants(key.device))
    start = _input_state(key, counter, nonce, n)
    a, b, c, d = (start[4 * r : 4 * r + 4].clone() for r in range(4))
    tmp = torch.empty_like(a)
    for _ in range(10):  # 10 double rounds = 20 rounds
        _quarter_rounds_(a, b, c, d, tmp, consts)  # columns
        b, c, d = b.roll(-1, 0), c.roll(-2, 0), d.roll(-3, 0)
        _quarter_rounds_(a, b, c, d, tmp, consts)  # diagonals
        b, c, d = b.roll(1, 0), c.roll(2, 0), d.roll(3, 0)
    return torch.cat([a, b, c, d]).add_(start)  # RFC 8439 §2.3: add the input words


def chacha20_keystream(
    key: bytes, counter: int, nonce: int, nblocks: int, device: torch.device | str = "cpu"
) -> bytes:
    """``nblocks`` ChaCha20 blocks from block ``counter`` on, serialized as in RFC 8439
    (little-endian words), computed on ``device``."""
    blocks = chacha20_blocks(key_words(key, device), counter, nonce, nblocks)
    return blocks.t().contiguous().cpu().numpy().astype("<i4").tobytes()  # block-major
