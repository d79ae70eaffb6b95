"""Swap torch's recurrent and attention modules for their DP replacements, in place.

``swap_recurrent(model)`` replaces every ``nn.RNN``/``nn.GRU``/``nn.LSTM`` by a
:mod:`dpfy.layers.recurrent` layer and ``swap_attention(model)`` every ``nn.MultiheadAttention``
by :class:`dpfy.layers.DPMultiheadAttention`. The replacements share the old modules'
``nn.Parameter`` objects, so values, ``requires_grad`` and an optimizer built before the swap are
kept, and ``state_dict`` keys do not change. Each returns the qualified names it replaced.

``dpfy.validate(model, fix=True)`` swaps the same layers in its copy of the model through
:func:`dp_replacement` (validate imports this package; nothing here imports validate).
"""

from __future__ import annotations

from typing import Any, Callable

from torch import nn

from dpfy.layers.attention import DPMultiheadAttention
from dpfy.layers.recurrent import DPGRU, DPLSTM, DPRNN

__all__ = ["DP_REPLACEMENTS", "dp_replacement", "swap_recurrent", "swap_attention", "swap_layers"]

# torch type (exact) -> the factory of its DP replacement, sharing the module's parameters
Factory = Callable[[Any], nn.Module]  # each takes the torch module of its key's type
RECURRENT_REPLACEMENTS: dict[type[nn.Module], Factory] = {
    nn.RNN: DPRNN.from_module,
    nn.GRU: DPGRU.from_module,
    nn.LSTM: DPLSTM.from_module,
}
ATTENTION_REPLACEMENTS: dict[type[nn.Module], Factory] = {
    nn.MultiheadAttention: DPMultiheadAttention.from_module
}
DP_REPLACEMENTS = {**RECURRENT_REPLACEMENTS, **ATTENTION_REPLACEMENTS}


def dp_replacement(module: nn.Module) -> nn.Module | None:
    """The DP replacement of ``module`` (by exact type) sharing its parameters, or None."""
    make = DP_REPLACEMENTS.get(type(module))
    return None if make is None else make(module)


def _swap(model: nn.Module, table: dict[type[nn.Module], Factory]) -> list[str]:
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
    return _swap(model, RECURRENT_REPLACEMENTS)


def swap_attention(model: nn.Module) -> list[str]:
    """Replace every ``nn.MultiheadAttention`` inside ``model`` (in place) by a
    ``DPMultiheadAttention`` sharing its parameters; returns the replaced names."""
    return _swap(model, ATTENTION_REPLACEMENTS)


def swap_layers(model: nn.Module) -> list[str]:
    """Both swaps (what ``dpfy.validate(model, fix=True)`` does on its copy); the names."""
    return _swap(model, DP_REPLACEMENTS)
