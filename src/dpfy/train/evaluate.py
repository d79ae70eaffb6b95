"""Test-set evaluation: mean cross-entropy and accuracy, without gradients.

The one evaluator of dpfy: ``dpfy train`` and the reproductions (``dpfy experiment``, which
shows the accuracy in %) both call :func:`evaluate`.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

__all__ = ["evaluate", "EVAL_BATCH"]

EVAL_BATCH = 4096


@torch.no_grad()
def evaluate(model: nn.Module, data: Dataset) -> tuple[float, float]:
    """(mean loss, accuracy in [0, 1]) of ``model`` on ``data``; restores train/eval mode."""
    was_training = model.training
    model.eval()
    total_loss, correct, n = 0.0, 0, 0
    for x, y in DataLoader(data, batch_size=EVAL_BATCH):
        logits = model(x)  # (B, classes)
        total_loss += nn.functional.cross_entropy(logits, y, reduction="sum").item()
        correct += int((logits.argmax(1) == y).sum())
        n += len(y)
    model.train(was_training)
    return total_loss / max(n, 1), correct / max(n, 1)
