"""The Fashion-MNIST split, accuracy and plain DP-SGD loop of the small logistic-regression
experiments (experiments/pur, experiments/label_dp/dpsgd_baseline.py).

The split: ``n_train`` training and ``n_val`` validation images carved from the official
training split by ``holdout_indices`` (a fixed permutation, seed 1234, the split of the other
Fashion-MNIST experiments); the official test set is read once per configuration, after
selection on validation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dpfy.data import load_dataset
from dpfy.data.splits import holdout_indices

SPLIT_SEED = 1234


def load_holdout(n_train: int, n_val: int):
    """(dataset, (x, y) of the official training split, (train, validation) indices into it,
    (x, y) of the official test set)."""
    data = load_dataset("fashion_mnist")
    x_all, y_all = data.train.tensors
    tr, va = holdout_indices(len(y_all), n_train, n_val, seed=SPLIT_SEED)
    return data, (x_all, y_all), (tr, va), data.test.tensors


def acc(model, x, y) -> float:
    """Top-1 accuracy of ``model`` on (x, y), one forward."""
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def sgd_epochs(model, opt, loader, epochs: int) -> None:
    """``epochs`` passes of cross-entropy DP-SGD steps over the private ``loader``."""
    for _ in range(epochs):
        for x, y in loader:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
