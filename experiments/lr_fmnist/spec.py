"""What one run of the learning-rate reproduction is (``python -m experiments lr-fmnist``, issue 12).

Two comparisons share one harness:

- **Comparison 004**, the table of Bu & Liu 2025 (§5, Table 2), scaled down to this machine:
  at a target ε (or ε = ∞, non-private) on one model, the methods of :data:`METHODS_004`:
  ``adamw`` at one learning rate (the five grid points of NonDP-GS; NonDP-GS itself is the best
  of them, chosen in the report), ``dp_hyper``, ``dadapt``, ``prodigy``, ``adadp``, ``hyfree``
  ``noisy_max``, ``noisy_btls`` and ``default`` (the hand-tuned ``dpfy train`` default);
- **Comparison 000**, the MNIST comparison of Monir, Fauzan & Ghinita 2023 (§6.1) re-run on
  Fashion-MNIST at one fixed noise multiplier σ = 2.0: :data:`METHODS_000` (``sgd`` = plain
  DP-SGD, ``adadp``, ``quantile``, ``time_decay``).

A spec is frozen and JSON-able; its key identifies a finished run in the results file. It holds
no seed: model initialization, sampling and noise come from the OS CSPRNG.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dpfy._require import require
from experiments.runner import KeyedSpec

__all__ = ["LrSpec", "METHODS_004", "METHODS_000", "NONDP_GS_GRID", "DP_HYPER_GRID",
           "COMPARISONS", "FINITE_ONLY"]

# Bu & Liu 2025, §5: NonDP-GS's learning-rate grid (AdamW).
NONDP_GS_GRID = (5e-5, 1e-4, 5e-4, 1e-3, 5e-3)
# DP-hyper's narrow grid (Bu & Liu 2025, §5: "a narrow range around the optimal η"); fixed
# before any run from the upper half of NonDP-GS's grid (AdamW under DP noise prefers the
# larger rates).
DP_HYPER_GRID = (5e-4, 1e-3, 5e-3)
METHODS_004 = ("adamw", "dp_hyper", "dadapt", "prodigy", "adadp", "noisy_max", "noisy_btls",
               "hyfree", "default")
METHODS_000 = ("sgd", "adadp", "quantile", "time_decay")
COMPARISONS = ("004", "000")
# No ε = ∞ row: DP-hyper at ε = ∞ is NonDP-GS; HyFreeDP splits a finite ε between gradient and
# probes; NoisyMax's and NoisyBTLS's probe releases refuse σ = 0 ("an extra release without
# noise").
FINITE_ONLY = ("dp_hyper", "hyfree", "noisy_max", "noisy_btls")


@dataclass(frozen=True)
class LrSpec(KeyedSpec):
    """One run (``dp_hyper``: its selection runs and its final run, one record).

    Args:
      comparison: ``"004"`` (target ε; ``epsilon=None`` is ε = ∞, non-private) or ``"000"``
        (fixed ``noise_multiplier``).
      method: one of :data:`METHODS_004` or :data:`METHODS_000`.
      epsilon: the target ε of the run (004), None for ε = ∞ (004) or for a fixed σ (000).
      noise_multiplier: σ of every step (000 only; time decay starts there).
      lr: ``adamw``'s learning rate (a NonDP-GS grid point); None for every other method
        (their rates are fixed in :mod:`experiments.lr_fmnist.baselines`).
      model: ``tanh_cnn`` or ``groupnorm_cnn``.
      replicate: 0, 1, …: repeated runs of the same settings (fresh OS randomness each).
      epochs: passes over the training subset.
      batch_size: expected batch b (q = b/N); ``default`` uses dpfy train's 2048/60000 rate.
      train_size, test_size: the first this many Fashion-MNIST images (a public rule).
      delta: δ of every ε.
      probe_every: HyFreeDP's K.
    """

    comparison: str
    method: str
    epsilon: float | None = None
    noise_multiplier: float | None = None
    lr: float | None = None
    model: str = "tanh_cnn"
    replicate: int = 0
    epochs: int = 5
    batch_size: int = 512
    train_size: int = 60000
    test_size: int = 10000
    delta: float = 1e-5
    probe_every: int = 5

    def __post_init__(self) -> None:
        require(self.comparison in COMPARISONS, "comparison", self.comparison,
                f"one of {list(COMPARISONS)}")
        methods = METHODS_004 if self.comparison == "004" else METHODS_000
        require(self.method in methods, "method", self.method,
                f"one of {list(methods)} for comparison {self.comparison}")
        if self.comparison == "000":
            require(self.noise_multiplier is not None and self.noise_multiplier > 0
                    and self.epsilon is None, "noise_multiplier", self.noise_multiplier,
                    "a fixed σ > 0 (and no target ε) for comparison 000",
                    "Monir et al. 2023 compare their methods at one σ")
        else:
            require(self.noise_multiplier is None, "noise_multiplier", self.noise_multiplier,
                    "None for comparison 004", "004 compares methods at a target ε")
            require(self.epsilon is None or (math.isfinite(self.epsilon) and self.epsilon > 0),
                    "epsilon", self.epsilon, "> 0 and finite, or None for ε = ∞")
            require(self.epsilon is not None or self.method not in FINITE_ONLY, "epsilon",
                    self.epsilon, f"finite for method {self.method!r}",
                    "It has no ε = ∞ row (see FINITE_ONLY)")
        require((self.lr is not None) == (self.method == "adamw"), "lr", self.lr,
                "given exactly for method 'adamw' (a NonDP-GS grid point)")
        for name in ("epochs", "batch_size", "train_size", "test_size", "probe_every"):
            require(getattr(self, name) >= 1, name, getattr(self, name), ">= 1")

    @property
    def private(self) -> bool:
        """False for the ε = ∞ rows (σ = 0, same loop)."""
        return self.epsilon is not None or self.noise_multiplier is not None

    @property
    def label(self) -> str:
        """Short name for logs and tables."""
        eps = ("σ=%g" % self.noise_multiplier if self.comparison == "000"
               else "ε=%s" % ("∞" if self.epsilon is None else "%g" % self.epsilon))
        lr = f" lr={self.lr:g}" if self.lr is not None else ""
        return f"{self.comparison} {self.model} {self.method}{lr} {eps} rep {self.replicate}"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LrSpec":
        return cls(**d)
