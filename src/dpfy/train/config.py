"""The training configuration: one frozen dataclass, one field per CLI flag.

Values come from, in increasing priority: the defaults below, a TOML, YAML or JSON file
(``--config``), then command-line flags. :func:`resolve` fills in what depends on the data (δ).
The fields are :mod:`dpfy.train.config_fields` (and :mod:`dpfy.train.config_batchnorm`), their
checks :mod:`dpfy.train.config_checks`, the reading of a config file
:mod:`dpfy.train.config_file`; their public names are importable from here.

The seed is a secret. Without ``--seed`` no seed exists: the model init draws a fresh seed from
the operating system and the engine draws sampling and noise from its secure generator, so
nobody can re-run training on two neighbouring datasets and see which reproduces ``model.pt``.
With ``--seed`` the run is reproducible by anyone who holds the seed, which undoes the privacy
(the report and ``dpfy train`` say so first). Either way the published ``config.json``
(:meth:`TrainConfig.to_public_json`) holds ``"seed": null`` and only ``"reproducible"``: the seed
and the generator states live in the checkpoint alone, which is secret and deleted when the run
finishes.

The defaults are the Fashion-MNIST benchmark: Tramèr & Boneh's (ICLR 2021) end-to-end tanh CNN
at ε = 3, δ = 1e-5, with their large-batch recipe (batch 2048, SGD with momentum 0.9, a large
learning rate, clip 0.1); see docs/training.md for what was tried on this machine.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Mapping

from dpfy._require import require
from dpfy.train.config_checks import (
    ACCOUNTANTS,
    FLOAT32_MAX,
    MAX_AUGMULT,
    MAX_EPOCHS,
    MAX_THREADS,
    OPTIMIZERS,
    CheckedFields,
    parse_floats,
)
from dpfy.train.config_fields import field_types
from dpfy.train.config_file import PUBLIC_ONLY, coerce, load_config_file

# dpfy.adaptive (every method, hence torch) and dpfy.privacy.calibration (torch) are imported
# where they are used, not here: `dpfy train --help` builds its parser from this module's fields
# and must start without torch (start-up time, not an import cycle).

__all__ = [
    "TrainConfig",
    "OPTIMIZERS",
    "ACCOUNTANTS",
    "RESUME_IGNORED",
    "PUBLIC_ONLY",
    "SEED_WARNING",
    "DEFAULT_LR",
    "DEFAULT_OPTIMIZER",
    "method_default",
    "default_batch_size",
    "load_config_file",
    "resolve",
    "coerce",
    "field_types",
    "guide_delta",
    "parse_floats",
    "FLOAT32_MAX",
    "MAX_EPOCHS",
    "MAX_AUGMULT",
    "MAX_THREADS",
]

# Fields that may differ when resuming: they change where data is read from, where the run
# computes or how fast it goes, not what it computes (another device may round differently).
RESUME_IGNORED = frozenset({"data_dir", "threads", "device"})
# --lr / --optimizer when neither given nor set by a method (method_default): Tramèr & Boneh's
# SGD recipe.
DEFAULT_LR = 4.0
DEFAULT_OPTIMIZER = "sgd"
DEFAULT_MOMENTUM = 0.9
# --batch-size when not given: the benchmark's 2048 where it is at most a quarter of the training
# set, else a quarter of it (at least 4 logical batches per epoch, so small sets train too).
DEFAULT_BATCH_SIZE = 2048


def default_batch_size(num_examples: int) -> int:
    """``--batch-size`` when not given, for a training set of ``num_examples``."""
    return max(1, min(DEFAULT_BATCH_SIZE, num_examples // 4))


SEED_WARNING = (
    "This run was trained with a fixed seed (--seed), so it is reproducible: anyone "
    "who holds the seed can regenerate its sampling and noise, re-run training on "
    "two neighbouring datasets and tell which one produced the model. The seed "
    "undoes the privacy guarantee below; keep it secret, or train without --seed "
    "for a model you publish"
)


@dataclass(frozen=True)
class TrainConfig(CheckedFields):
    """Everything that decides what ``dpfy train`` computes. Validated on construction."""

    def __post_init__(self) -> None:
        # Frozen: resolved once, so every reader sees a value.
        if self.optimizer is None:
            object.__setattr__(
                self, "optimizer", method_default(self.method, "optimizer", DEFAULT_OPTIMIZER)
            )
        if self.lr is None:
            object.__setattr__(
                self, "lr", float(method_default(self.method, "initial_lr", DEFAULT_LR))
            )
        if self.momentum is None:
            object.__setattr__(
                self, "momentum", float(method_default(self.method, "momentum", DEFAULT_MOMENTUM))
            )
        self._check_values()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        """Every field, the seed included: for the (secret) checkpoint, never for publishing."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @property
    def reproducible(self) -> bool:
        """True when a seed fixes sampling and noise (anyone with the seed can undo privacy)."""
        return self.seed is not None

    def to_public_dict(self) -> dict[str, Any]:
        """The settings with the seed blanked and only whether one was given."""
        return {**self.to_dict(), "seed": None, "reproducible": self.reproducible}

    def to_public_json(self, spec: Any = None) -> str:
        """``config.json`` of a run: what can be published (no seed, no generator state), with
        the run spec (``optimizer.spec``, :class:`dpfy.spec.RunSpec`) under ``"spec"``."""
        extra = {"spec": spec.to_dict()} if spec is not None else {}
        return json.dumps({**self.to_public_dict(), **extra}, indent=2, sort_keys=True)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, source: str = "config") -> "TrainConfig":
        """Build from a mapping of field names; unknown keys and wrong types raise."""
        return cls(**coerce(values, source=source))


def method_default(method: str | None, what: str, default: Any) -> Any:
    """``--lr`` (``what="initial_lr"``), ``--optimizer`` (``"optimizer"``) or ``--momentum``
    (``"momentum"``) when not given: the first chained method's own (class attribute
    ``default_<what>``, e.g. HyFreeDP's η₀ = 1e-4 and Adam, ADADP's plain SGD: momentum 0),
    else ``default`` (the SGD recipe: lr 4.0, sgd, momentum 0.9).

    A method that fits η itself starts from its paper's η₀, not from the SGD recipe's 4.0 (which
    HyFreeDP took as η₀ while the CLI could not tell a default from a given value). An unknown
    name keeps ``default`` here; the trainer refuses the name itself.
    """
    from dpfy.adaptive import REGISTRY  # importing the package registers every method

    for name in (method or "").split(","):
        value = getattr(REGISTRY.get(name.strip()), f"default_{what}", None)
        if value is not None:
            return value
    return default


def guide_delta(num_examples: int) -> float:
    """δ = 1/N^1.1, the "How to DP-fy ML" guide's convention (Ponomareva et al. 2023, §5.3.2)."""
    return float(num_examples) ** -1.1


def resolve(
    cfg: TrainConfig, *, num_examples: int, reference_delta: float | None
) -> tuple[TrainConfig, str]:
    """Fill in δ and the batch size (:func:`default_batch_size`, applied to the units a step
    samples: users under ``--user-sampling uls``); returns the resolved config and how δ was
    chosen.

    The seed stays as given: None means a secure run (no seed is invented, see the module
    docstring).
    """
    how = "given"
    delta = cfg.delta
    if delta is None and reference_delta is not None:
        delta, how = (
            reference_delta,
            f"reference δ for {cfg.dataset} (comparability with published results)",
        )
    elif delta is None:
        delta, how = guide_delta(num_examples), f"1/N^1.1 with N = {num_examples}"
    require(
        delta < 1 / num_examples,
        "delta",
        delta,
        f"< 1/N = {1 / num_examples:.3g}",
        "δ ≥ 1/N would allow leaking one example outright; use δ = 1/N^1.1",
    )
    batch = cfg.batch_size
    if batch is None:  # the rule applies to what a step samples: users under ULS (train/units)
        from dpfy.train.units import sampled_units

        units = sampled_units(
            num_examples, cfg.user_ids, cfg.user_sampling, cfg.max_examples_per_user
        )
        batch = default_batch_size(units[0])
    bands = cfg.bands
    if cfg.noise == "bandmf" and bands is None:  # recorded in config.json as run
        from dpfy.sampling.cyclic import default_bands

        bands = default_bands(num_examples, batch)
    return dataclasses.replace(cfg, delta=delta, batch_size=batch, bands=bands), how
