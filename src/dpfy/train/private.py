"""Builds the private optimizer of a run from its config: the trainer's one call into the engine.

Everything privacy-relevant (sampling, clipping, noise, the ledger, the calibration of σ to a
target ε) happens inside ``dpfy.make_private``; this module only maps config fields to its
arguments and, with ``--schedule``, builds the adaptive schedule first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from dpfy._require import require
from dpfy.data import DataSplits
from dpfy.train.config import TrainConfig

__all__ = ["PrivateRun", "make_private_run", "make_optimizer"]


@dataclass
class PrivateRun:
    """The private model, optimizer and Poisson loader, plus the run's public shape."""

    model: nn.Module
    optimizer: Any                # the engine's private optimizer
    loader: Any                   # yields Poisson-sampled logical batches
    sample_rate: float            # q
    steps_per_epoch: int
    total_steps: int

    @property
    def noise_multiplier(self) -> float | None:
        """σ of every step, or None when a schedule sets σ_t."""
        sigma = self.optimizer.noise_multiplier
        method = self.optimizer.method
        sets_sigma = method is not None and "noise_multiplier" in method.sets
        return None if sigma is None or sets_sigma else float(sigma)


def make_optimizer(cfg: TrainConfig, params) -> torch.optim.Optimizer:
    """The non-private optimizer the engine wraps."""
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum,
                               weight_decay=cfg.weight_decay)
    return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def _schedule(cfg: TrainConfig, *, sample_rate: float, steps_per_epoch: int):
    """The adaptive schedule named by ``cfg.schedule`` (imported only when asked for)."""
    require(cfg.epsilon is not None, "schedule", cfg.schedule, "used with a target --epsilon",
            "A schedule is calibrated to a budget; drop --noise-multiplier")
    try:
        from dpfy.adaptive import make_schedule
    except ImportError as e:
        raise ValueError(f"schedule must be available, got schedule = '{cfg.schedule}' but "
                         f"dpfy.adaptive.make_schedule cannot be imported ({e}). Drop "
                         f"--schedule or update dpfy") from None
    return make_schedule(cfg.schedule, target_epsilon=cfg.epsilon, delta=cfg.delta,
                         sample_rate=sample_rate, total_steps=cfg.epochs * steps_per_epoch,
                         steps_per_epoch=steps_per_epoch, max_grad_norm=cfg.clip,
                         accountant=cfg.accountant, **(cfg.schedule_options or {}))


def build_methods(cfg: TrainConfig) -> list | None:
    """The methods ``cfg.method`` names, in chain order, with their options (uncalibrated:
    ``make_private`` calibrates them for the run's facts)."""
    if not cfg.method:
        return None
    from dpfy.adaptive import make

    names = [n.strip() for n in cfg.method.split(",") if n.strip()]
    options = dict(cfg.method_options or {})
    per: dict[str, dict] = {n: {} for n in names}
    for key, value in options.items():
        target, dot, opt = key.partition(".")
        if dot:
            require(target in per, "method_options", key, f"addressed to one of {names}",
                    "Write NAME.KEY=VALUE with NAME among the --method names")
            per[target][opt] = value
        else:
            require(len(names) == 1, "method_options", key,
                    "NAME.KEY=VALUE when several methods are chained",
                    f"Say which of {names} the option is for")
            per[names[0]][key] = value
    return [make(n, **per[n]) for n in names]


def make_private_run(cfg: TrainConfig, model: nn.Module, data: DataSplits) -> PrivateRun:
    """Wrap ``model`` for DP training on ``data.train`` as ``cfg`` says."""
    import dpfy

    n = data.num_train
    require(cfg.batch_size <= n, "batch_size", cfg.batch_size,
            f"<= the number of training examples ({n})", "Lower --batch-size")
    sample_rate = cfg.batch_size / n
    # An epoch is one pass of the Poisson loader: ⌈N/b⌉ logical batches (the sampler's rule).
    # The run is planned, calibrated and guarded for exactly epochs × that many steps.
    steps_per_epoch = max(1, math.ceil(n / cfg.batch_size - 1e-9))
    total_steps = cfg.epochs * steps_per_epoch
    optimizer = make_optimizer(cfg, [p for p in model.parameters() if p.requires_grad])
    loader = DataLoader(data.train, batch_size=cfg.batch_size)
    schedule = (_schedule(cfg, sample_rate=sample_rate, steps_per_epoch=steps_per_epoch)
                if cfg.schedule else build_methods(cfg))
    model, optimizer, loader = dpfy.make_private(
        model, optimizer, loader,
        noise_multiplier=cfg.noise_multiplier, target_epsilon=cfg.epsilon,
        target_delta=cfg.delta, max_steps=total_steps, max_grad_norm=cfg.clip,
        clipping=cfg.clipping, engine=cfg.engine, seed=cfg.seed, method=schedule,
        poisson_sampling=True, max_physical_batch_size=cfg.physical_batch_size,
        accountant=cfg.accountant)
    needs = optimizer.method.needs.validation if optimizer.method is not None else None
    require(needs is None or cfg.public_validation == "test", "public_validation",
            cfg.public_validation, f"'test' for method {cfg.method or cfg.schedule!r}",
            "It reads a validation metric each epoch; pass --public-validation test only if "
            "the test split is public data (it then drives the noise)")
    require(len(loader) == steps_per_epoch, "steps per epoch", len(loader),
            f"{steps_per_epoch} (what the run was planned for)",
            "This is a bug in dpfy: the trainer and the sampler disagree; please report it")
    return PrivateRun(model=model, optimizer=optimizer, loader=loader, sample_rate=sample_rate,
                      steps_per_epoch=steps_per_epoch, total_steps=total_steps)
