"""The run's privacy report, rendered by :class:`dpfy.privacy.report.PrivacyReport` from the
private optimizer's ledger: privacy_report.md/.json and epsilon_over_steps.png.

The JSON keeps the report's whole context (model, layer table, sampling note, warnings), so
``dpfy report RUN_DIR`` re-renders the same Markdown. A run with ``--seed`` opens with the seed
warning; checkpoints are listed as secret.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from dpfy.data import DataSplits
from dpfy.privacy import epsilon as ledger_epsilon
from dpfy.privacy.report import PrivacyReport
from dpfy.train.config import SEED_WARNING, TrainConfig

__all__ = ["write_report", "RELEASED", "NOT_RELEASED"]

RELEASED = ("final model weights (model.pt) and test-set metrics. The train loss/accuracy "
            "columns of metrics.csv are non-private diagnostics computed on raw training data "
            "and are not covered by this guarantee: do not publish them")
NOT_RELEASED = ("checkpoint.pt, written in the run's .partial directory while training and "
                "deleted when the run finishes, holds the seed and the generator states, which "
                "reproduce the sampling and the noise; it is secret and not part of the release "
                "(config.json and this report never hold them)")


def _describe(cfg: TrainConfig, notes: Mapping[str, Any], data: DataSplits, private) -> str:
    params = sum(p.numel() for p in private.model.parameters())
    return (f"{cfg.model} ({params:,} parameters) trained with DP-SGD ({cfg.optimizer}, lr "
            f"{cfg.lr:g}, clip {cfg.clip:g}, {cfg.clipping} clipping, expected batch "
            f"{cfg.batch_size}, {cfg.epochs} epochs) on {data.description}; δ: "
            f"{notes.get('delta_rule', 'given')}")


def write_report(cfg: TrainConfig, notes: Mapping[str, Any], data: DataSplits, private,
                 directory: Path) -> float:
    """Write the report files into ``directory``; return the final ε (``cfg.accountant``)."""
    ledger = private.optimizer.ledger
    PrivacyReport.from_ledger(
        ledger, delta=cfg.delta, accountant=cfg.accountant, released=RELEASED,
        dataset_size=data.num_train, model_description=_describe(cfg, notes, data, private),
        layer_table=private.optimizer.grads.explain(),  # per layer: rule and engine route (R7)
        sampling_note=f"Poisson sampling by dpfy's sampler, q = {private.sample_rate:.5g}, "
                      f"{private.steps_per_epoch} steps per epoch",
        warnings=(SEED_WARNING,) if cfg.reproducible else (), not_released=NOT_RELEASED,
    ).write(directory)
    return float(ledger_epsilon(ledger, delta=cfg.delta, accountant=cfg.accountant))
