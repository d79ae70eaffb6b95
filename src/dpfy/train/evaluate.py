"""Test-set evaluation: mean cross-entropy and accuracy, without gradients.

The one evaluator of dpfy: ``dpfy train`` and the reproductions (``dpfy experiment``, which
shows the accuracy in %) both call :func:`evaluate`.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from dpfy.train.device import model_device

__all__ = ["evaluate", "EVAL_BATCH"]

EVAL_BATCH = 4096


@torch.no_grad()
def evaluate(model: nn.Module, data: Dataset) -> tuple[float, float]:
    """(mean loss, accuracy in [0, 1]) of ``model`` on ``data``; restores train/eval mode."""
    was_training = model.training
    model.eval()
    total_loss, correct, n = 0.0, 0, 0
    device = model_device(model)
    for x, y in _batches(data):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        logits = model(x)  # (B, classes)
        total_loss += nn.functional.cross_entropy(logits, y, reduction="sum").item()
        correct += int((logits.argmax(1) == y).sum())
        n += len(y)
    model.train(was_training)
    return total_loss / max(n, 1), correct / max(n, 1)


def _batches(data: Dataset):
    """Consecutive batches of EVAL_BATCH examples: slices of a ``TensorDataset``'s tensors
    (where they are, a GPU included: one view per batch), else a ``DataLoader``'s."""
    if type(data) is TensorDataset and len(data.tensors) == 2:
        x, y = data.tensors[:2]
        for start in range(0, len(x), EVAL_BATCH):
            yield x[start : start + EVAL_BATCH], y[start : start + EVAL_BATCH]
        return
    yield from DataLoader(data, batch_size=EVAL_BATCH)
