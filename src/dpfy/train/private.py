"""Builds the private optimizer of a run: the one call into ``make_private`` training makes.

Everything privacy-relevant (sampling, clipping, noise, the ledger, the calibration of σ or of
a method to a target ε) happens inside ``dpfy.make_private``. :func:`private_run` wraps a model
and a training set and reads the run's shape (q, steps per epoch, total steps) back from the
sampler it built, so there is one definition of an epoch: the sampler's ``len(loader)``.
``dpfy train`` reaches it through :func:`make_private_run` (config fields to arguments; with
``--method`` the method is built uncalibrated and ``make_private`` calibrates it for the run's
facts: a schedule solves its noise for the target ε there), and the reproductions
(``experiments/`` in a checkout) call it directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from dpfy._require import require
from dpfy.adaptive import make
from dpfy.api import make_private
from dpfy.data import DataSplits
from dpfy.data.augment import crop_flip
from dpfy.data.fashion_mnist import MEAN as FMNIST_MEAN, STD as FMNIST_STD
from dpfy.train.batchnorm import batchnorm_options
from dpfy.train.config import TrainConfig
from dpfy.train.units import load_user_ids

__all__ = [
    "PrivateRun",
    "private_run",
    "make_private_run",
    "run_options",
    "make_optimizer",
    "per_example_cross_entropy",
]


def per_example_cross_entropy(model: nn.Module, batch) -> torch.Tensor:
    """Per-example training losses (B,) of ``dpfy train``'s classifiers, for methods whose
    release specs probe losses (HyFreeDP, NoisyMax) and the per-example norm tracker; the same
    loss the training loop minimizes. They pass the batch as the loader yields it (on the host
    unless the training set is held on the device), so it is moved to the model's device first,
    as the training loop moves it."""
    x, y = batch
    device = next((p.device for p in model.parameters()), x.device)
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    return torch.nn.functional.cross_entropy(model(x), y, reduction="none")


@dataclass
class PrivateRun:
    """The private model, optimizer and Poisson loader, plus the run's public shape."""

    model: nn.Module
    optimizer: Any  # the private optimizer (dpfy.optim.DPOptimizer)
    loader: Any  # yields Poisson-sampled logical batches
    sample_rate: float  # q
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
    """The non-private optimizer ``make_private`` wraps."""
    assert cfg.lr is not None and cfg.momentum is not None, "TrainConfig resolves them"
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(
            params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
        )
    return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def build_methods(cfg: TrainConfig) -> list | None:
    """The methods ``cfg.method`` names, in chain order, with their options (uncalibrated:
    ``make_private`` calibrates them for the run's facts)."""
    if not cfg.method:
        return None
    names = [n.strip() for n in cfg.method.split(",") if n.strip()]
    options = dict(cfg.method_options or {})
    per: dict[str, dict] = {n: {} for n in names}
    for key, value in options.items():
        target, dot, opt = key.partition(".")
        if dot:
            require(
                target in per,
                "method_options",
                key,
                f"addressed to one of {names}",
                "Write NAME.KEY=VALUE with NAME among the --method names",
            )
            per[target][opt] = value
        else:
            require(
                len(names) == 1,
                "method_options",
                key,
                "NAME.KEY=VALUE when several methods are chained",
                f"Say which of {names} the option is for",
            )
            per[names[0]][key] = value
    return [make(n, **per[n]) for n in names]


def private_run(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    train: Dataset,
    *,
    batch_size: int,
    epochs: int,
    **options: Any,
) -> PrivateRun:
    """Wrap ``model`` and ``optimizer`` for DP training on ``train`` for ``epochs`` passes.

    Batches are Poisson-sampled at q = batch_size / N. The run is planned, calibrated and
    guarded for exactly the logical batches the private loader yields in ``epochs`` passes
    (``make_private(epochs=...)``); its steps per epoch are the sampler's (``len(loader)``).

    Args:
      model, optimizer: the non-private model and the torch optimizer over its parameters.
      train: the private training set (one example = one unit of privacy).
      batch_size: the expected logical batch size b.
      epochs: passes over ``train``.
      **options: the rest of ``dpfy.make_private``'s arguments (noise_multiplier or
        target_epsilon, target_delta, max_grad_norm, method, seed, accountant, ...).
    """
    n = len(train)  # type: ignore[arg-type]
    require(
        batch_size <= n,
        "batch_size",
        batch_size,
        f"<= the number of training examples ({n})",
        "Lower --batch-size",
    )
    model, optimizer, loader = make_private(
        model,
        optimizer,
        DataLoader(train, batch_size=batch_size),
        epochs=epochs,
        poisson_sampling=True,
        **options,
    )
    steps_per_epoch = len(loader)  # the sampler's: ⌈N/b⌉ logical batches
    require(
        optimizer.max_steps == epochs * steps_per_epoch,
        "max_steps",
        optimizer.max_steps,
        f"{epochs} epochs × {steps_per_epoch} steps per epoch (what the run was planned for)",
        "This is a bug in dpfy: the plan and the sampler disagree; please report it",
    )
    assert optimizer.max_steps is not None, "planned for epochs (required above)"
    return PrivateRun(
        model=model,
        optimizer=optimizer,
        loader=loader,
        sample_rate=loader.sampler.sample_rate,
        steps_per_epoch=steps_per_epoch,
        total_steps=optimizer.max_steps,
    )


def run_options(cfg: TrainConfig) -> dict[str, Any]:
    """``make_private``'s arguments that every run built from ``cfg`` shares (``dpfy train``
    and ``dpfy audit``): the batch, the horizon, the noise, the clipping and the accountant."""
    assert cfg.batch_size is not None, "resolve() set the batch size"
    return {
        "batch_size": cfg.batch_size,
        "epochs": cfg.epochs,
        "noise_multiplier": cfg.noise_multiplier,
        "target_epsilon": cfg.epsilon,
        "target_delta": cfg.delta,
        "max_grad_norm": cfg.clip,
        "clipping": cfg.clipping,
        "route": cfg.route,
        "seed": cfg.seed,
        "max_physical_batch_size": cfg.physical_batch_size,
        "accountant": cfg.accountant,
    }


def user_options(cfg: TrainConfig) -> dict[str, Any]:
    """``make_private``'s user-level arguments from ``cfg`` (none without --user-ids)."""
    if cfg.user_ids is None:
        return {}
    return {
        "user_ids": load_user_ids(cfg.user_ids),
        "user_sampling": cfg.user_sampling,
        "max_examples_per_user": cfg.max_examples_per_user,
        "user_reduction": cfg.user_reduction,
    }


# A black pixel in each image dataset's normalization (public constants): the crops' fill.
BACKGROUND = {"fashion_mnist": -FMNIST_MEAN / FMNIST_STD}


def augment_options(cfg: TrainConfig, input_shape: tuple[int, ...]) -> dict[str, Any]:
    """``make_private``'s augmentation multiplicity arguments from ``cfg`` (none at K = 1);
    its crops need images (C, H, W)."""
    if cfg.augmult == 1:
        return {}
    require(
        len(input_shape) == 3,
        "augmult",
        cfg.augmult,
        f"1 for {cfg.dataset}, whose examples are not images (shape {input_shape})",
        "--augmult crops images; drop it for tabular data",
    )
    return {
        "augmult": cfg.augmult,
        "augment": crop_flip(
            padding=cfg.augment_padding,
            flip=(cfg.augment or "crop") == "crop_flip",
            fill=BACKGROUND.get(cfg.dataset, 0.0),
        ),
    }


def make_private_run(cfg: TrainConfig, model: nn.Module, data: DataSplits) -> PrivateRun:
    """Wrap ``model`` for DP training on ``data.train`` as ``cfg`` says."""
    optimizer = make_optimizer(cfg, [p for p in model.parameters() if p.requires_grad])
    method = build_methods(cfg)
    private = private_run(
        model,
        optimizer,
        data.train,
        **run_options(cfg),
        method=method,
        noise=cfg.noise,
        bands=cfg.bands,
        # the per-example loss for a method whose specs probe losses (unused otherwise)
        loss_fn=per_example_cross_entropy,
        microbatch_size=cfg.microbatch_size,
        individual_accounting=cfg.individual_accounting,
        **user_options(cfg),
        **augment_options(cfg, data.input_shape),
        **batchnorm_options(cfg, data),
    )
    reads = private.optimizer.method is not None and private.optimizer.method.implements("observe")
    require(
        not reads or cfg.public_validation == "test",
        "public_validation",
        cfg.public_validation,
        f"'test' for method {cfg.method!r}",
        "It reads a validation metric each epoch; pass --public-validation test only if "
        "the test split is public data (it then drives the noise)",
    )
    return private
