"""What one run of the individualized-privacy reproduction is (``python -m experiments idp-fmnist``).

Monir, Fauzan & Ghinita 2023 (the review), §6.2: Table 9's cases, and MNIST parameters inferred
by reproducing its Case 1 numbers (expected batch 512, c = 0.2, δ = 1e-5, the RDP accountant;
the review does not state them). Four
variants are compared on the same privacy groups:

- ``uniform-strict``: DP-SGD at the strictest budget min ε_p (what uniform DP must do to keep
  every promise);
- ``uniform-weighted``: DP-SGD at Σ_p r_p·ε_p, the fraction-weighted budget: an upper
  reference, not a private option (it spends more than the strictest group's budget);
- ``idp-sample`` / ``idp-scale``: IDP-SGD Sample and Scale (docs/individual.md).

A spec is frozen and JSON-able; its key identifies a finished run in the results file. It
holds no seed: model initialization, sampling and noise come from the OS CSPRNG. The
assignment of examples to groups depends only on ``budget_seed``, which is public (the
assignment is an experiment's random split, not private data).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dpfy._require import require
from experiments.runner import KeyedSpec
from dpfy.privacy.accountants import RIGOROUS
from dpfy.privacy.individual import check_groups

__all__ = ["CASES", "VARIANTS", "IdpSpec"]

# Table 9 of the review (§6.2): budgets of groups 1/2/3 (34 %, 43 %, 23 % of the data).
TABLE9_FRACTIONS = (0.34, 0.43, 0.23)
CASES: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "case1": ((1.0, 2.0, 3.0), TABLE9_FRACTIONS),
    "case2": ((1.0, 10.0, 20.0), TABLE9_FRACTIONS),
    "case3": ((1.0, 2.0, 20.0), TABLE9_FRACTIONS),
}
VARIANTS = ("uniform-strict", "uniform-weighted", "idp-sample", "idp-scale")


@dataclass(frozen=True)
class IdpSpec(KeyedSpec):
    """One training run.

    Args:
      case: a label for the budgets (``case1`` … or anything for custom budgets).
      budgets, fractions: ε_p and r_p of the privacy groups (distinct budgets, r summing to 1).
      variant: one of :data:`VARIANTS`.
      replicate: 0, 1, …: repeated runs of the same settings (fresh OS randomness each).
      epochs: passes; T = epochs × ⌈N/b⌉ Poisson steps at q = b/N.
      batch_size: expected batch b.
      train_size, test_size: the first this many training / test images (a public rule).
      lr, momentum: SGD's.
      clip: c, the base threshold (IDP Scale clips group p to c_p = s_p·c).
      delta: every group's δ.
      accountant: the accountant every variant is calibrated with (the paper's: RDP).
      budget_seed: the public seed of the random assignment of examples to groups.
    """

    case: str
    budgets: tuple[float, ...]
    fractions: tuple[float, ...]
    variant: str
    replicate: int = 0
    epochs: int = 5
    batch_size: int = 512
    train_size: int = 60000
    test_size: int = 10000
    lr: float = 2.0
    momentum: float = 0.9
    clip: float = 0.2
    delta: float = 1e-5
    accountant: str = "rdp"
    budget_seed: int = 0

    def __post_init__(self) -> None:
        check_groups(list(self.budgets), list(self.fractions))
        require(self.variant in VARIANTS, "variant", self.variant, f"one of {list(VARIANTS)}")
        require(self.accountant in RIGOROUS, "accountant", self.accountant,
                f"one of {list(RIGOROUS)}", "Calibrate with 'rdp' or 'pld'")
        for name in ("epochs", "batch_size", "train_size", "test_size"):
            require(getattr(self, name) >= 1, name, getattr(self, name), ">= 1")

    @classmethod
    def of_case(cls, case: str, variant: str, **kw: Any) -> "IdpSpec":
        """The spec of a Table 9 case (:data:`CASES`)."""
        require(case in CASES, "case", case, f"one of {sorted(CASES)}")
        budgets, fractions = CASES[case]
        return cls(case=case, budgets=budgets, fractions=fractions, variant=variant, **kw)

    @property
    def uniform_epsilon(self) -> float | None:
        """ε of a uniform variant (min ε_p or Σ r_p ε_p); None for IDP."""
        if self.variant == "uniform-strict":
            return min(self.budgets)
        if self.variant == "uniform-weighted":
            return math.fsum(r * e for r, e in zip(self.fractions, self.budgets))
        return None

    @property
    def individual(self) -> str | None:
        """``"sample"`` / ``"scale"`` for the IDP variants, None for the uniform ones."""
        return self.variant[4:] if self.variant.startswith("idp-") else None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "IdpSpec":
        return cls(**{**d, "budgets": tuple(d["budgets"]), "fractions": tuple(d["fractions"])})
