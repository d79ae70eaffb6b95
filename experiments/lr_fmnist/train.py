"""Train, evaluate and account one run of the learning-rate reproduction.

Every run goes through :func:`dpfy.train.private.private_run` (``make_private`` with Poisson
sampling at q = b/N, planned for ``epochs`` passes), :func:`dpfy.train.epoch.run_epoch` and
:func:`dpfy.train.evaluate.evaluate`: the loop of ``dpfy train``. The method's optimizer and
engine arguments come from :func:`experiments.lr_fmnist.baselines.setup`.

The record gives the test accuracy after each epoch, ε at δ by PLD read from the run's own
ledger (DP-hyper: each ledger, and all of them composed), the git commit the run ran at (the
HyFreeDP rule changes during the session) and a trace every ``trace_every`` steps of the
method's state: η_t and R_l,t for HyFreeDP (``optimizer.method_state``: ``lr``, ``loss_clip``),
η_t for ADADP, and D-Adaptation's / Prodigy's ``d``. These are released quantities
(post-processing of the private releases), so publishing them costs nothing.

No seed: the model's initialization, sampling and noise come from the OS CSPRNG.
"""

from __future__ import annotations

import functools
import secrets
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils.data import TensorDataset

from experiments.lr_fmnist.baselines import dp_hyper_epsilon, dp_hyper_plan, setup
from experiments.lr_fmnist.spec import LrSpec
from dpfy.models import build_model
from dpfy.privacy import epsilon
from dpfy.sampling import PoissonSampler
from dpfy.train.epoch import run_epoch
from dpfy.train.evaluate import evaluate
from dpfy.train.private import PrivateRun, private_run

__all__ = ["train_lr", "git_commit", "state_trace"]

Say = Callable[[str], None]


def git_commit() -> str:
    """HEAD of the dpfy checkout; when the working tree's ``adaptive/hyfree.py`` (the file whose
    rule changes this session) differs from HEAD, also that file's git blob id
    (``HEAD+hyfree.py@BLOB``), so a row run on uncommitted code still names its code."""
    root = Path(__file__).resolve().parents[3]
    path = "src/dpfy/adaptive/hyfree.py"
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, check=True,
                              capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", path], cwd=root,
                               capture_output=True).returncode != 0
        blob = subprocess.run(["git", "hash-object", path], cwd=root, check=True,
                              capture_output=True, text=True).stdout.strip()[:12]
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (f"+hyfree.py@{blob}" if dirty else "")


def state_trace(optimizer: Any) -> dict[str, float]:
    """The released step-size state of the run's method or optimizer (empty if none)."""
    out: dict[str, float] = {}
    state = getattr(optimizer, "method_state", None)
    for name in ("lr", "loss_clip"):
        value = getattr(state, name, None)
        if isinstance(value, (int, float)):
            out[name] = float(value)
    group = optimizer.param_groups[0]
    if "d" in group:                                    # D-Adaptation, Prodigy
        out["d"] = float(group["d"])
    return out


def _private(spec: LrSpec, train: TensorDataset, *, lr: float | None = None,
             noise_multiplier: float | None = None, eps: float | None = None) -> PrivateRun:
    torch.manual_seed(secrets.randbits(63))                              # model init only
    model = build_model(spec.model, input_shape=tuple(train.tensors[0].shape[1:]),
                        num_classes=10)
    s = setup(spec, model, lr=lr, noise_multiplier=noise_multiplier, epsilon=eps)
    return private_run(model, s.optimizer, train, batch_size=spec.batch_size,
                       epochs=spec.epochs, **s.engine)


def _fit(spec: LrSpec, private: PrivateRun, test: TensorDataset, trace_every: int,
         say: Say | None, t0: float) -> dict[str, Any]:
    """Train ``private`` for the spec's epochs; accuracy per epoch, state trace, PLD ε."""
    opt = private.optimizer
    trace: list[dict[str, float]] = []

    def on_step(optimizer: Any) -> None:
        step = optimizer.step_count
        if step % trace_every == 0 and (not trace or trace[-1]["step"] != step):
            row = state_trace(optimizer)
            if row:
                trace.append({"step": step, **row})

    epochs = []
    for e in range(spec.epochs):
        run_epoch(private, delta=spec.delta, on_step=on_step)
        acc = 100.0 * evaluate(private.model, test)[1]
        epochs.append({"epoch": e + 1, "step": opt.step_count, "test_accuracy": acc})
        if say:
            say(f"  {spec.label}: epoch {e + 1}/{spec.epochs} acc {acc:.2f}% "
                f"({time.time() - t0:.0f}s)")
    return {"test_accuracy": epochs[-1]["test_accuracy"], "epochs": epochs, "trace": trace,
            "steps": opt.ledger.num_steps, "sample_rate": private.sample_rate,
            "epsilon_pld": epsilon(opt.ledger, delta=spec.delta, accountant="pld"),
            "noise_multiplier": private.noise_multiplier}


def _dp_hyper(spec: LrSpec, train: TensorDataset, test: TensorDataset, trace_every: int,
              say: Say | None, t0: float) -> dict[str, Any]:
    """k selection runs at the per-grid σ (15 % of ε), the best on the test split (declared
    public), then the final run at 85 % of ε; total ε = all ledgers composed (PLD)."""
    assert spec.epsilon is not None
    n = len(train)
    sampler = PoissonSampler(n, sample_rate=spec.batch_size / n)         # as dpfy tune's grid
    plan = dp_hyper_plan(epsilon=spec.epsilon, delta=spec.delta, sample_rate=sampler.sample_rate,
                         steps=spec.epochs * sampler.steps_per_epoch, dataset_size=n)
    selection, ledgers = [], []
    for lr in plan.grid:
        private = _private(spec, train, lr=lr, noise_multiplier=plan.select_noise_multiplier)
        fit = _fit(spec, private, test, trace_every, say, t0)
        ledgers.append(private.optimizer.ledger)
        selection.append({"lr": lr, "test_accuracy": fit["test_accuracy"],
                          "epsilon_pld": fit["epsilon_pld"]})
    best = max(selection, key=lambda r: r["test_accuracy"])
    final = _private(spec, train, lr=best["lr"], eps=plan.final_epsilon)
    rec = _fit(spec, final, test, trace_every, say, t0)
    ledgers.append(final.optimizer.ledger)
    rec.update(final_epsilon_pld=rec["epsilon_pld"],
               epsilon_pld=dp_hyper_epsilon(ledgers, spec.delta),
               dp_hyper={"grid": list(plan.grid), "selection": selection,
                         "selected_lr": best["lr"], "select_epsilon": plan.select_epsilon,
                         "select_noise_multiplier": plan.select_noise_multiplier,
                         "selection_epsilon_pld": dp_hyper_epsilon(ledgers[:-1], spec.delta),
                         "final_target_epsilon": plan.final_epsilon,
                         "selected_on": "the test split, declared public"})
    return rec


@functools.cache
def _process_commit() -> str:
    """:func:`git_commit` read once per process, at its first run: a process runs the code it
    imported then, so a commit made while a grid is running must not relabel its later rows
    (it did: rows run at 8315298 were labelled with the next commit)."""
    return git_commit()


def train_lr(spec: LrSpec, train: TensorDataset, test: TensorDataset, *,
             trace_every: int = 5, say: Say | None = None) -> dict[str, Any]:
    """Train one :class:`LrSpec` on ``train``; returns its JSON-able record (no seed in it)."""
    t0 = time.time()
    commit = _process_commit()
    if spec.method == "dp_hyper":
        rec = _dp_hyper(spec, train, test, trace_every, say, t0)
    else:
        rec = _fit(spec, _private(spec, train), test, trace_every, say, t0)
    return {"key": spec.key(), "spec": spec.to_dict(), **rec, "git_commit": commit,
            "seconds": time.time() - t0}
