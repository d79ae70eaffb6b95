"""A federated partition of a labelled dataset: users with power-law sizes and non-IID labels.

No offline dataset on this machine has real user ids, so user-level experiments use the
standard synthetic federated benchmark partition of real images (as in Hsu et al. 2019,
"Measuring the effects of non-identical data distribution", for the Dirichlet labels, and the
power-law user sizes of LEAF, Caldas et al. 2018): the images are real, the users are not.

- **Sizes**: n_u = m + ⌊(N − U·m)·w_u / Σ w⌋ with w_u ~ Pareto(a) (a Lomax draw, shape a):
  a few heavy users, many light ones; every user has at least m examples; the remainder of
  the rounding goes to the largest users, so Σ n_u = N and every example has one user.
- **Labels**: user u's label mix p_u ~ Dirichlet(α·1): small α (0.1) gives users one or two
  classes, large α (100) nearly the global mix. User u's n_u examples are drawn from the
  class pools with probabilities p_u (renormalized over the classes that still have
  examples), without replacement.

Everything follows from the public ``seed`` (numpy's PCG64): the partition is public, so it
costs no privacy; only the examples inside it are private.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from dpfy._require import require

__all__ = ["UserPartition", "partition_users", "federated_fashion_mnist"]


@dataclass(frozen=True)
class UserPartition:
    """One user id per example, and how it was made (public)."""

    user_ids: torch.Tensor  # (N,) int64, values 0..num_users−1
    num_users: int
    alpha: float
    size_shape: float
    min_size: int
    seed: int

    @property
    def sizes(self) -> torch.Tensor:
        """(U,) examples per user."""
        return torch.bincount(self.user_ids, minlength=self.num_users)

    def users(self) -> list[torch.Tensor]:
        """Each user's example indices (sorted), user 0 first."""
        order = torch.argsort(self.user_ids, stable=True)
        return list(torch.split(order, self.sizes.tolist()))

    def describe(self) -> str:
        s = self.sizes.double()
        return (
            f"{self.num_users} users, sizes from a power law (Pareto shape "
            f"{self.size_shape:g}, at least {self.min_size}): min {int(s.min())}, median "
            f"{int(s.median())}, max {int(s.max())}; labels non-IID, Dirichlet(α = "
            f"{self.alpha:g}); public seed {self.seed}"
        )

    def sha256(self) -> str:
        """A fingerprint of the ids (to check a saved partition is the one described)."""
        return hashlib.sha256(self.user_ids.numpy().astype("<i4").tobytes()).hexdigest()

    def save(self, path: str | Path) -> Path:
        """One id per line, example 0 first (what ``--user-ids FILE`` reads)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savetxt(path, self.user_ids.numpy(), fmt="%d")
        return path


def _sizes(
    rng: np.random.Generator, n: int, num_users: int, shape: float, min_size: int
) -> np.ndarray:
    weights = rng.pareto(shape, num_users) + 1e-12
    spare = n - num_users * min_size
    sizes = min_size + np.floor(spare * weights / weights.sum()).astype(np.int64)
    rest = n - int(sizes.sum())
    sizes[np.argsort(-weights, kind="stable")[:rest]] += 1  # rounding remainder: heaviest
    return sizes


def partition_users(
    labels: torch.Tensor,
    *,
    num_users: int = 1000,
    alpha: float = 0.5,
    size_shape: float = 1.5,
    min_size: int = 5,
    seed: int = 0,
) -> UserPartition:
    """Assign every example to one of ``num_users`` users (module docstring).

    Args:
      labels: (N,) integer class labels.
      num_users: U.
      alpha: α of the per-user Dirichlet label mix (> 0; smaller is more non-IID).
      size_shape: a, the Pareto shape of the user sizes (> 0; smaller is heavier-tailed).
      min_size: m, the fewest examples a user holds.
      seed: the public seed of the partition.
    """
    labels = torch.as_tensor(labels).long()
    n = len(labels)
    require(
        num_users >= 1 and num_users * min_size <= n,
        "num_users",
        num_users,
        f">= 1 with num_users × min_size <= {n} examples",
    )
    require(alpha > 0, "alpha", alpha, "> 0")
    require(size_shape > 0, "size_shape", size_shape, "> 0")
    require(min_size >= 1, "min_size", min_size, ">= 1")
    rng = np.random.Generator(np.random.PCG64(seed))
    sizes = _sizes(rng, n, num_users, size_shape, min_size)
    y = labels.numpy()
    classes = np.unique(y)
    pools = [list(rng.permutation(np.flatnonzero(y == c))) for c in classes]
    mixes = rng.dirichlet(np.full(len(classes), alpha), num_users)
    ids = np.empty(n, dtype=np.int64)
    for u in rng.permutation(num_users):  # a random order, so no user is always last
        need, p = int(sizes[u]), mixes[u].copy()
        while need > 0:
            left = np.array([len(pool) for pool in pools], dtype=np.float64)
            p = np.where(left > 0, p, 0.0)
            p = p / p.sum() if p.sum() > 0 else left / left.sum()
            counts = rng.multinomial(need, p)
            for c, k in enumerate(np.minimum(counts, left.astype(np.int64))):
                for _ in range(int(k)):
                    ids[pools[c].pop()] = u
                need -= int(k)
    return UserPartition(
        torch.from_numpy(ids), num_users, float(alpha), float(size_shape), int(min_size), int(seed)
    )


def federated_fashion_mnist(
    *,
    num_users: int = 1000,
    alpha: float = 0.5,
    size_shape: float = 1.5,
    min_size: int = 5,
    seed: int = 0,
    data_dir: str | Path | None = None,
):
    """Fashion-MNIST's 60,000 real training images split among synthetic users.

    Returns (splits, partition): :class:`~dpfy.data.DataSplits` (train and test as usual) and
    the :class:`UserPartition` of the training set (the test set has no users: it is the
    held-out evaluation set).
    """
    from dpfy.data.fashion_mnist import load_fashion_mnist

    splits = load_fashion_mnist(data_dir)
    assert isinstance(splits.train, TensorDataset)  # load_fashion_mnist's train split is one
    partition = partition_users(
        splits.train.tensors[1],
        num_users=num_users,
        alpha=alpha,
        size_shape=size_shape,
        min_size=min_size,
        seed=seed,
    )
    return splits, partition
