"""The model-state guard itself: :class:`BufferGuard` hooks a model and refuses, in the
training forward or before the step, any change to its state (what is watched, when and at
what cost: the :mod:`dpfy.buffers` package docstring)."""

from __future__ import annotations

import sys
import weakref
from collections import OrderedDict
from functools import partial
from typing import Any, cast

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from dpfy._deferred import Explain, PendingChecks
from dpfy._hooks import CheckedCopy, OwnHook
from dpfy.buffers.changes import (
    ATTRIBUTE_FIX,
    PARAMETER_FIX,
    BufferChange,
    buffer_fix,
    compiled_refusal,
    inside_torch_compile,
)
from dpfy.buffers.prints import PrintCache
from dpfy.buffers.marks import (
    UNREAD,
    VALUES,
    Marks,
    copy_of,
    how_changed,
    kind_of,
    marks_changed,
    param_marks,
    ptr_of,
    Seen,
    version_of,
    watched_tensors,
)
from dpfy.errors import PrivacyRefusal

__all__ = ["BufferGuard", "guard_of", "is_training_forward", "watched"]

# The guard attached to each model (by make_private); a new guard on the same model replaces it.
_GUARDS: "weakref.WeakKeyDictionary[nn.Module, BufferGuard]" = weakref.WeakKeyDictionary()


def is_training_forward(module: nn.Module) -> bool:
    """True unless ``module`` is in eval mode and autograd is off (see module docstring)."""
    return module.training or torch.is_grad_enabled()


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
        self.stack: list[tuple[dict[tuple[int, str], Seen], Marks | None] | None] = []
        self.values_checked = False
        self.prints = PrintCache()  # kept between the parameters' fingerprints

    def snapshot(self, with_copies: bool, params: bool = True) -> dict[tuple[int, str], Seen]:
        """Every watched tensor's marks; a bitwise copy of each buffer and tensor attribute,
        and (``with_copies``: the first checked forward) of each parameter too."""
        return {
            (k, name): Seen(
                t,
                version_of(t),
                ptr_of(t),
                copy_of(t) if with_copies or name not in m._parameters else None,
                kind_of(m, name),
            )
            for k, (_, m) in enumerate(self.owners)
            for name, t in watched_tensors(m, params)
        }

    def change(
        self, k: int, name: str, how: str, after: bool = False, kind: str | None = None
    ) -> BufferChange:
        owner_name, m = self.owners[k]
        how = how.replace(" during the forward", "") if after else how
        kind = kind or kind_of(m, name)
        fix = {"parameter": PARAMETER_FIX, "tensor attribute": ATTRIBUTE_FIX}.get(kind)
        return BufferChange(
            owner_name, type(m).__name__, name, how, fix or buffer_fix(m), kind, after
        )

    def values_changed(self, k: int, name: str, after: bool, flags: list[bool]) -> list[Any]:
        """The change a deferred comparison of one tensor's values found (dpfy._deferred)."""
        return [self.change(k, name, VALUES, after)]

    def pre(self, module: nn.Module) -> None:
        if not is_training_forward(module):
            # an evaluation forward uses the model as it stands: a write that training forwards
            # with no step after them left on the device for the step to read is refused first,
            # as the CPU refuses it in the forward (no read when nothing waits)
            self.guard.pending.flush()
            self.stack.append(None)
            return
        marks = param_marks(self.owners, self.prints) if self.values_checked else None
        # no marks (the first checked forward, or they could not be taken: a parameter without
        # storage, a fingerprint kernel failing): the snapshot copies the parameters, or their
        # values would go unchecked in this forward
        self.stack.append((self.snapshot(with_copies=marks is None, params=marks is None), marks))

    def post(self, failed: bool = False) -> None:
        # always_call: runs (and pops) also when the forward raised
        entry = self.stack.pop() if self.stack else None
        raised = self.guard.raised
        if entry is None or (raised is not None and sys.exc_info()[1] is raised):
            return  # not checked, or an inner module's refusal is already on its way up
        self.values_checked = True
        now = param_marks(self.owners, self.prints)
        changes = self.changes(*entry, now=now)
        if changes and failed and sys.exc_info()[0] is not None and not self.guard.collect:
            self.guard.pending.hold(changes)  # the forward raised: refused when next read
        elif changes:
            self.guard._refuse(changes)
        if self.root:  # the state the step must find (see BufferGuard.check_settled)
            # nothing changed: the snapshot before the forward describes the state now (the
            # same tensors, versions, storage and bits); one that holds copies of the
            # parameters (the first forward's) is taken anew where fingerprints stand in for
            # them, and kept where none can (their copies are what the step compares)
            same = not changes and (entry[1] is None) == (now is None)
            snap = entry[0] if same else self.snapshot(with_copies=now is None, params=now is None)
            self.guard.settled = (snap, now)

    def changes(
        self,
        before: dict[tuple[int, str], Seen],
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
            for name, tensor in watched_tensors(m, params):
                seen = before.get((k, name))
                matched += seen is not None
                how = how_changed(seen, tensor, pending is not None)
                if isinstance(how, torch.Tensor):  # compared on the device: read by the step
                    assert pending is not None, "deferred only with a pending list"
                    pending.add(how, partial(self.values_changed, k, name, after))
                elif how is not None:
                    changes.append(self.change(k, name, how, after))
        if matched != len(before):  # some buffer that was there is gone
            changes += [
                self.change(k, name, "deleted during the forward", after, seen.kind)
                for (k, name), seen in before.items()
                if name not in dict(watched_tensors(self.owners[k][1], params))
            ]
        if marks is not None:
            now_marks = now if now is not None else param_marks(self.owners, self.prints)
            # fingerprints before but none now (a parameter moved to another device, their
            # kernel failing): identity, version and storage still say what changed; if
            # nothing, the values could not be compared, which is not a pass
            unread = now_marks is None and marks[1] is not None
            if now_marks is None:
                now_marks = param_marks(self.owners, fingerprinted=False) or ({}, None, ())
            defer = None
            if pending is not None:

                def defer(mismatch: torch.Tensor, explain: Explain) -> None:
                    pending.add(
                        mismatch,
                        lambda f: [self.change(k, n, how, after) for (k, n), how in explain(f)],
                    )

            found = marks_changed(marks, now_marks, defer)
            if unread and not found:
                found = [(key, UNREAD) for key in marks[0]]
            changes += [self.change(k, name, how, after) for (k, name), how in found]
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
        self.settled: tuple[dict[tuple[int, str], Seen], Marks | None] | None = None
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
