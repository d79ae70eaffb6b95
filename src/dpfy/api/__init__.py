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
from dpfy.step.arguments import check_materialized, check_numbers
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

    Each logical batch releases Σ_i w_i g_i + N(0, (σ·Δ)²) once (w_i from the clipping policy,
    Δ its sensitivity), records ``Release("gradient", σ)`` in the ledger with the sampler's
    sampling and rate, and steps the optimizer on that sum divided by b = qN (Poisson).

    Args:
      model: any ``nn.Module`` without BatchNorm (see :func:`dpfy.validate`, or
        ``batchnorm=`` below); batch dim first.
        Inside a ``torch.distributed`` process group of W ≥ 2 ranks (wrapped in
        ``DistributedDataParallel`` or not) training is data-parallel: ``loader.batch_size``
        is per rank, each rank clips its part of every global Poisson batch, rank 0 adds the
        noise and one all-reduce releases the global sum (:mod:`dpfy.step.distributed`,
        docs/distributed.md).
      optimizer: any torch.optim optimizer over exactly the model's trainable parameters.
      loader: a DataLoader with a ``batch_size``; q = batch_size / len(dataset).
      noise_multiplier: σ; ``0`` is allowed for debugging (nothing is private then).
      target_epsilon, target_delta, epochs: instead of σ: calibrate σ so that the
        ⌈epochs × len(loader)⌉ logical batches the loader yields over those epochs (or
        ``max_steps``) spend ``target_epsilon`` at ``target_delta``; the budget guard then
        refuses any further step with :class:`dpfy.errors.BudgetExhausted`, and caps ε at
        ``target_epsilon`` (``epsilon_cap``, unless given).
      max_grad_norm: C (flat, automatic); per layer: a float (split C/√K) or K floats;
        ``clipping="individual"``: one C_i per example.
      clipping: ``"flat" | "per_layer" | "automatic" | "individual" | "microbatch"`` (see
        ``dpfy.clipping``). ``"microbatch"`` (with ``microbatch_size=k``) clips each
        microbatch's *mean* gradient to C, at sensitivity 2C (Algorithm 3 of Ponomareva et al.
        2023; ``dpfy.sampling.microbatch``); not the memory-only ``max_physical_batch_size``.
      route: how per-unit norms and sums are computed: ``"auto"`` (layer rules, vmap for
        other modules), ``"ghost"`` (layer rules only) or ``"vmap"`` (materialized).
      seed: None (default): sampling and noise come from a CSPRNG keyed by the operating
        system, so nothing published can reproduce them. An int makes the run reproducible:
        **anyone who knows the seed can undo the privacy**; it lives only in checkpoints, and
        ``make_private`` warns (:class:`dpfy.errors.SeedWarning`). A secure run's checkpoint
        holds no noise key: its resume draws fresh noise.
      method: an adaptive method (``dpfy.adaptive``), a registry name (``dpfy methods``), or a
        list of them (chained in order). ``make_private`` calibrates it for the run's facts
        (q, N, steps, sampling, δ, target ε); a method built for other facts is refused.
      poisson_sampling: False uses dpfy's shuffled fixed-size sampler, accounted as
        ``Sampling.SHUFFLE``.
      max_physical_batch_size: split logical batches into physical ones of at most this size;
        ``"auto"``: the largest size whose memory estimate (:mod:`dpfy.memory`, per layer from
        the routes, measured on a 4-example probe) fits ``memory_limit``. The
        optimizer updates once per logical batch: ``optimizer.updated`` says whether the last
        ``step()`` did (for per-update LR schedulers); ``len(loader)`` counts logical batches.
      memory_limit: bytes for ``"auto"`` (default: half the memory available now,
        :func:`dpfy.memory.default_memory_limit`).
      accountant: for ``target_epsilon``, ``epsilon_cap`` (PLD or RDP only: the GDP CLT may
        under-report ε) and ``optimizer.epsilon`` (any).
      max_steps: budget guard T (default: ``epochs`` × logical batches per epoch, or the
        method's ``total_steps``).
      epsilon_cap: stop (raise) before a step that would take ε(target_delta) above this.
      loss_reduction: ``"mean"`` or ``"sum"``, how your loss reduces over the batch.
      sample_rates: per-example Poisson rates q_i instead of batch_size / N.
      loss_fn: ``fn(model, batch) -> (B,)`` per-example losses, for methods with loss probes
        (``needs.probes``); called under no_grad at perturbed parameters, with the batch as
        the private loader yields it (move it to the model's device, as your training loop does).
      budgets, individual: individualized privacy (docs/individual.md): one ε per training
        example (aligned with the dataset; the groups are the distinct budgets) and
        ``individual="sample"`` (per-group Poisson rates q_p, one σ) or ``"scale"`` (per-group
        thresholds c_p = s_p·max_grad_norm, noise std σ_scale·max_grad_norm). σ and the rates
        or thresholds come from :func:`dpfy.privacy.calibrate_individual` at the loader's q,
        the run's steps (``epochs``/``max_steps``) and ``target_delta``; every group gets its
        own ledger (``optimizer.privacy_groups``, ``optimizer.group_epsilons(δ)``) and ε cap, and
        training stops before any group would exceed its budget. Excludes noise_multiplier,
        target_epsilon, sample_rates, clipping other than flat, methods and shuffling.
      user_ids, user_sampling, max_examples_per_user, user_reduction: user-level DP
        (docs/guide/user_level.md): the unit of privacy is one user, with all of their
        examples, and adjacency is add-or-remove one user. ``user_ids`` holds one integer id per
        example (aligned with the dataset; read once). ``user_sampling="uls"`` samples users
        (Poisson, rate q_u = batch_size / U: ``batch_size`` is then the expected number of
        *users* per step), takes at most ``max_examples_per_user`` random rows of each sampled
        user (None: all), clips each user's ``user_reduction`` (``"mean"`` or ``"sum"`` of
        their gradients) to C, and divides the noisy sum by q_u·U; its ledger is a
        Poisson-subsampled Gaussian at the user level. ``user_sampling="els"`` keeps at most
        k = ``max_examples_per_user`` random examples of every user, Poisson-samples examples
        (rate batch_size / N_kept) and clips each alone; its ledger is accounted at the user
        level as a mixture of Gaussians with Binomial(k, q) weights. ``target_epsilon`` is then
        a user-level ε. Refused with user ids: shuffling, sample_rates, data-parallel ranks,
        individualized budgets, clipping="individual", and under ULS a method whose releases
        are per example (a per-sample transform, loss probes).
      noise: the noise mechanism (docs/guide/correlated_noise.md). ``"gaussian"`` (default):
        independent noise each step (DP-SGD). ``"tree"``: DP-FTRL's tree aggregation
        (Kairouz et al. 2021) over dpfy's shuffled passes (whatever ``poisson_sampling``
        says: its accounting needs one participation per pass), the tree restarting each
        pass; no amplification is claimed, so it suits pipelines that cannot Poisson-sample.
        ``"bandmf"``: banded matrix factorization (Choquette-Choo et al. 2023) with ``bands``
        b and cyclic Poisson sampling (b groups, Poisson inside each; the loader's batch size
        is the expected batch), its strategy optimized for the prefix sums of the run's
        steps; it keeps b − 1 noise vectors of the parameters' size. Both need a fixed σ (no
        method that sets σ or adds releases), one process, no individualized budgets.
      bands: b for ``noise="bandmf"`` (b = 1 is DP-SGD with Poisson sampling); default
        min(8, ⌊N/B⌋), :func:`dpfy.sampling.cyclic.default_bands`.
      declare_row_wise: the user's declaration that each row of every layer's input and output
        gradient depends on its own example only. dpfy checks this at the first step by
        perturbing one example in training mode, through the backward (docs/guide/
        per_example_contract.md); a model that probe cannot run is refused unless declared,
        and then only warned about. A model the probe finds mixing is refused either way.

      augmult, augment: augmentation multiplicity (De et al. 2022, §3.1;
        ``dpfy.sampling.augmult``, docs/guide/accuracy.md): every sampled example reaches the
        model as ``augmult`` = K consecutive rows, ``augment(batch, generator)`` maps the
        collated batch of B·K rows to their augmentations (e.g.
        ``dpfy.data.augment.crop_flip(padding=2)``; ``"dataset"``: the dataset's own random
        ``__getitem__`` makes them), and the K copies' gradients are averaged *before*
        clipping, as one unit: the update is (1/b)(Σ_u clip_C(mean_k g_{u,k}) + noise) with
        your loss the mean over the B·K rows. Sensitivity stays C per example; q, b and the
        ledger are the examples', as with K = 1; ``max_physical_batch_size`` counts rows.
        ``augment`` draws from its own generator (seeded from ``seed``'s own child sequence,
        never the noise stream). Refused with user ids, microbatch or individual clipping,
        individualized budgets, correlated noise, data-parallel ranks, and methods whose
        releases are per row (a per-sample transform, loss probes).

      individual_accounting: K: record every training example's clipped-norm ratio
        ‖clip(g_i)‖/C every K steps (on a deep copy of the model; needs ``loss_fn``, flat
        clipping) for ``dpfy account --individual`` (:mod:`dpfy.individual_tracking`, saved by
        its ``save_norms``). The norms are private data, an analysis for the data holder:
        never used in training, never part of the release.

      batchnorm, public_data, public_description, bn_bound, bn_share, bn_noise_multiplier:
        keep the model's BatchNorm layers (docs/guide/batchnorm.md). ``"public"``: their
        statistics come from ``public_data`` (a tensor of inputs or a Dataset, named
        ``public_description`` in the spec and the report; not protected by the guarantee).
        ``"privatized"``: each layer's batch mean and mean of squares, clipped to the declared
        activation bound ``bn_bound``, are released with Gaussian noise at every step and
        recorded in the ledger beside the gradient, at ``bn_noise_multiplier`` or taking
        ``bn_share`` of each step's precision (0.3 by default); a σ calibrated to a target ε
        is split between the gradient and the statistics so the run spends its target.
        Privatized statistics are refused with ``max_physical_batch_size``, correlated noise,
        individualized budgets, data-parallel ranks, user ids, ``augmult`` and microbatch
        clipping, and ``bn_share`` with a method that sets σ.

      module, data_loader: Opacus's names for ``model`` and ``loader`` (aliases; give one of
        each pair). A :class:`~dpfy.sampling.DPDataLoader` from an earlier ``make_private`` may
        be passed: the new run draws from the DataLoader it was built from.

    Returns:
      model (nn.Module): the same model, hooked. Autograd's own gradient of its trainable
        parameters is off while private, since their gradients come from the engine, and
        ``p.requires_grad`` still reads True (``dpfy.grads.held``).
      optimizer (DPOptimizer): a :class:`dpfy.optim.DPOptimizer` wrapping ``optimizer``; its
        ``epsilon()`` and ``ledger`` say what the run has spent; its ``spec`` is the run spec
        (:class:`dpfy.spec.RunSpec`, docs/spec.md) with σ and the sampler's facts filled in.
      loader (DPDataLoader): a :class:`dpfy.sampling.DPDataLoader` that samples ``loader``'s
        dataset (Poisson by default).
    """
    model = alias("model", model, "module", module)
    loader = alias("loader", loader, "data_loader", data_loader)
    if isinstance(loader, DPDataLoader):  # re-privatizing: a fresh sampler over its data
        loader = loader.original
    user_model, model = admit(model, optimizer, loader)
    assert optimizer is not None  # admit refused anything but an Optimizer
    check_materialized(model)
    check_numbers(
        noise_multiplier=noise_multiplier,
        target_epsilon=target_epsilon,
        target_delta=target_delta,
        epochs=epochs,
        epsilon_cap=epsilon_cap,
        max_grad_norm=max_grad_norm if isinstance(max_grad_norm, str) else None,  # or K floats
    )
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
