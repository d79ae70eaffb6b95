"""Small real datasets bundled with scikit-learn: handwritten digits and breast cancer.

Both ship inside scikit-learn's wheel, so they load offline. Each is split 80/20 into train and
test with a fixed permutation (the split is public and not a privacy parameter). Features are
scaled with public bounds only, never with statistics of the private training split.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import TensorDataset

from dpfy._require import require_extra
from dpfy.data.splits import DataSplits

__all__ = ["load_digits", "load_breast_cancer", "BREAST_CANCER_RANGES", "sklearn_datasets"]

TEST_FRACTION = 0.2
SPLIT_SEED = 0  # fixes which examples are held out; public, unrelated to the DP noise

# Per-feature (min, max) from the "Summary Statistics" table that is published with the
# Wisconsin diagnostic breast cancer data (UCI; reproduced in sklearn's DESCR). Public bounds,
# so min-max scaling with them spends no privacy budget.
BREAST_CANCER_RANGES: tuple[tuple[float, float], ...] = (
    (6.981, 28.11),
    (9.71, 39.28),
    (43.79, 188.5),
    (143.5, 2501.0),
    (0.053, 0.163),
    (0.019, 0.345),
    (0.0, 0.427),
    (0.0, 0.201),
    (0.106, 0.304),
    (0.05, 0.097),
    (0.112, 2.873),
    (0.36, 4.885),
    (0.757, 21.98),
    (6.802, 542.2),
    (0.002, 0.031),
    (0.002, 0.135),
    (0.0, 0.396),
    (0.0, 0.053),
    (0.008, 0.079),
    (0.001, 0.03),
    (7.93, 36.04),
    (12.02, 49.54),
    (50.41, 251.2),
    (185.2, 4254.0),
    (0.071, 0.223),
    (0.027, 1.058),
    (0.0, 1.252),
    (0.0, 0.291),
    (0.156, 0.664),
    (0.055, 0.208),
)


def sklearn_datasets():
    """``sklearn.datasets`` (an optional extra: a clear refusal naming it when it is not
    installed), where the digits and breast cancer sets come from, here and in
    :mod:`dpfy.data.public_digits`."""
    return require_extra("sklearn.datasets", feature="the digits and breast_cancer datasets")


def _split(x: np.ndarray, y: np.ndarray) -> tuple[TensorDataset, TensorDataset]:
    order = np.random.default_rng(SPLIT_SEED).permutation(len(x))
    n_test = int(round(TEST_FRACTION * len(x)))
    test, train = order[:n_test], order[n_test:]

    def make(idx: np.ndarray) -> TensorDataset:
        return TensorDataset(
            torch.as_tensor(x[idx], dtype=torch.float32), torch.as_tensor(y[idx], dtype=torch.int64)
        )

    return make(train), make(test)


def load_digits() -> DataSplits:
    """1,797 8×8 handwritten digits (UCI optdigits); pixel counts 0..16 scaled to [0, 1]."""
    bunch = sklearn_datasets().load_digits()
    x = (bunch.images / 16.0)[:, None, :, :]  # (N, 1, 8, 8)
    train, test = _split(x, bunch.target)
    return DataSplits(
        "digits",
        train,
        test,
        input_shape=(1, 8, 8),
        num_classes=10,
        description="scikit-learn digits (UCI optdigits, 8x8), pixels/16, fixed 80/20 split",
    )


def load_breast_cancer() -> DataSplits:
    """569 tumours, 30 features, 2 classes; features min-max scaled with published bounds."""
    bunch = sklearn_datasets().load_breast_cancer()
    lo, hi = np.array(BREAST_CANCER_RANGES).T  # (30,), (30,)
    x = np.clip((bunch.data - lo) / (hi - lo), 0.0, 1.0)  # (N, 30)
    train, test = _split(x, bunch.target)
    return DataSplits(
        "breast_cancer",
        train,
        test,
        input_shape=(30,),
        num_classes=2,
        description="scikit-learn breast cancer (Wisconsin diagnostic), min-max "
        "scaled with the published feature ranges, fixed 80/20 split",
    )
