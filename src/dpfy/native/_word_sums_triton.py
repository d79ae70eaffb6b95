"""The Triton kernel of :mod:`dpfy.native.word_sums`: one program sums one chunk of 32-bit words.

Imported only through :func:`dpfy.native.triton_support.kernel_module` (reloaded when
``TRITON_INTERPRET`` changes). A chunk is given by its start address (an int64 read from a
table on the device, cast to a pointer: the chunks of all tensors in one launch, as Triton's
grouped matmul reads its operands) and its length in words; its words are read as int32 and
added in int64 (wrapping), so a change of any one word changes the chunk's sum.

Only Triton's builtins are used (``tl.full``, ``tl.reduce`` with ``tl.sum``'s combine function), not
the jit-decorated helpers of ``triton.language.standard`` (``tl.zeros``, ``tl.sum``): those are
decorated when Triton is first imported, so under ``TRITON_INTERPRET=1`` set later (the tests)
the interpreter cannot call them, and with it set then, a compiled kernel cannot (hence
``_SUM``, below).
"""

from __future__ import annotations

import triton
import triton.language as tl

INTERPRETED = bool(triton.knobs.runtime.interpret)


@triton.jit
def _add(a, b):
    return a + b


# interpreted: tl.sum's own combine function, which the interpreter recognizes and sums with
# numpy (any other combine function it calls element by element); compiled: this module's own,
# since tl.standard's is the interpreter's when Triton was first imported under TRITON_INTERPRET=1
# (and a kernel cannot call that one)
_SUM = tl.standard._sum_combine if INTERPRETED else _add


@triton.jit
def chunk_word_sums(addresses, lengths, out, BLOCK: tl.constexpr):
    """out[c] = Σ of the lengths[c] int32 words from address addresses[c], in int64."""
    c = tl.program_id(0)
    start = tl.load(addresses + c).to(tl.pointer_type(tl.int32))
    n = tl.load(lengths + c)
    acc = tl.full([BLOCK], 0, dtype=tl.int64)
    for first in range(0, n, BLOCK):
        at = first + tl.arange(0, BLOCK)
        acc += tl.load(start + at, mask=at < n, other=0).to(tl.int64)
    tl.store(out + c, tl.reduce(acc, 0, _SUM))
