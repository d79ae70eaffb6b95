"""What the model-state guard (:mod:`dpfy.buffers`) notes of each watched tensor, and how it
tells that one changed: identity, version counter, storage, a bitwise copy of buffers and tensor
attributes, and the parameters' fingerprints (the sum of their bits read as integers; see the
package docstring for why each is needed)."""

from __future__ import annotations

from typing import Callable, Hashable, NamedTuple, cast

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from dpfy._deferred import Explain, PendingChecks
from dpfy.buffers.prints import PrintCache, fingerprints, relaid

_Tensor = torch.Tensor
# the attributes every Module has (hook tables, ``training``, ``_parameters``, ...): the scan
# for tensor attributes skips a module that has no other (ReLU, Flatten, Sequential)
_MODULE_INTERNALS = frozenset(vars(nn.Module()))
# a module's attribute names (in order) -> those not in _MODULE_INTERNALS, in order
_OWN_NAMES: dict[tuple[str, ...], tuple[str, ...]] = {}


def watched_tensors(m: nn.Module, params: bool = True) -> list[tuple[str, torch.Tensor | None]]:
    """``m``'s own buffers, tensor attributes (a tensor assigned to ``self.x`` that is neither
    a parameter nor a buffer: saved with ``torch.save(model)`` and read by later forwards all
    the same) and (``params``) parameters (lazy parameters, still to be shaped by their first
    forward, are skipped: they hold no value yet)."""
    state = list(m._buffers.items())
    attrs = vars(m)
    names = tuple(attrs)
    own = _OWN_NAMES.get(names)
    if own is None:
        if len(_OWN_NAMES) > 4096:
            _OWN_NAMES.clear()
        own = _OWN_NAMES[names] = tuple(n for n in names if n not in _MODULE_INTERNALS)
    state += [(n, t) for n in own if isinstance(t := attrs[n], _Tensor)]
    if not params:
        return state
    return [*state, *((n, p) for n, p in m._parameters.items() if p is None or not is_lazy(p))]


def kind_of(m: nn.Module, name: str) -> str:
    """What ``name`` is in ``m``: "parameter", "buffer" or "tensor attribute"."""
    return (
        "parameter"
        if name in m._parameters
        else "buffer"
        if name in m._buffers
        else "tensor attribute"
    )


# the parameters' (identity, version, storage) by key, their fingerprints and the layout of
# those (dpfy.buffers.prints)
Marks = tuple[
    dict[tuple[int, str], tuple[int, int, int]], "torch.Tensor | None", tuple[Hashable, ...]
]


def param_marks(
    owners: list[tuple[str, nn.Module]], cache: PrintCache | None = None, fingerprinted: bool = True
) -> Marks | None:
    """(identity, version, storage) of every parameter of ``owners``, and their fingerprints
    (:func:`dpfy.buffers.prints.fingerprints`): the check of the forwards after the first (no
    copy); None when a parameter has no version counter or storage, or the parameters are on
    several devices (then the full snapshot, which copies them, is used). ``cache``: the
    caller's, kept between calls. ``fingerprinted=False``: the marks alone, with no
    fingerprints (on any devices). Runs three times a training step, so it reads each
    parameter's ``data_ptr`` and device once."""
    try:
        marks: dict[tuple[int, str], tuple[int, int, int]] = {}
        params: list[tuple[Hashable, torch.Tensor, int]] = []
        device = None
        for k, (_, m) in enumerate(owners):
            if not m._parameters:
                continue
            for n, p in m._parameters.items():
                if p is None or is_lazy(p):
                    continue
                key = (k, n)
                ptr = p.data_ptr()
                marks[key] = (id(p), p._version, ptr)
                if not fingerprinted:
                    continue
                where = p.device
                if device is None:
                    device = where
                elif where != device:  # no one tensor of fingerprints: compared bit for bit
                    return None
                params.append((key, p, ptr))
        if not fingerprinted:
            return marks, None, ()
        cache = PrintCache() if cache is None else cache
        prints, layout = fingerprints(params, cache)
        if len(cache.views) > len(marks):  # parameters were removed
            for gone in set(cache.views) - set(marks):
                del cache.views[gone]
        return marks, prints, layout
    except (RuntimeError, KeyError):
        return None


VALUES = "given new values without a version bump (.data or a native kernel)"
# fingerprints before, none after (not a pass: the values were not compared)
UNREAD = (
    "unverified: the parameters' fingerprints could not be taken again, so their values were "
    "not compared with those before (a fingerprint kernel that failed, or parameters now on "
    "several devices)"
)
Defer = Callable[[torch.Tensor, Explain], None]


def marks_changed(
    before: Marks, now: Marks, defer: Defer | None = None
) -> list[tuple[tuple[int, str], str]]:
    """Which parameters changed between two :func:`param_marks`, and how. ``defer``: the
    fingerprints are compared on their device, the mismatch handed to it with how to explain
    it (no host read here: see :mod:`dpfy._deferred`)."""
    (was, was_prints, was_layout), (is_, is_prints, is_layout) = before, now
    out = [(key, "registered during the forward") for key in is_ if key not in was]
    for key, (ident, version, ptr) in was.items():
        mark = is_.get(key)
        how = (
            "deleted during the forward"
            if mark is None
            else "replaced by another tensor"
            if mark[0] != ident
            else "modified in place"
            if mark[1] != version
            else "given new storage (.data assignment)"
            if mark[2] != ptr
            else None
        )
        if how is not None:
            out.append((key, how))
    if not out and was_prints is not None and is_prints is not None:
        if was_layout != is_layout:  # laid out anew under the same storage: not comparable
            return [(key, VALUES) for key in relaid(was_layout, is_layout)]  # type: ignore[misc]
        # a parameter of several chunks has several entries; the keys are param_marks's
        keys = cast(list[tuple[int, str]], list(was_layout[1:]))

        def changed(flags: list[bool]) -> list[tuple[tuple[int, str], str]]:
            return [(k, VALUES) for k in dict.fromkeys(k for k, x in zip(keys, flags) if x)]

        if defer is not None and PendingChecks.applies(is_prints):
            defer(was_prints != is_prints, changed)
        elif not torch.equal(was_prints, is_prints):
            out = changed((was_prints != is_prints).tolist())
    return out


class Seen(NamedTuple):
    """A buffer as it was before a forward (a tuple: one is built per buffer per forward)."""

    tensor: torch.Tensor | None
    version: int | None  # None: no version counter (None buffer, inference tensor)
    ptr: int | None  # None: no storage to point to (None buffer, sparse tensor)
    copy: torch.Tensor | None  # bitwise copy (parameters: first checked forward only)
    kind: str = "buffer"  # or "parameter", "tensor attribute"


def version_of(t: torch.Tensor | None) -> int | None:
    """``t``'s in-place version counter, or None where it has none (None, an inference
    tensor): the guard notes it before a forward and compares it after (:mod:`dpfy.buffers`)."""
    if t is None:
        return None
    try:
        return t._version
    except RuntimeError:  # inference tensors keep no version counter (nor accept writes)
        return None


def ptr_of(t: torch.Tensor | None) -> int | None:
    """``t``'s storage address, or None where it has none (None, a sparse tensor): a changed
    address is a ``.data`` assignment, which bumps no version counter."""
    if t is None:
        return None
    try:
        return t.data_ptr()
    except RuntimeError:  # sparse and other storage-less layouts
        return None


def copy_of(t: torch.Tensor | None) -> torch.Tensor | None:
    """A detached copy of ``t`` to compare its bits with after the forward (writes that bypass
    the version counter), or None where none can be taken (None, not strided, on ``meta``)."""
    if t is None or t.layout != torch.strided or t.device.type == "meta":
        return None
    return t.detach().clone()


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes (so NaNs compare equal to themselves and -0.0 differs from 0.0)."""
    return t.detach().reshape(-1).contiguous().view(torch.uint8)


def how_changed(
    before: Seen | None, now: torch.Tensor | None, defer: bool = False
) -> str | torch.Tensor | None:
    """What happened during a forward to a buffer present after it, or None if nothing did
    (``defer``: the values' comparison as a (1,) bool tensor on their device, no host read)."""
    if before is None:
        return "registered during the forward"
    if now is not before.tensor:
        return "replaced by another tensor"
    if version_of(now) != before.version:
        return "modified in place"
    if ptr_of(now) != before.ptr:
        return "given new storage (.data assignment)"
    if before.copy is None or now is None:
        return None
    if now.shape != before.copy.shape or now.dtype != before.copy.dtype:
        return VALUES
    if defer and PendingChecks.applies(now):
        return (_bits(now) != _bits(before.copy)).any().reshape(1)
    return None if torch.equal(_bits(now), _bits(before.copy)) else VALUES
