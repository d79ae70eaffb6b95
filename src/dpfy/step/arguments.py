"""make_private's first checks on what it is handed: numbers that are numbers, and a model whose
weights exist.

Both used to surface far from their cause: ``noise_multiplier="1.0"`` as Python's bare
``TypeError: '>=' not supported between instances of 'str' and 'int'``, and a model built on
the ``meta`` device (``torch.device("meta")``, or ``from_pretrained(..., device_map="meta")``)
as a device error inside the first forward, after the loader and the ledger were built.
"""

from __future__ import annotations

import numbers
from typing import Any

from torch import nn

__all__ = ["check_numbers", "check_materialized"]


def check_numbers(**values: Any) -> None:
    """Each of ``values`` is None or a real number (an int, a float or a NumPy scalar; not a
    bool, not a string). Raises ``TypeError`` in dpfy's error format."""
    for name, value in values.items():
        if value is None or (isinstance(value, numbers.Real) and not isinstance(value, bool)):
            continue
        fix = f"Pass a number, e.g. {name}=1.0"
        if isinstance(value, str):
            try:
                fix = f"Pass {name}={float(value)!r} (a number, not the string {value!r})"
            except ValueError:
                pass
        raise TypeError(
            f"{name} must be a number (int or float), got {name} = {value!r} "
            f"({type(value).__name__}). {fix}"
        )


def check_materialized(model: nn.Module) -> None:
    """No parameter or buffer of ``model`` is on the ``meta`` device (shapes without values)."""
    meta = [name for name, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if meta:
        shown = ", ".join(meta[:3]) + (f" and {len(meta) - 3} more" if len(meta) > 3 else "")
        raise ValueError(
            f"model must hold real weights, got model = {type(model).__name__} with "
            f"{len(meta)} tensors on the meta device ({shown}): they have shapes but no values, "
            f"so its forward cannot run. Materialize it before make_private: "
            f"model.to_empty(device='cpu') then load or initialize the weights "
            f"(model.load_state_dict(...), or reset_parameters() on each layer)"
        )
