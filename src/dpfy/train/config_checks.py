"""The checks a training configuration runs when it is built: every value in range, every
flag given with the flags it needs and without those it cannot be combined with.

:class:`CheckedFields` is the base of :class:`~dpfy.train.config.TrainConfig`, which resolves
its method-dependent defaults and then calls :meth:`CheckedFields._check_values`: a typo fails
here, in milliseconds, before any data loads. The bounds below keep a value from starting a run
that cannot finish. Nothing here imports torch (the calibration's bound on ε and, for
--individual, :func:`dpfy.spec.check`, which do, are imported where they are used).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from dpfy._require import require
from dpfy.privacy.accountants import RIGOROUS
from dpfy.privacy.individual_budgets import check_groups
from dpfy.train.config_fields import TrainFields, field_types, optional_fields

__all__ = [
    "CheckedFields",
    "OPTIMIZERS",
    "ACCOUNTANTS",
    "FLOAT32_MAX",
    "MAX_EPOCHS",
    "MAX_AUGMULT",
    "MAX_THREADS",
    "parse_floats",
    "check_types_and_finite",
]

OPTIMIZERS = ("sgd", "adam")
# The accountants a run may calibrate and cap with: the rigorous ones (never the GDP CLT, which
# can under-report ε). One list for make_private, the ε guard and the trainer.
ACCOUNTANTS = RIGOROUS
# Bounds that keep a typo from starting a run that cannot finish: the largest float32 (lr = 1e300
# overflowed inside torch's optimizer) and a number of passes no run reaches.
FLOAT32_MAX = 3.4028234663852886e38
MAX_EPOCHS = 1_000_000
# --augmult's bound: K copies multiply every step's rows; far above De et al.'s K = 16.
MAX_AUGMULT = 256
# torch.set_num_threads(10**6) maps a thread pool the process cannot hold and crashes it
# (a segfault, not an error): far above any machine's cores, far below that.
MAX_THREADS = 1024


@dataclass(frozen=True)
class CheckedFields(TrainFields):
    """The configuration's fields and the checks on their values (no field of its own)."""

    def _check_values(self) -> None:
        """Refuse every value out of range and every combination of flags dpfy cannot run
        (called once the defaults that depend on the method are resolved)."""
        check_types_and_finite(self)
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
        if self.individual is not None:
            self._check_individual_run()
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

    def _check_individual(self) -> None:
        """The --individual flags: one source of budgets, as groups or a file (what they cannot
        be combined with: :meth:`_check_individual_run`)."""
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
        if self.budgets is not None:
            assert self.budget_fractions is not None, "required with budgets above"
            check_groups(
                parse_floats(self.budgets, "budgets"),
                parse_floats(self.budget_fractions, "budget_fractions"),
            )

    def _check_individual_run(self) -> None:
        """What --individual cannot be combined with, asked of :func:`dpfy.spec.check` (the
        declarations ``make_private`` refuses by) for the run these flags describe: ``dpfy
        train --individual`` builds its run from the budgets alone, so a flag the checker
        refuses with budgets (--epsilon, --method, --clipping other than flat, --user-ids,
        --augmult, --noise, --batchnorm privatized) is refused here, never dropped. Its
        messages name ``make_private``'s keywords, which the CLI writes as flags."""
        # imported here: dpfy.spec imports torch, which a config without budgets never needs
        from dpfy.spec import (
            AccountingSpec,
            BatchNormStatistics,
            ClippingSpec,
            ExampleUnit,
            IndividualBudgets,
            PerformanceOptions,
            RunSpec,
            UserUnit,
            check,
        )
        from dpfy.spec.run import NOISES

        require(self.noise in NOISES, "noise", self.noise, f"one of {list(NOISES)}")
        unit = (
            ExampleUnit(self.augmult)
            if self.user_ids is None
            else UserUnit(
                str(self.user_sampling),
                self.max_examples_per_user,
                self.user_reduction,
                self.augmult,
            )
        )
        spec = RunSpec(  # dpfy train samples Poisson batches in one process
            unit=unit,
            noise=NOISES[self.noise](noise_multiplier=self.noise_multiplier),
            clipping=ClippingSpec(self.clipping, self.clip, self.microbatch_size),
            accounting=AccountingSpec(
                self.accountant,
                self.delta,
                target_epsilon=self.epsilon,
                individual=IndividualBudgets(variant=self.individual),
            ),
            method=self.method,
            batchnorm=(
                BatchNormStatistics(self.batchnorm, self.bn_bound, self.bn_share)
                if self.batchnorm is not None
                else None
            ),
        )
        performance = PerformanceOptions(
            route=self.route, max_physical_batch_size=self.physical_batch_size
        )
        check(spec, performance)


def parse_floats(text: str, name: str) -> list[float]:
    """``"1,2,3"`` -> [1.0, 2.0, 3.0]; anything else raises naming ``name``."""
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        require(False, name, text, "comma-separated numbers", "Write e.g. 1,2,3")
        raise


def check_types_and_finite(cfg: TrainFields) -> None:
    """Every field holds its type (an int where a float is expected is fine; a bool is not a
    number) and every number is finite: ``lr = inf`` would start a run that fails at its
    second step with NaN gradients."""
    optional = optional_fields()
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
