"""Fashion-MNIST as scattering features: the data of Tramèr & Boneh's ScatterNet models.

The 2-D scattering transform (:class:`dpfy.models.scattering.Scattering2D`, J = 2, L = 8) of
each standardized image, (81, 7, 7) per image. The transform is fixed before any data is seen
(no parameters, nothing learned), so features are a data-independent function of one example
each: training on them is DP-SGD on the same examples, with the same unit of privacy.

Computing them takes minutes on a small CPU, so they are cached: ``<cache>/fashion_mnist_
scattering_J2_L8_<split>.pt`` with ``<cache>`` = ``$DPFY_CACHE_DIR`` or ``~/.cache/dpfy``. The
cache holds a function of the data; it is as sensitive as the images (keep it where they are).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

from dpfy.data.fashion_mnist import load_fashion_mnist
from dpfy.data.splits import DataSplits
from dpfy.models.scattering import Scattering2D

__all__ = ["load_fashion_mnist_scattering", "scattering_features", "cache_dir"]

VERSION = "v1"  # bump when the transform's numbers change: old caches are then ignored


def cache_dir() -> Path:
    """Where computed features are kept: $DPFY_CACHE_DIR, else ~/.cache/dpfy."""
    return Path(os.environ.get("DPFY_CACHE_DIR") or Path.home() / ".cache" / "dpfy")


@torch.no_grad()
def scattering_features(
    images: torch.Tensor, *, J: int = 2, L: int = 8, chunk: int = 512
) -> torch.Tensor:
    """(N, C, H, W) images -> (N, C·K, H/2^J, W/2^J) scattering coefficients, float32."""
    transform = Scattering2D((int(images.shape[-2]), int(images.shape[-1])), J=J, L=L)
    return torch.cat([transform(images[i : i + chunk]) for i in range(0, len(images), chunk)])


def _cached(split: TensorDataset, name: str, J: int, L: int) -> TensorDataset:
    images, labels = split.tensors
    # keyed by the images' content: another --data-dir of the same size gets its own features
    digest = hashlib.sha256(images.contiguous().numpy().tobytes()).hexdigest()[:16]
    path = cache_dir() / f"fashion_mnist_scattering_J{J}_L{L}_{VERSION}_{name}_{digest}.pt"
    if path.is_file():
        feats = torch.load(path, weights_only=True)
        if feats.shape[0] == len(images):
            return TensorDataset(feats, labels)
    print(
        f"dpfy: computing the scattering features of {len(images):,} {name} images once "
        f"(about 5 ms of CPU per image); cached as {path}",
        file=sys.stderr,
        flush=True,
    )
    feats = scattering_features(images, J=J, L=L)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(feats, tmp)
    tmp.replace(path)
    return TensorDataset(feats, labels)


def load_fashion_mnist_scattering(data_dir: str | Path | None = None) -> DataSplits:
    """Fashion-MNIST's 60,000 training and 10,000 test images as (81, 7, 7) features."""
    raw = load_fashion_mnist(data_dir)
    J, L = 2, 8
    train = _cached(raw.train, "train", J, L)  # type: ignore[arg-type]
    test = _cached(raw.test, "test", J, L)  # type: ignore[arg-type]
    return dataclasses.replace(
        raw,
        name="fashion_mnist_scattering",
        train=train,
        test=test,
        input_shape=tuple(train.tensors[0].shape[1:]),
        description=(
            f"{raw.description}; then a fixed 2-D wavelet scattering transform "
            f"(J = {J}, L = {L}; Tramèr & Boneh 2021), no parameters, no data-"
            f"dependent statistics"
        ),
    )
