"""The parameters a private model trains, held by dpfy: what ``requires_grad`` says about them.

The gradient engine turns autograd's own parameter gradient off for the parameters it trains
(``grads/engine.py``: the per-example sums replace that matmul), so autograd's flag is False on
each of them while the model is private. User code reads the flag for other reasons: counting
trainable parameters (peft's ``print_trainable_parameters``), building an optimizer from the
parameters that require a gradient, freezing a layer with ``requires_grad_(False)``, copying
the model. A held parameter therefore answers ``requires_grad`` with the truth — is it trained —
while autograd still sees False:

- ``p.requires_grad`` reads whether the private step trains ``p``;
- ``p.requires_grad_(False)`` (or ``module.requires_grad_(False)``) records a freeze, which the
  private step refuses at its next step (:func:`frozen_since`), naming the fix;
- ``copy.deepcopy`` and pickling (``torch.save(model)``) give a plain ``nn.Parameter`` whose
  autograd flag is that truth, so a copy of a private model trains like any model.

``DistributedDataParallel`` reads the same flag to build its reducer, which needs autograd's
flag: wrapping a private model in DDP would crash inside torch. The held parameters are
therefore listed in the model's ``_ddp_params_and_buffers_to_ignore`` (:func:`hide_from_ddp`),
so that DDP after ``make_private`` raises its own "no parameter that requires a gradient"
error, as it did before; wrap *before* ``make_private`` (``dpfy.step.distributed``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, SupportsIndex

import torch
from torch import nn

__all__ = [
    "hold",
    "release",
    "is_held",
    "autograd_requires_grad",
    "frozen_since",
    "hide_from_ddp",
    "show_to_ddp",
]

_TRAINED = "_dpfy_trained"  # the truth, on each held parameter
# autograd's own flag, under the override: a getset descriptor (torch's stub types it bool)
_AUTOGRAD: Any = torch._C.TensorBase.requires_grad


class _Held:
    """Mixed in before the parameter's own class (see the module docstring)."""

    data: torch.Tensor  # the parameter's, through the class mixed into

    @property
    def requires_grad(self) -> bool:
        return self.__dict__[_TRAINED]

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        self.__dict__[_TRAINED] = bool(value)

    def requires_grad_(self, requires_grad: bool = True) -> "_Held":
        self.__dict__[_TRAINED] = bool(requires_grad)
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> nn.Parameter:
        if id(self) not in memo:
            memo[id(self)] = nn.Parameter(
                self.data.clone(memory_format=torch.preserve_format), self.__dict__[_TRAINED]
            )
        return memo[id(self)]

    def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
        state = {k: v for k, v in self.__dict__.items() if k != _TRAINED}
        if not state:
            return (
                torch._utils._rebuild_parameter,
                (self.data, self.__dict__[_TRAINED], OrderedDict()),
            )
        return (
            torch._utils._rebuild_parameter_with_state,
            (self.data, self.__dict__[_TRAINED], OrderedDict(), state),
        )


_CLASSES: dict[type, type] = {}


def _held_class(cls: type) -> type:
    """The held variant of a parameter class (one per class, so ``isinstance`` still holds)."""
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"Held{cls.__name__}", (_Held, cls), {"__module__": __name__})
    return _CLASSES[cls]


def is_held(p: torch.Tensor) -> bool:
    return isinstance(p, _Held)


def autograd_requires_grad(t: torch.Tensor) -> bool:
    """Autograd's own flag: whether a backward may differentiate ``t`` (False on a held
    parameter, whatever its ``requires_grad`` says)."""
    return bool(_AUTOGRAD.__get__(t))


def hold(p: nn.Parameter) -> None:
    """Turn autograd's gradient of ``p`` off while ``requires_grad`` keeps reading True."""
    if is_held(p):
        return
    _AUTOGRAD.__set__(p, False)
    p.__class__ = _held_class(type(p))
    p.__dict__[_TRAINED] = True


def release(p: nn.Parameter) -> None:
    """Give ``p`` back its class and autograd's flag, set to what ``requires_grad`` read."""
    if not is_held(p):
        return
    trained = p.__dict__.pop(_TRAINED)
    p.__class__ = type(p).__mro__[2]  # (held class, _Held, the original class, ...)
    _AUTOGRAD.__set__(p, trained)


def frozen_since(named: dict[str, nn.Parameter]) -> list[str]:
    """The names of held parameters frozen (``requires_grad_(False)``) since they were held."""
    return [n for n, p in named.items() if is_held(p) and not p.__dict__[_TRAINED]]


_DDP_IGNORE = "_ddp_params_and_buffers_to_ignore"  # read by DistributedDataParallel.__init__


class _HeldNames(list):
    """The names DDP must ignore while the model is private; a copy keeps only the user's."""

    def __init__(self, names: list[str], users: list[str] | None) -> None:
        super().__init__(list(users or []) + [n for n in names if n not in (users or [])])
        self.users = list(users) if users is not None else None

    def __deepcopy__(self, memo: dict[int, Any]) -> list[str] | None:
        return list(self.users) if self.users is not None else []

    def __reduce__(self) -> Any:
        return (list, (list(self.users or []),))


def hide_from_ddp(model: nn.Module, names: list[str]) -> None:
    """List the held parameters ``names`` of ``model`` for DistributedDataParallel to ignore."""
    users = getattr(model, _DDP_IGNORE, None)
    model.__dict__[_DDP_IGNORE] = _HeldNames(names, users)


def show_to_ddp(model: nn.Module) -> None:
    """Undo :func:`hide_from_ddp` (the user's own list, if any, is kept)."""
    held = model.__dict__.get(_DDP_IGNORE)
    if isinstance(held, _HeldNames):
        if held.users is None:
            del model.__dict__[_DDP_IGNORE]
        else:
            model.__dict__[_DDP_IGNORE] = held.users
