"""Per-example privacy budgets for individualized DP-SGD: checked, grouped, drawn or loaded.

The groups of :mod:`dpfy.privacy.individual` are the distinct budgets ε_p with their shares r_p
of the training set: :func:`check_groups` refuses what cannot be calibrated,
:func:`assign_groups` groups one ε per training example, :func:`random_budgets` draws such an
assignment for experiments and :func:`load_budgets` reads one from a file
(``dpfy train --budgets-file``). Nothing here accounts (no torch, no accountant): the
calibration is :mod:`dpfy.privacy.individual`, which re-exports these names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from dpfy._require import require

__all__ = ["check_groups", "BudgetAssignment", "assign_groups", "random_budgets", "load_budgets"]

_FRACTION_SUM_TOL = 1e-6


def check_groups(budgets: Sequence[float], fractions: Sequence[float]) -> None:
    """Refuse budgets ≤ 0 or not finite, repeated budgets, or fractions that do not sum to 1."""
    require(len(budgets) >= 1, "budgets", budgets, "at least one ε")
    require(
        len(fractions) == len(budgets),
        "len(fractions)",
        len(fractions),
        f"{len(budgets)} (one fraction per budget)",
    )
    for e in budgets:
        require(
            isinstance(e, (int, float)) and 0 < e < math.inf,
            "budget",
            e,
            "> 0 and finite",
            "Give every group a positive ε",
        )
    require(
        len(set(budgets)) == len(budgets),
        "budgets",
        list(budgets),
        "distinct",
        "Groups are the distinct budgets: merge equal ones and add their fractions",
    )
    for r in fractions:
        require(isinstance(r, (int, float)) and 0 < r <= 1, "fraction", r, "in (0, 1]")
    total = math.fsum(fractions)
    require(
        abs(total - 1) <= _FRACTION_SUM_TOL,
        "sum(fractions)",
        total,
        "1",
        "Give each group's share of the training set; the shares must add up to 1",
    )


@dataclass(frozen=True)
class BudgetAssignment:
    """Per-example budgets grouped: the groups are the distinct budgets (ascending).

    Attributes:
      budgets: ε_p of each group, ascending.
      sizes: examples per group.
      group_of: (N,) int64, the group index of every example (public).
    """

    budgets: tuple[float, ...]
    sizes: tuple[int, ...]
    group_of: np.ndarray

    @property
    def fractions(self) -> tuple[float, ...]:
        """r_p = size_p / N, the realized shares (what the calibration uses)."""
        n = sum(self.sizes)
        return tuple(s / n for s in self.sizes)


def assign_groups(
    budgets: Sequence[float] | np.ndarray, dataset_size: int | None = None
) -> BudgetAssignment:
    """Group per-example budgets (one ε per training example, aligned with the dataset)."""
    arr = np.asarray(budgets, dtype=np.float64)
    require(
        arr.ndim == 1 and arr.size >= 1,
        "budgets",
        f"shape {arr.shape}",
        "one ε per training example (a 1-d array)",
    )
    if dataset_size is not None:
        require(
            arr.size == dataset_size,
            "len(budgets)",
            arr.size,
            f"the dataset's size {dataset_size}",
            "Give one budget per training example, in dataset order",
        )
    bad = ~(np.isfinite(arr) & (arr > 0))
    require(
        not bad.any(),
        "budget",
        float(arr[bad][0]) if bad.any() else None,
        "> 0 and finite for every example",
        f"Fix the {int(bad.sum())} bad entries (first at index "
        f"{int(np.argmax(bad)) if bad.any() else -1})",
    )
    values, inverse, counts = np.unique(arr, return_inverse=True, return_counts=True)
    return BudgetAssignment(
        tuple(float(v) for v in values), tuple(int(c) for c in counts), inverse.astype(np.int64)
    )


def random_budgets(
    budgets: Sequence[float], fractions: Sequence[float], dataset_size: int, seed: int
) -> np.ndarray:
    """(N,) budgets: group p gets round(r_p·N) examples (largest remainders), placed at random.

    For experiments: the assignment depends only on ``seed``, which is public and recorded, so
    the assignment is **not private** (nothing about the data decides it).
    """
    check_groups([float(e) for e in budgets], [float(r) for r in fractions])
    exact = np.asarray(fractions, dtype=np.float64) * dataset_size
    counts = np.floor(exact).astype(np.int64)
    for i in np.argsort(-(exact - counts), kind="stable")[: dataset_size - int(counts.sum())]:
        counts[i] += 1
    out = np.repeat(np.asarray(budgets, dtype=np.float64), counts)  # (N,)
    return out[np.random.default_rng(seed).permutation(dataset_size)]


def load_budgets(path: str) -> np.ndarray:
    """(N,) per-example budgets from a ``.npy`` file or a ``.csv`` of numbers (any layout,
    read in row order), for ``dpfy train --budgets-file``."""
    suffix = str(path).lower().rsplit(".", 1)[-1]
    require(
        suffix in ("npy", "csv"),
        "budgets_file",
        path,
        "a .npy or .csv file",
        "Save one ε per training example with numpy.save or as comma-separated text",
    )
    try:
        arr = (
            np.load(path, allow_pickle=False)
            if suffix == "npy"
            else np.loadtxt(path, delimiter=",", dtype=np.float64, ndmin=1)
        )
    except (OSError, ValueError) as err:
        require(False, "budgets_file", path, "a readable file of numbers", str(err))
        raise
    return np.asarray(arr, dtype=np.float64).reshape(-1)
