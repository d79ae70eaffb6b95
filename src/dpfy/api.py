"""``make_private``: turn a model, optimizer and loader into private ones; the budget guard.

The user's loop stays plain PyTorch::

    model, optimizer, loader = dpfy.make_private(model, optimizer, loader,
                                                 noise_multiplier=1.0, max_grad_norm=1.0)
    for x, y in loader:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    optimizer.epsilon(delta=1e-5)

What it wires together (docs/architecture.md): a sampler (whose facts the loader *and* the ledger
read), the
per-sample gradient engine (``dpfy.grads``), a clipping policy (``dpfy.clipping``), a noise source
(``dpfy.noise``), the ledger (``dpfy.privacy``) and the optimizer wrapper (``dpfy.optim``) that
executes one plan per logical batch. Normalizer: the noisy sum is divided by b = qN, the expected
batch size, under Poisson sampling (b = batch size for a kept shuffled loader).
"""

from __future__ import annotations

import math
import warnings
import weakref
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from dpfy._require import require
from dpfy.adaptive.base import Method, make as make_method, calibrate_for_run
from dpfy.adaptive.chain import chain
from dpfy.buffers import BufferGuard
from dpfy.clipping import make_clipping
from dpfy.errors import SeedWarning
from dpfy.grads import GradEngine
from dpfy.individual_tracking import attach_norm_tracker
from dpfy.layers.public_batchnorm import attach_public_statistics
from dpfy.memory import plan_physical_batch
from dpfy.noise import (
    BandMFMechanism,
    GaussianMechanism,
    NoiseMechanism,
    NoiseSource,
    TreeMechanism,
)
from dpfy.noise.seeds import derive_seeds  # re-exported: dpfy.api.derive_seeds
from dpfy.noise.toeplitz import optimize_banded
from dpfy.optim import DPOptimizer
from dpfy.privacy import Ledger, calibrate_noise_multiplier
from dpfy.privacy.accountants import RIGOROUS, check_accountant
from dpfy.privacy.delta_check import check_delta
from dpfy.errors import PrivacyRefusal
from dpfy.sampling import (
    USER_SAMPLINGS,
    DPDataLoader,
    make_sampler,
    make_user_sampler,
)
from dpfy.sampling.augmult import Augmentation, AugmultUnits, check_augmult
from dpfy.sampling.microbatch import check_microbatch, make_microbatch_sampler
from dpfy.sampling.sampler import Sampler
from dpfy.step.distributed import current_collective, global_batch_notice, unwrap_model
from dpfy.step.arguments import check_materialized, check_numbers
from dpfy.step.guard import EpsilonGuard
from dpfy.step.individual import individualize
from dpfy.step.private_step import PrivateStep, require_loss_fn, split_batch_refusal
from dpfy.types import RunFacts, Sampling, StepPlan

__all__ = ["make_private", "derive_seeds"]

_ATTACHED: "weakref.WeakKeyDictionary[nn.Module, GradEngine]" = weakref.WeakKeyDictionary()


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
) -> tuple[nn.Module, DPOptimizer, DPDataLoader]:
    """Make ``model``/``optimizer``/``loader`` differentially private (DP-SGD and variants).

    Each logical batch releases Σ_i w_i g_i + N(0, (σ·Δ)²) once (w_i from the clipping policy,
    Δ its sensitivity), records ``Release("gradient", σ)`` in the ledger with the sampler's
    sampling and rate, and steps the optimizer on that sum divided by b = qN (Poisson).

    Args:
      model: any ``nn.Module`` without BatchNorm (see :func:`dpfy.validate`, or
        :func:`dpfy.layers.public_batchnorm` for public statistics); batch dim first.
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
        (``needs.probes``); called under no_grad at perturbed parameters.
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

      module, data_loader: Opacus's names for ``model`` and ``loader`` (aliases; give one of
        each pair). A :class:`~dpfy.sampling.DPDataLoader` from an earlier ``make_private`` may
        be passed: the new run draws from the DataLoader it was built from.

    Returns:
      model (nn.Module): the same model, hooked. Autograd's own gradient of its trainable
        parameters is off while private, since their gradients come from the engine, and
        ``p.requires_grad`` still reads True (``dpfy.grads.held``).
      optimizer (DPOptimizer): a :class:`dpfy.optim.DPOptimizer` wrapping ``optimizer``; its
        ``epsilon()`` and ``ledger`` say what the run has spent.
      loader (DPDataLoader): a :class:`dpfy.sampling.DPDataLoader` that samples ``loader``'s
        dataset (Poisson by default).
    """
    model = _alias("model", model, "module", module)
    loader = _alias("loader", loader, "data_loader", data_loader)
    if isinstance(loader, DPDataLoader):  # re-privatizing: a fresh sampler over its data
        loader = loader.original
    user_model, model = _admit(model, optimizer, loader)
    assert optimizer is not None  # _admit refused anything but an Optimizer
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
    _check_arguments(
        noise_multiplier=noise_multiplier,
        target_epsilon=target_epsilon,
        method=method,
        budgets=budgets,
        accountant=accountant,
        max_steps=max_steps,
    )
    _check_user_level(
        user_ids=user_ids,
        user_sampling=user_sampling,
        max_examples_per_user=max_examples_per_user,
        user_reduction=user_reduction,
        poisson_sampling=poisson_sampling,
        sample_rates=sample_rates,
        collective=collective,
        budgets=budgets,
        individual=individual,
        clipping=clipping,
    )
    _check_noise(
        noise,
        bands,
        collective=collective,
        budgets=budgets,
        individual=individual,
        sample_rates=sample_rates,
        user_ids=user_ids,
        microbatch_size=microbatch_size,
    )
    sampling_seed, noise_seed = derive_seeds(seed) if seed is not None else (None, None)
    if seed is not None:
        warn_seed(seed)
    clipping = check_microbatch(
        clipping,
        microbatch_size,
        poisson_sampling=poisson_sampling,
        others={
            "user_ids": user_ids,
            "sample_rates": sample_rates,
            "method": method,
            "budgets": budgets,
            "individual": individual,
            "data-parallel": collective,
            "noise": None if noise == "gaussian" else noise,
        },
    )
    check_augmult(
        augmult,
        augment,
        others={
            "user_ids": user_ids,
            "clipping='microbatch'": clipping == "microbatch",
            "clipping='individual'": clipping == "individual",
            "budgets / individual": budgets is not None or individual is not None,
            "data-parallel ranks": collective,
            "noise": None if noise == "gaussian" else noise,
        },
    )
    augmentation = Augmentation(augmult, augment, seed) if augmult > 1 else None
    physical: int | None
    if max_physical_batch_size == "auto":
        physical = plan_physical_batch(model, loader, memory_limit=memory_limit, route=route)
    else:
        require(
            memory_limit is None,
            "memory_limit",
            memory_limit,
            "None unless max_physical_batch_size='auto'",
            "Pass one of them",
        )
        require(
            not isinstance(max_physical_batch_size, str),
            "max_physical_batch_size",
            max_physical_batch_size,
            "an int >= 1, None or 'auto'",
        )
        assert not isinstance(max_physical_batch_size, str)  # refused above
        physical = max_physical_batch_size

    # -- the run's facts: the sampler's, and the horizon ---------------------------------------
    sampler: Sampler = (
        make_user_sampler(
            loader,
            user_ids,
            user_sampling=user_sampling,  # type: ignore[arg-type]
            max_examples_per_user=max_examples_per_user,
            user_reduction=user_reduction,
            seed=sampling_seed,
        )
        if user_ids is not None
        else make_microbatch_sampler(loader, microbatch_size, seed=sampling_seed)  # type: ignore[arg-type]
        if clipping == "microbatch"
        else make_sampler(
            loader,
            poisson_sampling=poisson_sampling and noise != "tree",
            sample_rates=sample_rates,
            seed=sampling_seed,
            shard=collective.shard if collective is not None else None,
            bands=(bands if bands is not None else "default") if noise == "bandmf" else None,
        )
    )
    if augmentation is not None:  # the example stays the unit of privacy; its K rows are clipped
        sampler.units = AugmultUnits(augmult)
    largest = getattr(sampler, "largest_unit", None)  # ULS: a user's rows of one step
    if largest is not None and physical is not None:
        require(
            largest <= physical,
            "max_physical_batch_size",
            physical,
            f">= {largest}, the most rows one user brings to a "
            f"step (a user's rows are clipped together, in one physical batch)",
            "Raise it, or cap the rows per user and step with max_examples_per_user",
        )
    dp_loader = DPDataLoader(
        loader,
        sampler,
        max_physical_batch_size=physical,
        augmentation=augmentation,
    )
    max_steps = _horizon(epochs, max_steps, target_epsilon, target_delta, len(dp_loader))
    if (target_epsilon is not None or epsilon_cap is not None) and accountant not in RIGOROUS:
        raise ValueError(
            f"accountant must be one of {list(RIGOROUS)} when it decides the noise (target_"
            f"epsilon, epsilon_cap), got accountant = {accountant!r}. The GDP CLT can under-"
            f"report ε; calibrate with 'pld' and read GDP afterwards with "
            f"optimizer.epsilon(delta, accountant='gdp', approximate=True)"
        )

    # -- calibrate: individual budgets, the method, σ ------------------------------------------
    # C: the user's (a float, or K floats per layer), or individual clipping's per-example C_i
    clip_norm: float | Sequence[float] | torch.Tensor = max_grad_norm
    individual_run = None
    if budgets is not None or individual is not None:
        individual_run = individualize(
            budgets,
            individual,
            sampler=sampler,
            max_steps=max_steps,
            delta=target_delta,
            accountant=accountant,
            max_grad_norm=max_grad_norm,
            seed=sampling_seed,
            others={
                "noise_multiplier": noise_multiplier,
                "target_epsilon": target_epsilon,
                "sample_rates": sample_rates,
                "method": method,
                "collective": collective,
            },
            clipping=clipping,
            poisson_sampling=poisson_sampling,
        )
        sampler, noise_multiplier = individual_run.sampler, individual_run.noise_multiplier
        clipping, clip_norm = individual_run.clipping, individual_run.max_grad_norm
        dp_loader = DPDataLoader(loader, sampler, max_physical_batch_size=physical)
    n, q = sampler.dataset_size, sampler.sample_rate
    check_delta(target_delta, n, "users" if user_ids is not None else "examples")
    if collective is not None:
        collective.agree(
            {
                "dataset_size": n,
                "sample_rate": q,
                "noise_multiplier": noise_multiplier,
                "target_epsilon": target_epsilon,
                "target_delta": target_delta,
                "epochs": epochs,
                "max_steps": max_steps,
                "max_grad_norm": repr(clip_norm),
                "clipping": clipping,
                "method": repr(method),
                "accountant": accountant,
                "loss_reduction": loss_reduction,
                "seeded": seed is not None,
            }
        )
        collective.broadcast_module(model)
        batch_size = loader.batch_size
        assert batch_size is not None, "make_sampler refused a loader without a batch_size"
        if collective.rank == 0 and individual_run is None:
            warnings.warn(
                global_batch_notice(collective.world_size, int(batch_size), n, q),
                stacklevel=2,
            )
    grads = GradEngine(
        model, route=route, loss_reduction=loss_reduction, declare_row_wise=declare_row_wise
    )
    try:
        _check_optimizer_params(optimizer, grads)
        layers = [list(layer.param_names) for layer in grads.layers]
        policy = make_clipping(clipping, clip_norm, layers, dataset_size=n)
        if clipping == "individual":
            require(
                poisson_sampling,
                "poisson_sampling",
                False,
                "True for clipping='individual'",
                "Per-example thresholds need the batch's dataset indices",
            )
        method = _resolve_method(method)
        if method is not None:
            facts = RunFacts(
                sampling=sampler.sampling,
                sample_rate=q,
                steps=max_steps,
                dataset_size=n,
                steps_per_epoch=len(dp_loader),
                normalizer=sampler.normalizer,
                delta=target_delta,
                target_epsilon=target_epsilon,
                accountant=accountant,
                max_grad_norm=(float(clip_norm) if isinstance(clip_norm, (int, float)) else None),
                num_groups=len(grads.layers),
                inner_optimizer=type(optimizer).__name__,
                inner_hyperparameters={
                    k: v for k, v in optimizer.param_groups[0].items() if k != "params"
                },
                max_examples_per_user=sampler.max_examples_per_user,
            )
            method = calibrate_for_run(method, facts)
            method_steps = getattr(method, "total_steps", None)
            if max_steps is None and method_steps:
                max_steps = int(method_steps)
        if target_epsilon is not None and not (
            method is not None and "noise_multiplier" in method.sets
        ):
            # _horizon required δ and the run's length with a target ε
            assert target_delta is not None and max_steps is not None
            noise_multiplier = calibrate_noise_multiplier(
                target_epsilon=target_epsilon,
                delta=target_delta,
                sample_rate=q,
                steps=max_steps,
                accountant=accountant,
                sampling=sampler.sampling,
                max_examples_per_user=getattr(sampler, "max_examples_per_user", None),
                noise=noise,
                period=_period(noise, sampler),
            )
        if target_epsilon is not None and epsilon_cap is None:
            epsilon_cap = target_epsilon  # the target is a limit, whatever changes the horizon
        if noise != "gaussian" and method is not None:
            require(
                "noise_multiplier" not in method.sets,
                "method",
                method.registry_name or type(method).__name__,
                f"a method that does not set σ with noise={noise!r}",
                "Correlated noise needs one σ for the whole run: use noise='gaussian'",
            )

        if method is not None and (sampler.sampling is Sampling.ULS or augmentation is not None):
            _refuse_per_example_releases(
                method, q, noise_multiplier, policy.default_clip(), augmult=augmult
            )
        if method is not None:
            _check_capabilities(
                method,
                grads,
                physical,
                clipping,
                loss_fn,
                StepPlan(
                    step=0,
                    sample_rate=q,
                    noise_multiplier=noise_multiplier or 0.0,
                    clip=policy.default_clip(),
                ),
            )

        # -- assemble ---------------------------------------------------------------------------
        private_step = PrivateStep(
            optimizer,
            grads=grads,
            clipping=policy,
            mechanism=_mechanism(
                noise,
                NoiseSource(noise_seed),
                sampler=sampler,
                noise_multiplier=noise_multiplier,
                horizon=max_steps or len(dp_loader),
            ),
            sampler=sampler,
            cursor=dp_loader.cursor,
            noise_multiplier=noise_multiplier,
            method=method,
            ledger=Ledger(dataset_size=n),
            guard=EpsilonGuard(
                max_steps=max_steps,
                epsilon_cap=epsilon_cap,
                delta=target_delta,
                accountant=accountant,
            ),
            model=model,
            loss_fn=loss_fn,
            collective=collective,
            individual=individual_run.budgets if individual_run is not None else None,
        )
        dp_optimizer = DPOptimizer(optimizer, private_step, accountant=accountant, seed=seed)
        attach_public_statistics(model, optimizer)  # dpfy.layers.public_batchnorm, if used
        if individual_accounting is not None:  # analysis only: nothing of it is released
            attach_norm_tracker(
                dp_optimizer,
                model,
                loader.dataset,
                refresh_every=individual_accounting,
                loss_fn=loss_fn,
                max_grad_norm=max_grad_norm,
                clipping=clipping,
                augmult=augmult,
                user_level=user_ids is not None,
            )
    except Exception:
        grads.detach()
        raise
    BufferGuard(model)  # refuses buffers a training forward changes (dpfy/buffers.py)
    _ATTACHED[model] = grads
    return user_model, dp_optimizer, dp_loader


SEED_WARNING = (
    "make_private(seed={seed}): sampling and noise follow from the seed, so anyone "
    "who knows it can reproduce the noise and undo the privacy. Use a seed only "
    "for debugging or reproducing a result, never for a model you release "
    "(seed=None, the default, draws both from the operating system)"
)


def warn_seed(seed: int) -> None:
    """Warn, once per make_private call, that a seeded run's noise can be undone."""
    warnings.warn(SEED_WARNING.format(seed=seed), SeedWarning, stacklevel=3)


def _check_noise(noise: str, bands: int | None, **others: Any) -> None:
    """``noise=`` and ``bands=``, and what correlated noise cannot be combined with."""
    require(
        noise in ("gaussian", "tree", "bandmf"), "noise", noise, "'gaussian', 'tree' or 'bandmf'"
    )
    require(
        bands is None or noise == "bandmf",
        "bands",
        bands,
        "None unless noise='bandmf'",
        "Pass noise='bandmf' with bands=b, or drop bands=",
    )
    if noise == "gaussian":
        return
    given = sorted(k for k, v in others.items() if v is not None)
    require(
        not given,
        "arguments",
        given,
        f"none of them with noise={noise!r}",
        "Correlated noise is single-process, for uniform budgets and rates; use "
        "noise='gaussian' for these",
    )


def _period(noise: str, sampler: Any) -> int | None:
    """The release's period: the tree's restart length (steps per pass) or the band count."""
    return {
        "gaussian": None,
        "tree": getattr(sampler, "steps_per_epoch", None),
        "bandmf": getattr(sampler, "bands", None),
    }[noise]


def _mechanism(
    noise: str, source: NoiseSource, *, sampler: Any, noise_multiplier: float | None, horizon: int
) -> NoiseMechanism:
    """The run's noise mechanism on the sampler's facts (BandMF's strategy optimized for the
    prefix sums of ``horizon`` steps)."""
    if noise == "gaussian":
        return GaussianMechanism(
            source,
            sampling=sampler.sampling,
            sample_rate=sampler.sample_rate,
            max_examples_per_user=getattr(sampler, "max_examples_per_user", None),
        )
    require(
        noise_multiplier is not None and noise_multiplier > 0,
        "noise_multiplier",
        noise_multiplier,
        f"> 0 with noise={noise!r}",
        "Pass noise_multiplier=σ or target_epsilon= (correlated noise cannot be turned off)",
    )
    assert noise_multiplier is not None  # the require above refused None
    if noise == "tree":
        return TreeMechanism(
            source,
            period=sampler.steps_per_epoch,
            noise_multiplier=noise_multiplier,
            sample_rate=sampler.sample_rate,
            sampler_position=lambda: sampler.batch_in_pass,
        )
    return BandMFMechanism(
        source,
        coefficients=optimize_banded(horizon, sampler.bands),
        noise_multiplier=noise_multiplier,
        sample_rate=sampler.sample_rate,
        sampler_position=lambda: sampler.step,
    )


def _alias(name: str, value: Any, opacus_name: str, opacus_value: Any) -> Any:
    """``value``, or Opacus's keyword for it; exactly one of the two."""
    require(
        (value is None) != (opacus_value is None),
        f"{name} / {opacus_name}",
        (type(value).__name__, type(opacus_value).__name__),
        "exactly one given",
        f"Pass {name}= (or Opacus's {opacus_name}=), once",
    )
    return value if value is not None else opacus_value


def _admit(
    model: nn.Module, optimizer: torch.optim.Optimizer | None, loader: DataLoader
) -> tuple[nn.Module, nn.Module]:
    """Check the three objects' types; the user's model and the one to hook (unwrapped)."""
    require(isinstance(model, nn.Module), "model", type(model).__name__, "an nn.Module")
    require(
        isinstance(optimizer, torch.optim.Optimizer),
        "optimizer",
        type(optimizer).__name__,
        "a torch.optim.Optimizer",
    )
    require(
        isinstance(loader, DataLoader),
        "loader",
        type(loader).__name__,
        "a torch.utils.data.DataLoader",
    )
    inner = unwrap_model(model)
    require(
        inner not in _ATTACHED,
        "model",
        type(model).__name__,
        "not already private",
        "Call make_private once per model (build a fresh model to start over)",
    )
    return model, inner


def _check_arguments(
    *,
    noise_multiplier: float | None,
    target_epsilon: float | None,
    method: Any,
    budgets: Any,
    accountant: str,
    max_steps: int | None,
) -> None:
    """The privacy arguments, before anything is built: one source of σ, valid values."""
    require(
        noise_multiplier is None or target_epsilon is None,
        "noise_multiplier / target_epsilon",
        (noise_multiplier, target_epsilon),
        "not both given",
        "Pass σ directly or a target ε to calibrate it, not both",
    )
    require(
        noise_multiplier is not None
        or target_epsilon is not None
        or method is not None
        or budgets is not None,
        "noise_multiplier",
        None,
        "given (or target_epsilon, or a method that sets σ)",
        "Pass noise_multiplier=σ or target_epsilon=..., target_delta=..., epochs=...",
    )
    if noise_multiplier is not None:
        require(noise_multiplier >= 0, "noise_multiplier", noise_multiplier, ">= 0")
        if noise_multiplier == 0:
            warnings.warn(
                "noise_multiplier=0: no noise is added; training is NOT private "
                "(use only for debugging)",
                stacklevel=3,
            )
    check_accountant(accountant)
    if max_steps is not None:
        require(isinstance(max_steps, int) and max_steps >= 1, "max_steps", max_steps, ">= 1")


def _check_user_level(
    *,
    user_ids: Any,
    user_sampling: str | None,
    max_examples_per_user: int | None,
    user_reduction: str,
    poisson_sampling: bool,
    sample_rates: Any,
    collective: Any,
    budgets: Any,
    individual: Any,
    clipping: str,
) -> None:
    """The user-level arguments, and what cannot be accounted with users as the unit."""
    if user_ids is None:
        require(
            user_sampling is None and max_examples_per_user is None and user_reduction == "mean",
            "user_ids",
            None,
            "given with user_sampling / max_examples_per_user / user_reduction",
            "Pass user_ids= (one user id per example) to make the unit of privacy the user",
        )
        return
    require(
        user_sampling in USER_SAMPLINGS,
        "user_sampling",
        user_sampling,
        f"one of {list(USER_SAMPLINGS)} with user_ids",
        "'uls' samples users and clips each one's rows together; 'els' caps every user at "
        "k examples and samples examples (pass max_examples_per_user=k)",
    )
    require(
        max_examples_per_user is None
        or (
            isinstance(max_examples_per_user, int)
            and not isinstance(max_examples_per_user, bool)
            and max_examples_per_user >= 1
        ),
        "max_examples_per_user",
        max_examples_per_user,
        "None or an integer >= 1",
    )
    require(
        user_sampling != "els" or max_examples_per_user is not None,
        "max_examples_per_user",
        None,
        "an integer k >= 1 with user_sampling='els'",
        "ELS's user-level accounting needs k, the most examples a user keeps",
    )
    others = {
        "poisson_sampling=False": not poisson_sampling,
        "sample_rates": sample_rates is not None,
        "data-parallel ranks": collective is not None,
        "budgets / individual": budgets is not None or individual is not None,
        "clipping='individual'": clipping == "individual",
    }
    given = [name for name, on in others.items() if on]
    if given:
        raise PrivacyRefusal(
            f"user-level DP (user_ids) must use dpfy's user-level Poisson sampler in one "
            f"process with one threshold per unit, got {', '.join(given)}: those are per "
            f"example and cannot be accounted per user. Drop them (individualized budgets per "
            f"user are not built), or drop user_ids for example-level DP"
        )


def _refuse_per_example_releases(
    method: Method, q: float, sigma: float | None, clip: Any, *, augmult: int = 1
) -> None:
    """ULS clips users, not rows (and ``augmult`` clips an example's K rows together): a
    method whose releases are per row (a per-sample transform, loss probes of each row)
    cannot be accounted per unit."""
    name = method.registry_name or type(method).__name__
    state = method.init()
    specs = method.releases(
        state,
        method.plan(
            state, StepPlan(step=0, sample_rate=q, noise_multiplier=sigma or 0.0, clip=clip)
        ),
    )
    per_example = [n for n, s in specs.items() if s.kind == "loss"]
    if augmult > 1 and (method.implements("transform") or per_example):
        raise PrivacyRefusal(
            f"method {name!r} must release per-unit values with augmult={augmult}, got "
            f"{'a per-sample transform ' if method.implements('transform') else ''}"
            f"{('per-row loss probes ' + str(per_example)) if per_example else ''}: they act "
            f"on each of an example's {augmult} augmented rows, not on the example. Drop "
            f"augmult, or use a method without them"
        )
    if method.implements("transform") or per_example:
        raise PrivacyRefusal(
            f"method {name!r} must release per-user values under user_sampling='uls', got "
            f"{'a per-sample transform' if method.implements('transform') else ''}"
            f"{' and ' if method.implements('transform') and per_example else ''}"
            f"{('per-example loss probes ' + str(per_example)) if per_example else ''}: their "
            f"sensitivity is per example, not per user. Use user_sampling='els' (each "
            f"example clipped alone, accounted per user), or a method without them"
        )


def _horizon(
    epochs: float | None,
    max_steps: int | None,
    target_epsilon: float | None,
    target_delta: float | None,
    steps_per_epoch: int,
) -> int | None:
    """T, the ε guard's horizon: ``max_steps``, or the logical batches of ``epochs`` passes."""
    if target_epsilon is not None:
        require(
            target_delta is not None and 0 < target_delta < 1,
            "target_delta",
            target_delta,
            "in (0, 1) with target_epsilon",
            "The usual choice is δ < 1/N",
        )
        require(
            epochs is not None or max_steps is not None,
            "epochs",
            epochs,
            "given with target_epsilon",
            "Say how long the run is: epochs= or max_steps=",
        )
    if max_steps is None and epochs is not None:
        require(
            isinstance(epochs, (int, float))
            and not isinstance(epochs, bool)
            and math.isfinite(epochs)
            and epochs > 0,
            "epochs",
            epochs,
            "a finite number > 0",
            "Say how many passes over the data the run makes",
        )
        max_steps = max(1, math.ceil(epochs * steps_per_epoch - 1e-9))
    return max_steps


def _check_optimizer_params(optimizer: torch.optim.Optimizer, grads: GradEngine) -> None:
    """The optimizer must update exactly the model's trainable parameters.

    Frozen parameters of the model (``requires_grad=False``) may be in it too, as they are in an
    optimizer built over all of ``model.parameters()``: they never get a gradient, so the
    optimizer skips them; one unfrozen later is refused at the release
    (``DPOptimizer._refuse_uncovered_grads``).
    """
    in_opt = {id(p) for g in optimizer.param_groups for p in g["params"]}
    names = {id(p): n for n, p in grads.named_params}
    extra = len(in_opt - {id(p) for p in grads.model.parameters()})
    require(
        extra == 0,
        "optimizer parameters",
        f"{extra} not in the model",
        "a subset of the model's parameters",
        "Build the optimizer from this model's parameters (model.parameters())",
    )
    left = sorted(n for i, n in names.items() if i not in in_opt)
    require(
        not left,
        "trainable parameters",
        left,
        "all in the optimizer",
        "Add them to the optimizer or freeze them with requires_grad_(False) first",
    )


def _resolve_method(method: "Method | str | Sequence[Method | str] | None") -> "Method | None":
    """A method from a registry name, a method, or a sequence of them (chained in order)."""
    if method is None:
        return None
    if isinstance(method, str):
        return make_method(method)
    if isinstance(method, (list, tuple)):
        resolved = [_resolve_method(m) for m in method]
        require(
            all(m is not None for m in resolved),
            "method",
            method,
            "a list of dpfy methods or registry names, without None",
        )
        return chain(*[m for m in resolved if m is not None])
    require(
        isinstance(method, Method),
        "method",
        type(method).__name__,
        "a dpfy method, a registry name or a list of them",
        "Build one with dpfy.adaptive.make(name, ...); `dpfy methods` lists the names",
    )
    assert isinstance(method, Method)  # the require above refused others
    return method


def _check_capabilities(
    method: Method,
    grads: GradEngine,
    max_physical_batch_size: Any,
    clipping: str,
    loss_fn: Any,
    plan: StepPlan,
) -> None:
    """What the method's capabilities ask of the run, checked once before training.

    Derived from what the method implements and declares, never from flags: a per-sample
    transform needs the materialized route, loss-probe releases need ``loss_fn`` (checked
    again at every step that declares one), post-release probes need whole logical batches.
    """
    name = method.registry_name or type(method).__name__
    if method.implements("transform"):
        require(
            grads.route != "ghost",
            "route",
            grads.route,
            f"'auto' or 'vmap' for method {name!r} (it transforms per-sample gradients "
            f"coordinate-wise, which the ghost route never forms)",
            "Drop route='ghost'; every layer then takes the materialized route "
            "(memory: B × parameters)",
        )
    if method.implements("clipping"):
        require(
            clipping == "flat",
            "clipping",
            clipping,
            f"'flat' (the default) with method {name!r}, which supplies its own clipping",
            "Drop clipping=, or drop the method: dpfy never replaces a clipping policy "
            "you asked for silently",
        )
    state = method.init()
    specs = method.releases(state, method.plan(state, plan))  # the first step's releases
    require_loss_fn(specs, loss_fn, name)
    if any(spec.after_release for spec in specs.values()) and max_physical_batch_size:
        raise split_batch_refusal(name)
