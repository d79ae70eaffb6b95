"""The fields of ``dpfy train``'s configuration, one per flag, with their defaults and ``--help``.

The base of :class:`~dpfy.train.config.TrainConfig` (after the BatchNorm fields of
:mod:`dpfy.train.config_batchnorm`), kept apart so that the configuration module stays small;
the values are checked by :mod:`dpfy.train.config_checks` when a configuration is built.
:func:`field_types` and :func:`optional_fields` say what each field holds, for the checks, the
config file reader and the command line. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from dpfy.train.config_batchnorm import BatchNormFields, help_field as _f

__all__ = ["TrainFields", "field_types", "optional_fields"]


@dataclass(frozen=True)
class TrainFields(BatchNormFields):
    """Every setting of ``dpfy train`` but the BatchNorm ones, in ``--help`` order."""

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


def optional_fields() -> frozenset[str]:
    """The fields that may be None (typed ``X | None``, or None by default)."""
    return frozenset(
        f.name for f in fields(TrainFields) if f.default is None or "None" in str(f.type)
    )


def field_types() -> dict[str, type]:
    """Field name -> the non-None type it holds (float, int, str, bool or dict)."""
    names = {"float": float, "int": int, "str": str, "bool": bool, "dict": dict}
    return {f.name: names[str(f.type).replace(" | None", "")] for f in fields(TrainFields)}
