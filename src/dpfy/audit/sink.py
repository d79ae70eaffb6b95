"""Coordinates no real example touches, for Dirac gradient canaries.

A Dirac canary's clipped gradient is C on one coordinate of the released update and 0
everywhere else (Nasr et al. 2023, "Tight auditing of differentially private machine
learning", §4). For the adversary's view of that coordinate to be exactly the canary's
contribution plus the run's noise, no real example may have a gradient there.
:class:`CanarySink` provides such coordinates without changing the model's function: it
wraps the model and adds the output of a bias-free ``nn.Linear(count, 1)`` whose input is
always zeros. Every example's gradient on that layer's weight is grad_out ⊗ 0 = 0, so the
real examples' per-example gradients (and their norms, hence their clipping) are unchanged,
and the model's outputs are unchanged (the layer adds exact zeros). The noise the private
step adds lands on these coordinates like on every other: they are part of the released
update, at the run's σ and C.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dpfy._require import require

__all__ = ["CanarySink", "find_sink"]


class CanarySink(nn.Module):
    """``model`` plus ``count`` trainable coordinates that no input reaches (``sink.weight``).

    The forward is ``model(...) + 0`` (the sink's output on a zero input, broadcast over every
    non-batch dimension), so predictions, losses and the real examples' gradients are
    exactly those of ``model``. The model's output must be one tensor with the batch first.
    """

    def __init__(self, model: nn.Module, count: int) -> None:
        super().__init__()
        require(isinstance(count, int) and count >= 1, "count", count, "an int >= 1")
        self.model = model
        self.sink = nn.Linear(count, 1, bias=False)
        nn.init.zeros_(self.sink.weight)

    @property
    def count(self) -> int:
        return int(self.sink.in_features)

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = self.model(*args, **kwargs)
        require(
            torch.is_tensor(out) and out.dim() >= 1,
            "the model's output",
            type(out).__name__,
            "one tensor with the batch dimension first",
            "Audit this model with canary kind 'direction' (random directions over its "
            "own parameters)",
        )
        zeros = out.new_zeros(out.shape[0], self.count)
        untouched = self.sink(zeros)  # (B, 1), exactly zero
        return out + untouched.reshape(out.shape[0], *([1] * (out.dim() - 1)))


def find_sink(model: nn.Module) -> tuple[str, CanarySink]:
    """The qualified name of the sink's weight and the :class:`CanarySink` inside ``model``."""
    found = [(name, m) for name, m in model.named_modules() if isinstance(m, CanarySink)]
    require(
        len(found) == 1,
        "CanarySink modules in the model",
        len(found),
        "exactly 1",
        "Wrap the model once: CanarySink(model, count) (dpfy.audit.sink)",
    )
    name, sink = found[0]
    return (f"{name}." if name else "") + "sink.weight", sink
