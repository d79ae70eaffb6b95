"""One change the model-state guard (:mod:`dpfy.buffers`) found, and the refusal it gives:
the fix to name for each kind of state (buffer, tensor attribute, parameter), and the refusal
for a forward run inside ``torch.compile``, where the guard cannot read the model's state."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


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
