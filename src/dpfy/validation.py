"""``dpfy.validate``: find (and optionally fix) what stops a model from training privately.

The module is ``dpfy.validation`` so that its name never shadows the function ``dpfy.validate``
on the lazily loaded package root.

Problems seen without running the model:

- layers that mix the examples of a batch (any BatchNorm): fixable, replaced by a GroupNorm that
  stays meaningful for the layer's input (:func:`batchnorm_to_groupnorm`);
- modules with ``track_running_stats=True``: their running statistics learn from the training
  data and would be saved with the model unaccounted; fixable for InstanceNorm, whose training
  forward normalizes each example by its own statistics anyway (tracking is turned off);
- for ``route="ghost"``, modules without a layer rule (they go to vmap under ``"auto"``).

With ``example_input``, one training-mode forward of a deep copy runs under
:class:`dpfy.buffers.BufferGuard` and every buffer it changes is a problem, whatever the module
(a user module that accumulates a statistic in ``forward``, say): the same check ``make_private``
makes at the first training forward, done before training.

With ``example_batch`` (the pre-flight), a deep copy also runs one *private* forward and backward
on that batch with the engine attached and its batch guard bound to the batch's rows, and every
problem the first training steps would raise is listed at once, each naming the module and the
fix: layers without torch.func support, dropout inside a vmap layer, a layer whose batch cannot be
found (time-first and ambiguous, a ``PackedSequence``), a rule refusing its input (EmbeddingBag
in max mode), a loss that reaches no trainable parameter. Tied weights and 0-dim parameters are
supported and not problems (``dpfy explain`` shows the ties).

``fix=True`` first swaps the layers that ``dpfy.layers`` rebuilds from Linears (``nn.RNN``,
``nn.GRU``, ``nn.LSTM``, ``nn.MultiheadAttention``: :func:`dpfy.layers.dp_replacement`), then
applies the BatchNorm and InstanceNorm fixes.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
import math
from typing import Any, Callable

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm
from torch.utils._pytree import tree_flatten

from dpfy._require import require
from dpfy.buffers import BufferChange, BufferGuard, guard_of
from dpfy.grads import GradEngine, build_layers
from dpfy.grads.vmap import check_no_dropout
from dpfy.grads.loss_contract import LossContract
from dpfy.grads.rules import rule_for
from dpfy.layers import dp_replacement

__all__ = ["validate", "batchnorm_to_groupnorm", "buffer_problems", "preflight_problems"]

_SPATIAL_BATCHNORMS = (nn.BatchNorm2d, nn.BatchNorm3d)  # inputs (B, C, H, W) / (B, C, D, H, W)


def batchnorm_to_groupnorm(bn: _BatchNorm, name: str = "") -> nn.GroupNorm:
    """A GroupNorm for ``bn`` that normalizes each example on its own and still depends on it.

    - BatchNorm2d / BatchNorm3d (spatial inputs): gcd(32, C) groups (Wu & He 2018's 32 when C
      allows it); each group normalizes C/G channels × all positions.
    - BatchNorm1d (and any other BatchNorm): one group. Its input is (B, C) or (B, C, L), and the
      shape is not known here. On (B, C) a group of k channels normalizes only k values: k = 1
      gives a constant (the old GroupNorm(C, C) replacement made the model ignore its input),
      k = 2 keeps only the sign of a difference. One group is LayerNorm over C on (B, C) and
      LayerNorm over (C, L) on (B, C, L): meaningful for both. C = 1 is refused: a single value
      normalized on its own is a constant.

    The affine parameters (values and ``requires_grad``) are copied from ``bn``; its running
    statistics, learnt from data, are dropped.

    Args:
      bn: the BatchNorm to replace (initialized, for the lazy variants).
      name: its qualified name in the model, for error messages.
    """
    label = name or type(bn).__name__
    c = bn.num_features
    require(
        c >= 1,
        f"{label}.num_features",
        c,
        ">= 1 (an initialized layer)",
        "Run one forward of the model before dpfy.validate, so lazy layers know their size",
    )
    if isinstance(bn, _SPATIAL_BATCHNORMS):
        groups = math.gcd(32, c)
    else:
        require(
            c >= 2,
            f"{label}.num_features",
            c,
            ">= 2 for a replacement that depends on its input",
            "A single channel normalized per example is a constant: remove the "
            "layer, or replace it by hand (nn.GroupNorm(1, 1) if its input is (B, 1, L) "
            "with L >= 2)",
        )
        groups = 1
    ref = bn.weight if bn.affine else bn.running_mean
    factory: dict[str, Any] = {} if ref is None else {"device": ref.device, "dtype": ref.dtype}
    gn = nn.GroupNorm(groups, c, eps=bn.eps, affine=bn.affine, **factory)
    if bn.affine:
        with torch.no_grad():
            gn.weight.copy_(bn.weight)
            gn.bias.copy_(bn.bias)
        gn.weight.requires_grad_(bn.weight.requires_grad)
        gn.bias.requires_grad_(bn.bias.requires_grad)
    return gn


def _stop_tracking(norm: _InstanceNorm) -> None:
    """Turn an InstanceNorm's running statistics off, as its constructor would have."""
    norm.track_running_stats = False
    for buffer in ("running_mean", "running_var", "num_batches_tracked"):
        setattr(norm, buffer, None)


def _fix(model: nn.Module, name: str = "") -> nn.Module:
    """Swap in the DP layers, replace BatchNorms and turn InstanceNorm tracking off, in place;
    returns the root."""
    new = dp_replacement(model)
    if new is not None:
        return new
    if isinstance(model, _BatchNorm):
        return batchnorm_to_groupnorm(model, name)
    if isinstance(model, _InstanceNorm) and model.track_running_stats:
        _stop_tracking(model)
    for child_name, child in model.named_children():
        setattr(model, child_name, _fix(child, f"{name}.{child_name}" if name else child_name))
    return model


def buffer_problems(model: nn.Module, example_input: Any) -> list[BufferChange]:
    """The buffers that one training forward of a copy of ``model`` on ``example_input`` changes.

    The copy is in training mode with autograd on (a training forward, as ``make_private``'s
    guard defines it); ``model`` itself is not run. A tuple is passed as positional arguments.
    """
    require(
        guard_of(model) is None,
        "model",
        type(model).__name__,
        "not yet private when example_input is given",
        "Validate before make_private: the private model's hooks "
        "would capture the example as if it were a training batch",
    )
    probe = copy.deepcopy(model).train()
    guard = BufferGuard(probe, collect=True)
    try:
        with torch.enable_grad():
            _call(probe, example_input)
    finally:
        guard.detach()
    return guard.problems


def _call(model: nn.Module, batch: Any) -> Any:
    """``model`` called as the user calls it: a mapping (a dict, Hugging Face's
    ``BatchEncoding``) as keyword arguments, a tuple as positional ones, else one argument."""
    if isinstance(batch, Mapping):
        return model(**batch)
    return model(*(batch if isinstance(batch, tuple) else (batch,)))


def _batch_rows(batch: Any) -> int:
    """Rows of an example batch: dim 0 of its first tensor (a tensor, tuple or mapping)."""
    values = (
        batch.values()
        if isinstance(batch, Mapping)
        else (batch if isinstance(batch, tuple) else (batch,))
    )
    first = next((t for t in values if torch.is_tensor(t) and t.dim() >= 1), None)
    require(
        first is not None,
        "example_batch",
        type(batch).__name__,
        "a tensor, a tuple of positional arguments or a dict of keyword arguments holding "
        "at least one tensor with the batch in dimension 0",
        "Pass what the model is called with, e.g. model(*batch) or model(**batch)",
    )
    assert first is not None, "required above"
    return first.shape[0]


def _scalar_loss(output: Any) -> torch.Tensor:
    """A loss that depends on every floating-point tensor of ``output``: Σ out²."""
    if isinstance(output, dict):  # Hugging Face ModelOutput is a dict
        output = tuple(output.values())
    leaves = [t for t in tree_flatten(output)[0] if torch.is_tensor(t) and t.is_floating_point()]
    zero = torch.zeros((), device=leaves[0].device if leaves else None)  # the output's device
    return sum((t.float().square().sum() for t in leaves), zero)


def preflight_problems(
    model: nn.Module,
    example_batch: Any,
    *,
    route: str = "auto",
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    loss_reduction: str = "mean",
) -> list[str]:
    """Problems of one private forward/backward of a copy of ``model`` on ``example_batch``.

    Args:
      model: the model (not run, not modified: a deep copy in training mode is).
      example_batch: what the model is called with: a tensor, a tuple (positional arguments)
        or a dict (keyword arguments, e.g. a tokenizer's output). A tiny batch (2–4 rows) does.
      route: the route ``make_private`` will use ("auto", "ghost" or "vmap").
      loss_fn: ``fn(output) -> scalar`` (default: Σ of the squares of every float output, so
        that every layer receives a gradient). A loss given here is checked against the loss
        contract the first step checks (:mod:`dpfy.grads.loss_contract`): its reduction must be
        ``loss_reduction``, with no term autograd cannot differentiate and no divisor that
        depends on the batch.
      loss_reduction: what ``make_private`` will be told (``"mean"``, the default, or ``"sum"``).

    Returns:
      One message per problem, each naming the module and the fix (empty: ready).
    """
    require(
        guard_of(model) is None,
        "model",
        type(model).__name__,
        "not yet private for the pre-flight",
        "Validate before make_private",
    )
    rows = _batch_rows(example_batch)
    probe = copy.deepcopy(model).train()
    try:
        eng = GradEngine(probe, route=route, loss_reduction="sum")
    except ValueError as e:
        return [str(e)]
    eng.bind_batch(rows)
    contract = LossContract(probe, lambda: rows, loss_reduction) if loss_fn is not None else None
    try:
        with torch.enable_grad():
            out = _call(probe, example_batch)
            (loss_fn or _scalar_loss)(out).backward()
        return eng.preflight() + ((contract.problems() or []) if contract is not None else [])
    except Exception as e:  # the forward or backward itself fails: that is the problem
        return [
            f"the private forward/backward on example_batch must run, got {type(e).__name__}: {e}"
        ]
    finally:
        eng.detach()
        if contract is not None:
            contract.remove()


def _static_problems(model: nn.Module, route: str) -> tuple[list[str], set[str]]:
    """Problems visible without running the model, and the modules they name."""
    problems, named = [], set()
    for name, m in model.named_modules():
        label = name or "(root)"
        if isinstance(m, _BatchNorm):
            problems.append(
                f"{label}: {type(m).__name__} mixes the examples of a batch (and "
                f"learns running statistics from them); dpfy.validate(model, "
                f"fix=True) replaces it with GroupNorm, or dpfy.layers.public_batchnorm("
                f"model, public_data) normalizes with statistics of declared public data"
            )
            named.add(name)
            continue
        if getattr(m, "track_running_stats", False) is True:
            fix = (
                "dpfy.validate(model, fix=True) turns tracking off"
                if isinstance(m, _InstanceNorm)
                else "build it with track_running_stats=False"
            )
            problems.append(
                f"{label}: {type(m).__name__} has track_running_stats=True: its "
                f"running statistics learn from the training data and would be "
                f"saved with the model unaccounted; {fix}"
            )
            named.add(name)
        if (
            route == "ghost"
            and rule_for(m) is None
            and any(p.requires_grad for p in m.parameters(recurse=False))
        ):
            problems.append(
                f"{label}: no layer rule for {type(m).__name__}; use route='auto' "
                f"or register a rule"
            )
    if route != "ghost":
        problems += _vmap_problems(model, route)
    return problems, named


def _vmap_problems(model: nn.Module, route: str) -> list[str]:
    """What the first step will refuse in the modules that go to torch.func (no layer rule),
    seen without a batch: recurrent layers torch.func cannot batch (``nn.RNN``, ``nn.GRU``)
    and dropout inside such a module (its masks cannot be replayed per example)."""
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    if not trainable:
        return []
    try:
        layers = build_layers(model, route, trainable)
    except ValueError:  # a module the engine refuses outright: listed by the checks above
        return []
    problems = []
    for layer in layers:
        if layer.rule is not None:
            continue
        m, name = layer.module, layer.label
        if isinstance(m, (nn.RNN, nn.GRU)):
            problems.append(
                f"{name}: torch.func cannot form the per-example gradients of "
                f"{type(m).__name__} (the first step would refuse it); "
                f"dpfy.validate(model, fix=True) swaps in dpfy.layers.DP"
                f"{type(m).__name__}, with the same parameters"
            )
            continue
        try:
            check_no_dropout(m, layer.name)  # the check the vmap route makes at the step
        except ValueError as e:
            problems.append(f"{name}: {e} (the first step would refuse it)")
    return problems


def validate(
    model: nn.Module,
    example_batch: Any = None,
    *,
    fix: bool = False,
    route: str = "auto",
    example_input: Any = None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    loss_reduction: str = "mean",
) -> list[str] | nn.Module:
    """List the problems of ``model``, or (``fix=True``) return a fixed copy.

    Args:
      model: the model to check; not modified (and not run: the examples run a copy).
      example_batch: the pre-flight (see :func:`preflight_problems`): what the model is called
        with on a tiny batch (tensor, tuple of positional arguments, dict of keyword
        arguments); one private forward/backward of a copy lists every problem the first
        training step would raise, plus every buffer that forward changes.
      loss_fn: with ``example_batch``, ``fn(output) -> scalar`` (default Σ out²); the loss is
        checked as the first step checks it (its reduction against ``loss_reduction``, terms
        autograd cannot differentiate, divisors that depend on the batch).
      loss_reduction: what ``make_private`` will be told: ``"mean"`` (default) or ``"sum"``.
      fix: return a deep copy with ``nn.RNN``/``GRU``/``LSTM``/``MultiheadAttention`` swapped
        for their ``dpfy.layers`` DP replacements, every BatchNorm replaced by a GroupNorm
        (:func:`batchnorm_to_groupnorm`) and InstanceNorm's ``track_running_stats`` turned off,
        raising ``ValueError`` if a problem remains that cannot be fixed automatically.
      route: the route you intend to use; with ``"ghost"`` modules without a rule are problems.
      example_input: a batch the model accepts (a tuple: positional arguments; a mapping:
        keyword arguments); if given, one training-mode forward of a copy reports every
        buffer that forward changes.

    Returns:
      ``fix=False``: a list of human-readable problems (empty: ready). ``fix=True``: the model.
    """
    if fix:
        fixed = _fix(copy.deepcopy(model))
        left = validate(
            fixed,
            example_batch,
            route=route,
            example_input=example_input,
            loss_fn=loss_fn,
            loss_reduction=loss_reduction,
        )
        if left:
            raise ValueError(
                f"model must have no unfixable problems, got {left}. Change those layers by hand"
            )
        return fixed
    problems, named = _static_problems(model, route)
    if example_batch is not None and example_input is None:
        example_input = example_batch  # the buffer check runs the same call
    if example_input is not None:
        problems += [str(c) for c in buffer_problems(model, example_input) if c.module not in named]
    if example_batch is not None and not problems:  # the engine refuses those before running
        problems += preflight_problems(
            model, example_batch, route=route, loss_fn=loss_fn, loss_reduction=loss_reduction
        )
    return problems
