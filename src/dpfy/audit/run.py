"""An audited training run: a ``dpfy train`` configuration trained with canaries, then audited.

:func:`audited_private_run` wraps a model, optimizer and training set exactly as
:func:`dpfy.train.private.private_run` does (``make_private``, Poisson sampling, the run's
ledger), with the included canaries appended to the training set and
:class:`~dpfy.audit.canaries.CanaryGradients` chained after the run's own methods.
:func:`audit_result` reads the canary scores and the claimed ε from the optimizer.
:func:`audit_config` does all of it for a :class:`~dpfy.train.config.TrainConfig` (what
``dpfy audit`` runs): it trains through ``private_run`` and ``run_epoch`` (the trainer's own
loop) but not through ``dpfy.train.train`` itself — no checkpoints, no resume — and writes the
privacy report with the audit's section into ``out``.

The canaries change the run: N grows by the included canaries, so q = b/N and the calibrated
σ are those of the audited run, whose own ledger gives the claimed ε. With Dirac canaries
(the default) the model is wrapped in a :class:`~dpfy.audit.sink.CanarySink`, which adds one
coordinate per canary that no real example touches and changes nothing else.

``plant_noise_scale`` (``dpfy audit --plant-noise-scale F``) scales the run's noise behind its
ledger's back (:mod:`dpfy.audit.plant`) to measure the audit's power; such a run writes only
``audit.json`` and ``config.json``, marked as never published.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from dpfy._require import require
from dpfy.audit.canaries import KINDS, CanaryDataset, CanaryGradients, CanarySet, find_canaries
from dpfy.audit.plant import plant_noise_scale as plant
from dpfy.audit.result import AuditResult, audit_scores
from dpfy.audit.sink import CanarySink
from dpfy.data import load_dataset
from dpfy.models import build_model
from dpfy.train.config import TrainConfig, resolve
from dpfy.train.device import device_description, model_device, resolve_device
from dpfy.train.epoch import run_epoch
from dpfy.train.evaluate import evaluate
from dpfy.train.private import (
    PrivateRun,
    build_methods,
    make_optimizer,
    private_run,
    run_options,
)
from dpfy.train.report import write_report
from dpfy.train.rundir import RunDir, write_atomic
from dpfy.train.trainer import check_accountable, check_names, progress_bar, usable_cores

__all__ = [
    "AuditedRun",
    "audited_private_run",
    "canary_scores",
    "canary_step_scores",
    "audit_result",
    "audit_config",
    "check_supported",
    "SUPPORTED",
    "DEFAULT_CANARIES",
    "DEFAULT_KIND",
]

DEFAULT_CANARIES = 1000
DEFAULT_KIND = "dirac"

# The TrainConfig fields audit_config carries into the audited run; any other field set away
# from its default is refused (a setting the audit would drop would audit another run).
SUPPORTED = frozenset(
    {
        "dataset",
        "data_dir",
        "model",
        "epsilon",
        "delta",
        "noise_multiplier",
        "epochs",
        "batch_size",
        "physical_batch_size",
        "clip",
        "clipping",
        "optimizer",
        "lr",
        "momentum",
        "weight_decay",
        "seed",
        "accountant",
        "method",
        "method_options",
        "route",
        "threads",
        "device",
    }
)


def check_supported(cfg: TrainConfig) -> None:
    """Refuse a configuration with a setting :func:`audit_config` does not carry over."""
    for f in dataclasses.fields(TrainConfig):
        if f.name not in SUPPORTED and getattr(cfg, f.name) != f.default:
            raise ValueError(
                f"{f.name} must be unset for dpfy audit, got {f.name} = "
                f"{getattr(cfg, f.name)!r}. The audit does not carry this setting into its "
                f"run; audit the configuration without it"
            )


def _template(train: Dataset) -> tuple[Any, Any]:
    """An input of the data's shape (zeros) and a label: what a canary row feeds the model."""
    x, y = train[0]
    label = torch.zeros_like(y) if torch.is_tensor(y) else type(y)(0)  # same type as real
    return torch.zeros_like(torch.as_tensor(x)), label


@dataclass(frozen=True)
class AuditedRun:
    """A private run with canaries: the run, its bound canary method, its training set."""

    private: PrivateRun
    probe: CanaryGradients
    dataset: CanaryDataset


def audited_private_run(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    train: Dataset,
    *,
    canaries: CanarySet,
    batch_size: int,
    epochs: int,
    method: Any = None,
    **engine: Any,
) -> AuditedRun:
    """``private_run`` on ``train`` plus the included canaries, with the canary method chained
    after ``method`` (a method, a name, or a list of them). ``engine``: the rest of
    ``make_private``'s arguments."""
    data = CanaryDataset(train, canaries, _template(train))
    probe = CanaryGradients(canaries, data)
    methods = (
        list(method) if isinstance(method, (list, tuple)) else ([] if method is None else [method])
    )
    private = private_run(
        model,
        optimizer,
        data,
        batch_size=batch_size,
        epochs=epochs,
        method=methods + [probe],
        **engine,
    )
    probe = find_canaries(private.optimizer.method)
    probe.bind(private.loader.cursor)
    return AuditedRun(private=private, probe=probe, dataset=data)


def _state(optimizer: Any) -> torch.Tensor:
    state = optimizer.method_state
    if isinstance(state, dict):
        state = state[CanaryGradients.registry_name]
    return state


def canary_scores(optimizer: Any) -> np.ndarray:
    """The linear scores Σ_t b·⟨g̃_t, u_j⟩ of every canary, from the canary method's state."""
    return _state(optimizer)[0].numpy()


def canary_step_scores(optimizer: Any) -> np.ndarray:
    """The per-step log-likelihood-ratio scores of every canary, summed over the steps
    (:func:`dpfy.audit.canaries.step_scores`): what the audit tests."""
    return _state(optimizer)[1].numpy()


def audit_result(
    private: PrivateRun,
    canaries: CanarySet,
    *,
    delta: float,
    accountant: str | None = None,
    confidence: float = 0.95,
    planted_noise_scale: float | None = None,
) -> AuditResult:
    """The audit of a finished run: claimed ε from its ledger, bounds and the GDP estimate
    from its canaries' per-step scores."""
    opt = private.optimizer
    accountant = accountant or opt.accountant
    return audit_scores(
        canary_step_scores(opt),
        canaries.included.numpy(),
        claimed_epsilon=opt.epsilon(delta, accountant=accountant),
        delta=delta,
        accountant=accountant,
        steps=opt.step_count,
        confidence=confidence,
        canary_kind=canaries.kind,
        planted_noise_scale=planted_noise_scale,
    )


def audit_config(
    cfg: TrainConfig,
    *,
    canaries: int = DEFAULT_CANARIES,
    out: str | Path | None = None,
    data=None,
    model: nn.Module | None = None,
    progress: bool = False,
    echo: Callable[[str], None] = print,
    canary_kind: str = DEFAULT_KIND,
    plant_noise_scale: float | None = None,
) -> AuditResult:
    """Train ``cfg`` with ``canaries`` canaries and audit it; write its report into ``out``.

    Model init, sampling, noise and the canary draw come from ``cfg.seed`` when given, else
    from fresh OS randomness (the canary draw is the audit's secret either way).
    ``canary_kind``: ``"dirac"`` (the model is wrapped in a CanarySink) or ``"direction"``.
    ``plant_noise_scale``: multiply the noise std by this behind the ledger's back (a power
    test; the run is never published and no privacy report is written).
    """
    check_names(cfg, data, model)
    check_accountable(cfg)
    check_supported(cfg)
    device = resolve_device(cfg.device)  # an unusable --device is refused before any work
    require(canary_kind in KINDS, "canary_kind", canary_kind, f"one of {list(KINDS)}")
    run = RunDir.create(out) if out is not None else None
    try:
        data = data if data is not None else load_dataset(cfg.dataset, data_dir=cfg.data_dir)
        cfg, rule = resolve(cfg, num_examples=data.num_train, reference_delta=data.reference_delta)
        cfg = dataclasses.replace(cfg, device=str(device))  # config.json names the device
        assert cfg.batch_size is not None and cfg.delta is not None  # resolve fills both
        torch.set_num_threads(cfg.threads or usable_cores())
        seed = cfg.seed if cfg.seed is not None else secrets.randbits(63)
        torch.manual_seed(seed)
        if model is None:
            model = build_model(
                cfg.model, input_shape=data.input_shape, num_classes=data.num_classes
            )
        model = model.to(device)  # the batches follow it (run_epoch)
        if canary_kind == "dirac":
            model = CanarySink(model, canaries)
        draw = CanarySet.draw(
            model, canaries, torch.Generator().manual_seed(seed + 1), kind=canary_kind
        )
        optimizer = make_optimizer(cfg, [p for p in model.parameters() if p.requires_grad])
        audited = audited_private_run(
            model,
            optimizer,
            data.train,
            canaries=draw,
            method=build_methods(cfg),
            **run_options(cfg),
        )
        private = audited.private
        if plant_noise_scale is not None:
            plant(private.optimizer, plant_noise_scale)
            echo(
                f"dpfy audit: noise × {plant_noise_scale:g} PLANTED behind the ledger's back "
                f"(a power test): this run's claimed ε is false by construction; it is never "
                f"published (no privacy report, ledger or model is written)"
            )
        echo(
            f"dpfy audit: {cfg.dataset} + {int(draw.included.sum())} included "
            f"{canary_kind} canaries of {canaries}, {private.total_steps} steps, "
            f"q = {private.sample_rate:.5g}"
        )
        bar = progress_bar(private.total_steps, 0, progress)
        try:
            for _ in range(cfg.epochs):
                run_epoch(private, bar=bar, delta=cfg.delta)
        finally:
            if bar is not None:
                bar.close()
        result = audit_result(
            private,
            draw,
            delta=cfg.delta,
            accountant=cfg.accountant,
            planted_noise_scale=plant_noise_scale,
        )
        if run is not None and plant_noise_scale is not None:
            write_atomic(
                run.staging / "config.json", cfg.to_public_json(private.optimizer.spec) + "\n"
            )
            write_atomic(run.staging / "audit.json", json.dumps(result.to_dict(), indent=2) + "\n")
            run.finalize()
        elif run is not None:
            staged = dataclasses.replace(
                data,
                train=audited.dataset,
                description=f"{data.description}, plus {result.canaries_in} included canaries",
            )
            _write(run, cfg, rule, staged, private, result, evaluate(private.model, data.test))
            run.finalize()
        return result
    except BaseException:
        if run is not None:
            shutil.rmtree(run.staging, ignore_errors=True)
        raise


def _write(
    run,
    cfg: TrainConfig,
    rule: str,
    data,
    private: PrivateRun,
    result: AuditResult,
    test: Sequence[float],
) -> None:
    """The audited run's privacy report (with the audit section), ledger and audit.json."""
    write_report(
        cfg,
        {"delta_rule": rule, "device": device_description(model_device(private.model))},
        data,
        private,
        run.staging,
        sections=(result.section(),),
    )
    write_atomic(run.staging / "ledger.json", private.optimizer.ledger.to_json(indent=1) + "\n")
    write_atomic(run.staging / "config.json", cfg.to_public_json(private.optimizer.spec) + "\n")
    audit = {**result.to_dict(), "test_loss": float(test[0]), "test_acc": float(test[1])}
    write_atomic(run.staging / "audit.json", json.dumps(audit, indent=2) + "\n")
