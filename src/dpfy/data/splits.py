"""A dataset as dpfy trains on it: a private training split, a test split and public facts."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import Dataset

from dpfy._require import require

__all__ = ["DataSplits", "holdout_indices"]


@dataclass(frozen=True)
class DataSplits:
    """Train and test splits plus the public facts a model and a privacy report need.

    Args:
      name: registry name, e.g. ``"fashion_mnist"``.
      train: the private training set; every example is one unit of privacy.
      test: held-out examples used only for evaluation (not protected by the guarantee).
      input_shape: shape of one example, e.g. ``(1, 28, 28)`` or ``(30,)``.
      num_classes: number of labels.
      description: one line for the privacy report (source, preprocessing).
      reference_delta: δ that published results on this dataset use, or ``None`` when there is
        none; when the user gives no δ, the trainer uses it (for comparability), otherwise the
        guide's convention δ = 1/N^1.1.
    """

    name: str
    train: Dataset
    test: Dataset
    input_shape: tuple[int, ...]
    num_classes: int
    description: str
    reference_delta: float | None = None

    @property
    def num_train(self) -> int:
        return len(self.train)  # type: ignore[arg-type]

    @property
    def num_test(self) -> int:
        return len(self.test)  # type: ignore[arg-type]


def holdout_indices(
    num_examples: int, num_train: int, num_val: int, *, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Training and validation indices carved from one training split: the first ``num_train``
    and the next ``num_val`` entries of a random permutation of ``range(num_examples)``.

    The experiments select hyperparameters on the validation part and read the test split once.
    ``seed`` fixes the permutation so that every experiment uses the same split; it is not a
    privacy seed (which examples are in the split is public, the examples are not).
    """
    require(
        num_train > 0 and num_val >= 0 and num_train + num_val <= num_examples,
        "num_train + num_val",
        num_train + num_val,
        f"<= num_examples = {num_examples} (num_train > 0, num_val >= 0)",
        "Carve fewer examples",
    )
    perm = torch.randperm(num_examples, generator=torch.Generator().manual_seed(seed))
    return perm[:num_train], perm[num_train : num_train + num_val]
