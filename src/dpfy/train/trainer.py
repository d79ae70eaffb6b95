"""The training run behind ``dpfy train``: data → model → private optimizer → epochs → report.

:func:`train` starts a run in a new directory; :func:`resume` continues an interrupted one
exactly (same data order, noise and ledger) from its last epoch checkpoint. Both write into
``<out>.partial/`` and rename it to ``<out>/`` only after the model, metrics, plots and the
privacy report are written (see :mod:`dpfy.train.rundir`).

Privacy: the only path to the model's weights is ``dpfy.make_private``'s optimizer; ε is read
from its ledger by an accountant. Train loss/accuracy are logged as non-private diagnostics.
Nothing published holds a seed or generator state (see :mod:`dpfy.train.config`): those live
only in ``checkpoint.pt`` (and ``checkpoint.prev.pt``, the one before), which are deleted
when the run finishes. Every file is written atomically with fsync; a run killed at any point
(``kill -9`` included) continues with ``--resume`` to the same bytes an uninterrupted run with
the same seed writes (docs/fault_tolerance.md). A run that fails before its
first checkpoint leaves no directory behind, so the same ``--out`` can be used again.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import secrets
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from torch import nn
from tqdm.auto import tqdm

from dpfy._require import require, require_extra
from dpfy.data import DataSplits, load_dataset
from dpfy.errors import SeedWarning
from dpfy.individual_tracking import save_norms
from dpfy.models import build_model
from dpfy.privacy.individual import load_budgets, random_budgets
from dpfy.privacy.report_text import SAMPLER_WORDS
from dpfy.privacy.statement import ledger_statement, stated_delta, stated_epsilon
from dpfy.train.checkpoint import Checkpoint, load_latest
from dpfy.train.device import device_description, hold_on_device, resolve_device
from dpfy.train.config import RESUME_IGNORED, SEED_WARNING, TrainConfig, parse_floats, resolve
from dpfy.train.epoch import run_epoch
from dpfy.train.averaging import ParameterAverage, averaging_section
from dpfy.train.evaluate import evaluate
from dpfy.train.metrics import MetricsLog
from dpfy.train.plots import plot_accuracy
from dpfy.train.preflight import check_accountable, check_names
from dpfy.train.private import make_optimizer, make_private_run, private_run, run_options
from dpfy.train.report import (
    ALGORITHM,
    augmult_description,
    clip_description,
    write_report,
)
from dpfy.train.rundir import COMPLETE_MARKER, RunDir, write_atomic

__all__ = [
    "TrainResult",
    "train",
    "resume",
    "usable_cores",
    "check_names",
    "check_accountable",
    "progress_bar",
]

Echo = Callable[[str], None]


@dataclass(frozen=True)
class TrainResult:
    """Where a finished run is and what it achieved."""

    out: Path
    epsilon: float
    delta: float
    test_acc: float
    wall_time_s: float
    config: TrainConfig

    @property
    def report(self) -> Path:
        return self.out / "privacy_report.md"


def usable_cores() -> int:
    """Cores this process may run on (the affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def train(
    cfg: TrainConfig,
    *,
    out: str | Path,
    data: DataSplits | None = None,
    model: nn.Module | None = None,
    progress: bool = True,
    echo: Echo = print,
) -> TrainResult:
    """Train privately according to ``cfg`` and write everything to ``out``.

    Args:
      cfg: the configuration; δ is resolved here when unset. Without ``cfg.seed`` the run is
        secure (nothing can reproduce its noise); with it, anyone holding the seed can.
      out: a directory that must not exist yet.
      data: your own train/test splits (default: ``load_dataset(cfg.dataset)``).
      model: your own module (default: ``build_model(cfg.model)``). Its initial weights are
        used as given (the seed then fixes sampling and noise only).
      progress: show a progress bar with the ε spent so far.
      echo: where the resolved config and the privacy statement are printed.
    """
    check_names(cfg, data, model)
    check_accountable(cfg)
    resolve_device(cfg.device)  # an unusable --device is refused before the data is read
    require_extra("matplotlib", feature="dpfy train (it writes accuracy.png)")
    run = RunDir.create(out)  # before any slow work: an unwritable --out fails at once
    try:
        with run.held():
            data = data if data is not None else load_dataset(cfg.dataset, data_dir=cfg.data_dir)
            resolved, delta_rule = resolve(
                cfg, num_examples=data.num_train, reference_delta=data.reference_delta
            )
            return _run(
                resolved, {"delta_rule": delta_rule}, run, data, model, None, progress, echo
            )
    except BaseException:
        if not run.has_checkpoint() and not run.is_complete():  # nothing to resume: no trace
            shutil.rmtree(run.staging, ignore_errors=True)
        raise


def resume(
    path: str | Path,
    *,
    overrides: Mapping[str, Any] | None = None,
    data: DataSplits | None = None,
    model: nn.Module | None = None,
    progress: bool = True,
    echo: Echo = print,
) -> TrainResult:
    """Continue the interrupted run at ``path`` from its last checkpoint.

    ``overrides`` are settings the user gave again (flags or a config file); each must equal
    the stored value, except ``data_dir`` and ``threads``, which may change. A damaged
    ``checkpoint.pt`` falls back to ``checkpoint.prev.pt`` (one warning line through ``echo``);
    a run killed after it finished writing (only its rename was missing) is renamed.
    """
    require_extra("matplotlib", feature="dpfy train (it writes accuracy.png)")
    run = RunDir.for_resume(path)
    with run.held():
        if run.is_complete():
            return _rename_finished(run, echo)
        run.remove_temporaries()
        ckpt = load_latest(run, echo)
        return _resume(run, ckpt, overrides, data, model, progress, echo)


def _resume(
    run: RunDir,
    ckpt: Checkpoint,
    overrides: Mapping[str, Any] | None,
    data: DataSplits | None,
    model: nn.Module | None,
    progress: bool,
    echo: Echo,
) -> TrainResult:
    stored = TrainConfig.from_mapping(ckpt.config, source="checkpoint")
    overrides = dict(overrides or {})
    differ = {
        k: v for k, v in overrides.items() if k not in RESUME_IGNORED and getattr(stored, k) != v
    }
    if differ:
        name = sorted(differ)[0]
        raise ValueError(
            f"{name} must match the interrupted run when resuming, got {name} = "
            f"{differ[name]!r} but the run used {getattr(stored, name)!r}"
            + (f" (also differ: {sorted(differ)[1:]})" if len(differ) > 1 else "")
            + ". Drop the differing settings, or start a new run with --out"
        )
    cfg = dataclasses.replace(stored, **{k: v for k, v in overrides.items() if k in RESUME_IGNORED})
    require(
        cfg.individual_accounting is None,
        "individual_accounting",
        cfg.individual_accounting,
        "unset to resume (the norms recorded before are lost)",
        "Start a new run with --out",
    )
    check_names(cfg, data, model)
    data = data if data is not None else load_dataset(cfg.dataset, data_dir=cfg.data_dir)
    return _run(cfg, ckpt.notes, run, data, model, ckpt, progress, echo)


def _run(
    cfg: TrainConfig,
    notes: dict[str, Any],
    run: RunDir,
    data: DataSplits,
    model: nn.Module | None,
    ckpt: Checkpoint | None,
    progress: bool,
    echo: Echo,
) -> TrainResult:
    device = resolve_device(cfg.device)
    cfg = dataclasses.replace(cfg, device=str(device))  # config.json names the device
    assert cfg.delta is not None, "resolve() set δ (a checkpoint holds the resolved config)"
    notes = {**notes, "device": device_description(device)}
    data = hold_on_device(data, device)  # a training set that fits is copied there once
    torch.set_num_threads(cfg.threads or usable_cores())
    # Model init: the given seed, or a fresh secret one that is never stored (a resumed run
    # loads its weights and torch's RNG state from the checkpoint). Sampling and noise: the
    # engine, seeded by cfg.seed or secure when it is None.
    torch.manual_seed(cfg.seed if cfg.seed is not None else secrets.randbits(63))
    if model is None:
        model = build_model(cfg.model, input_shape=data.input_shape, num_classes=data.num_classes)
    model = model.to(device)
    with warnings.catch_warnings():  # a seeded run's warning is echoed below, once
        warnings.simplefilter("ignore", SeedWarning)
        private = (
            _individual_run(cfg, model, data)
            if cfg.individual is not None
            else make_private_run(cfg, model, data)
        )
    metrics = MetricsLog()
    start_epoch, elapsed = 0, 0.0
    average = ParameterAverage(private.model, cfg.ema) if cfg.ema is not None else None
    if ckpt is None:
        write_atomic(run.staging / "config.json", cfg.to_public_json(private.optimizer.spec) + "\n")
        echo(_statement(cfg, notes, data, private))
    else:
        private.model.load_state_dict(ckpt.model)
        private.optimizer.load_state_dict(ckpt.optimizer)
        torch.set_rng_state(ckpt.torch_rng)
        if average is not None:
            average.load_state_dict(ckpt.extra["ema"])
        metrics = MetricsLog(list(ckpt.metrics))
        start_epoch = ckpt.epoch
        elapsed = metrics.last()["wall_time_s"] if metrics.rows else 0.0
        echo(f"dpfy train: resuming {run.final} after epoch {start_epoch} of {cfg.epochs}")
    if cfg.reproducible:  # at every start, a resumed one too
        echo(f"dpfy train: WARNING: {SEED_WARNING}.")
    t0 = time.monotonic() - elapsed
    bar = progress_bar(private.total_steps, private.optimizer.step_count, progress)
    try:
        for epoch in range(start_epoch, cfg.epochs):
            stats = run_epoch(
                private,
                bar=bar,
                delta=cfg.delta,
                on_step=None
                if average is None
                else lambda opt: average.update(private.model) if opt.updated else None,
            )
            test_loss, test_acc = evaluate(private.model, data.test)
            ema_metrics = {}
            if average is not None:
                with average.swapped_in(private.model) as averaged:
                    ema_metrics = dict(
                        zip(("test_loss_ema", "test_acc_ema"), evaluate(averaged, data.test))
                    )
            if (
                cfg.public_validation == "test"
                and private.optimizer.method is not None
                and private.optimizer.method.implements("observe")
            ):
                private.optimizer.observe(val_metric=test_acc)  # declared public by the user
            eps = float(private.optimizer.epsilon(cfg.delta, approximate=True))  # as labelled
            info = private.optimizer.last_step_info or {}
            metrics.append(
                epoch=epoch + 1,
                step=private.optimizer.step_count,
                epsilon=eps,
                noise_multiplier=info.get("noise_multiplier"),
                clip=info.get("clip"),
                lr=_lr(private.optimizer, info),
                train_loss_nonprivate=stats.loss,
                train_acc_nonprivate=stats.acc,
                test_loss=test_loss,
                test_acc=test_acc,
                wall_time_s=round(time.monotonic() - t0, 2),
                **ema_metrics,
            )
            if bar is not None:
                bar.set_postfix_str(f"ε={eps:.3f} test_acc={100 * test_acc:.2f}%")
            metrics.write(run.staging)
            Checkpoint(
                config=cfg.to_dict(),
                notes=notes,
                epoch=epoch + 1,
                model=private.model.state_dict(),
                optimizer=private.optimizer.state_dict(),
                metrics=metrics.rows,
                torch_rng=torch.get_rng_state(),
                extra={} if average is None else {"ema": average.state_dict()},
            ).save(run.checkpoint, previous=run.previous_checkpoint)
    finally:
        if bar is not None:
            bar.close()
    return _finish(cfg, notes, run, data, private, metrics, time.monotonic() - t0, echo, average)


def _individual_run(cfg: TrainConfig, model: nn.Module, data: DataSplits):
    """The private run for --individual: per-example budgets from --budgets-file, or groups
    from --budgets/--budget-fractions assigned at random with the public --budget-seed."""
    if cfg.budgets_file is not None:
        budgets = load_budgets(cfg.budgets_file)
    else:
        assert cfg.budgets is not None and cfg.budget_fractions is not None, "TrainConfig checks"
        budgets = random_budgets(
            parse_floats(cfg.budgets, "budgets"),
            parse_floats(cfg.budget_fractions, "budget_fractions"),
            data.num_train,
            cfg.budget_seed,
        )
    optimizer = make_optimizer(cfg, [p for p in model.parameters() if p.requires_grad])
    # run_options' σ and target ε are None and its clipping 'flat' here (TrainConfig checks)
    return private_run(
        model,
        optimizer,
        data.train,
        **run_options(cfg),
        budgets=budgets,
        individual=cfg.individual,
    )


def _group_lines(cfg: TrainConfig, private) -> str:
    """One line per privacy group: its budget and the ε it spent (individualized runs)."""
    groups = private.optimizer.privacy_groups
    spent = groups.epsilons(delta=cfg.delta, accountant=cfg.accountant)
    return "\n".join(
        f"dpfy train: group {p} ({g.size} examples): ε = {stated_epsilon(e)} of budget {g.budget:g}"
        for p, (g, e) in enumerate(zip(groups.groups, spent))
    )


def _lr(optimizer: Any, info: Mapping[str, Any]) -> float:
    base = optimizer.param_groups[0]["lr"]
    return float(base * info.get("lr_scale", 1.0))


def progress_bar(total: int, done: int, enabled: bool):
    """The run's step counter (``None`` when ``enabled`` is false)."""
    if not enabled:
        return None
    return tqdm(total=total, initial=done, desc="dpfy train", unit="step", dynamic_ncols=True)


def _statement(cfg: TrainConfig, notes: Mapping[str, Any], data: DataSplits, private) -> str:
    """The resolved config and a plain-English privacy statement (R15)."""
    budget = (
        f"target ε = {cfg.epsilon:g}"
        if cfg.epsilon is not None
        else f"fixed σ = {cfg.noise_multiplier:g}"
        if cfg.noise_multiplier is not None
        else f"individualized budgets, IDP-SGD {cfg.individual}: each group spends at "
        f"most its own ε (examples assigned at random, public seed "
        f"{cfg.budget_seed}; not private)"
        if cfg.budgets is not None
        else f"individualized budgets from {cfg.budgets_file}, IDP-SGD {cfg.individual}"
    )
    assert cfg.delta is not None, "δ is resolved before the run starts"
    sigma = private.noise_multiplier
    noise = (
        f"noise multiplier σ = {sigma:.4g}"
        if sigma is not None
        else f"noise multiplier σ_t from method '{cfg.method}'"
    )
    unit = (
        ""
        if cfg.user_ids is None
        else f", user-level DP ({cfg.user_sampling.upper()}, "  # type: ignore[union-attr]
        f"{private.optimizer.sampler.dataset_size} users; the unit of privacy is one user)"
    )
    batch = "users" if cfg.user_sampling == "uls" else "batch"
    return (
        f"dpfy train: resolved config:\n{cfg.to_public_json()}\n"
        f"dpfy train: {ALGORITHM[cfg.noise]} on {data.name} (N = {data.num_train}){unit}, "
        f"{SAMPLER_WORDS.get(private.optimizer.sampler.sampling.value, 'Poisson sampling')} "
        f"with rate q = {private.sample_rate:.5g} (expected {batch} {cfg.batch_size}), "
        f"{private.total_steps} steps, {clip_description(private)}"
        f"{augmult_description(cfg)}, "
        f"{noise} ({budget}); "
        f"δ = {stated_delta(cfg.delta)} "
        f"({notes.get('delta_rule', 'given')}); ε accounted with {cfg.accountant.upper()}."
    )


def _finish(
    cfg: TrainConfig,
    notes: Mapping[str, Any],
    run: RunDir,
    data: DataSplits,
    private,
    metrics: MetricsLog,
    wall: float,
    echo: Echo,
    average: ParameterAverage | None = None,
) -> TrainResult:
    assert cfg.delta is not None, "resolve() set δ"
    staging = run.staging
    buf = io.BytesIO()
    torch.save(private.model.state_dict(), buf)
    write_atomic(staging / "model.pt", buf.getvalue())
    if average is not None:  # post-processing of the released iterates: the same ε
        buf = io.BytesIO()
        torch.save(average.state_dict_of(private.model), buf)
        write_atomic(staging / "model_ema.pt", buf.getvalue())
        sections = [averaging_section(cfg, metrics.last())]
    else:
        sections = []
    write_atomic(staging / "ledger.json", private.optimizer.ledger.to_json(indent=1) + "\n")
    save_norms(private.optimizer, staging)  # --individual-accounting: private, run dir only
    plot_accuracy(metrics.rows, staging / "accuracy.png", title=data.name)
    groups = private.optimizer.privacy_groups
    if groups is not None:  # individualized budgets: per-group table and ε over steps
        sections.append(groups.report_section(delta=cfg.delta, accountant=cfg.accountant))
        groups.plot(staging / "group_epsilon.png", delta=cfg.delta, accountant=cfg.accountant)
    eps = write_report(cfg, notes, data, private, staging, sections=sections)
    summary = {
        "epsilon": eps,
        "delta": cfg.delta,
        "accountant": cfg.accountant,
        "test_acc": metrics.last()["test_acc"],
        "epochs": cfg.epochs,
        "steps": private.optimizer.step_count,
        "wall_time_s": round(wall, 2),
    }
    if average is not None:
        summary.update(test_acc_ema=metrics.last()["test_acc_ema"], ema=cfg.ema)
    # summary.json last: it marks the staging directory complete (RunDir.is_complete), so a
    # kill from here on leaves a run that --resume only renames.
    write_atomic(staging / COMPLETE_MARKER, json.dumps(summary, indent=2) + "\n")
    out = run.finalize()  # drops the secret checkpoints first
    stated = ledger_statement(private.optimizer.ledger, eps, cfg.delta, cfg.accountant.upper())
    echo(
        f"dpfy train: test accuracy {100 * summary['test_acc']:.2f}% after "
        f"{summary['steps']} steps, {wall:.0f} s; {stated}"
    )
    if average is not None:
        echo(
            f"dpfy train: parameter average (EMA, β = {cfg.ema:g}, model_ema.pt): test "
            f"accuracy {100 * summary['test_acc_ema']:.2f}%"
        )
    if groups is not None:
        echo(_group_lines(cfg, private))
    echo(f"dpfy train: privacy report: {out / 'privacy_report.md'}")
    return TrainResult(
        out=out,
        epsilon=eps,
        delta=cfg.delta,
        test_acc=summary["test_acc"],
        wall_time_s=wall,
        config=cfg,
    )


def _rename_finished(run: RunDir, echo: Echo) -> TrainResult:
    """Finish a run that was killed after writing everything, before its rename."""
    summary = json.loads((run.staging / COMPLETE_MARKER).read_text())
    public = json.loads((run.staging / "config.json").read_text())
    cfg = TrainConfig.from_mapping(public, source="config.json")  # seed blanked: public copy
    out = run.finalize()
    echo(f"dpfy train: {out} had finished writing before it was interrupted; renamed it")
    echo(f"dpfy train: privacy report: {out / 'privacy_report.md'}")
    return TrainResult(
        out=out,
        epsilon=summary["epsilon"],
        delta=summary["delta"],
        test_acc=summary["test_acc"],
        wall_time_s=summary["wall_time_s"],
        config=cfg,
    )
