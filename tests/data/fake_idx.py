"""A tiny synthetic Fashion-MNIST directory in the real IDX layout, for loader and CLI tests."""

import gzip
from pathlib import Path

import numpy as np

from dpfy.data.fashion_mnist import FILES
from dpfy.data.idx import encode_idx


def write_fake(root: Path, n_train: int = 6, n_test: int = 4, gz: bool = True) -> None:
    """A tiny Fashion-MNIST directory: image k has every pixel = 10·k, label k mod 10."""
    root.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("test", n_test)):
        imgs = np.stack([np.full((28, 28), 10 * k, np.uint8) for k in range(n)])
        labels = (np.arange(n) % 10).astype(np.uint8)
        for key, arr in ((f"{split}_images", imgs), (f"{split}_labels", labels)):
            data = encode_idx(arr)
            name = FILES[key] + (".gz" if gz else "")
            (root / name).write_bytes(gzip.compress(data) if gz else data)
