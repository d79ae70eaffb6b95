"""Datasets by name. Everything loads from local files; nothing is ever downloaded.

``load_dataset("fashion_mnist" | "digits" | "breast_cancer", data_dir=...)`` returns
:class:`DataSplits`. Any torch ``Dataset`` can be used through the Python API instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from dpfy._require import require
from dpfy.data.fashion_mnist import load_fashion_mnist
from dpfy.data.idx import read_idx
from dpfy.data.scattering_features import load_fashion_mnist_scattering
from dpfy.data.sklearn_sets import load_breast_cancer, load_digits
from dpfy.data.splits import DataSplits

__all__ = ["DATASETS", "DataSplits", "load_dataset", "read_idx"]

DATASETS: dict[str, Callable[..., DataSplits]] = {
    "fashion_mnist": load_fashion_mnist,
    "fashion_mnist_scattering": load_fashion_mnist_scattering,  # Tramèr & Boneh's features
    "digits": lambda data_dir=None: load_digits(),
    "breast_cancer": lambda data_dir=None: load_breast_cancer(),
}
# Datasets that read from a directory (the others are bundled with a Python package).
USES_DATA_DIR = frozenset({"fashion_mnist", "fashion_mnist_scattering"})


def load_dataset(name: str, *, data_dir: str | Path | None = None) -> DataSplits:
    """Load a dataset by registry name; ``data_dir`` only for file-based datasets."""
    require(
        name in DATASETS,
        "dataset",
        name,
        f"one of {sorted(DATASETS)}",
        "Pick a listed name, or pass your own torch Dataset through the Python API",
    )
    require(
        data_dir is None or name in USES_DATA_DIR,
        "data_dir",
        data_dir,
        f"unset for dataset '{name}' (it is bundled with scikit-learn)",
        "Drop --data-dir",
    )
    return DATASETS[name](data_dir=data_dir)
