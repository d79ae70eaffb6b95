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
  compared with one device sync; bit for bit with a copy at every forward where it cannot be
  taken: parameters on several devices, a fingerprint kernel failing; on a device, where the
  private step reads them, the comparisons stay there as flags read with the step's
  sensitivity check: dpfy._deferred),
  which any write that changes the sum of those integers changes: every change of one
  element, in practice any arithmetic update. A rearrangement that keeps every integer word
  (the elements of a float64 parameter permuted through ``.data``,
  ``w.data.copy_(w.data.flip(0))``; a float32 one rolled by two elements) keeps the sum and is
  not seen (a sum ignores positions; weighting them would cost a read of an index tensor as
  large as the parameters).

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

from dpfy.buffers.changes import BufferChange, buffer_fix, inside_torch_compile
from dpfy.buffers.guard import BufferGuard, guard_of, is_training_forward, watched

__all__ = [
    "BufferGuard",
    "BufferChange",
    "guard_of",
    "buffer_fix",
    "is_training_forward",
    "inside_torch_compile",
    "watched",
]
