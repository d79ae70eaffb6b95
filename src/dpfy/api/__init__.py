"""``make_private``: turn a model, optimizer and loader into private ones; the budget guard.

The user's loop stays plain PyTorch::

    model, optimizer, loader = dpfy.make_private(model, optimizer, loader,
                                                 noise_multiplier=1.0, max_grad_norm=1.0)
    for x, y in loader:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    optimizer.epsilon(delta=1e-5)

``make_private`` is a keyword façade: its keywords become one run spec and its performance
options (:func:`dpfy.spec.from_keywords`), the one checker refuses what cannot be accounted
together (:func:`dpfy.spec.check`), and the builder (:mod:`dpfy.api.build`) wires a sampler
(whose facts the loader *and* the ledger read), the per-sample gradient engine, a clipping
policy, a noise mechanism, the ledger and the optimizer wrapper that executes one plan per
logical batch. Normalizer: the noisy sum is divided by b = qN, the expected batch size, under
Poisson sampling (b = batch size for a kept shuffled loader).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from dpfy.adaptive.base import Method
from dpfy.api.admit import admit, alias, derive_seeds, warn_seed
from dpfy.api.build import build
from dpfy.optim import DPOptimizer
from dpfy.sampling import DPDataLoader
from dpfy.spec import check, from_keywords
from dpfy.step.arguments import check_materialized
from dpfy.step.distributed import current_collective

__all__ = ["make_private", "derive_seeds"]


def make_private(
    model: nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    loader: DataLoader | None = None,
    *,
    noise_multiplier: float | None = None,
    target_epsilon: float | None = None,
    target_delta: float | None = None,
    epochs: float | None = None,
    max_grad_norm: float | Sequence[float] = 1.0,
    clipping: str = "flat",
    route: str = "auto",
    seed: int | None = None,
    method: "Method | str | Sequence[Method | str] | None" = None,
    poisson_sampling: bool = True,
    max_physical_batch_size: int | str | None = None,
    memory_limit: int | None = None,
    accountant: str = "pld",
    max_steps: int | None = None,
    epsilon_cap: float | None = None,
    loss_reduction: str = "mean",
    sample_rates: Sequence[float] | torch.Tensor | None = None,
    loss_fn: "Callable[[nn.Module, Any], torch.Tensor] | None" = None,
    budgets: "Sequence[float] | np.ndarray | torch.Tensor | None" = None,
    individual: str | None = None,
    user_ids: "Sequence[int] | torch.Tensor | None" = None,
    user_sampling: str | None = None,
    max_examples_per_user: int | None = None,
    user_reduction: str = "mean",
    noise: str = "gaussian",
    bands: int | None = None,
    declare_row_wise: bool = False,
    module: nn.Module | None = None,
    data_loader: DataLoader | None = None,
    microbatch_size: int | None = None,
    augmult: int = 1,
    augment: "Callable[[Any, torch.Generator], Any] | str | None" = None,
    individual_accounting: int | None = None,
    batchnorm: str | None = None,
    public_data: "torch.Tensor | Dataset | None" = None,
    public_description: str | None = None,
    bn_bound: float | None = None,
    bn_share: float | None = None,
    bn_noise_multiplier: float | None = None,
) -> tuple[nn.Module, DPOptimizer, DPDataLoader]:
    """Make ``model``/``optimizer``/``loader`` differentially private (DP-SGD and variants).

    Each logical batch releases its clipped sum plus N(0, (σ·Δ)²) once, records it in the
    ledger with the sampler's facts, and steps the optimizer on that sum divided by b = qN.
    What every keyword does, in full: docs/make_private.md. In short:

    Args:
      model, optimizer, loader: an ``nn.Module`` (batch dim first; BatchNorm only with
        ``batchnorm=``), a torch optimizer over its trainable parameters, and a DataLoader
        with a ``batch_size`` (q = batch_size / N). Data-parallel inside a process group.
      module, data_loader: Opacus's names for ``model`` and ``loader``.
      noise_multiplier: σ (``0`` only for debugging: nothing is private then).
      target_epsilon, target_delta, epochs, max_steps, epsilon_cap, accountant: instead of σ,
        the budget: σ is calibrated (PLD or RDP) so the run's steps spend it, and the guard
        refuses a step past ``max_steps`` or one taking ε above ``epsilon_cap``.
      max_grad_norm, clipping, microbatch_size: C and the clipping policy (flat, per-layer,
        automatic, individual, microbatch).
      route, max_physical_batch_size, memory_limit: performance options; the guarantee is the
        same for every choice.
      seed: None (default): a CSPRNG keyed by the operating system. An int makes the run
        reproducible: **anyone who knows the seed can undo the privacy** (warned).
      method: an adaptive method (``dpfy.adaptive``), its registry name, or a list of them.
      poisson_sampling, sample_rates: False for shuffled fixed-size batches (no
        amplification); per-example Poisson rates.
      loss_fn, loss_reduction: ``fn(model, batch) -> (B,)`` losses for methods with loss
        probes; ``"mean"`` or ``"sum"``, how your loss reduces over the batch.
      budgets, individual: individualized privacy budgets (docs/individual.md).
      individual_accounting: record clipped norms every K steps for the data holder.
      user_ids, user_sampling, max_examples_per_user, user_reduction: user-level DP
        (docs/guide/user_level.md).
      noise, bands: ``"gaussian"``, ``"tree"`` (DP-FTRL) or ``"bandmf"`` with b bands.
      declare_row_wise: declare rows independent where the first step's probe cannot run.
      augmult, augment: augmentation multiplicity (K augmented rows per example, one unit).
      batchnorm, public_data, public_description, bn_bound, bn_share, bn_noise_multiplier:
        BatchNorm with public or privatized statistics (docs/guide/batchnorm.md).

    Returns:
      model (nn.Module): the same model, hooked (autograd's own gradient off while private).
      optimizer (DPOptimizer): wraps ``optimizer``; its ``epsilon()``, ``ledger`` and ``spec``
        say what the run spends.
      loader (DPDataLoader): samples ``loader``'s dataset (Poisson by default).
    """
    model = alias("model", model, "module", module)
    loader = alias("loader", loader, "data_loader", data_loader)
    if isinstance(loader, DPDataLoader):  # re-privatizing: a fresh sampler over its data
        loader = loader.original
    user_model, model = admit(model, optimizer, loader)
    assert optimizer is not None  # admit refused anything but an Optimizer
    check_materialized(model)
    collective = current_collective()  # data-parallel ranks (dpfy.step.distributed), or None
    spec, performance = from_keywords(
        world_size=collective.world_size if collective is not None else 1,
        noise_multiplier=noise_multiplier,
        target_epsilon=target_epsilon,
        target_delta=target_delta,
        epochs=epochs,
        max_grad_norm=max_grad_norm,
        clipping=clipping,
        route=route,
        method=method,
        poisson_sampling=poisson_sampling,
        max_physical_batch_size=max_physical_batch_size,
        memory_limit=memory_limit,
        accountant=accountant,
        max_steps=max_steps,
        epsilon_cap=epsilon_cap,
        sample_rates=sample_rates,
        budgets=budgets,
        individual=individual,
        user_ids=user_ids,
        user_sampling=user_sampling,
        max_examples_per_user=max_examples_per_user,
        user_reduction=user_reduction,
        noise=noise,
        bands=bands,
        microbatch_size=microbatch_size,
        augmult=augmult,
        augment=augment,
        batchnorm=batchnorm,
        public_data=public_data,
        public_description=public_description,
        bn_bound=bn_bound,
        bn_share=bn_share,
        bn_noise_multiplier=bn_noise_multiplier,
    )
    check(spec, performance)  # what cannot be accounted together, before anything is built
    if seed is not None:
        warn_seed(seed)
    dp_optimizer, dp_loader = build(
        spec,
        performance,
        model=model,
        optimizer=optimizer,
        loader=loader,
        collective=collective,
        seed=seed,
        user_ids=user_ids,
        augment=augment,
        public_data=public_data,
        loss_fn=loss_fn,
        loss_reduction=loss_reduction,
        declare_row_wise=declare_row_wise,
        individual_accounting=individual_accounting,
    )
    return user_model, dp_optimizer, dp_loader
