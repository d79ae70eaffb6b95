"""The builder: a checked run spec becomes a sampler, a calibrated σ and one private step.

:func:`build` takes the :class:`~dpfy.spec.RunSpec` and :class:`~dpfy.spec.PerformanceOptions`
that ``make_private`` built from its keywords and :func:`dpfy.spec.check` admitted, and wires
the pieces together (docs/architecture.md): the sampler (whose facts the loader *and* the
ledger read), individualized budgets, the method calibrated for the run's facts, σ calibrated
to the target ε, the per-sample gradient engine, the clipping policy, the noise mechanism, the
budget guard and the ledger, in one :class:`~dpfy.step.private_step.PrivateStep` behind the
:class:`~dpfy.optim.DPOptimizer`. The calibrated spec (σ and the sampler's facts filled in) is
the optimizer's ``spec``.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Sequence

import torch
from torch import nn
from torch.utils.data import DataLoader

from dpfy._require import require
from dpfy.adaptive.base import Method, calibrate_for_run
from dpfy.api.admit import ATTACHED, check_optimizer_params, derive_seeds, resolve_method
from dpfy.api.mechanism import horizon, mechanism
from dpfy.buffers import BufferGuard
from dpfy.clipping import make_clipping
from dpfy.grads import GradEngine
from dpfy.individual_tracking import attach_norm_tracker
from dpfy.layers.batchnorm_setup import BatchNormSetup, setup_batchnorm
from dpfy.layers.privatized_batchnorm import PrivatizedStatistics
from dpfy.layers.public_batchnorm import attach_public_statistics
from dpfy.memory import plan_physical_batch
from dpfy.noise import NoiseSource
from dpfy.optim import DPOptimizer
from dpfy.privacy import Ledger
from dpfy.privacy.calibration_inputs import Target
from dpfy.privacy.delta_check import check_delta
from dpfy.privacy.events import CyclicPoisson, Poisson, SamplingKind, sampling_kind
from dpfy.sampling import DPDataLoader, make_sampler, make_user_sampler
from dpfy.sampling.augmult import Augmentation, AugmultUnits
from dpfy.sampling.microbatch import make_microbatch_sampler
from dpfy.sampling.sampler import Sampler
from dpfy.spec.facts import run_facts
from dpfy.spec import PerformanceOptions, RunSpec, check, declare_method
from dpfy.spec.run import BandMF, Tree, UserUnit
from dpfy.step.distributed import global_batch_notice
from dpfy.step.guard import EpsilonGuard
from dpfy.step.individual import individualize
from dpfy.step.private_step import PrivateStep
from dpfy.types import StepPlan

__all__ = ["build"]


def _sampler(
    spec: RunSpec, loader: DataLoader, user_ids: Any, seed: int | None, collective: Any
) -> Sampler:
    """The sampler the spec's sampling, unit and mechanism ask for."""
    unit, clip = spec.unit, spec.clipping
    if isinstance(unit, UserUnit):
        return make_user_sampler(
            loader,
            user_ids,
            user_sampling=unit.sampling,
            max_examples_per_user=unit.max_examples_per_user,
            user_reduction=unit.reduction,
            seed=seed,
        )
    if clip.kind == "microbatch" and clip.microbatch_size != 1:  # k = 1: per-example clipping
        assert clip.microbatch_size is not None  # dpfy.spec.from_keywords required it
        return make_microbatch_sampler(loader, clip.microbatch_size, seed=seed)
    return make_sampler(
        loader,
        poisson_sampling=spec.sampling.kind is Poisson and not isinstance(spec.noise, Tree),
        sample_rates=spec.sampling.sample_rates,
        seed=seed,
        shard=collective.shard if collective is not None else None,
        bands=(spec.noise.bands or "default") if isinstance(spec.noise, BandMF) else None,
    )


def _resolved(sampler: Sampler) -> SamplingKind:
    """The built sampler's facts as a sampling kind's value (q, N, the user cap, the bands)."""
    kind = sampling_kind(
        sampler.sampling,
        sampler.sample_rate,
        dataset_size=sampler.dataset_size,
        max_examples_per_user=getattr(sampler, "max_examples_per_user", None),
    )
    if isinstance(kind, CyclicPoisson):
        kind = dataclasses.replace(kind, bands=getattr(sampler, "bands", None))
    return kind


def _agree(collective: Any, spec: RunSpec, facts: dict[str, Any]) -> None:
    """Every rank runs the same spec (dpfy.step.distributed): refuse one that differs."""
    acc = spec.accounting
    collective.agree(
        {
            "dataset_size": facts["n"],
            "sample_rate": facts["q"],
            "noise_multiplier": spec.noise.noise_multiplier,
            "target_epsilon": acc.target_epsilon,
            "target_delta": acc.delta,
            "epochs": acc.epochs,
            "max_steps": facts["max_steps"],
            "max_grad_norm": repr(facts["clip_norm"]),
            "clipping": facts["clipping"],
            "method": repr(spec.method),
            "accountant": acc.accountant,
            "loss_reduction": facts["loss_reduction"],
            "seeded": facts["seeded"],
        }
    )


def _calibrate_method(
    method: Method, spec: RunSpec, sampler: Sampler, grads: GradEngine, **facts: Any
) -> Method:
    """The method calibrated for the run's facts (q, N, steps, sampling, δ, target ε, ...)."""
    clip_norm, optimizer = facts["clip_norm"], facts["optimizer"]
    return calibrate_for_run(
        method,
        run_facts(
            spec,
            _resolved(sampler),
            steps=facts["max_steps"],
            steps_per_epoch=facts["steps_per_epoch"],
            normalizer=sampler.normalizer,
            max_grad_norm=float(clip_norm) if isinstance(clip_norm, (int, float)) else None,
            optimizer=type(optimizer).__name__,
            hyperparameters={k: v for k, v in optimizer.param_groups[0].items() if k != "params"},
            num_groups=len(grads.layers),
        ),
    )


def _setup_batchnorm(
    spec: RunSpec, model: nn.Module, public_data: Any, physical: int | None
) -> BatchNormSetup | None:
    """Convert the model's BatchNorms as the spec's BatchNorm statistics say, before the
    gradient engine sees it (None: the model is left as it is)."""
    bn = spec.batchnorm
    if bn is None:
        return None
    return setup_batchnorm(
        model,
        bn.kind,
        public_data=public_data,
        public_description=bn.public_data or "public data",
        bn_bound=bn.bound,
        bn_noise_multiplier=bn.noise_multiplier,
        bn_share=bn.share,
        max_physical_batch_size=physical,
    )


def _finish_batchnorm(
    setup: BatchNormSetup, spec: RunSpec, optimizer: DPOptimizer, *, calibrated: bool
) -> RunSpec:
    """Attach privatized statistics to the built run; the spec with the σ each release got
    (a calibrated σ is split between the gradient and the statistics)."""
    setup.finish(optimizer, calibrated=calibrated)
    stats, bn = setup.stats, spec.batchnorm
    if not isinstance(stats, PrivatizedStatistics) or bn is None:
        return spec
    bn = dataclasses.replace(
        bn, noise_multiplier=stats.noise_multiplier, releases=stats.num_releases
    )
    sigma = optimizer.private_step.noise_multiplier
    return dataclasses.replace(spec, batchnorm=bn).with_noise_multiplier(sigma)


def build(
    spec: RunSpec,
    performance: PerformanceOptions,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: DataLoader,
    collective: Any,
    seed: int | None,
    user_ids: Any = None,
    augment: Any = None,
    public_data: Any = None,
    loss_fn: Any = None,
    loss_reduction: str = "mean",
    declare_row_wise: bool = False,
    individual_accounting: int | None = None,
) -> tuple[DPOptimizer, DPDataLoader]:
    """The private optimizer and loader of a checked spec (``model`` already admitted)."""
    sampling_seed, noise_seed = derive_seeds(seed) if seed is not None else (None, None)
    acc, unit, asked = spec.accounting, spec.unit, spec
    augmult = unit.augmult
    augmentation = Augmentation(augmult, augment, seed) if augmult > 1 else None
    physical: int | None
    if performance.max_physical_batch_size == "auto":
        physical = plan_physical_batch(
            model, loader, memory_limit=performance.memory_limit, route=performance.route
        )
    else:
        assert not isinstance(performance.max_physical_batch_size, str)  # PerformanceOptions
        physical = performance.max_physical_batch_size

    bn_setup = _setup_batchnorm(spec, model, public_data, physical)

    # -- the run's facts: the sampler's, and the horizon ---------------------------------------
    sampler = _sampler(spec, loader, user_ids, sampling_seed, collective)
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
        loader, sampler, max_physical_batch_size=physical, augmentation=augmentation
    )
    max_steps = horizon(acc.epochs, acc.max_steps, acc.target_epsilon, acc.delta, len(dp_loader))

    # -- calibrate: individual budgets, the method, σ ------------------------------------------
    # C: the user's (a float, or K floats per layer), or individual clipping's per-example C_i
    clip_norm: float | Sequence[float] | torch.Tensor = spec.clipping.max_grad_norm
    clipping = spec.clipping.kind
    if clipping == "microbatch" and spec.clipping.microbatch_size == 1:
        clipping = "flat"  # k = 1: each row its own unit, Δ = C (dpfy.sampling.microbatch)
    sigma = spec.noise.noise_multiplier
    individual_run = None
    if acc.individual is not None:  # its combinations were refused by dpfy.spec.check
        individual_run = individualize(
            acc.individual.budgets,
            acc.individual.variant,
            sampler=sampler,
            max_steps=max_steps,
            delta=acc.delta,
            accountant=acc.accountant,
            max_grad_norm=clip_norm,
            seed=sampling_seed,
        )
        sampler, sigma = individual_run.sampler, individual_run.noise_multiplier
        clipping, clip_norm = individual_run.clipping, individual_run.max_grad_norm
        dp_loader = DPDataLoader(loader, sampler, max_physical_batch_size=physical)
    n, q = sampler.dataset_size, sampler.sample_rate
    check_delta(acc.delta, n, "users" if isinstance(unit, UserUnit) else "examples")
    spec = spec.with_noise_multiplier(sigma)
    if collective is not None:
        facts = dict(n=n, q=q, max_steps=max_steps, clip_norm=clip_norm, clipping=clipping)
        _agree(
            collective, spec, dict(facts, loss_reduction=loss_reduction, seeded=seed is not None)
        )
        collective.broadcast_module(model)
        batch_size = loader.batch_size
        assert batch_size is not None, "make_sampler refused a loader without a batch_size"
        if collective.rank == 0 and individual_run is None:
            warnings.warn(
                global_batch_notice(collective.world_size, int(batch_size), n, q), stacklevel=3
            )
    grads = GradEngine(
        model,
        route=performance.route,
        loss_reduction=loss_reduction,
        declare_row_wise=declare_row_wise,
    )
    try:
        check_optimizer_params(optimizer, grads)
        layers = [list(layer.param_names) for layer in grads.layers]
        policy = make_clipping(clipping, clip_norm, layers, dataset_size=n)
        method = resolve_method(spec.method)
        if method is not None:
            method = _calibrate_method(
                method,
                spec,
                sampler,
                grads,
                clip_norm=clip_norm,
                optimizer=optimizer,
                max_steps=max_steps,
                steps_per_epoch=len(dp_loader),
            )
            method_steps = getattr(method, "total_steps", None)
            if max_steps is None and method_steps:
                max_steps = int(method_steps)
        if acc.target_epsilon is not None and not (
            method is not None and "noise_multiplier" in method.sets
        ):
            # horizon() required δ and the run's length with a target ε
            assert acc.delta is not None and max_steps is not None
            kind = sampling_kind(
                sampler.sampling,
                q,
                max_examples_per_user=getattr(sampler, "max_examples_per_user", None),
            )
            target = Target(acc.target_epsilon, acc.delta, acc.accountant)
            noise = spec.noise.calibrated(
                kind, max_steps, target, period=spec.noise.period(sampler)
            )
            sigma = noise.noise_multiplier
            spec = dataclasses.replace(spec, noise=noise)
        epsilon_cap = acc.epsilon_cap
        if acc.target_epsilon is not None and epsilon_cap is None:
            epsilon_cap = acc.target_epsilon  # the target is a limit, whatever changes the horizon
        if method is not None:  # the method's declarations, against the spec as it was asked
            plan = StepPlan(
                step=0, sample_rate=q, noise_multiplier=sigma or 0.0, clip=policy.default_clip()
            )
            check(asked, performance, method=declare_method(method, plan), loss_fn=loss_fn)

        # -- assemble ---------------------------------------------------------------------------
        ran = dataclasses.replace(acc, max_steps=max_steps, epsilon_cap=epsilon_cap)
        spec = dataclasses.replace(spec, accounting=ran).with_sampling(_resolved(sampler))
        private_step = PrivateStep(
            optimizer,
            grads=grads,
            clipping=policy,
            mechanism=mechanism(
                spec.noise,
                NoiseSource(noise_seed),
                sampler=sampler,
                horizon=max_steps or len(dp_loader),
            ),
            sampler=sampler,
            cursor=dp_loader.cursor,
            noise_multiplier=sigma,
            method=method,
            ledger=Ledger(dataset_size=n),
            guard=EpsilonGuard(
                max_steps=max_steps,
                epsilon_cap=epsilon_cap,
                delta=acc.delta,
                accountant=acc.accountant,
            ),
            model=model,
            loss_fn=loss_fn,
            collective=collective,
            individual=individual_run.budgets if individual_run is not None else None,
        )
        dp_optimizer = DPOptimizer(optimizer, private_step, accountant=acc.accountant, seed=seed)
        attach_public_statistics(model, optimizer)  # dpfy.layers.public_batchnorm, if used
        if bn_setup is not None:
            sets_sigma = method is not None and "noise_multiplier" in method.sets
            calibrated = acc.target_epsilon is not None and not sets_sigma
            spec = _finish_batchnorm(bn_setup, spec, dp_optimizer, calibrated=calibrated)
        if individual_accounting is not None:  # analysis only: nothing of it is released
            attach_norm_tracker(
                dp_optimizer,
                model,
                loader.dataset,
                refresh_every=individual_accounting,
                loss_fn=loss_fn,
                max_grad_norm=asked.clipping.max_grad_norm,
                clipping=clipping,
                augmult=augmult,
                user_level=isinstance(unit, UserUnit),
            )
    except Exception:
        grads.detach()
        raise
    BufferGuard(model)  # refuses buffers a training forward changes (dpfy/buffers/guard.py)
    ATTACHED[model] = grads
    dp_optimizer.spec = spec
    return dp_optimizer, dp_loader
