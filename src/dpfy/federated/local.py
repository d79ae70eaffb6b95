"""The client's side of DP-FedAvg: local training from the global model, the model delta, and
its clipping (McMahan et al. 2018; Algorithm 2 of Ponomareva et al. 2023, "How to DP-fy ML").

A sampled user starts from the global parameters θ, runs ``epochs`` passes of plain
(non-private) minibatch SGD on their own examples, and returns the model delta
Δ_u = θ − ω_u (the start minus the end, so the server's θ ← θ − η_s·mean(Δ) is a descent
step). Local training needs no noise: the delta is one user's contribution, clipped as one
unit to ‖Δ̃_u‖ ≤ C, and the server adds the noise once, to the sum over users.

With one local step (``epochs=1``, a single full batch, ``lr=1`` and a summed loss), Δ_u is
the user's gradient sum Σ_{i∈u} ∇ℓ_i(θ): DP-FedSGD, which is user-level sampling (ULS) with a
per-user clip on the sum.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import torch
from torch import nn

from dpfy._require import require

__all__ = [
    "LocalTraining",
    "trainable_state",
    "local_delta",
    "delta_norm",
    "clip_delta",
    "local_generator",
    "local_seed",
    "user_contribution",
]

Delta = dict[str, torch.Tensor]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class LocalTraining:
    """The public hyperparameters of a user's local training (the same for every user).

    Args:
      epochs: passes over the user's examples (K/⌈n_u/B_m⌉ of Algorithm 2), >= 1.
      lr: η_c, the local SGD learning rate, > 0.
      batch_size: B_m, the local minibatch size; None: the user's whole data in one batch.
    """

    def __init__(self, *, epochs: int = 1, lr: float = 0.1, batch_size: int | None = None) -> None:
        require(isinstance(epochs, int) and epochs >= 1, "epochs", epochs, "an integer >= 1")
        require(lr > 0 and math.isfinite(lr), "lr", lr, "> 0 and finite")
        require(
            batch_size is None or (isinstance(batch_size, int) and batch_size >= 1),
            "batch_size",
            batch_size,
            "None (the whole user) or an integer >= 1",
        )
        self.epochs, self.lr, self.batch_size = epochs, float(lr), batch_size

    def to_config(self) -> dict[str, float | int]:
        """Flat public values (what the server sends to a client each round)."""
        return {
            "local-epochs": self.epochs,
            "local-lr": self.lr,
            "local-batch-size": 0 if self.batch_size is None else self.batch_size,
        }

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "LocalTraining":
        size = int(config["local-batch-size"])
        return cls(
            epochs=int(config["local-epochs"]),
            lr=float(config["local-lr"]),
            batch_size=None if size == 0 else size,
        )


def trainable_state(model: nn.Module) -> Delta:
    """{name: detached copy} of the trainable parameters (what DP-FedAvg aggregates)."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def local_delta(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: LossFn,
    training: LocalTraining,
    *,
    generator: torch.Generator | None = None,
) -> Delta:
    """Δ_u = θ − ω_u after local SGD on one user's examples (``model`` holds θ; it is left at
    ω_u, so pass a working copy of the global model).

    Minibatches follow a permutation drawn from ``generator`` each epoch (data order when
    None). Local training is not private by itself: the delta must be clipped
    (:func:`clip_delta`) and noised on the server.
    """
    require(
        len(x) == len(y) and len(x) >= 1,
        "the user's data",
        f"{len(x)} inputs, {len(y)} targets",
        "non-empty and aligned",
    )
    start = trainable_state(model)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    n = len(x)
    size = n if training.batch_size is None else min(training.batch_size, n)
    model.train()
    for _ in range(training.epochs):
        order = torch.arange(n) if generator is None else torch.randperm(n, generator=generator)
        for lo in range(0, n, size):
            idx = order[lo : lo + size]
            model.zero_grad(set_to_none=True)
            loss_fn(model(x[idx]), y[idx]).backward()
            with torch.no_grad():
                for _, p in params:
                    if p.grad is not None:
                        p.sub_(training.lr * p.grad)
    model.zero_grad(set_to_none=True)
    return {n: start[n] - p.detach() for n, p in params}


def delta_norm(delta: Mapping[str, torch.Tensor]) -> float:
    """‖Δ‖₂ over all parameters together (one user is one unit), in float64."""
    return math.sqrt(sum(float(t.double().square().sum()) for t in delta.values()))


def clip_delta(delta: Mapping[str, torch.Tensor], clip: float) -> tuple[Delta, float]:
    """(Δ · min(1, C/‖Δ‖), ‖Δ‖): the clipped delta and the norm before clipping.

    Scaled in float32 at least: a bfloat16 or float16 product rounds each entry by up to 2⁻⁸
    (2⁻¹¹ for float16) relative, which can land the delta above C, where the server refuses it
    (float32's 2⁻²⁴ is within the server's check)."""
    require(clip > 0, "clip", clip, "> 0")
    norm = delta_norm(delta)
    scale = min(1.0, clip / norm) if norm > 0 else 1.0
    wide = {n: t.to(torch.promote_types(t.dtype, torch.float32)) for n, t in delta.items()}
    return {n: t * scale for n, t in wide.items()}, norm


def local_seed(seed: int | None, round_index: int, user: int) -> int | None:
    """The seed of one user's minibatch order in one round (None: data order).

    Local shuffling is not where the privacy comes from (the clip and the server's noise
    are); it is derived from (seed, round, user) so the in-process and the Flower runs of one
    seed train the same local models. Python hashes tuples of ints deterministically.
    """
    if seed is None:
        return None
    return hash((int(seed), int(round_index), int(user))) & 0x7FFF_FFFF_FFFF_FFFF


def local_generator(seed: int | None) -> torch.Generator | None:
    """A torch generator seeded with ``seed`` (a :func:`local_seed`), or None."""
    return None if seed is None else torch.Generator().manual_seed(int(seed))


def user_contribution(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: LossFn,
    training: LocalTraining,
    clip: float,
    *,
    generator: torch.Generator | None = None,
) -> tuple[Delta, float]:
    """A sampled user's whole client step: local training, then the clipped delta.

    Returns (Δ̃_u, ‖Δ_u‖). ``model`` must hold the global parameters; it is left at ω_u.
    """
    return clip_delta(local_delta(model, x, y, loss_fn, training, generator=generator), clip)
