"""Swap torch's recurrent and attention modules for their DP replacements, in place.

``swap_recurrent(model)`` replaces every ``nn.RNN``/``nn.GRU``/``nn.LSTM`` by a
:mod:`dpfy.layers.recurrent` layer and ``swap_attention(model)`` every ``nn.MultiheadAttention``
by :class:`dpfy.layers.DPMultiheadAttention`. The replacements share the old modules'
``nn.Parameter`` objects, so values, ``requires_grad`` and an optimizer built before the swap are
kept, and ``state_dict`` keys do not change. Each returns the qualified names it replaced.

Importing this module also registers :func:`replacement` with ``dpfy.validate.REPLACEMENTS``,
so that ``dpfy.validate(model, fix=True)`` swaps the same layers in its copy of the model.
"""

from __future__ import annotations

from typing import Callable

from torch import nn

from dpfy.layers.attention import DPMultiheadAttention
from dpfy.layers.recurrent import DPGRU, DPLSTM, DPRNN

__all__ = ["REPLACEMENTS", "replacement", "swap_recurrent", "swap_attention", "swap_layers"]

RECURRENT: dict[type[nn.Module], Callable[[nn.Module], nn.Module]] = {
    nn.RNN: DPRNN.from_module, nn.GRU: DPGRU.from_module, nn.LSTM: DPLSTM.from_module}
ATTENTION: dict[type[nn.Module], Callable[[nn.Module], nn.Module]] = {
    nn.MultiheadAttention: DPMultiheadAttention.from_module}
REPLACEMENTS = {**RECURRENT, **ATTENTION}


def replacement(module: nn.Module, name: str = "") -> nn.Module | None:
    """The DP replacement of ``module`` (exact type), or None: the hook signature of
    ``dpfy.validate.REPLACEMENTS`` (``name`` is the module's qualified name, unused)."""
    make = REPLACEMENTS.get(type(module))
    return None if make is None else make(module)


def _swap(model: nn.Module, table: dict[type[nn.Module], Callable[[nn.Module], nn.Module]]
          ) -> list[str]:
    """Replace (in place) every submodule whose exact type is in ``table``; the names."""
    done = []
    for name, m in list(model.named_modules()):
        for child_name, child in list(m.named_children()):
            make = table.get(type(child))
            if make is not None:
                setattr(m, child_name, make(child))
                done.append(f"{name}.{child_name}" if name else child_name)
    return done


def swap_recurrent(model: nn.Module) -> list[str]:
    """Replace every ``nn.RNN``, ``nn.GRU``, ``nn.LSTM`` inside ``model`` (in place) by
    ``DPRNN``/``DPGRU``/``DPLSTM`` sharing its parameters; returns the replaced names.

    The root module itself cannot be replaced in place: wrap a bare recurrent layer in a
    container first (or build ``DPLSTM.from_module(lstm)`` directly).
    """
    return _swap(model, RECURRENT)


def swap_attention(model: nn.Module) -> list[str]:
    """Replace every ``nn.MultiheadAttention`` inside ``model`` (in place) by a
    ``DPMultiheadAttention`` sharing its parameters; returns the replaced names."""
    return _swap(model, ATTENTION)


def swap_layers(model: nn.Module) -> list[str]:
    """Both swaps (what ``dpfy.validate(model, fix=True)`` should call); the replaced names."""
    return _swap(model, REPLACEMENTS)


def _register_with_validate() -> None:
    """Add :func:`replacement` to ``dpfy.validate.REPLACEMENTS`` once."""
    from dpfy.validate import REPLACEMENTS as fixes
    if replacement not in fixes:
        fixes.append(replacement)


_register_with_validate()
