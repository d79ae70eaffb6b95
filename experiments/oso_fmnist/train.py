"""Train and account one run of the Galli et al. 2024 Fashion-MNIST comparison
(:mod:`oso_grid`'s RunSpec).

Private runs go through ``dpfy.make_private`` (Poisson sampling at q = b/N, planned for
``epochs`` passes) with the per-grid noise multiplier of their method's grid; NoDP is plain
SGD on shuffled batches of b for the same number of steps. After training the run's own
ledger is read by PLD twice: ε of the run, and ε of ``runs`` such runs composed (the grid),
which must not exceed the grid's budget; a run that would is refused (never written).

No seed: model initialization, sampling and noise come from the OS CSPRNG (a published seed
would undo the privacy of the run), so runs are not bit-reproducible by design.

Evaluation (Galli et al. 2024's protocol): on the test subset at step 0, every ``eval_every``
steps and at the end; the best value represents the run (selection on the test set is not
accounted, as in the paper). A run whose parameters stop being finite (a function of released
values only) is stopped and marked diverged.
"""

from __future__ import annotations

import math
import secrets
import time
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from dpfy import make_private
from dpfy._require import require
from dpfy.adaptive import make
from experiments.oso_fmnist.grid import (ADAMWOSM_LR, INITIAL_CLIP, QUANTILE_STEP, RunSpec,
                                       Settings, grid_noise_multiplier)
from dpfy.models import build_model
from dpfy.models.conv_autoencoder import conv_autoencoder
from dpfy.privacy import epsilon
from dpfy.privacy.tuning import composed_runs

__all__ = ["train_spec", "build_task_model", "task_loss", "evaluate_metric", "lower_is_better",
           "private_parts",
           "EPS_SLACK"]

# Relative slack on "grid ε ≤ budget": the calibration is on the safe side; this only absorbs
# float rounding of the same PLD computation.
EPS_SLACK = 1e-9
EVAL_BATCH = 1000


def lower_is_better(settings: Settings) -> bool:
    """MSE (autoencoder) is minimized, accuracy (classifier) maximized."""
    return settings.task == "autoencoder"


def build_task_model(settings: Settings, input_shape: tuple[int, ...]) -> nn.Module:
    """The task's model, initialized from a fresh OS-random torch seed (never published).

    The autoencoder is built directly: it is not in ``dpfy.models.MODELS``, whose models are
    classifiers that ``dpfy train`` fits with cross-entropy.
    """
    torch.manual_seed(secrets.randbits(63))
    if settings.task == "autoencoder":
        return conv_autoencoder(input_shape)
    return build_model("tanh_cnn", input_shape=input_shape, num_classes=10)


def task_loss(settings: Settings, model: nn.Module, x: torch.Tensor,
              y: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of the per-example loss (pixel-mean MSE, or cross-entropy)."""
    out = model(x)
    if len(x) == 0:                  # an empty Poisson batch still steps (noise only)
        return out.sum()
    if settings.task == "autoencoder":
        return nn.functional.mse_loss(out, x)
    return nn.functional.cross_entropy(out, y)


@torch.no_grad()
def evaluate_metric(settings: Settings, model: nn.Module, test: Dataset) -> float:
    """Test MSE (standardized pixels) or test accuracy in %."""
    was = model.training
    model.eval()
    total, n = 0.0, 0
    for x, y in DataLoader(test, batch_size=EVAL_BATCH):
        out = model(x)
        if settings.task == "autoencoder":
            total += float(nn.functional.mse_loss(out, x, reduction="sum")) / x[0].numel()
        else:
            total += 100.0 * float((out.argmax(1) == y).sum())
        n += len(x)
    model.train(was)
    return total / max(n, 1)


def _finite(model: nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


def private_parts(spec: RunSpec, model: nn.Module, train: Dataset):
    """(model, optimizer, loader, ν) of a private run, checked against the calibration."""
    s = spec.settings
    nu = grid_noise_multiplier(spec)
    if spec.method == "online":
        method = make("oso", initial_clip=INITIAL_CLIP, clip_rate=s.online_rate,
                      lr_rate=s.online_rate)
        opt, clip = torch.optim.SGD(model.parameters(), lr=spec.lr), INITIAL_CLIP
    elif spec.method == "quantile":
        method = make("quantile", initial_clip=INITIAL_CLIP, target_quantile=spec.quantile,
                      step_size=QUANTILE_STEP)
        opt, clip = torch.optim.SGD(model.parameters(), lr=spec.lr), INITIAL_CLIP
    elif spec.method == "adamwosm":
        method = make("adamwosm")
        opt = torch.optim.SGD(model.parameters(), lr=ADAMWOSM_LR, momentum=0.9)
        clip = spec.clip
    else:                                                          # threshold: DP-SGD
        method, clip = None, spec.clip
        opt = torch.optim.SGD(model.parameters(), lr=spec.lr)
    model, opt, loader = make_private(
        model, opt, DataLoader(train, batch_size=s.batch_size), noise_multiplier=nu,
        target_delta=s.delta, epochs=s.epochs, max_grad_norm=clip, method=method,
        accountant="pld", poisson_sampling=True)
    # ν was calibrated for (q, T) from the settings: the run must be exactly that run
    require(opt.max_steps == s.steps and math.isclose(loader.sampler.sample_rate, s.sample_rate),
            "the private run", f"T = {opt.max_steps}, q = {loader.sampler.sample_rate}",
            f"T = {s.steps}, q = {s.sample_rate} (what ν was calibrated for)",
            "This is a bug in the experiment: the sampler and the settings disagree")
    return model, opt, loader, nu


def _nodp(spec: RunSpec, model: nn.Module, train: Dataset):
    s = spec.settings
    gen = torch.Generator().manual_seed(secrets.randbits(63))
    batches = DataLoader(train, batch_size=s.batch_size, shuffle=True, generator=gen)
    opt = torch.optim.SGD(model.parameters(), lr=spec.lr)

    def loader():
        done = 0
        while True:
            for batch in batches:
                if done == s.steps:
                    return
                done += 1
                yield batch
    return model, opt, loader(), None


def train_spec(spec: RunSpec, train: TensorDataset, test: Dataset, *,
               progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Train, evaluate and account one run; returns its JSON-able record."""
    t0 = time.time()
    s = spec.settings
    model = build_task_model(s, tuple(train.tensors[0].shape[1:]))
    private = spec.method != "nodp"
    model, opt, loader, nu = (private_parts if private else _nodp)(spec, model, train)
    evals = [(0, evaluate_metric(s, model, test))]
    trace: dict[str, list] = {"step": [], "clip": [], "lr_scale": []}
    diverged, step = False, 0
    for x, y in loader:
        opt.zero_grad(set_to_none=True)
        task_loss(s, model, x, y).backward()
        opt.step()
        step += 1
        if private:
            info = opt.last_step_info                    # C_t, ρ_t/ρ_1: released values
            trace["step"].append(step)
            trace["clip"].append(float(info["clip"]))
            trace["lr_scale"].append(float(info.get("lr_scale", 1.0)))
        if not _finite(model):
            diverged = True
            break
        if step % s.eval_every == 0 or step == s.steps:
            evals.append((step, evaluate_metric(s, model, test)))
            if not math.isfinite(evals[-1][1]):
                diverged = True
                break
    record: dict[str, Any] = {
        "key": spec.key(), "spec": spec.to_dict(), "steps": step, "diverged": diverged,
        "evals": evals, "final": evals[-1][1] if not diverged else None,
        "seconds": time.time() - t0, "noise_multiplier": nu, "runs": spec.runs,
    }
    good = [v for _, v in evals if math.isfinite(v)]
    pick = min if lower_is_better(s) else max
    record["best"] = None if diverged or not good else pick(good)
    if private:
        ledger = opt.ledger
        record["epsilon_run_pld"] = epsilon(ledger, delta=s.delta, accountant="pld")
        record["epsilon_grid_pld"] = epsilon(composed_runs(ledger, spec.runs), delta=s.delta,
                                             accountant="pld")
        require(record["epsilon_grid_pld"] <= spec.epsilon * (1 + EPS_SLACK),
                "the grid's ε by PLD", record["epsilon_grid_pld"],
                f"<= the per-grid budget {spec.epsilon}",
                "This is a bug: the calibration and the run's ledger disagree")
        record["trace"] = trace
    if progress:
        progress(f"{spec.method} eps={spec.epsilon} {spec.hyperparameters()} "
                 f"rep={spec.replicate}: best {record['best']} "
                 f"({record['seconds']:.0f}s{', DIVERGED' if diverged else ''})")
    return record
