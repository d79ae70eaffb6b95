"""The unit of privacy: which rows of a batch belong to one protected unit.

Differential privacy protects a *unit*: adding or removing one unit changes a release by at
most the clipping threshold. Today a unit is one example (one row); the seam is here so that
a user (all of their rows: user-level DP) or an example's augmented copies can be one unit.

A sampler holds its units (``sampler.units``) and says, for the dataset indices of a physical
batch, which unit each row belongs to (:meth:`ExampleUnits.units_of`): ``None`` when every row
is its own unit, else a (B,) tensor of unit positions 0..U−1. The private step then asks the
gradient engine for per-unit norms ‖Σ_{i∈u} g_i‖, clips per unit, and forms the weighted sum
with row weights w_{u(i)}; the report states the unit (:func:`dpfy.privacy.report_text.unit_text`).
"""

from __future__ import annotations

import hashlib
from typing import Any, ClassVar

import torch

from dpfy._require import require
from dpfy.sampling.draws import generator_state

__all__ = ["ExampleUnits", "UserUnits", "known_indices", "require_same_unit"]


def known_indices(indices: torch.Tensor | None) -> torch.Tensor:
    """The physical batch's dataset indices, which a unit other than the example needs to say
    which rows belong together; refused when the batch did not come from dpfy's loader."""
    require(
        indices is not None,
        "the batch's dataset indices",
        None,
        "known",
        "Iterate the loader make_private returned",
    )
    assert indices is not None  # the require above refused None
    return indices


class ExampleUnits:
    """Each example (one row of the training set) is one unit of privacy."""

    name = "example"
    adjacency_note = "add or remove one example"

    def units_of(self, indices: torch.Tensor | None) -> torch.Tensor | None:
        """Every row is its own unit: None (the step's per-row fast path)."""
        return None


class UserUnits:
    """Each user, with all of their examples, is one unit of privacy (user-level DP).

    Built once from one user id per example (aligned with the dataset) and kept: the ids of
    a run never change, which is what user-level accounting assumes. The ids themselves are
    sensitive and never reach a report; only counts do.

    Args:
      user_ids: (N,) integer ids, one per example; any values (they are mapped to positions
        0..U−1 in sorted order of the ids).
      clip_per_user: True (ULS): a user's rows in a step are clipped together, and
        :meth:`units_of` says which rows belong to which user. False (ELS): every row is
        clipped alone (:meth:`units_of` is None) and the accounting is at the user level.
      reduction: with ``clip_per_user``, what is clipped: ``"mean"`` (the mean of the user's
        gradients in the step, clipped to C) or ``"sum"`` (their sum, clipped to C).

    Attributes:
      user_of: (N,) user position of each example. sizes: (U,) examples per user.
      num_users: U. num_examples: N.
    """

    name = "user"
    adjacency_note = "add or remove one user (all of their examples)"

    def __init__(
        self, user_ids: torch.Tensor, *, clip_per_user: bool, reduction: str = "mean"
    ) -> None:
        ids = torch.as_tensor(user_ids)
        require(
            ids.dim() == 1
            and ids.numel() >= 1
            and not ids.is_floating_point()
            and not ids.is_complex()
            and ids.dtype is not torch.bool,
            "user_ids",
            f"{tuple(ids.shape)} {ids.dtype}",
            "a 1-D integer tensor, one id per example",
            "Pass torch.as_tensor(ids) with one integer user id per example of the dataset",
        )
        require(reduction in ("mean", "sum"), "user_reduction", reduction, "'mean' or 'sum'")
        _, user_of = torch.unique(ids.detach().cpu().long(), return_inverse=True)  # (N,)
        self.user_of = user_of
        self.sizes = torch.bincount(user_of)  # (U,)
        self.num_users, self.num_examples = int(self.sizes.numel()), int(ids.numel())
        self.order = torch.argsort(user_of, stable=True)  # examples grouped by user
        self.offsets = torch.cat([self.sizes.new_zeros(1), self.sizes.cumsum(0)])  # (U+1,)
        self.clip_per_user, self.reduction = clip_per_user, reduction

    @property
    def digest(self) -> str:
        """A fingerprint of the grouping of examples into users (checkpoints only: a resumed
        run must group the examples as the run it continues did)."""
        return hashlib.sha256(self.user_of.numpy().astype("<i8").tobytes()).hexdigest()

    def units_of(self, indices: torch.Tensor | None) -> torch.Tensor | None:
        """(B,) each row's user, numbered 0..U'−1 within the batch (ULS); None under ELS,
        whose rows are clipped one by one. One ``unique`` over B ids: O(B log B)."""
        if not self.clip_per_user:
            return None
        indices = known_indices(indices)
        return torch.unique(self.user_of[indices.cpu()], return_inverse=True)[1]

    def unit_scale(self, unit_of_row: torch.Tensor) -> torch.Tensor | None:
        """(U',) the factor that turns a user's gradient sum into what is clipped: 1/n_u
        (n_u the user's rows in this step) for ``"mean"``, None for ``"sum"``."""
        if self.reduction == "sum":
            return None
        return 1.0 / torch.bincount(unit_of_row).to(torch.float64)


class UnitSampler:
    """What the samplers of examples share: their unit of privacy (one example per row unless
    the sampler sets ``units``), the ELS cap k its ledger records (None: none), which unit each
    row of a batch is, whether its draws come from the OS CSPRNG (``generator`` None) rather
    than a seeded, reproducible torch generator, and what its checkpoint saves."""

    units: ExampleUnits | UserUnits = ExampleUnits()
    max_examples_per_user: int | None = None
    generator: torch.Generator | None
    resumed: ClassVar[tuple[str, ...]] = ()  # what a checkpoint keeps beside the generator

    def state_dict(self) -> dict[str, Any]:
        """SECRET (checkpoints only): the generator's state under ``"generator"``, then each
        attribute named in ``resumed`` (where the sampler stands in its draws) under its name."""
        saved = {name: getattr(self, name) for name in self.resumed}
        return {"generator": generator_state(self.generator), **saved}

    def units_of(self, indices: torch.Tensor | None) -> torch.Tensor | None:
        """Each row's unit of privacy (None: every row is its own unit)."""
        return self.units.units_of(indices)

    @property
    def secure(self) -> bool:
        """True when the draws come from the OS CSPRNG (not reproducible)."""
        return self.generator is None


def require_same_unit(units: ExampleUnits | UserUnits, saved: dict) -> None:
    """Refuse a sampler checkpoint ``saved`` of another unit of privacy than ``units``: a
    user-level run resumed as an example-level one (or the reverse) would account the wrong
    neighbouring relation."""
    got = saved.get("unit", "example")
    require(
        got == units.name,
        "the checkpoint's unit of privacy",
        got,
        f"{units.name}, the run being resumed",
        "A user-level run cannot be resumed as an "
        "example-level one (or the reverse): pass the same user_ids / --user-ids and "
        "--user-sampling",
    )
