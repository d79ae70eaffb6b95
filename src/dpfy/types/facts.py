"""The facts of one run: fixed by ``make_private`` from the sampler and its arguments."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from dpfy.types.sampling import Sampling

__all__ = ["RunFacts"]


@dataclass(frozen=True)
class RunFacts:
    """The facts of one run, fixed by ``make_private`` from its sampler and arguments.

    A method reads them; it never takes them from the user a second time.
    """

    sampling: Sampling
    sample_rate: float  # q, the sampler's rate
    steps: int | None  # T, the ε guard's horizon (None: unbounded)
    dataset_size: int | None = None  # N
    steps_per_epoch: int | None = None  # logical batches per pass of the loader
    normalizer: float | None = None  # b, the public batch-size normalizer
    delta: float | None = None
    target_epsilon: float | None = None
    accountant: str = "pld"
    max_grad_norm: float | None = None  # C (C_0 of a clip schedule); None: per-layer etc.
    num_groups: int | None = None  # clipping groups (layers) of the model
    inner_optimizer: str | None = None  # class name of the torch optimizer make_private wraps
    inner_hyperparameters: Mapping[str, Any] | None = None  # its first param group, minus params
    max_examples_per_user: int | None = None  # k of an ELS run (user-level), recorded per step

    def differences(self, other: "RunFacts") -> list[str]:
        """The facts that differ, as ``name: mine vs other`` strings."""
        out = []
        for f in ("sampling", "sample_rate", "steps", "delta", "target_epsilon"):
            a, b = getattr(self, f), getattr(other, f)
            if a is not None and b is not None and a != b:
                out.append(f"{f}: {a} (method) vs {b} (run)")
        return out
