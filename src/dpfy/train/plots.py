"""Plots of a run: train and test accuracy over epochs (ε over steps comes with the report)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from dpfy._require import require_extra

__all__ = ["plot_accuracy"]


def plot_accuracy(rows: Sequence[dict[str, Any]], path: Path, *, title: str = "") -> None:
    """Line plot of test accuracy and (non-private) train accuracy per epoch, with ε on top."""
    matplotlib = require_extra("matplotlib", feature="the accuracy plot (accuracy.png)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    epochs = [r["epoch"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(epochs, [100 * r["test_acc"] for r in rows], marker="o", ms=3, label="test")
    ax.plot(
        epochs,
        [100 * r["train_acc_nonprivate"] for r in rows],
        marker="o",
        ms=3,
        label="train (non-private diagnostic)",
    )
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    if rows:
        head = f"{title}: " if title else ""
        ax.set_title(
            f"{head}final test accuracy {100 * rows[-1]['test_acc']:.2f}% at "
            f"ε = {rows[-1]['epsilon']:.2f}"
        )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
