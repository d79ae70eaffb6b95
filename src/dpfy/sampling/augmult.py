"""Augmentation multiplicity: K augmented copies of every sampled example, clipped as one unit
(De et al. 2022, "Unlocking high-accuracy differentially private image classification through
scale", §3.1 and §4).

The sampler draws *examples*, exactly as without augmentation; the loader then hands the model
K rows per sampled example, consecutive (rows k·K … k·K+K−1 are the copies of the k-th example
of the physical batch), fetched from the dataset K times and passed through ``augment``. The
unit the step clips is the example: its K rows (:class:`AugmultUnits`), whose gradients are
*averaged* before clipping, so a unit contributes

    clip_C( (1/K) Σ_k g_{u,k} ),    g_{u,k} = ∇ℓ(θ; aug_k(x_u)),

and the step releases (1/b)·(Σ_u clip_C(ḡ_u) + N(0, σ²C²)), b = qN the expected number of
*examples*. How the loss reduction makes that so: the training loop's loss is the mean over the
B·K rows of the physical batch; the gradient engine multiplies by its row count (B·K) to
recover each row's own gradient g_{u,k} (``loss_reduction="mean"``), the unit's gradient sum
Σ_k g_{u,k} is scaled by 1/K (:meth:`AugmultUnits.unit_scale`) before its norm is taken and
clipped, and the noisy sum is divided by b, not by B·K.

Privacy: adding or removing one example adds or removes one unit, whose contribution has norm
≤ C whatever its copies are, so the sensitivity stays C per example and the sampling facts
(q, b, N, steps per epoch) are the examples', unchanged: the ledger of a run with K copies is
the ledger of the same run with K = 1. The cost is compute: K× the rows per step.

Randomness: the augmentations are not a privacy secret (they are functions of the example
only, and the bound above holds for any of them), but they never draw from the noise
generator's stream: ``augment`` gets its own ``torch.Generator``, seeded from the run seed's
own child sequence (a seeded run reproduces its augmentations) or from the operating system.
With ``augment="dataset"`` the dataset's ``__getitem__`` draws its own random transform on
each of the K fetches (torch's global generator, in the loader's workers: not reproduced by
dpfy's seed).
"""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np
import torch
from torch.utils._pytree import tree_flatten

from dpfy._require import require
from dpfy.sampling.units import ExampleUnits, known_indices

__all__ = ["AugmultUnits", "Augmentation", "augment_seed", "check_augmult"]

AugmentFn = Callable[[Any, torch.Generator], Any]


class AugmultUnits(ExampleUnits):
    """The unit of privacy is one example; the unit clipped is its K augmented copies.

    The loader's rows carry their example's dataset index K times, consecutively
    (:meth:`Augmentation.rows`); :meth:`units_of` numbers the examples of the physical batch
    and :meth:`unit_scale` makes the clipped quantity the mean of the K copies' gradients.
    """

    name = "example"  # adjacency: add or remove one example (with all of its copies)
    adjacency_note = "add or remove one example"

    def __init__(self, k: int) -> None:
        self.k = k

    def units_of(self, indices: torch.Tensor | None) -> torch.Tensor | None:
        """(B·K,) each row's example, numbered 0..B−1 within the physical batch."""
        indices = known_indices(indices)
        unit = torch.unique(indices.cpu(), return_inverse=True)[1]
        counts = torch.bincount(unit)
        require(
            bool((counts == self.k).all()),
            "rows per example",
            sorted(set(counts.tolist())),
            f"exactly augmult = {self.k}",
            "Iterate the loader make_private returned (each example's copies are one unit)",
        )
        return unit

    def unit_scale(self, unit_of_row: torch.Tensor) -> torch.Tensor:
        """(B,) 1/K: what is clipped is the mean of an example's K copies' gradients."""
        units = int(unit_of_row.max()) + 1 if unit_of_row.numel() else 0
        return torch.full((units,), 1.0 / self.k, dtype=torch.float64)


def augment_seed(seed: int) -> int:
    """The augmentation generator's seed: a child of the run seed's sequence, independent of
    the sampling and noise seeds (``dpfy.api.derive_seeds``)."""
    child = np.random.SeedSequence(seed, spawn_key=(1,))
    return int(child.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


class Augmentation:
    """K copies per example and the function that augments them, with its own generator.

    Args:
      k: K >= 1, the copies per sampled example.
      augment: ``fn(batch, generator) -> batch``: the collated batch of B·K rows (each
        example's K copies consecutive) in, the same rows augmented out (same leading size,
        same order); it draws its randomness from ``generator`` only. ``"dataset"``: the
        dataset augments on each fetch itself; None: only with K = 1.
      seed: the run seed (None: the generator is seeded from the operating system).
    """

    def __init__(self, k: int, augment: AugmentFn | str | None, seed: int | None) -> None:
        self.k, self.fn = k, augment
        start = augment_seed(seed) if seed is not None else int.from_bytes(os.urandom(8)) >> 1
        self.generator = torch.Generator().manual_seed(start)

    def rows(self, indices: torch.Tensor) -> torch.Tensor:
        """(B,) example indices → (B·K,) row indices, each example's K copies consecutive."""
        return indices.repeat_interleave(self.k)

    def examples_per_batch(self, rows: int | None) -> int | None:
        """The examples of a physical batch of at most ``rows`` rows (None: no limit)."""
        if rows is None:
            return None
        require(
            rows >= self.k,
            "max_physical_batch_size",
            rows,
            f">= augmult = {self.k} (it counts rows, K per example)",
            "Raise it to a multiple of augmult",
        )
        return rows // self.k

    def __call__(self, batch: Any) -> Any:
        """The batch with every row augmented (unchanged for ``"dataset"``)."""
        if not callable(self.fn):
            return batch
        out = self.fn(batch, self.generator)
        before = {t.shape[0] for t in tree_flatten(batch)[0] if torch.is_tensor(t) and t.dim()}
        after = {t.shape[0] for t in tree_flatten(out)[0] if torch.is_tensor(t) and t.dim()}
        require(
            after == before,
            "the augmented batch's rows",
            sorted(after),
            f"the batch's {sorted(before)} rows, in order",
            "augment must map each row to one augmented row (no dropping, no mixing)",
        )
        return out


def check_augmult(augmult: int, augment: Any) -> None:
    """Refuse an ``augmult`` / ``augment`` pair that is not valid (the features augmult cannot
    be combined with are declared in :mod:`dpfy.spec.check`)."""
    require(
        isinstance(augmult, int) and not isinstance(augmult, bool) and augmult >= 1,
        "augmult",
        augmult,
        "an integer >= 1",
        "Pass augmult=K, the augmented copies of each sampled example (1: none)",
    )
    require(
        augment is None or callable(augment) or augment == "dataset",
        "augment",
        augment,
        "None, 'dataset' or a callable fn(batch, generator) -> batch",
        "e.g. augment=dpfy.data.augment.crop_flip(padding=2)",
    )
    if augmult == 1:
        require(
            augment is None,
            "augment",
            augment,
            "None with augmult=1",
            "Pass augmult=K >= 2 with it (augment= only makes the K copies of an example)",
        )
        return
    require(
        augment is not None,
        "augment",
        None,
        f"given with augmult={augmult} (else the {augmult} copies are identical)",
        "Pass augment=fn(batch, generator), e.g. dpfy.data.augment.crop_flip(padding=2), or "
        "augment='dataset' if your dataset's __getitem__ draws its own random transform",
    )
