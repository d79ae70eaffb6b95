"""The training configuration: one frozen dataclass, one field per CLI flag.

Values come from, in increasing priority: the defaults below, a TOML, YAML or JSON file
(``--config``), then command-line flags. :func:`resolve` fills in what depends on the data (δ).

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
import math
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

from dpfy._require import require, require_extra
from dpfy.privacy.accountants import RIGOROUS
from dpfy.train.config_batchnorm import BatchNormFields, help_field as _f

# dpfy.adaptive (every method, hence torch), dpfy.privacy.calibration and .individual (torch) are
# imported where they are used, not here: `dpfy train --help` builds its parser from this
# module's fields and must start without torch (start-up time, not an import cycle).

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
]

OPTIMIZERS = ("sgd", "adam")
# The accountants a run may calibrate and cap with: the rigorous ones (never the GDP CLT, which
# can under-report ε). One list for make_private, the ε guard and the trainer.
ACCOUNTANTS = RIGOROUS
# Fields that may differ when resuming: they change where data is read from, where the run
# computes or how fast it goes, not what it computes (another device may round differently).
RESUME_IGNORED = frozenset({"data_dir", "threads", "device"})
# Bounds that keep a typo from starting a run that cannot finish: the largest float32 (lr = 1e300
# overflowed inside torch's optimizer) and a number of passes no run reaches.
FLOAT32_MAX = 3.4028234663852886e38
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


MAX_EPOCHS = 1_000_000
# --augmult's bound: K copies multiply every step's rows; far above De et al.'s K = 16.
MAX_AUGMULT = 256
# torch.set_num_threads(10**6) maps a thread pool the process cannot hold and crashes it
# (a segfault, not an error): far above any machine's cores, far below that.
MAX_THREADS = 1024
# Keys of the published config.json that are facts about the run, not settings: read back
# (``--config config.json``) they are ignored.
PUBLIC_ONLY = frozenset({"reproducible"})

SEED_WARNING = (
    "This run was trained with a fixed seed (--seed), so it is reproducible: anyone "
    "who holds the seed can regenerate its sampling and noise, re-run training on "
    "two neighbouring datasets and tell which one produced the model. The seed "
    "undoes the privacy guarantee below; keep it secret, or train without --seed "
    "for a model you publish"
)


@dataclass(frozen=True)
class TrainConfig(BatchNormFields):
    """Everything that decides what ``dpfy train`` computes. Validated on construction."""

    dataset: str = _f("fashion_mnist", "dataset name: fashion_mnist, digits, breast_cancer")
    data_dir: str | None = _f(
        None,
        "directory with the dataset's files (Fashion-MNIST IDX); "
        "default /usr/share/datasets/fashion-mnist",
    )
    model: str = _f("tanh_cnn", "model name: tanh_cnn, groupnorm_cnn, mlp, logreg")
    epsilon: float | None = _f(3.0, "target ε; σ is calibrated so the whole run spends it")
    delta: float | None = _f(
        None,
        "δ; default: the dataset's reference δ (1e-5 for "
        "Fashion-MNIST), else 1/N^1.1 (the guide's convention)",
    )
    noise_multiplier: float | None = _f(None, "fixed σ instead of a target ε")
    epochs: int = _f(40, "passes over the training data (in expectation, Poisson sampling)")
    batch_size: int | None = _f(
        None,
        "expected logical batch size; sample rate q = batch_size "
        "/ N (default: 2048, Tramèr & Boneh's, or N/4 when the "
        "training set has fewer than 8192 examples: digits 359, "
        "breast_cancer 113; with --user-sampling uls the same rule "
        "counts users, with els the examples kept after capping)",
    )
    physical_batch_size: int | None = _f(None, "largest batch held in memory at once")
    clip: float = _f(0.1, "per-example gradient clipping norm C")
    clipping: str = _f(
        "flat",
        "clipping policy (see the engine): flat, per_layer, automatic, "
        "microbatch (with --microbatch-size)",
    )
    optimizer: str | None = _f(
        None,
        "sgd or adam; default: the method's own when --method "
        "names one (hyfree: sgd with momentum), else sgd",
    )
    lr: float | None = _f(
        None,
        "learning rate; default: the method's own initial η when "
        "--method names one (hyfree: 1e-4, Bu & Liu's; a given --lr "
        "is hyfree's initial η), else 4.0 (the benchmark's SGD recipe)",
    )
    momentum: float | None = _f(
        None,
        "SGD momentum; default: the method's own when --method "
        "names one (adadp, noisy_max, noisy_btls: 0, the plain "
        "SGD they need), else 0.9",
    )
    weight_decay: float = _f(0.0, "L2 weight decay")
    seed: int | None = _f(
        None,
        "seed for init, sampling and noise: makes the run reproducible "
        "by anyone holding it, which undoes the privacy; never "
        "published (default: none; OS randomness, secure)",
    )
    accountant: str = _f("pld", "pld or rdp")
    method: str | None = _f(
        None,
        "adaptive method(s) by registry name (`dpfy methods`), "
        "schedules included (noise_decay, dynamic, plateau); "
        "repeat --method (or separate by commas) to chain them",
    )
    method_options: dict = _f(
        None, "options for the method, KEY=VALUE (NAME.KEY=VALUE to address one method of a chain)"
    )
    public_validation: str | None = _f(
        None,
        "'test' declares the test split public, so a "
        "method that reads a validation metric (plateau) "
        "may use its accuracy",
    )
    route: str = _f("auto", "how per-example norms and sums are computed: auto, ghost, vmap")
    threads: int | None = _f(None, "torch threads; default: number of usable cores")
    device: str = _f(
        "auto", "where to train: auto (CUDA when available, else the CPU), cpu, cuda or cuda:K"
    )
    individual: str | None = _f(
        None,
        "individualized privacy budgets (docs/individual.md): "
        "'sample' (per-group sample rates) or 'scale' (per-group "
        "clip thresholds); with --budgets-file or --budgets",
    )
    budgets_file: str | None = _f(
        None, "one ε per training example, in dataset order (.npy or .csv), for --individual"
    )
    budgets: str | None = _f(
        None,
        "group budgets for --individual, comma-separated (e.g. "
        "1,2,3); examples are assigned to groups at random",
    )
    budget_fractions: str | None = _f(
        None,
        "each --budgets group's share of the training set, comma-separated (e.g. 0.34,0.43,0.23)",
    )
    budget_seed: int = _f(
        0,
        "public seed of the random assignment of examples to --budgets "
        "groups (recorded in config.json: the assignment is not private)",
    )
    user_ids: str | None = _f(
        None,
        "user-level DP (docs/guide/user_level.md): a file with one "
        "integer user id per training example, in dataset order "
        "(.npy, or text/.csv); the unit of privacy is then the user",
    )
    user_sampling: str | None = _f(
        None,
        "with --user-ids: 'uls' (sample users; --batch-size is "
        "the expected number of users per step) or 'els' "
        "(cap users at --max-examples-per-user examples, "
        "sample examples)",
    )
    max_examples_per_user: int | None = _f(
        None,
        "k: ELS keeps at most k random examples per "
        "user (required); ULS takes at most k random "
        "examples per sampled user and step (default: "
        "all)",
    )
    user_reduction: str = _f("mean", "ULS: clip each user's 'mean' or 'sum' of gradients")
    noise: str = _f(
        "gaussian",
        "noise mechanism: gaussian (DP-SGD), tree (DP-FTRL tree "
        "aggregation over shuffled passes, no amplification needed) or "
        "bandmf (banded matrix factorization with cyclic Poisson "
        "sampling, --bands)",
    )
    bands: int | None = _f(
        None,
        "BandMF's band count b, with --noise bandmf (b = 1 is DP-SGD; "
        "default min(8, N // batch size)); "
        "memory: b - 1 extra copies of the trainable parameters",
    )
    microbatch_size: int | None = _f(
        None,
        "with --clipping microbatch: k, the average rows of "
        "a microbatch whose mean gradient is clipped to C "
        "(sensitivity 2C; docs/guide/accuracy.md); not the "
        "memory-only --physical-batch-size",
    )
    ema: float | None = _f(
        None,
        "parameter averaging: keep an exponential moving average of "
        "the weights with decay β (e.g. 0.999; De et al. 2022), "
        "evaluated and saved as model_ema.pt beside model.pt "
        "(post-processing: no privacy cost)",
    )
    augmult: int = _f(
        1,
        "augmentation multiplicity K (De et al. 2022): K augmented "
        "copies of each sampled example, their mean gradient clipped "
        "as one unit; K times the compute, the same accounting as "
        "K = 1 (docs/guide/accuracy.md)",
    )
    augment: str | None = _f(
        None,
        "with --augmult K >= 2, image batches only: 'crop' (random "
        "crops of the image padded by --augment-padding background "
        "pixels) or 'crop_flip' (and random horizontal flips); default crop",
    )
    augment_padding: int = _f(2, "with --augmult: the crops' padding, in pixels")
    individual_accounting: int | None = _f(
        None,
        "K: record every training example's clipped gradient norm every K steps into "
        "RUN/per_example_norms.npz for dpfy account --individual (private data: an analysis "
        "for the data holder, never used in training nor released; "
        "docs/individual_accounting.md)",
    )

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
        _check_types_and_finite(self)
        # dataset and model names are checked against their registries by the trainer, since
        # the Python API also accepts a user's own Dataset and nn.Module under any name.
        require(
            isinstance(self.dataset, str) and self.dataset != "", "dataset", self.dataset, "a name"
        )
        require(isinstance(self.model, str) and self.model != "", "model", self.model, "a name")
        require(
            (self.epsilon is None) != (self.noise_multiplier is None)
            or self.individual is not None,
            "epsilon",
            self.epsilon,
            "given exactly when noise_multiplier is not "
            f"(noise_multiplier = {self.noise_multiplier})",
            "Give either a target --epsilon or a fixed --noise-multiplier",
        )
        if self.epsilon is not None:
            require(
                math.isfinite(self.epsilon) and self.epsilon > 0,
                "epsilon",
                self.epsilon,
                "> 0",
                "A target ε must be positive; ε = 3 is a common choice",
            )
            # The calibration's own bound, checked here too so a typo fails before data loads.
            from dpfy.privacy.calibration import MAX_TARGET_EPSILON

            require(
                self.epsilon <= MAX_TARGET_EPSILON,
                "epsilon",
                self.epsilon,
                f"<= {MAX_TARGET_EPSILON:g} (larger ε is no meaningful guarantee and drives "
                f"σ to 0)",
                "Lower --epsilon, or give a fixed --noise-multiplier",
            )
        if self.noise_multiplier is not None:
            require(
                self.noise_multiplier > 0,
                "noise_multiplier",
                self.noise_multiplier,
                "> 0",
                "σ = 0 is not private",
            )
        if self.delta is not None:
            require(
                0 < self.delta < 1,
                "delta",
                self.delta,
                "in (0, 1)",
                "Use δ ≪ 1/N, e.g. δ = 1/N^1.1 (leave --delta unset for that)",
            )
        require(self.epochs >= 1, "epochs", self.epochs, ">= 1")
        require(
            self.epochs <= MAX_EPOCHS,
            "epochs",
            self.epochs,
            f"<= {MAX_EPOCHS}",
            "Lower --epochs: a run of more passes would not finish",
        )
        if self.batch_size is not None:
            require(self.batch_size >= 1, "batch_size", self.batch_size, ">= 1")
        if self.physical_batch_size is not None:
            require(
                self.physical_batch_size >= 1,
                "physical_batch_size",
                self.physical_batch_size,
                ">= 1",
            )
        require(self.clip > 0, "clip", self.clip, "> 0")
        require(self.optimizer in OPTIMIZERS, "optimizer", self.optimizer, f"one of {OPTIMIZERS}")
        assert self.lr is not None and self.momentum is not None, "resolved above"
        require(self.lr > 0, "lr", self.lr, "> 0")
        require(0 <= self.momentum < 1, "momentum", self.momentum, "in [0, 1)")
        require(self.weight_decay >= 0, "weight_decay", self.weight_decay, ">= 0")
        for name in ("clip", "lr", "weight_decay"):
            require(
                getattr(self, name) <= FLOAT32_MAX,
                name,
                getattr(self, name),
                f"<= {FLOAT32_MAX:.3g}",
                "The model's tensors are float32",
            )
        require(
            self.accountant in ACCOUNTANTS, "accountant", self.accountant, f"one of {ACCOUNTANTS}"
        )
        if self.seed is not None:
            require(0 <= self.seed < 2**63, "seed", self.seed, "in [0, 2**63)")
        require(
            re.fullmatch(r"auto|cpu|cuda(:\d+)?", str(self.device)) is not None,
            "device",
            self.device,
            "auto, cpu, cuda or cuda:K",
            "Write e.g. --device cuda:0",
        )
        if self.threads is not None:
            require(
                1 <= self.threads <= MAX_THREADS,
                "threads",
                self.threads,
                f"in [1, {MAX_THREADS}]",
                "Give at most the machine's cores",
            )
        require(
            self.method_options is None or self.method is not None,
            "method_options",
            self.method_options,
            "empty unless a method is chosen",
            "Add --method NAME",
        )
        require(
            self.public_validation in (None, "test"),
            "public_validation",
            self.public_validation,
            "None or 'test'",
            "Only declare a split public if it holds no private data",
        )
        self._check_individual()
        self._check_users()
        require(
            (self.microbatch_size is not None) == (self.clipping == "microbatch"),
            "microbatch_size",
            self.microbatch_size,
            "given exactly with --clipping microbatch",
            "Pass --clipping microbatch --microbatch-size K together",
        )
        self._check_augmult()
        require(
            self.individual_accounting is None or self.individual is None,
            "individual_accounting",
            self.individual_accounting,
            "unset with --individual (budgets)",
            "Drop --individual-accounting, or --individual",
        )
        require(
            self.ema is None or 0 < self.ema < 1,
            "ema",
            self.ema,
            "in (0, 1)",
            "0.999 is De et al.'s value",
        )

    def _check_augmult(self) -> None:
        """--augmult K in [1, MAX_AUGMULT]; --augment and its padding only with K >= 2
        (make_private refuses what augmentation multiplicity cannot be combined with)."""
        require(
            isinstance(self.augmult, int)
            and not isinstance(self.augmult, bool)
            and 1 <= self.augmult <= MAX_AUGMULT,
            "augmult",
            self.augmult,
            f"an integer in [1, {MAX_AUGMULT}] (K times the compute per step)",
        )
        require(
            self.augment in (None, "crop", "crop_flip"),
            "augment",
            self.augment,
            "'crop' or 'crop_flip'",
        )
        require(
            isinstance(self.augment_padding, int) and 0 <= self.augment_padding <= 16,
            "augment_padding",
            self.augment_padding,
            "an integer in [0, 16]",
        )
        for name, default in (("augment", None), ("augment_padding", 2)):
            require(
                self.augmult >= 2 or getattr(self, name) == default,
                name,
                getattr(self, name),
                f"{default!r} (unset) unless --augmult K >= 2",
                "Pass --augmult K too",
            )

    def _check_users(self) -> None:
        """The user-level flags: all with --user-ids, ELS with its cap, no per-example budgets."""
        if self.user_ids is None:
            for name, value, unset in (
                ("user_sampling", self.user_sampling, None),
                ("max_examples_per_user", self.max_examples_per_user, None),
                ("user_reduction", self.user_reduction, "mean"),
            ):
                require(
                    value == unset,
                    name,
                    value,
                    "left unset without user_ids",
                    "Add --user-ids FILE (one user id per training example)",
                )
            return
        require(
            isinstance(self.user_ids, str) and self.user_ids.strip() != "",
            "user_ids",
            self.user_ids,
            "a path to a file of user ids",
            "Give --user-ids FILE (one integer user id per training example)",
        )
        require(
            self.user_sampling in ("uls", "els"),
            "user_sampling",
            self.user_sampling,
            "'uls' or 'els' when user_ids is given",
            "Add --user-sampling uls (sample users) or els (sample examples, capped per user)",
        )
        require(
            self.user_sampling != "els" or self.max_examples_per_user is not None,
            "max_examples_per_user",
            None,
            "given with --user-sampling els",
            "ELS caps every user at k examples: add --max-examples-per-user K",
        )
        require(
            self.max_examples_per_user is None or self.max_examples_per_user >= 1,
            "max_examples_per_user",
            self.max_examples_per_user,
            ">= 1",
        )
        require(
            self.user_reduction in ("mean", "sum"),
            "user_reduction",
            self.user_reduction,
            "'mean' or 'sum'",
        )
        require(
            self.individual is None,
            "individual",
            self.individual,
            "unset with --user-ids (per-example budgets cannot be accounted per user)",
            "Drop --individual, or --user-ids",
        )

    def _check_individual(self) -> None:
        """The --individual flags: one source of budgets, nothing that would decide σ besides."""
        if self.individual is None:
            given = [
                n
                for n in ("budgets_file", "budgets", "budget_fractions")
                if getattr(self, n) is not None
            ]
            require(
                not given,
                given[0] if given else "",
                getattr(self, given[0]) if given else None,
                "unset without --individual",
                "Add --individual sample or --individual scale",
            )
            return
        require(
            self.individual in ("sample", "scale"),
            "individual",
            self.individual,
            "'sample' or 'scale'",
        )
        require(
            (self.budgets_file is None) != (self.budgets is None),
            "budgets_file",
            self.budgets_file,
            f"given exactly when budgets is not (budgets = {self.budgets!r})",
            "Give one ε per example with --budgets-file PATH, or "
            "groups with --budgets 1,2,3 --budget-fractions 0.34,0.43,0.23",
        )
        require(
            (self.budgets is None) == (self.budget_fractions is None),
            "budget_fractions",
            self.budget_fractions,
            "given exactly with --budgets",
            "Give each group's share of the training set",
        )
        require(
            self.epsilon is None and self.noise_multiplier is None,
            "epsilon",
            self.epsilon,
            "unset with --individual (each group's budget is its ε)",
            "Drop --epsilon and --noise-multiplier",
        )
        require(
            self.method is None and self.clipping == "flat",
            "individual",
            self.individual,
            "used without --method and --clipping other than flat",
            "Drop those flags",
        )
        require(
            self.accountant in RIGOROUS,
            "accountant",
            self.accountant,
            f"one of {list(RIGOROUS)} with --individual",
            "Use --accountant rdp or pld",
        )
        if self.budgets is not None:
            assert self.budget_fractions is not None, "required with budgets above"
            from dpfy.privacy.individual_budgets import check_groups

            check_groups(
                parse_floats(self.budgets, "budgets"),
                parse_floats(self.budget_fractions, "budget_fractions"),
            )

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

    def to_public_json(self) -> str:
        """``config.json`` of a run: what can be published (no seed, no generator state)."""
        return json.dumps(self.to_public_dict(), indent=2, sort_keys=True)

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


def parse_floats(text: str, name: str) -> list[float]:
    """``"1,2,3"`` -> [1.0, 2.0, 3.0]; anything else raises naming ``name``."""
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        require(False, name, text, "comma-separated numbers", "Write e.g. 1,2,3")
        raise


def _check_types_and_finite(cfg: TrainConfig) -> None:
    """Every field holds its type (an int where a float is expected is fine; a bool is not a
    number) and every number is finite: ``lr = inf`` would start a run that fails at its
    second step with NaN gradients."""
    optional = _optional_fields()
    for name, kind in field_types().items():
        value = getattr(cfg, name)
        if value is None and name not in optional:
            raise TypeError(
                f"{name} must be set, got {name} = None. Give a value or leave "
                f"the setting out for its default"
            )
        if value is None:
            continue
        ok = isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool)
        ok = ok or (kind is float and isinstance(value, int) and not isinstance(value, bool))
        if not ok:
            article = "an" if kind is int else "a"
            raise TypeError(
                f"{name} must be {article} {kind.__name__}, got {name} = "
                f"{value!r}. Fix the value's type"
            )
        if kind in (float, int):
            require(
                math.isfinite(value),
                name,
                value,
                "a finite number",
                "NaN and infinity are not settings",
            )


def _optional_fields() -> frozenset[str]:
    """The fields that may be None (typed ``X | None``, or None by default)."""
    return frozenset(
        f.name for f in fields(TrainConfig) if f.default is None or "None" in str(f.type)
    )


def field_types() -> dict[str, type]:
    """Field name -> the non-None type it holds (float, int, str, bool or dict)."""
    names = {"float": float, "int": int, "str": str, "bool": bool, "dict": dict}
    return {f.name: names[str(f.type).replace(" | None", "")] for f in fields(TrainConfig)}


def coerce(values: Mapping[str, Any], *, source: str) -> dict[str, Any]:
    """Check keys and convert values to the field types (TOML writes ``lr = 4`` as an int)."""
    types = field_types()
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = key.replace("-", "_")
        if name in PUBLIC_ONLY:
            continue
        require(
            name in types,
            f"{source} key",
            key,
            f"one of {sorted(types)}",
            "Fix the spelling or remove the key",
        )
        kind = types[name]
        require(
            value is not None or name in _optional_fields(),
            name,
            value,
            f"set (in {source})",
            "Give a value or remove the key for its default",
        )
        if value is None or isinstance(value, kind) and not isinstance(value, bool):
            out[name] = value
            continue
        ok = kind is float and isinstance(value, int) and not isinstance(value, bool)
        ok = ok or (kind is int and isinstance(value, float) and value.is_integer())
        what = "a table of KEY = VALUE options" if kind is dict else f"a {kind.__name__}"
        require(ok, name, value, f"{what} (in {source})", "Fix the value's type")
        out[name] = kind(value)
    return out


def load_config_file(path: str | Path) -> dict[str, Any]:
    """The top-level keys of a TOML (``.toml``), YAML (``.yaml``/``.yml``) or JSON config file.

    A run's published ``config.json`` is accepted as is (its seed is null).
    """
    path = Path(path)
    suffix = path.suffix.lower()
    require(
        suffix in (".toml", ".yaml", ".yml", ".json"),
        "config",
        str(path),
        "a .toml, .yaml, .yml or .json file",
        "Rename the file or convert it",
    )
    require(path.is_file(), "config", str(path), "an existing file", "Check the path")
    text = path.read_text()
    if suffix in (".yaml", ".yml"):
        require_extra("yaml", feature="a YAML config file")
    try:
        if suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        elif suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text) or {}
    except Exception as e:  # tomllib.TOMLDecodeError, json.JSONDecodeError, yaml.YAMLError
        raise ValueError(
            f"config must be valid {suffix[1:].upper()}, got a parse error in "
            f"'{path}': {str(e).splitlines()[0]}. Fix the file"
        ) from None
    require(
        isinstance(data, dict),
        "config",
        str(path),
        "a mapping of keys to values",
        "Write one `key = value` per line",
    )
    return coerce(data, source=f"config file {path.name}")


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
