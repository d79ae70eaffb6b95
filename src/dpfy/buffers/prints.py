"""The parameters' fingerprints: the sum of each one's bits read as integers (wrapping), so
that a write bypassing the version counter (``p.data.add_(x)``, a native kernel) is seen.

Two ways to compute them, the same guarantee (a change of any one word of a parameter changes
an entry of the result):

- **one sum per parameter** (the CPU's way): through an integer view of the parameter kept
  between calls, 64-bit words where its bytes allow (a CPU sums int64 ≈ 15× faster than int32);
- **one launch for all of them** (a GPU's, with Triton): :class:`dpfy.native.word_sums.WordSums`
  sums chunks of every parameter's 32-bit words in one kernel, one entry per chunk. A sum per
  parameter would be one kernel launch per parameter tensor, three times a step (the guard
  checks before and after each training forward and before the step): ~600 launches a step for
  BERT-base. Parameters whose memory is not whole 32-bit words (an odd-length float16 one) are
  summed the first way and appended.

Which entry is whose is the *layout* (one key per entry, and which way it was computed): two
fingerprints are compared only under the same layout. A :class:`PrintCache` keeps the views and
the launch table between calls, and the way chosen at its first use on a device (so two
fingerprints of one guard on one device are always computed alike; parameters moved to another
device, whose storage changed anyway, are fingerprinted the way that device allows).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Hashable

import torch

from dpfy.native.word_sums import WordSums, summable, word_sums_available

__all__ = ["PrintCache", "fingerprints", "relaid", "FORCE_ONE_LAUNCH"]

# compute in one launch on the CPU too (with TRITON_INTERPRET=1): tests and benchmarks/step_ops
FORCE_ONE_LAUNCH = False

Key = Hashable
# what a parameter's integer view or table entry stays valid for: identity, storage, shape, dtype
_Mark = tuple[int, int, torch.Size, torch.dtype]

_INT_VIEWS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64, 16: torch.int64}


@dataclass
class PrintCache:
    """What :func:`fingerprints` keeps between calls for one set of parameters."""

    views: dict[Key, tuple[_Mark, torch.Tensor]] = field(default_factory=dict)
    device: torch.device | None = None  # where the way below was chosen (None: not yet)
    one_launch: bool = False  # the way chosen for ``device``
    table: tuple[tuple[_Mark, ...], WordSums] | None = None
    launched: bool = False  # the kernel has run for this cache on ``device``


def _int_view(p: torch.Tensor) -> torch.Tensor:
    """``p``'s memory read as integers (a view: no copy; a contiguous copy when ``p`` is not
    contiguous): 64-bit words where its bytes allow, else integers of its element size. Either
    way a change of any one element changes one word, so the wrapping sum."""
    t = p.detach()
    t = t if t.is_contiguous() else t.contiguous()
    words = t.view(_INT_VIEWS[t.element_size()])
    if t.dim() and t.element_size() < 8 and t.numel() * t.element_size() % 8 == 0:
        try:
            return words.view(-1).view(torch.int64)
        except RuntimeError:  # storage offset not a multiple of 8 bytes
            pass
    return words


def _fingerprint(p: torch.Tensor) -> torch.Tensor:
    """The sum of ``p``'s bits read as integers (int64, a 0-dim tensor on ``p``'s device)."""
    return _int_view(p).sum()  # integer sums are int64 (wrapping), the default dtype


def _mark(p: torch.Tensor, ptr: int) -> _Mark:
    return (id(p), ptr, p.shape, p.dtype)


def _cached_sum(p: torch.Tensor, key: Key, cache: PrintCache, ptr: int) -> torch.Tensor:
    """:func:`_fingerprint` of ``p`` through its integer view kept in ``cache`` (one op a
    parameter instead of four: the view is made once). The cached view holds ``p``'s storage,
    so an equal ``data_ptr`` with equal shape and dtype of a contiguous ``p`` is that same
    memory read the same way (contiguous: the shape fixes the strides)."""
    if not p.is_contiguous() or p.numel() == 0:
        return _fingerprint(p) if p.numel() else torch.zeros((), dtype=torch.int64, device=p.device)
    mark = _mark(p, ptr)
    kept = cache.views.get(key)
    if kept is None or kept[0] != mark:
        kept = cache.views[key] = (mark, _int_view(p))
    return kept[1].sum()


# devices where the one-launch kernel failed at its first launch (it did not compile, or Triton
# cannot run there): their parameters are summed one by one from then on
_FAILED: set[torch.device] = set()


def _one_launch_possible(device: torch.device) -> bool:
    return (
        (device.type != "cpu" or FORCE_ONE_LAUNCH)
        and device not in _FAILED
        and word_sums_available(device)
    )


def _each(
    params: list[tuple[Key, torch.Tensor, int]], cache: PrintCache
) -> tuple[torch.Tensor, tuple[Hashable, ...]]:
    """One sum per parameter (the CPU's way)."""
    sums = [_cached_sum(p, key, cache, ptr) for key, p, ptr in params]
    return torch.stack(sums), ("each", *(key for key, _, _ in params))


def _launch_failed(
    params: list[tuple[Key, torch.Tensor, int]], cache: PrintCache, err: Exception
) -> tuple[torch.Tensor, tuple[Hashable, ...]]:
    """The kernel failed at this cache's first launch: nothing computed its way was kept, so the
    cache (and every later one on this device) takes the other way, with a warning."""
    device = params[0][1].device
    if device not in _FAILED:
        warnings.warn(
            f"dpfy's one-launch parameter fingerprint (dpfy.native.word_sums) failed on "
            f"{device} ({type(err).__name__}: {err}); the model-state guard sums each "
            f"parameter with torch instead (one launch per parameter tensor, three times a "
            f"step). Check the Triton install (pip install 'dpfy[gpu]')",
            RuntimeWarning,
            stacklevel=2,
        )
    _FAILED.add(device)
    cache.one_launch, cache.table = False, None
    return _each(params, cache)


def fingerprints(
    params: list[tuple[Key, torch.Tensor, int]], cache: PrintCache
) -> tuple[torch.Tensor | None, tuple[Hashable, ...]]:
    """The fingerprints of ``params`` ((key, parameter, its ``data_ptr()``), all on one device)
    and their layout: a tag for the way, then the key of each entry. No host read."""
    if not params:
        return None, ()
    device = params[0][1].device
    if cache.device != device:  # the first call, or the model moved: a GPU's way is not the CPU's
        cache.one_launch, cache.device = _one_launch_possible(device), device
        cache.table = None  # it holds the parameters' memory on the device they left
        cache.launched = False
        cache.views.clear()
    if not cache.one_launch:
        return _each(params, cache)
    whole = [(key, p, ptr) for key, p, ptr in params if summable(p)]
    rest = [(key, p, ptr) for key, p, ptr in params if not summable(p)]
    prints = None
    keys: list[Key] = []
    if whole:
        marks = tuple(_mark(p, ptr) for _, p, ptr in whole)
        try:
            if cache.table is None or cache.table[0] != marks:
                cache.table = (marks, WordSums([p for _, p, _ in whole]))
            table = cache.table[1]
            prints = table()
        except Exception as err:  # noqa: BLE001 - any failure of Triton's compile or launch
            if cache.launched:  # fingerprints of its way exist: switching would misread them
                raise
            return _launch_failed(params, cache, err)
        cache.launched = True
        keys = [whole[i][0] for i in table.owners]
    if rest:
        others, each_layout = _each(rest, cache)
        prints = others if prints is None else torch.cat([prints, others])
        keys += each_layout[1:]
    return prints, ("one launch", *keys)


def relaid(was: tuple[Hashable, ...], now: tuple[Hashable, ...]) -> list[Hashable]:
    """The keys whose entries two layouts lay out differently: those given another number of
    entries (another length under the same storage); else those at other positions (a
    parameter made non-contiguous under the same storage, so summed after the others;
    parameters iterated in another order); every key of either when the way differs. Not
    empty when the layouts differ (the caller refuses then), so nothing is compared with an
    entry of another parameter or computed another way."""
    if was[:1] != now[:1]:
        return list(dict.fromkeys([*was[1:], *now[1:]]))
    at_was, at_now = _positions(was[1:]), _positions(now[1:])
    every = dict.fromkeys([*at_was, *at_now])
    counted = [k for k in every if len(at_was.get(k, ())) != len(at_now.get(k, ()))]
    return counted or [k for k in every if at_was.get(k) != at_now.get(k)]


def _positions(keys: tuple[Hashable, ...]) -> dict[Hashable, list[int]]:
    """Each key's entries, by position."""
    at: dict[Hashable, list[int]] = {}
    for i, key in enumerate(keys):
        at.setdefault(key, []).append(i)
    return at
