"""Whether the loader's ``collate_fn`` keeps each row its own example's: the collate probe.

A ``collate_fn`` forms the batch the model sees from the examples the sampler drew. One that
mixes examples (MixUp or CutMix applied to the batch, as torchvision documents them: row j
becomes λ·x_j + (1 − λ)·x_{π(j)}, and its label too) gives example i a share in other rows,
and so in their clipped gradients: one example's contribution to the released sum is no longer
bounded by the clip norm (reproduced: 2.52·C). The model-side probes cannot see this, since
they run after collation.

The check. On the first batch of at least two examples, the examples are collated once more
with example r replaced by the next example of the batch, for r the first and the last row (or
the next ones in, where a replacement changes the batch's shape: a random draw per element of a
padded batch would no longer line up), each time from the RNG states (torch's CPU generator,
Python's ``random``, NumPy's global generator) the real collation started from, so that a
collate function drawing per-row randomness draws the same. Every tensor row of the collated
batch other than row r must be bit for bit the real batch's (along dimension 0, over the region
both batches have where padding to the longest example changes a shape). The RNG states are
then set to where the real collation left them: the training run's streams are unchanged.
``torch.utils.data``'s ``default_collate`` is row-wise by construction and is not probed.

What it cannot see: mixing this batch does not show (a permutation that pairs r with itself
in both probes), mixing outside tensors, and mixing in the dataset's ``__getitem__`` (which
sees one example only and so cannot mix). Cost: two more collations of the first batch
(up to six where replacements change the padded shape).
"""

from __future__ import annotations

import random
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten
from torch.utils.data import default_collate

from dpfy.errors import PrivacyRefusal

__all__ = ["CollateProbe", "collate_mixes"]


class CollateProbe:
    """Wraps a collate function; its first call on ≥ 2 examples is checked (module docstring)."""

    def __init__(self, collate_fn: Callable[[list[Any]], Any]) -> None:
        self.collate_fn = collate_fn
        self.checked = collate_fn is default_collate

    def __call__(self, items: list[Any]) -> Any:
        if self.checked or len(items) < 2:
            return self.collate_fn(items)
        before = _rng_states()
        batch = self.collate_fn(items)
        after = _rng_states()
        try:
            found = collate_mixes(self.collate_fn, items, batch, before)
        finally:
            _set_rng_states(after)
        self.checked = True
        if found is not None:
            raise PrivacyRefusal(
                f"the loader's collate_fn ({_name(self.collate_fn)}) must form each row of the "
                f"batch from its own example alone, got {found}: it mixes examples across the "
                f"batch (MixUp or CutMix on the batch, say), so one example reaches other "
                f"examples' rows and losses and its contribution is not bounded by the clip "
                f"norm. Remove the mixing from collate_fn (augment each example on its own in "
                f"the dataset's transform); nothing of this batch was used"
            )
        return batch


def collate_mixes(
    collate_fn: Callable[[list[Any]], Any], items: list[Any], batch: Any, rng: tuple[Any, ...]
) -> str | None:
    """What shows that ``collate_fn`` mixes examples (None: nothing): ``batch`` is
    ``collate_fn(items)`` collated from the RNG states ``rng``.

    Two replacements are compared: of the first and the last row, or, where one changes the
    batch's shape (padding to the longest example, when the replaced one was the longest), of
    the next rows in from either end, up to :data:`TRIES` collations; if no replacement keeps
    the shape, the first two are compared over the region both batches have.
    """
    n = len(items)
    order = list(dict.fromkeys(r for k in range((n + 1) // 2) for r in (k, n - 1 - k)))
    tried: list[tuple[int, Any]] = []
    for r in order[:TRIES]:
        changed = list(items)
        changed[r] = items[(r + 1) % n]
        _set_rng_states(rng)
        tried.append((r, collate_fn(changed)))
        if sum(_same_shapes(batch, other) for _, other in tried) >= 2:
            break
    same = [(r, o) for r, o in tried if _same_shapes(batch, o)]
    for r, other in same if same else tried[:2]:
        what = _rows_changed(batch, other, n, r)
        if what is not None:
            return (
                f"{what} changed when example {r} of the {n} was replaced by example {(r + 1) % n}"
            )
    return None


TRIES = 6  # collations at most: the first two that keep the batch's shape are compared


def _same_shapes(a: Any, b: Any) -> bool:
    la, lb = tree_flatten(a)[0], tree_flatten(b)[0]
    return len(la) == len(lb) and all(
        x.shape == y.shape for x, y in zip(la, lb) if torch.is_tensor(x) and torch.is_tensor(y)
    )


def _rows_changed(batch: Any, other: Any, n: int, r: int) -> str | None:
    """Which tensor of the collated batch has a row other than ``r`` that differs."""
    a, b = tree_flatten(batch)[0], tree_flatten(other)[0]
    if len(a) != len(b):
        return "the batch's structure"
    for k, (x, y) in enumerate(zip(a, b)):
        if not torch.is_tensor(x) or not torch.is_tensor(y):
            continue
        if x.dim() != y.dim() or x.dtype != y.dtype:
            return f"tensor {k} of the batch"
        if x.dim() >= 1 and x.shape[0] == n == y.shape[0]:
            keep = torch.tensor([i for i in range(n) if i != r])
            x, y = x.index_select(0, keep), y.index_select(0, keep)
        common = tuple(slice(0, min(p, q)) for p, q in zip(x.shape, y.shape))
        if not torch.equal(_bits(x[common]), _bits(y[common])):
            return f"tensor {k} of the batch (rows other than {r})"
    return None


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous()
    return t.reshape(-1).view(torch.uint8) if t.numel() and t.dtype != torch.bool else t


def _rng_states() -> tuple[Any, ...]:
    np_state = None
    try:
        import numpy as np

        np_state = np.random.get_state()
    except ImportError:  # pragma: no cover - numpy ships with torch's usual installs
        pass
    return torch.get_rng_state(), random.getstate(), np_state


def _set_rng_states(states: tuple[Any, ...]) -> None:
    torch_state, py_state, np_state = states
    torch.set_rng_state(torch_state)
    random.setstate(py_state)
    if np_state is not None:
        import numpy as np

        np.random.set_state(np_state)


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__
