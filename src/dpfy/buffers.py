"""Refuse a model whose state learns from the data outside the released gradient.

What is watched (the one statement of it; ``docs/guide/per_example_contract.md`` repeats it for
users): every tensor a later forward reads or ``torch.save(model)`` saves, of every module of
the model — its **buffers** (``register_buffer``), its **tensor attributes** (a tensor assigned
to ``self.x`` that is neither a parameter nor a buffer: running statistics kept that way are
read by later forwards and pickled with the model just the same) and its **parameters** (which
may change only in the optimizer's step, from the released gradient). Whatever a training
forward, a hook or a backward writes into them would be released with ``model.pt``, and read by
later steps, without noise or ledger entry. ``InstanceNorm2d(track_running_stats=True)`` is the
standard example (one outlier moves its ``running_mean``); ActNorm's data-dependent
initialization writes a parameter; but any module can do it, so the check is general, not a
list of classes.

When (two checks, both by :class:`BufferGuard`, attached by ``make_private``):

1. around every *training forward* of the model (and of every module owning buffers, named by
   its own name when called directly): each watched tensor's marks before, compared right after
   the forward — the refusal comes in that forward, before its backward, so no gradient that saw
   the change is released. The guard's hooks are kept outermost on each module (its pre hook
   first, its post hook last, re-ordered at every call), so a hook the user registers after
   ``make_private`` runs inside the checked span;
2. before the private step uses a batch's gradients (``step/private_step.py``): the state the
   last training forward left must be unchanged — a backward (tensor or module) hook, or code
   between ``backward()`` and ``optimizer.step()``, that writes it is refused there, before
   anything of the batch is released.

A *training forward* is any forward except the usual evaluation idiom: every forward with the
module in training mode **or** with autograd recording (``torch.is_grad_enabled()``). Only a
forward in ``eval()`` mode under ``torch.no_grad()`` / ``torch.inference_mode()`` is not checked:
it cannot produce a gradient, and standard layers do not touch their buffers in eval mode, so
evaluation (and inference caches kept in buffers) keep working. A ``no_grad`` forward in training
mode *is* checked: running statistics learn in training mode whatever the grad mode.

How changes are seen:

- identity of the tensor under each name (reassignment ``self.b = self.b + x``, a new or a
  deleted one);
- ``tensor._version`` (every in-place op through the tensor or a view of it);
- ``tensor.data_ptr()`` (``self.b.data = ...``);
- the values, against writes that bypass the version counter (``self.b.data.add_(x)``, native
  kernels such as batch_norm's running-stat update): buffers and tensor attributes are compared
  bit for bit with a copy at every checked forward (they are small: statistics, masks, position
  tables); parameters bit for bit at the model's first training forward, and after it by a
  fingerprint (the sum of their bits read as integers, one read and no copy, all parameters
  compared with one device sync; on a device, where the private step reads them, the
  comparisons stay there as flags read with the step's sensitivity check: dpfy._deferred),
  which any ordinary write changes.

Not watched: Python values that are not tensors (a step counter), tensors inside lists or dicts
held by a module, and changes made outside the window from a training forward to its step (an
EMA of the weights updated in the training loop after ``optimizer.step()``): the user's contract.
Buffers that follow the parameters only (``spectral_norm``'s power iteration in training mode;
the old ``torch.nn.utils.weight_norm``, which stores the weight as a tensor attribute
recomputed in a pre-hook — ``torch.nn.utils.parametrizations.weight_norm`` does not) are
refused too: the guard cannot tell them from statistics of the data.

Cost: one pair of hooks on the root and on each module owning buffers; per checked forward a
few attribute reads per watched tensor, a copy of the buffers and tensor attributes, and one
read of the parameters. Earlier measurement (one thread, marks only): +15.5 µs per forward on
the tanh CNN; the fingerprint and the step's check add one read of the parameters and of the
buffers per step (measured in ``docs/guide/per_example_contract.md``).
"""

from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass
from functools import partial
from collections import OrderedDict
from typing import Any, Callable, NamedTuple, cast

import torch
from torch import nn
from torch.nn.parameter import is_lazy
from torch.utils.hooks import RemovableHandle

from dpfy._deferred import Explain, PendingChecks
from dpfy._hooks import CheckedCopy, OwnHook
from dpfy.errors import PrivacyRefusal

__all__ = ["BufferGuard", "BufferChange", "guard_of", "buffer_fix", "is_training_forward"]

# The guard attached to each model (by make_private); a new guard on the same model replaces it.
_GUARDS: "weakref.WeakKeyDictionary[nn.Module, BufferGuard]" = weakref.WeakKeyDictionary()


def is_training_forward(module: nn.Module) -> bool:
    """True unless ``module`` is in eval mode and autograd is off (see module docstring)."""
    return module.training or torch.is_grad_enabled()


def buffer_fix(module: nn.Module) -> str:
    """The fix to name for a buffer of ``module`` that a training forward changed."""
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return (
            "Replace the layer: model = dpfy.validate(model, fix=True) puts a GroupNorm in "
            "its place"
        )
    if getattr(module, "track_running_stats", False) is True:
        return (
            f"Build the {type(module).__name__} with track_running_stats=False "
            f"(model = dpfy.validate(model, fix=True) does this for InstanceNorm)"
        )
    return (
        "Keep the statistic out of the training forward: compute it beforehand from public "
        "data and only read it in forward (a value that must follow the training data "
        "cannot be released privately by dpfy)"
    )


ATTRIBUTE_FIX = (
    "Keep statistics of the training data out of the model's state: compute the value "
    "beforehand from public data and only read it in forward (a tensor attribute is "
    "state like a buffer: later forwards read it and torch.save(model) saves it)"
)

PARAMETER_FIX = (
    "Set its value before make_private (a data-dependent initialization from "
    "public data, or none) and let only the optimizer change it"
)


_Tensor = torch.Tensor
# the attributes every Module has (hook tables, ``training``, ``_parameters``, ...): the scan
# for tensor attributes skips a module that has no other (ReLU, Flatten, Sequential)
_MODULE_INTERNALS = frozenset(vars(nn.Module()))
# a module's attribute names (in order) -> those not in _MODULE_INTERNALS, in order
_OWN_NAMES: dict[tuple[str, ...], tuple[str, ...]] = {}


def _watched(m: nn.Module, params: bool = True) -> list[tuple[str, torch.Tensor | None]]:
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


def _kind(m: nn.Module, name: str) -> str:
    """What ``name`` is in ``m``: "parameter", "buffer" or "tensor attribute"."""
    return (
        "parameter"
        if name in m._parameters
        else "buffer"
        if name in m._buffers
        else "tensor attribute"
    )


Marks = tuple[dict[tuple[int, str], tuple[int, int, int]], "torch.Tensor | None"]

_INT_VIEWS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64, 16: torch.int64}


def _int_view(p: torch.Tensor) -> torch.Tensor:
    """``p``'s memory read as integers (a view: no copy; a contiguous copy when ``p`` is not
    contiguous): 64-bit words where its bytes allow (a CPU sums int64 ≈ 15× faster than it
    sums int32 into int64), else integers of its element size. Either way a change of any one
    element changes one word, so the wrapping sum."""
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
    """The sum of ``p``'s bits read as integers (int64, a 0-dim tensor on ``p``'s device): a
    write that bypasses the version counter (``p.data.add_(x)``) changes it. One read of the
    parameter, no copy; compared for all parameters at once (one device sync)."""
    return _int_view(p).sum()  # integer sums are int64 (wrapping), the default dtype


# the integer view of a parameter, kept while (identity, storage, shape, strides, dtype) hold:
ViewCache = dict[tuple[int, str], tuple[tuple[object, ...], torch.Tensor]]


def _cached_sum(p: torch.Tensor, key: tuple[int, str], views: ViewCache) -> torch.Tensor:
    """:func:`_fingerprint` of ``p`` through its integer view kept in ``views`` (one op a
    parameter instead of four: the view is made once). The cached view holds ``p``'s storage,
    so an equal ``data_ptr`` with equal shape, strides and dtype is that same memory."""
    if p.numel() == 0 or not p.is_contiguous():
        return _fingerprint(p) if p.numel() else torch.zeros((), dtype=torch.int64, device=p.device)
    mark = (id(p), p.data_ptr(), p.shape, p.stride(), p.dtype)
    kept = views.get(key)
    if kept is None or kept[0] != mark:
        kept = views[key] = (mark, _int_view(p))
    return kept[1].sum()


def _param_marks(
    owners: list[tuple[str, nn.Module]], views: ViewCache | None = None
) -> Marks | None:
    """(identity, version, storage) of every parameter of ``owners``, and their
    :func:`_fingerprint` s: the check of the forwards after the first (no copy); None when a
    parameter has no version counter or storage (then the full snapshot is used). ``views``:
    the caller's cache of integer views (:func:`_cached_sum`)."""
    try:
        marks: dict[tuple[int, str], tuple[int, int, int]] = {}
        sums: list[torch.Tensor] | None = []
        cache: ViewCache = {} if views is None else views
        device = None
        for k, (_, m) in enumerate(owners):
            for n, p in m._parameters.items():
                if p is None or is_lazy(p):
                    continue
                key = (k, n)
                marks[key] = (id(p), p._version, p.data_ptr())
                if sums is not None:
                    device = p.device if device is None else device
                    # several devices: marks only
                    if p.device == device:
                        sums.append(_cached_sum(p, key, cache))
                    else:
                        sums = None
        prints = torch.stack(sums) if sums else None
        if views is not None and len(views) > len(marks):  # parameters were removed
            for gone in set(views) - set(marks):
                del views[gone]
        return marks, prints
    except (RuntimeError, KeyError):
        return None


VALUES = "given new values without a version bump (.data or a native kernel)"
Defer = Callable[[torch.Tensor, Explain], None]


def _marks_changed(
    before: Marks, now: Marks, defer: Defer | None = None
) -> list[tuple[tuple[int, str], str]]:
    """Which parameters changed between two :func:`_param_marks`, and how. ``defer``: the
    fingerprints are compared on their device, the mismatch handed to it with how to explain
    it (no host read here: see :mod:`dpfy._deferred`)."""
    (was, was_prints), (is_, is_prints) = before, now
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
        keys = list(was)
        if defer is not None and PendingChecks.applies(is_prints):
            defer(was_prints != is_prints, lambda f: [(k, VALUES) for k, x in zip(keys, f) if x])
        elif not torch.equal(was_prints, is_prints):
            ne = (was_prints != is_prints).nonzero().flatten().tolist()
            out = [(keys[i], VALUES) for i in ne]
    return out


class _Seen(NamedTuple):
    """A buffer as it was before a forward (a tuple: one is built per buffer per forward)."""

    tensor: torch.Tensor | None
    version: int | None  # None: no version counter (None buffer, inference tensor)
    ptr: int | None  # None: no storage to point to (None buffer, sparse tensor)
    copy: torch.Tensor | None  # bitwise copy (parameters: first checked forward only)
    kind: str = "buffer"  # or "parameter", "tensor attribute"


def _version(t: torch.Tensor | None) -> int | None:
    if t is None:
        return None
    try:
        return t._version
    except RuntimeError:  # inference tensors keep no version counter (nor accept writes)
        return None


def _ptr(t: torch.Tensor | None) -> int | None:
    if t is None:
        return None
    try:
        return t.data_ptr()
    except RuntimeError:  # sparse and other storage-less layouts
        return None


def _copy(t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None or t.layout != torch.strided or t.device.type == "meta":
        return None
    return t.detach().clone()


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes (so NaNs compare equal to themselves and -0.0 differs from 0.0)."""
    return t.detach().reshape(-1).contiguous().view(torch.uint8)


def _how_changed(
    before: _Seen | None, now: torch.Tensor | None, defer: bool = False
) -> str | torch.Tensor | None:
    """What happened during a forward to a buffer present after it, or None if nothing did
    (``defer``: the values' comparison as a (1,) bool tensor on their device, no host read)."""
    if before is None:
        return "registered during the forward"
    if now is not before.tensor:
        return "replaced by another tensor"
    if _version(now) != before.version:
        return "modified in place"
    if _ptr(now) != before.ptr:
        return "given new storage (.data assignment)"
    if before.copy is None or now is None:
        return None
    if now.shape != before.copy.shape or now.dtype != before.copy.dtype:
        return VALUES
    if defer and PendingChecks.applies(now):
        return (_bits(now) != _bits(before.copy)).any().reshape(1)
    return None if torch.equal(_bits(now), _bits(before.copy)) else VALUES


@dataclass(frozen=True)
class BufferChange:
    """One buffer that a training forward changed, and what to do about it."""

    module: str  # qualified name of the module owning the buffer ("" for the root)
    kind: str  # the module's class name
    buffer: str  # the buffer's name within that module
    how: str  # what happened ("modified in place", ...)
    fix: str
    what: str = "buffer"  # or "parameter", "tensor attribute"
    after: bool = False  # changed after the forward, before the step (not in it)

    def __str__(self) -> str:
        qualified = f"{self.module}.{self.buffer}" if self.module else self.buffer
        why = (
            "Buffers and tensor attributes are saved and reused with the model but "
            "nothing accounts what they learn from the training data"
            if self.what != "parameter"
            else "A parameter may change only in the optimizer's step, from the released "
            "gradient: a value a forward writes into it is released with the model with no "
            "noise and no ledger entry"
        )
        when = (
            "after the training forward (in a backward hook, or between backward() and "
            "optimizer.step())"
            if self.after
            else "in a training forward"
        )
        return (
            f"{self.what} {qualified!r} of module {self.module or '(root)'!r} ({self.kind}) "
            f"must not change {when}, got it {self.how}. {why}. {self.fix}."
        )


def inside_torch_compile() -> bool:
    """Whether this code runs inside a ``torch.compile``'d call (TorchDynamo's frame callback
    is set), read without importing TorchDynamo (whose import costs seconds)."""
    dynamo = getattr(torch._C, "_dynamo", None)
    return dynamo is not None and bool(dynamo.eval_frame.get_eval_frame_callback())


def compiled_refusal(changes: list[BufferChange]) -> str:
    """The refusal for a private model's training forward run inside ``torch.compile`` with a
    backend under which dpfy's forward check, traced into the graph, misreads the model."""
    names = ", ".join(repr(f"{c.module}.{c.buffer}" if c.module else c.buffer) for c in changes)
    return (
        "the private model ran inside torch.compile, and dpfy's check of its training forward "
        f"read {names} as changed ({changes[0].how}). That check runs in the model's hooks, "
        "which torch.compile traces into its graph; with a backend that goes through "
        "AOTAutograd (inductor, the default, and aot_eager) what it reads there is not the "
        "tensors' own state, so dpfy cannot verify that the forward wrote no data of the "
        "batch into the model, and refuses before anything is released. Fix: compile with "
        'torch.compile(model, backend="eager") (dpfy\'s per-example hooks then run as in '
        "the uncompiled model: the same per-example norms and ledger, with no speed-up), or "
        "train the private model uncompiled."
    )


class _Watch:
    """One hooked module: notes the buffers of ``owners`` before its forward, checks after."""

    def __init__(
        self, guard: BufferGuard, owners: list[tuple[str, nn.Module]], root: bool = False
    ) -> None:
        self.guard = guard
        self.owners = owners
        self.root = root  # watches the whole tree from the model's own forward
        # one entry per open call: the full snapshot, and the parameters' marks when the
        # snapshot holds buffers only (None: not a checked forward)
        self.stack: list[tuple[dict[tuple[int, str], _Seen], Marks | None] | None] = []
        self.values_checked = False
        self.views: ViewCache = {}  # parameters' integer views (see _cached_sum)

    def snapshot(self, with_copies: bool, params: bool = True) -> dict[tuple[int, str], _Seen]:
        """Every watched tensor's marks; a bitwise copy of each buffer and tensor attribute,
        and (``with_copies``: the first checked forward) of each parameter too."""
        return {
            (k, name): _Seen(
                t,
                _version(t),
                _ptr(t),
                _copy(t) if with_copies or name not in m._parameters else None,
                _kind(m, name),
            )
            for k, (_, m) in enumerate(self.owners)
            for name, t in _watched(m, params)
        }

    def change(
        self, k: int, name: str, how: str, after: bool = False, kind: str | None = None
    ) -> BufferChange:
        owner_name, m = self.owners[k]
        how = how.replace(" during the forward", "") if after else how
        kind = kind or _kind(m, name)
        fix = {"parameter": PARAMETER_FIX, "tensor attribute": ATTRIBUTE_FIX}.get(kind)
        return BufferChange(
            owner_name, type(m).__name__, name, how, fix or buffer_fix(m), kind, after
        )

    def values_changed(self, k: int, name: str, after: bool, flags: list[bool]) -> list[Any]:
        """The change a deferred comparison of one tensor's values found (dpfy._deferred)."""
        return [self.change(k, name, VALUES, after)]

    def pre(self, module: nn.Module) -> None:
        if not is_training_forward(module):
            self.stack.append(None)
            return
        marks = _param_marks(self.owners, self.views) if self.values_checked else None
        self.stack.append(
            (self.snapshot(with_copies=not self.values_checked, params=marks is None), marks)
        )

    def post(self, failed: bool = False) -> None:
        # always_call: runs (and pops) also when the forward raised
        entry = self.stack.pop() if self.stack else None
        raised = self.guard.raised
        if entry is None or (raised is not None and sys.exc_info()[1] is raised):
            return  # not checked, or an inner module's refusal is already on its way up
        self.values_checked = True
        now = _param_marks(self.owners, self.views)
        changes = self.changes(*entry, now=now)
        if changes and failed and sys.exc_info()[0] is not None and not self.guard.collect:
            self.guard.pending.hold(changes)  # the forward raised: refused when next read
        elif changes:
            self.guard._refuse(changes)
        if self.root:  # the state the step must find (see BufferGuard.check_settled)
            # nothing changed: the snapshot before the forward describes the state now (the
            # same tensors, versions, storage and bits); the first forward's holds copies of
            # the parameters, so it is taken anew
            same = not changes and entry[1] is not None and now is not None
            snap = entry[0] if same else self.snapshot(with_copies=False, params=now is None)
            self.guard.settled = (snap, now)

    def changes(
        self,
        before: dict[tuple[int, str], _Seen],
        marks: Marks | None,
        after: bool = False,
        now: Marks | None = None,
    ) -> list[BufferChange]:
        """What changed since the snapshot ``before`` (and the parameters' ``marks``; ``now``:
        their marks at present, when already taken)."""
        params = marks is None  # the snapshot holds the parameters too
        # deferred where the step reads the flags; not inside torch.compile, whose graph would
        # hold the comparisons (its refusal names the backend: compiled_refusal)
        deferring = self.guard.defer and not self.guard.collect and not inside_torch_compile()
        pending = self.guard.pending if deferring else None
        changes, matched = [], 0
        for k, (_, m) in enumerate(self.owners):
            for name, tensor in _watched(m, params):
                seen = before.get((k, name))
                matched += seen is not None
                how = _how_changed(seen, tensor, pending is not None)
                if isinstance(how, torch.Tensor):  # compared on the device: read by the step
                    assert pending is not None, "deferred only with a pending list"
                    pending.add(how, partial(self.values_changed, k, name, after))
                elif how is not None:
                    changes.append(self.change(k, name, how, after))
        if matched != len(before):  # some buffer that was there is gone
            changes += [
                self.change(k, name, "deleted during the forward", after, seen.kind)
                for (k, name), seen in before.items()
                if name not in dict(_watched(self.owners[k][1], params))
            ]
        if marks is not None:
            now_marks = (now if now is not None else _param_marks(self.owners, self.views)) or (
                {},
                None,
            )
            defer = None
            if pending is not None:

                def defer(mismatch: torch.Tensor, explain: Explain) -> None:
                    pending.add(
                        mismatch,
                        lambda f: [self.change(k, n, how, after) for (k, n), how in explain(f)],
                    )

            changes += [
                self.change(k, name, how, after)
                for (k, name), how in _marks_changed(marks, now_marks, defer)
            ]
        return changes


class BufferGuard:
    """Refuse, right after a training forward, any buffer that forward changed.

    ``guard = BufferGuard(model)`` hooks ``model`` (see the module docstring for what is
    checked, when, and at what cost); ``guard.detach()`` removes the hooks. At most one guard
    per model: a new one replaces (detaches) the previous one. A ``copy.deepcopy`` (or a pickled
    copy) of a guarded model is a plain model: its copies of the hooks do nothing
    (:class:`dpfy._hooks.OwnHook`).

    Args:
      model: the model whose buffers must not learn from training forwards.
      collect: instead of raising :class:`dpfy.errors.PrivacyRefusal`, append each change to
        ``guard.problems`` (a :class:`BufferChange`, printable as one line); used by
        ``dpfy.validate(model, example_input=...)``.

    ``guard.defer = True`` (set by the private step, which reads ``guard.pending`` before
    every release): value comparisons on a device are left there as flags, refused when read
    (:mod:`dpfy._deferred`), instead of one device synchronization each.
    """

    def __init__(self, model: nn.Module, *, collect: bool = False) -> None:
        old = _GUARDS.get(model)
        if old is not None:
            old.detach()
        self.collect = collect
        self.problems: list[BufferChange] = []
        self.raised: PrivacyRefusal | None = None  # the last refusal (outer hooks let it pass)
        self.defer = False  # see the class docstring
        self.pending = PendingChecks(self._refuse)
        self._handles: list[RemovableHandle] = []
        modules = list(model.named_modules())
        self.settled: tuple[dict[tuple[int, str], _Seen], Marks | None] | None = None
        self._root: _Watch | None = None
        self._hook(model, modules, root=True)  # the whole tree, seen from the root's forward
        # a deferred comparison is read before any module's state is saved or copied
        read = CheckedCopy(lambda *a: self.pending.flush())  # (dpfy._deferred)
        self._handles += [m.register_state_dict_pre_hook(read) for _, m in modules]
        for name, m in modules:
            if m is not model and any(True for _ in m.named_buffers(recurse=False)):
                self._hook(m, [(name, m)])
        _GUARDS[model] = self
        self._model = weakref.ref(model)

    def _hook(
        self, module: nn.Module, owners: list[tuple[str, nn.Module]], root: bool = False
    ) -> None:
        watch = _Watch(self, owners, root)
        if root:
            self._root = watch
        handles: list[RemovableHandle] = []

        def pre(m: nn.Module, args: Any) -> None:
            # hooks the user registers later must run inside the guarded span: this call's
            # post hook last (the hook list is copied after the pre hooks ran), the next
            # call's pre hook first
            if next(reversed(m._forward_hooks), None) != handles[1].id:
                # torch's stub says dict; the hook tables are OrderedDicts at run time
                cast("OrderedDict[int, Any]", m._forward_hooks).move_to_end(handles[1].id)
            watch.pre(m)

        def post(m: nn.Module, args: Any, output: Any) -> None:
            if next(iter(m._forward_pre_hooks), None) != handles[0].id:
                cast("OrderedDict[int, Any]", m._forward_pre_hooks).move_to_end(  # as above
                    handles[0].id, last=False
                )
            watch.post(failed=output is None)  # None: the forward raised, or returned None

        handles += [
            module.register_forward_pre_hook(OwnHook(pre), prepend=True),
            module.register_forward_hook(OwnHook(post), always_call=True),
        ]
        self._handles += handles

    def _refuse(self, changes: list[BufferChange]) -> None:
        if self.collect:
            self.problems.extend(c for c in changes if c not in self.problems)
            return
        if inside_torch_compile():
            self.raised = PrivacyRefusal(compiled_refusal(changes))
        else:
            self.raised = PrivacyRefusal(
                "\n".join(map(str, changes)) + "\nThe model's buffers or parameters now hold "
                "values of this batch: rebuild (or reload) the model after the fix before "
                "training it."
            )
        raise self.raised

    def check_settled(self) -> None:
        """Refuse a change to the model's state since the end of its last training forward
        (a backward hook, or code between ``backward()`` and ``optimizer.step()``): called by
        the private step before it uses the batch's gradients. Then forgets that state."""
        settled, self.settled = self.settled, None
        if settled is not None and self._root is not None:
            changes = self._root.changes(*settled, after=True)
            if changes:
                self._refuse(changes)

    def forget_settled(self) -> None:
        """Forget the state noted at the last forward (the step's own forwards and updates
        follow; the next training forward notes it again)."""
        self.settled = None

    def detach(self) -> None:
        """Remove every hook of this guard (idempotent)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        model = self._model()
        if model is not None and _GUARDS.get(model) is self:
            del _GUARDS[model]


def guard_of(model: nn.Module) -> BufferGuard | None:
    """The guard attached to ``model``, if any."""
    return _GUARDS.get(model)


def watched(module: nn.Module) -> bool:
    """Whether a guard watches ``module``: attached to it or to a model that contains it (a
    model made private)."""
    return any(any(m is module for m in model.modules()) for model in list(_GUARDS.keys()))
