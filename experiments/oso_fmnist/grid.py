"""The grids of Galli et al. 2024's Fashion-MNIST comparison, and their per-grid budgets.

Galli, Palamidessi & Cucinotta 2024, Experiments section: the grid-search protocol, the grids
and the number of configurations per method, and the hyperparameters of Table 3. Five methods, each
with its own grid; a method with ``runs`` configurations gets, for every run, the noise
multiplier at which ``runs`` composed runs spend the target ε (the per-grid budget of Mohapatra
et al. 2022, :func:`dpfy.privacy.tuning.calibrate_grid_noise_multiplier`, here by PLD):

============== ============================ ================== =========================
name           paper name                   gridded            configurations at k
============== ============================ ================== =========================
``online``     Online (OSO-DPSGD, ``oso``)  initial lr ρ       k
``threshold``  FixedThreshold (DP-SGD)      ρ × C              k²
``quantile``   FixedQuantile (``quantile``) ρ × γ (5 values)   5k
``adamwosm``   AdamWOSM (``adamwosm``)      C (ρ₀ = 1e-3)      k
``nodp``       NoDP (non-private SGD)       ρ                  k (no budget)
============== ============================ ================== =========================

ρ ∈ log_grid(−2.5, 1.5, k), C ∈ log_grid(−2, 2, k), γ ∈ {0.1, 0.3, 0.5, 0.7, 0.9}; Online and
FixedQuantile start at C₀ = 0.1; FixedQuantile's η_C = 0.2.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any

from dpfy._require import require
from dpfy.privacy.tuning import calibrate_grid_noise_multiplier, log_grid

__all__ = ["METHODS", "PRIVATE_METHODS", "Settings", "RunSpec", "grid", "grid_runs",
           "grid_noise_multiplier", "LR_RANGE", "CLIP_RANGE", "QUANTILES"]

METHODS = ("online", "threshold", "quantile", "adamwosm", "nodp")
PRIVATE_METHODS = METHODS[:-1]
PAPER_NAMES = {"online": "Online", "threshold": "FixedThreshold", "quantile": "FixedQuantile",
               "adamwosm": "AdamWOSM", "nodp": "NoDP"}
LR_RANGE = (-2.5, 1.5)          # ρ ∈ [10^-2.5, 10^1.5]  (Galli et al. 2024)
CLIP_RANGE = (-2.0, 2.0)        # C ∈ [10^-2, 10^2]
QUANTILES = (0.1, 0.3, 0.5, 0.7, 0.9)
INITIAL_CLIP = 0.1              # C₀ of Online and FixedQuantile
QUANTILE_STEP = 0.2             # η_C
ADAMWOSM_LR = 1e-3              # ρ₀
PAPER_HYPER_RATE = 2.5e-3       # ρ_c = ρ_r
PAPER_STEPS = 1172              # 10 epochs of 60,000 at b = 512: the horizon ρ_c was set for
TASKS = ("autoencoder", "classifier")


@dataclass(frozen=True)
class Settings:
    """The scale of one reproduction: everything shared by all runs of a results file.

    Args:
      task: ``"autoencoder"`` (Galli et al.'s Fashion-MNIST task, MSE, ``conv_autoencoder``) or
        ``"classifier"`` (cross-entropy, dpfy's ``tanh_cnn``; metric: test accuracy).
      train_size: the first ``train_size`` training images are the private set (a public rule).
      test_size: the first ``test_size`` test images are the evaluation set.
      batch_size: expected Poisson batch b; q = b / train_size.
      epochs: passes; T = epochs × ⌈train_size / b⌉ steps.
      k: grid granularity (Galli et al. 2024: 5, 7 or 9).
      delta: δ of every budget (Galli et al. 2024 do not state it; 1e-5 is assumed).
      hyper_rate: ρ_c = ρ_r of Online. None: the paper's 2.5e-3 scaled by 1172 / T, so the
        largest drift e^{ρ_c T} of C and ρ equals the paper's over its 1172 steps.
      eval_every: evaluate on the test subset every this many steps (and at the end); the
        best evaluation represents the run, as in Galli et al. 2024's protocol.
    """

    task: str = "autoencoder"
    train_size: int = 3200           # the committed run (experiments/oso_fmnist/README.md)
    test_size: int = 1000
    batch_size: int = 32
    epochs: int = 1                  # the CLI's shared --epochs (default 3) overrides this
    k: int = 5
    delta: float = 1e-5
    hyper_rate: float | None = None
    eval_every: int = 50

    def __post_init__(self) -> None:
        require(self.task in TASKS, "task", self.task, f"one of {list(TASKS)}")
        for name in ("train_size", "test_size", "batch_size", "epochs", "eval_every"):
            value = getattr(self, name)
            require(isinstance(value, int) and value >= 1, name, value, "an integer >= 1")
        require(self.batch_size <= self.train_size, "batch_size", self.batch_size,
                f"<= train_size ({self.train_size})")
        require(isinstance(self.k, int) and self.k >= 2, "k", self.k, "an integer >= 2",
                "002 uses k in {5, 7, 9}")
        require(0 < self.delta < 1, "delta", self.delta, "in (0, 1)")
        require(self.hyper_rate is None or 0 < self.hyper_rate < 1, "hyper_rate",
                self.hyper_rate, "in (0, 1) or unset")

    @property
    def sample_rate(self) -> float:
        return self.batch_size / self.train_size

    @property
    def steps(self) -> int:
        """T: the Poisson loader's logical batches over ``epochs`` passes (⌈N/b⌉ per pass)."""
        return self.epochs * math.ceil(self.train_size / self.batch_size)

    @property
    def online_rate(self) -> float:
        """ρ_c = ρ_r used by Online."""
        if self.hyper_rate is not None:
            return self.hyper_rate
        return min(PAPER_HYPER_RATE * PAPER_STEPS / self.steps, 0.5)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RunSpec:
    """One run: a method, its hyperparameters, the grid's ε and a replicate index.

    ``replicate`` only labels repeated runs of a configuration: no seed is used or published
    (noise, sampling and initialization come from the operating system's CSPRNG).
    """

    method: str
    epsilon: float | None                  # the grid's ε; None for NoDP
    lr: float
    clip: float | None = None              # FixedThreshold, AdamWOSM
    quantile: float | None = None          # FixedQuantile's γ
    replicate: int = 0
    settings: Settings = field(default_factory=Settings)

    def __post_init__(self) -> None:
        require(self.method in METHODS, "method", self.method, f"one of {list(METHODS)}")
        require((self.epsilon is None) == (self.method == "nodp"), "epsilon", self.epsilon,
                "None exactly for method 'nodp'", "Every private method runs at a grid's ε")

    @property
    def runs(self) -> int:
        """Configurations in this run's grid (what its per-grid budget is shared by)."""
        return grid_runs(self.method, self.settings.k)

    def hyperparameters(self) -> dict[str, float]:
        out = {"lr": self.lr}
        if self.clip is not None:
            out["clip"] = self.clip
        if self.quantile is not None:
            out["quantile"] = self.quantile
        return out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["settings"] = self.settings.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunSpec":
        return cls(**{**d, "settings": Settings(**d["settings"])})

    def key(self) -> str:
        """A stable id of everything that decides the run (for resuming)."""
        text = json.dumps(self.to_dict(), sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()[:12]

    def cell(self) -> tuple:
        """The grid cell: the run without its replicate index."""
        return (self.method, self.epsilon, self.lr, self.clip, self.quantile)


def grid_runs(method: str, k: int) -> int:
    """Configurations of ``method``'s grid at granularity ``k`` (Galli et al. 2024's protocol)."""
    require(method in METHODS, "method", method, f"one of {list(METHODS)}")
    return {"online": k, "threshold": k * k, "quantile": len(QUANTILES) * k,
            "adamwosm": k, "nodp": k}[method]


def grid(method: str, epsilon: float | None, settings: Settings) -> list[RunSpec]:
    """Replicate 0 of every configuration of ``method``'s grid at ``epsilon``."""
    k = settings.k
    lrs = [float(x) for x in log_grid(*LR_RANGE, k)]
    clips = [float(x) for x in log_grid(*CLIP_RANGE, k)]

    def spec(**kw: Any) -> RunSpec:
        return RunSpec(method=method, epsilon=epsilon, settings=settings, **kw)

    if method in ("online", "nodp"):
        out = [spec(lr=r) for r in lrs]
    elif method == "threshold":
        out = [spec(lr=r, clip=c) for r in lrs for c in clips]
    elif method == "quantile":
        out = [spec(lr=r, quantile=g) for r in lrs for g in QUANTILES]
    else:
        out = [spec(lr=ADAMWOSM_LR, clip=c) for c in clips]
    assert len(out) == grid_runs(method, k)   # the budget is shared by exactly these runs
    return out


@lru_cache(maxsize=None)
def _noise(epsilon: float, delta: float, sample_rate: float, steps: int, runs: int) -> float:
    return calibrate_grid_noise_multiplier(target_epsilon=epsilon, delta=delta,
                                           sample_rate=sample_rate, steps=steps, runs=runs,
                                           accountant="pld")


def grid_noise_multiplier(spec: RunSpec) -> float:
    """ν of every step of ``spec``: ``spec.runs`` composed runs spend ``spec.epsilon`` by PLD.

    For Online this is the combined ν of its two releases (split 1.01ν / 7.124ν by the
    method); for FixedQuantile the combined ν of gradient and count (split by the method).
    """
    require(spec.epsilon is not None, "epsilon", None, "set for a private method")
    s = spec.settings
    return _noise(float(spec.epsilon), s.delta, s.sample_rate, s.steps, spec.runs)
