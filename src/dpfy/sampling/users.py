"""User-level sampling: the unit of privacy is the user, with all of their examples.

Two samplers, the two algorithms of Charles et al. 2024 ("Fine-tuning large language models
with user-level differential privacy"), both built from one user id per example
(:class:`~dpfy.sampling.units.UserUnits`):

- :class:`UserPoissonSampler` (**ULS**, user-level sampling): each *user* joins a step
  independently with probability q_u; a sampled user brings all of their examples, or k of
  them drawn at random from the sampler's own generator (``max_examples_per_user``), and those
  rows are clipped together as one unit (their mean or their sum, clipped to C). The noisy sum
  over users is divided by the expected number of users q_u·U. Ledger: ``Sampling.ULS`` at
  rate q_u, a Poisson-subsampled Gaussian at the user level.
- :class:`UserCappedSampler` (**ELS**, example-level sampling with contribution bounding):
  every user keeps at most k examples of the training set, chosen once, at random, from the
  sampler's generator (so as secret as the batches); examples are Poisson-sampled at rate q
  and clipped one by one. Ledger: ``Sampling.ELS`` at rate q with k, a mixture of Gaussians
  with Binomial(k, q) weights at the user level (:mod:`dpfy.privacy.mixture`).

Both report ``dataset_size`` = U, the number of users: the count of units of privacy the
ledger and the δ convention (δ ≪ 1/U) are about; ``num_examples`` is N.

The rate comes from the loader's ``batch_size``: ULS reads it as the expected number of users
per step (q_u = batch_size / U), ELS as the expected number of examples per step
(q = batch_size / N_kept, N_kept the examples left after the cap).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from dpfy._require import require
from dpfy.errors import PrivacyRefusal
from dpfy.privacy import Sampling
from dpfy.sampling.admit import check_loader
from dpfy.sampling.draws import seeded_generator, uniform
from dpfy.sampling.poisson import PoissonSampler
from dpfy.sampling.units import UserUnits

__all__ = ["UserPoissonSampler", "UserCappedSampler", "USER_SAMPLINGS", "make_user_sampler"]

USER_SAMPLINGS = ("uls", "els")


def _members(units: UserUnits, users: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The examples of ``users`` grouped by user, (R,), and each one's group 0..len−1, (R,)."""
    counts = units.sizes[users]  # (S,)
    group = torch.repeat_interleave(torch.arange(len(users)), counts)  # (R,)
    first = torch.cumsum(counts, 0) - counts  # (S,)
    pos = torch.arange(int(counts.sum())) - first[group]  # (R,)
    return units.order[units.offsets[users][group] + pos], group


def _at_most_k(group: torch.Tensor, k: int, generator: torch.Generator | None) -> torch.Tensor:
    """(R,) bool: keep at most k rows of each group, a uniformly random subset of each."""
    keys = uniform(len(group), generator)
    order = torch.argsort(group.double() + keys * 0.5)  # groups stay apart: keys < 1/2 + gap
    ranked = torch.empty_like(group)
    sorted_group = group[order]
    first = torch.searchsorted(sorted_group, sorted_group, right=False)
    ranked[order] = torch.arange(len(group)) - first  # rank in group
    return ranked < k


def _require_clip_per_user(units: UserUnits, wanted: bool, why: str) -> None:
    """Refuse ``units`` whose clipping (per user, or per example) is not the sampler's."""
    got = units.clip_per_user
    require(got == wanted, "units", f"clip_per_user={got}", f"clip_per_user={wanted}", why)


class UserPoissonSampler(PoissonSampler):
    """ULS: Poisson sampling of users at rate q_u; a user's rows of a step are one unit.

    Args:
      units: the users (``UserUnits(ids, clip_per_user=True, reduction=...)``).
      sample_rate: q_u, the probability a user joins a step.
      max_examples_per_user: k, the most rows one sampled user brings to one step (a
        uniformly random subset of their examples, drawn afresh each step); None: all.
      seed: None draws from the OS CSPRNG; an int seeds a torch generator.
    """

    sampling = Sampling.ULS
    units: UserUnits

    def __init__(
        self,
        units: UserUnits,
        *,
        sample_rate: float,
        max_examples_per_user: int | None = None,
        seed: int | None = None,
    ) -> None:
        _require_clip_per_user(units, True, "ULS clips each user's rows together")
        super().__init__(units.num_users, sample_rate=sample_rate, seed=seed)
        require(
            max_examples_per_user is None
            or (isinstance(max_examples_per_user, int) and max_examples_per_user >= 1),
            "max_examples_per_user",
            max_examples_per_user,
            "None or an integer >= 1",
        )
        self.units = units
        self.max_examples_per_step = max_examples_per_user
        self.num_examples = units.num_examples

    def units_of(self, indices: torch.Tensor | None) -> torch.Tensor | None:
        """(B,) each row's user within the batch."""
        return self.units.units_of(indices)

    @property
    def largest_unit(self) -> int:
        """The most rows one user can bring to a step (a physical batch must hold them)."""
        most = int(self.units.sizes.max())
        k = self.max_examples_per_step
        return most if k is None else min(k, most)

    def draw(self) -> torch.Tensor:
        """One logical batch: the dataset indices of the sampled users' rows, grouped by user."""
        users = torch.nonzero(
            uniform(self.dataset_size, self.generator) < self.sample_rate
        ).flatten()  # (S,)
        rows, group = _members(self.units, users)
        if self.max_examples_per_step is not None and len(rows):
            rows = rows[_at_most_k(group, self.max_examples_per_step, self.generator)]
        return rows

    def physical_batches(self, idx: torch.Tensor, physical: int | None) -> list[torch.Tensor]:
        """Cut a logical batch into physical ones of at most ``physical`` rows, never inside a
        user: a user's rows must be clipped together, so they sit in one physical batch."""
        if not physical or len(idx) <= physical:
            return [idx]
        user = self.units.user_of[idx]
        starts = (
            torch.nonzero(torch.cat([torch.ones(1, dtype=torch.bool), user[1:] != user[:-1]]))
            .flatten()
            .tolist()
        )
        bounds = starts + [len(idx)]
        parts, begin = [], 0
        for a, b in zip(bounds[:-1], bounds[1:]):
            if b - a > physical:
                raise PrivacyRefusal(
                    f"max_physical_batch_size must hold every user's rows of a step, got a "
                    f"user with {b - a} rows and max_physical_batch_size = {physical}. Raise "
                    f"it, or cap the rows per user with max_examples_per_user"
                )
            if b - begin > physical:
                parts.append(idx[begin:a])
                begin = a
        parts.append(idx[begin:])
        return parts

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), **_resume_facts("uls", self.units)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_resume(state, "uls", self.units)
        super().load_state_dict(state)


class UserCappedSampler(PoissonSampler):
    """ELS: each user keeps at most k examples; examples are Poisson-sampled at rate q.

    The kept examples are chosen once, when the sampler is built: a uniformly random k of each
    larger user's examples, from the sampler's generator (seeded, or the OS CSPRNG), so the
    choice is as secret as the batches and independent of the data's content. ``kept`` holds
    their dataset indices.

    Args:
      units: the users (``UserUnits(ids, clip_per_user=False)``).
      max_examples_per_user: k >= 1 (recorded in the ledger: the accounting needs it).
      batch_size: the expected number of examples per step; q = batch_size / N_kept.
      seed: None draws from the OS CSPRNG; an int seeds a torch generator.
    """

    sampling = Sampling.ELS
    units: UserUnits

    def __init__(
        self,
        units: UserUnits,
        *,
        max_examples_per_user: int,
        batch_size: int,
        seed: int | None = None,
    ) -> None:
        _require_clip_per_user(units, False, "ELS clips every example alone")
        require(
            isinstance(max_examples_per_user, int) and max_examples_per_user >= 1,
            "max_examples_per_user",
            max_examples_per_user,
            "an integer >= 1 for ELS",
            "ELS caps every user at k examples: pass max_examples_per_user=k",
        )
        generator = seeded_generator(seed)
        every = torch.arange(units.num_users)
        rows, group = _members(units, every)
        self.kept = torch.sort(rows[_at_most_k(group, max_examples_per_user, generator)]).values
        n_kept = len(self.kept)
        require(
            1 <= batch_size <= n_kept,
            "loader.batch_size",
            batch_size,
            f"in [1, {n_kept}] (the examples left after capping users at {max_examples_per_user})",
            "Use a smaller batch size",
        )
        super().__init__(n_kept, sample_rate=batch_size / n_kept)
        self.generator = generator
        self.units = units
        self.max_examples_per_user = max_examples_per_user
        self.num_examples, self.num_kept = units.num_examples, n_kept
        self.dataset_size = units.num_users  # the units of privacy

    @property
    def steps_per_epoch(self) -> int:
        """Logical batches per pass over the kept examples: ⌈N_kept / b⌉."""
        return max(1, math.ceil(self.num_kept / self.normalizer - 1e-9))

    def units_of(self, indices: torch.Tensor | None) -> torch.Tensor | None:
        """None: every row is clipped alone (the accounting is at the user level)."""
        return None

    def draw(self) -> torch.Tensor:
        """One logical batch: the sorted dataset indices of the sampled kept examples."""
        mask = uniform(self.num_kept, self.generator) < self.sample_rate
        return self.kept[mask]

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), **_resume_facts("els", self.units), "kept": self.kept}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_resume(state, "els", self.units)
        kept = state.get("kept")
        require(
            kept is not None and torch.equal(kept, self.kept) or self.generator is None,
            "the checkpoint's kept examples",
            "different",
            "the examples this run kept (same user ids, k and seed)",
            "Resume with the same user ids, max_examples_per_user and seed",
        )
        if kept is not None:
            self.kept = kept
        super().load_state_dict(state)


def _resume_facts(user_sampling: str, units: UserUnits) -> dict[str, Any]:
    """What a user-level sampler's checkpoint records for :func:`_check_resume` to compare:
    the unit of privacy, the user sampling and the users' digest."""
    return {"unit": units.name, "user_sampling": user_sampling, "users": units.digest}


def _check_resume(state: dict[str, Any], user_sampling: str, units: UserUnits) -> None:
    """Refuse a checkpoint of another unit of privacy, another user sampling, or other users
    (the ids changed between the run and its resumption: the accounting assumes they do not)."""
    got = (state.get("unit", "example"), state.get("user_sampling"))
    require(
        got == ("user", user_sampling),
        "the checkpoint's unit of privacy",
        f"{got[0]} ({got[1] or 'example-level sampling'})",
        f"user ({user_sampling}), the run being resumed",
        "A run resumes with the unit of privacy and the sampling it started with: pass the "
        "same user_ids / --user-ids, --user-sampling and --max-examples-per-user",
    )
    require(
        state.get("users") == units.digest,
        "the user ids",
        "changed since the checkpoint",
        "the grouping of examples into users the run started with",
        "User ids must not change during a run (its user-level accounting assumes they do "
        "not): resume with the ids file the run started with, or start a new run",
    )


def make_user_sampler(
    loader: Any,
    user_ids: Any,
    *,
    user_sampling: str,
    max_examples_per_user: int | None,
    user_reduction: str = "mean",
    seed: int | None,
) -> UserPoissonSampler | UserCappedSampler:
    """The user-level sampler dpfy builds for ``loader`` and one user id per example.

    ``user_ids``: (N,) integer ids aligned with ``loader.dataset``, read once here (a copy is
    kept: the ids cannot change during the run). ULS reads ``loader.batch_size`` as the
    expected number of users per step, ELS as the expected number of examples per step.
    """
    check_loader(loader, True)
    require(
        user_sampling in USER_SAMPLINGS,
        "user_sampling",
        user_sampling,
        f"one of {list(USER_SAMPLINGS)} with user_ids",
        "'uls' samples users and clips each user's rows together; 'els' caps users at k "
        "examples and samples examples (Charles et al. 2024)",
    )
    ids = torch.as_tensor(user_ids).clone()
    n = len(loader.dataset)
    require(
        ids.dim() == 1 and ids.numel() == n,
        "user_ids",
        f"shape {tuple(ids.shape)}",
        f"one id per example of loader.dataset ({n},)",
        "Pass the user id of every example, in the dataset's order",
    )
    if user_sampling == "uls":
        units = UserUnits(ids, clip_per_user=True, reduction=user_reduction)
        b = loader.batch_size
        require(
            b <= units.num_users,
            "loader.batch_size",
            b,
            f"<= the number of users {units.num_users} (with ULS it is the expected "
            f"number of users per step)",
            "Use a smaller batch size",
        )
        return UserPoissonSampler(
            units,
            sample_rate=b / units.num_users,
            max_examples_per_user=max_examples_per_user,
            seed=seed,
        )
    require(
        user_reduction == "mean",
        "user_reduction",
        user_reduction,
        "'mean' (the default) with ELS, which clips each example alone",
        "Drop user_reduction=, or use user_sampling='uls'",
    )
    units = UserUnits(ids, clip_per_user=False)
    return UserCappedSampler(
        units,
        max_examples_per_user=max_examples_per_user,  # type: ignore
        batch_size=loader.batch_size,
        seed=seed,
    )
