"""Hugging Face integrations: :class:`DPTrainer`, a ``transformers.Trainer`` with dpfy's
private step (needs the ``dpfy[hf]`` extra: transformers)."""

from dpfy.hf.trainer import DPArguments, DPTrainer

__all__ = ["DPArguments", "DPTrainer"]
