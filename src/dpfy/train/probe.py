"""One tuning run of the guide's recipe: train for a fixed number of steps, score on validation.

A *probe* is the unit the tuning recipe (:mod:`dpfy.train.recipe`) is made of: a model trained
with dpfy's private optimizer at given (lr, C, σ, batch size) for exactly ``steps`` Poisson
batches, then scored on held-out data. It writes nothing and publishes nothing: its model is
thrown away, only its validation metric (and, when σ > 0, the ε of its own ledger) is kept.

Every probe goes through ``dpfy.make_private`` (the same sampler, clipping and b = qN
normalization as ``dpfy train``), so a learning rate found by a probe means the same thing in
the final run. Two settings exist only here:

- ``noise_multiplier = 0`` (the guide's non-private runs and ClipSearch, Ponomareva et al.
  2023, §5.4.1): **no noise, no privacy** — such a probe is a non-private use of the data it
  trains on, and its ε is infinite (``epsilon`` is ``math.inf``);
- ``clip = math.inf``: clipping off (g / max(1, ‖g‖/∞) = g), the guide's "non-private setting"
  in which the learning rate is tuned first.

``steps`` is the number of optimizer updates, not epochs, so that a probe at a small batch can
take exactly as many steps as the large run it stands for (Sander et al. 2023's fixed-step
proxy, :func:`dpfy.train.recipe.tan_noise_multiplier`).
"""

from __future__ import annotations

import dataclasses
import math
import secrets
import warnings
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from dpfy._require import require
from dpfy.api import make_private
from dpfy.errors import SeedWarning
from dpfy.models import build_model
from dpfy.privacy.accountants import pld_min_noise_multiplier
from dpfy.train.config import TrainConfig
from dpfy.train.device import resolve_device
from dpfy.train.evaluate import evaluate
from dpfy.train.private import make_optimizer

__all__ = ["Probe", "ProbeResult", "run_probe"]

# ε of a probe is read with this accountant when σ is below the PLD grid's floor (the small σ'
# of a fixed-noise proxy): RDP is rigorous there and cheap.
_SMALL_SIGMA_ACCOUNTANT = "rdp"


@dataclass(frozen=True)
class Probe:
    """What one probe trains with: the settings the recipe searches over."""

    lr: float
    clip: float  # math.inf: clipping off
    noise_multiplier: float  # 0: no noise (non-private)
    batch_size: int
    steps: int


@dataclass(frozen=True)
class ProbeResult:
    """A probe's validation loss and accuracy, and the ε of its own ledger (∞ at σ = 0)."""

    probe: Probe
    loss: float
    accuracy: float
    epsilon: float
    accountant: str

    def metric(self, select: str) -> float:
        """The validation metric ``select`` names (``"accuracy"`` or ``"loss"``)."""
        return self.accuracy if select == "accuracy" else self.loss


def run_probe(
    cfg: TrainConfig,
    probe: Probe,
    train: Dataset,
    validation: Dataset,
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    delta: float,
) -> ProbeResult:
    """Train ``cfg.model`` on ``train`` as ``probe`` says and score it on ``validation``.

    ``cfg`` supplies everything the probe does not vary (model, optimizer, momentum, weight
    decay, clipping policy, route, accountant, seed). With ``cfg.seed`` the probe is
    reproducible (model init, sampling); without it every draw is fresh and secret. A
    diverged probe (non-finite loss) scores accuracy 0 and loss ∞ rather than stopping the
    search.
    """
    n = len(train)  # type: ignore[arg-type]
    require(
        1 <= probe.batch_size <= n,
        "batch_size",
        probe.batch_size,
        f"in [1, {n}] (the examples the probe trains on)",
        "Lower --batch-size (or --tan-batch)",
    )
    require(probe.steps >= 1, "steps", probe.steps, ">= 1")
    require(probe.noise_multiplier >= 0, "noise_multiplier", probe.noise_multiplier, ">= 0")
    torch.manual_seed(cfg.seed if cfg.seed is not None else secrets.randbits(63))
    device = resolve_device(cfg.device)
    model: nn.Module = build_model(cfg.model, input_shape=input_shape, num_classes=num_classes)
    model = model.to(device)
    optimizer = make_optimizer(
        _with_lr(cfg, probe.lr), [p for p in model.parameters() if p.requires_grad]
    )
    with warnings.catch_warnings():
        # σ = 0 is intended here (the module docstring says what it means); a seed is the
        # recipe's own choice, warned about once by the caller.
        warnings.filterwarnings("ignore", message="noise_multiplier=0")
        warnings.simplefilter("ignore", SeedWarning)
        model, opt, loader = make_private(
            model,
            optimizer,
            DataLoader(train, batch_size=probe.batch_size),
            noise_multiplier=probe.noise_multiplier,
            max_grad_norm=probe.clip,
            clipping=cfg.clipping,
            route=cfg.route,
            seed=cfg.seed,
            poisson_sampling=True,
            accountant=cfg.accountant,
            max_steps=probe.steps,
            microbatch_size=cfg.microbatch_size,
            max_physical_batch_size=cfg.physical_batch_size,
        )
    diverged = False
    while opt.step_count < probe.steps and not diverged:
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            logits = model(x)
            # as dpfy.train.epoch.run_epoch: mean over the batch, an empty batch still steps
            loss = nn.functional.cross_entropy(logits, y) if len(y) else logits.sum()
            if not torch.isfinite(loss):
                diverged = True
                break
            loss.backward()
            opt.step()
            if opt.step_count >= probe.steps:
                break
    val_loss, val_acc = evaluate(model, validation)
    if diverged or not math.isfinite(val_loss):
        val_loss, val_acc = math.inf, 0.0
    epsilon, accountant = _probe_epsilon(opt, probe, cfg, delta)
    return ProbeResult(probe, val_loss, val_acc, epsilon, accountant)


def _with_lr(cfg: TrainConfig, lr: float) -> TrainConfig:
    return dataclasses.replace(cfg, lr=lr)


def _probe_epsilon(opt, probe: Probe, cfg: TrainConfig, delta: float) -> tuple[float, str]:
    """ε of the probe's own ledger at ``delta``: ∞ without noise; RDP below the PLD floor."""
    if probe.noise_multiplier == 0:
        return math.inf, "none"
    accountant = cfg.accountant
    if accountant == "pld" and probe.noise_multiplier < pld_min_noise_multiplier():
        accountant = _SMALL_SIGMA_ACCOUNTANT
    return float(opt.epsilon(delta, accountant=accountant)), accountant
