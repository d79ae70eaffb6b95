"""Fashion-MNIST (Xiao et al. 2017) from the local IDX files; never downloads.

Default location is Debian's ``dataset-fashion-mnist`` package
(``/usr/share/datasets/fashion-mnist``). Pixels are scaled to [0, 1] and standardized with the
dataset's published mean and standard deviation (public constants, so preprocessing spends no
privacy budget).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from dpfy.data.idx import read_idx
from dpfy.data.splits import DataSplits

__all__ = ["DEFAULT_DIR", "FILES", "MEAN", "STD", "load_fashion_mnist"]

DEFAULT_DIR = Path("/usr/share/datasets/fashion-mnist")
FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
# Public normalization constants of Fashion-MNIST's training pixels in [0, 1], as commonly
# published (e.g. in torchvision tutorials); constants, not statistics of the user's data.
MEAN, STD = 0.2860, 0.3530
INSTALL = (
    "Install Debian's package with `sudo apt-get install dataset-fashion-mnist` (or run "
    "`bash scripts/setup.sh`), or pass --data-dir DIR holding the four IDX files"
)


def _find(data_dir: Path, stem: str) -> Path:
    for candidate in (data_dir / f"{stem}.gz", data_dir / stem):
        if candidate.is_file():
            return candidate
    raise ValueError(
        f"data_dir must contain {stem}.gz (or {stem}), got data_dir = "
        f"'{data_dir}' without it. {INSTALL}"
    )


def _split(data_dir: Path, images: str, labels: str) -> TensorDataset:
    fix = (
        "The file is damaged: reinstall with `sudo apt-get install --reinstall "
        "dataset-fashion-mnist`, or pass --data-dir DIR with intact files"
    )
    x = read_idx(_find(data_dir, FILES[images]), fix=fix)
    y = read_idx(_find(data_dir, FILES[labels]), fix=fix)
    if x.ndim != 3 or y.ndim != 1 or len(x) != len(y) or x.dtype != np.uint8:
        raise ValueError(
            f"{images} and {labels} must be uint8 images (N, H, W) and N labels, got "
            f"shapes {x.shape} and {y.shape}. {fix}"
        )
    if y.size and (y.min() < 0 or y.max() > 9):
        raise ValueError(
            f"{labels} must hold labels in 0..9, got range {y.min()}..{y.max()}. {fix}"
        )
    pixels = torch.from_numpy(x.astype(np.float32) / 255.0)  # (N, H, W) in [0, 1]
    inputs = ((pixels - MEAN) / STD).unsqueeze(1)  # (N, 1, H, W)
    return TensorDataset(inputs, torch.from_numpy(y.astype(np.int64)))


def load_fashion_mnist(data_dir: str | Path | None = None) -> DataSplits:
    """The 60,000 training and 10,000 test images from ``data_dir`` (IDX, gzipped or not)."""
    root = Path(data_dir) if data_dir is not None else DEFAULT_DIR
    if not root.is_dir():
        raise ValueError(
            f"data_dir must be a directory with the Fashion-MNIST IDX files, got "
            f"data_dir = '{root}', which does not exist. {INSTALL}"
        )
    train = _split(root, "train_images", "train_labels")
    test = _split(root, "test_images", "test_labels")
    return DataSplits(
        name="fashion_mnist",
        train=train,
        test=test,
        input_shape=tuple(train.tensors[0].shape[1:]),
        num_classes=10,
        description=(
            f"Fashion-MNIST (Xiao et al. 2017), IDX files from {root}; pixels/255 "
            f"standardized with public constants mean={MEAN}, std={STD}"
        ),
        # Tramèr & Boneh (ICLR 2021) and most DP-SGD papers on (Fashion-)MNIST report δ = 1e-5.
        reference_delta=1e-5,
    )
