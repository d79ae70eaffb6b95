"""A dataset as dpfy trains on it: a private training split, a test split and public facts."""

from __future__ import annotations

from dataclasses import dataclass

from torch.utils.data import Dataset

__all__ = ["DataSplits"]


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
