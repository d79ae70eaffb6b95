"""The run's privacy report, rendered by :class:`dpfy.privacy.report.PrivacyReport` from the
private optimizer's ledger: privacy_report.md/.json and epsilon_over_steps.png.

The JSON keeps the report's whole context (model, layer table, sampling note, warnings, the
adaptive methods that ran, the data declared public), so ``dpfy report RUN_DIR`` re-renders the
same Markdown. A run with ``--seed`` opens with the seed warning; checkpoints are listed as
secret. A run with ``--method`` names each method and what it releases per step, read from its
release specs at the run's own facts (:func:`dpfy.adaptive.describe_releases`, as ``dpfy
methods`` does for an example run); with ``--public-validation test`` the report says
that the user declared the test split public and what its accuracy drove, since that split is
then outside the guarantee.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from dpfy.adaptive.base import method_name
from dpfy.adaptive.chain import Chain
from dpfy.adaptive.describe import describe_releases, releases_text
from dpfy.data import DataSplits
from dpfy.privacy import epsilon as ledger_epsilon
from dpfy.privacy.report import PrivacyReport, ReportSection
from dpfy.privacy.user_level import user_level_section
from dpfy.spec import report_context
from dpfy.train.batchnorm import public_statistics_statement
from dpfy.train.config import SEED_WARNING, TrainConfig

__all__ = [
    "write_report",
    "methods_ran",
    "clip_description",
    "augmult_description",
    "batchnorm_description",
    "public_data",
    "RELEASED",
    "NOT_RELEASED",
]

RELEASED = (
    "final model weights (model.pt) and test-set metrics. The train loss/accuracy "
    "columns of metrics.csv and metrics.json, and the train curve of accuracy.png, are "
    "non-private diagnostics computed on raw training data and are not covered by this "
    "guarantee: do not publish them"
)
NOT_RELEASED = (
    "checkpoint.pt and checkpoint.prev.pt (the one before it, kept as a fallback), "
    "written in the run's .partial directory while training and deleted when the "
    "run finishes, hold the model, the optimizer state and the ledger, and for a seeded "
    "run the seed and the generator states, which reproduce the sampling and the noise "
    "(a secure run's checkpoint holds no noise key: a resumed secure run draws fresh "
    "noise); they are secret and not part of the release (config.json and this report "
    "never hold them)"
)


def clip_description(private) -> str:
    """How the run clips, in words, from its run spec (``optimizer.spec``): the policy and C
    the run was built with, or the method that decides (a method that supplies its own
    clipping ignores --clip; one that sets C_t adapts it)."""
    clip = private.optimizer.spec.clipping
    for m in _members(private.optimizer.method):
        name = method_name(m)
        if m.implements("clipping"):
            return f"clipping by method '{name}' (--clip not used)"
        if "clip" in m.sets:
            return f"clip C_t set by method '{name}' ({clip.kind} clipping)"
    c = clip.max_grad_norm
    c_text = f"{c:g}" if isinstance(c, (int, float)) else str(c)
    if clip.kind == "microbatch" and (clip.microbatch_size or 1) > 1:
        return (
            f"clip {c_text}, microbatch clipping (the mean gradient of each microbatch "
            f"of {clip.microbatch_size} rows on average is clipped; sensitivity "
            f"2C = {2 * c:g}, the noise is σ·2C)"
        )
    return f"clip {c_text}, {clip.kind} clipping"


def batchnorm_description(spec) -> str:
    """The run spec's BatchNorm statistics in words ("" without them)."""
    bn = spec.batchnorm
    if bn is None:
        return ""
    if bn.kind == "public":
        return f", BatchNorm statistics from {bn.public_data} (declared public)"
    return (
        f", BatchNorm statistics privatized (each example's per-channel mean clipped to "
        f"[−{bn.bound:g}, {bn.bound:g}], {bn.releases} Gaussian releases per step at "
        f"σ_bn = {bn.noise_multiplier:.4g} beside the gradient's, in the ledger)"
    )


def augmult_description(cfg: TrainConfig) -> str:
    """Augmentation multiplicity in words ("" at K = 1): what was clipped, and why the
    accounting is the K = 1 run's."""
    if cfg.augmult == 1:
        return ""
    flips = " and horizontal flips" if cfg.augment == "crop_flip" else ""
    return (
        f", augmentation multiplicity K = {cfg.augmult} (each sampled example's "
        f"{cfg.augmult} augmented copies, random crops with padding {cfg.augment_padding}"
        f"{flips}, had their mean gradient clipped to C as one unit: sensitivity C per "
        f"example, the same q, σ and ledger as K = 1)"
    )


def _describe(cfg: TrainConfig, notes: Mapping[str, Any], data: DataSplits, private) -> str:
    params, spec = sum(p.numel() for p in private.model.parameters()), private.optimizer.spec
    clip = clip_description(private) + augmult_description(cfg) + batchnorm_description(spec)
    return (
        f"{cfg.model} ({params:,} parameters) trained with {ALGORITHM[spec.noise.name]} "
        f"({cfg.optimizer}, lr "
        f"{cfg.lr:g}, {clip}, expected batch "
        f"{cfg.batch_size}, {cfg.epochs} epochs) on {data.description}; device: "
        f"{notes.get('device', cfg.device)}; δ: {notes.get('delta_rule', 'given')}"
    )


# What each entry of a method's ``sets`` means to a reader of the report (dpfy.adaptive.SETS).
PLAN_FIELD_TEXT = {
    "noise_multiplier": "the noise multiplier σ_t (the noise schedule)",
    "clip": "the clipping threshold C_t",
    "lr_scale": "the learning-rate scale",
    "noise_split": "the split of σ_t between the gradient and its own releases",
}


def _members(method) -> Sequence:
    """The methods of a run in the order they run within a step (a chain's members)."""
    if method is None:
        return ()
    return method.members if isinstance(method, Chain) else (method,)


def methods_ran(method, noise_multiplier: float | None = None) -> list[dict[str, str]]:
    """One row per adaptive method of the run: its name and what it releases per step, from
    its release specs at step 0 of the run it was calibrated for (the gradient sum, then the
    method's own releases), as ``dpfy methods`` lists them for an example run.

    ``noise_multiplier``: the run's σ before the methods plan (None: 1, for methods that set
    σ themselves)."""
    if method is None:
        return []
    rows = describe_releases(
        method, noise_multiplier=(1.0 if noise_multiplier is None else noise_multiplier)
    )
    return [
        {
            "name": method_name(m),
            "releases": releases_text(rows, owner=method_name(m)),
        }
        for m in _members(method)
    ]


def public_data(cfg: TrainConfig, method, num_test: int) -> str | None:
    """The report's statement about the split the user declared public, or None."""
    if cfg.public_validation != "test":
        return None
    readers = [m for m in _members(method) if m.implements("observe")]
    head = (
        f"the user declared the test split public (--public-validation test; {num_test} "
        f"examples), so the guarantee does not cover it as private data, and it must not "
        f"contain private data"
    )
    if not readers:
        return f"{head}. No method of this run read it; only the test-set metrics used it"
    names = ", ".join(f"`{method_name(m)}`" for m in readers)
    drove = sorted({PLAN_FIELD_TEXT.get(f, f) for m in readers for f in m.sets})
    return (
        f"{head}. Its accuracy, measured after every epoch, was read by {names} and "
        f"drove {' and '.join(drove) or 'the method'}; it entered training without noise "
        f"and without a ledger entry because it was declared public"
    )


def user_section(cfg: TrainConfig, private, ledger) -> ReportSection:
    """The report's "Unit of privacy: users" section for a ``--user-ids`` run (ULS or ELS)."""
    assert cfg.delta is not None, "resolve() set δ"
    sampler = private.optimizer.sampler
    units = sampler.units
    largest = int(units.sizes.max())
    if sampler.sampling.value == "uls":
        k = sampler.max_examples_per_step
        algorithm = "ULS, user-level sampling (Charles et al. 2024)"
        rows = (
            "all of their examples"
            if k is None
            else f"at most {k} of their examples, drawn at random each step"
        )
        details = [
            f"Each user joins a step with probability q = {sampler.sample_rate:.5g} "
            f"(expected {sampler.normalizer:.4g} users per step; the noisy sum over "
            f"users is divided by that number).",
            f"A sampled user brings {rows} (the largest user holds {largest}); the "
            f"{units.reduction} of their "
            f"gradients is clipped to C as one vector.",
            "Accounting: a Poisson-subsampled Gaussian at the user level.",
        ]
        data = {
            "user_sampling": "uls",
            "user_rate": sampler.sample_rate,
            "max_examples_per_step": k,
            "user_reduction": units.reduction,
            "largest_user": largest,
        }
    else:
        k = sampler.max_examples_per_user
        algorithm = "ELS, example-level sampling with contribution bounding (Charles et al. 2024)"
        details = [
            f"Every user keeps at most k = {k} of their examples (the largest user held "
            f"{largest}): a uniformly random subset, chosen once from the sampler's "
            f"secret generator; {sampler.num_kept:,} of {sampler.num_examples:,} "
            f"examples are kept.",
            f"Examples join a step with probability q = {sampler.sample_rate:.5g} and "
            f"are clipped one by one to C.",
        ]
        data = {
            "user_sampling": "els",
            "example_rate": sampler.sample_rate,
            "max_examples_per_user": k,
            "kept_examples": sampler.num_kept,
            "largest_user": largest,
        }
    return user_level_section(
        ledger,
        delta=cfg.delta,
        accountant=cfg.accountant,
        num_users=units.num_users,
        num_examples=units.num_examples,
        algorithm=algorithm,
        details=details,
        data=data,
    )


# What the run's --noise trains with, in words.
ALGORITHM = {
    "gaussian": "DP-SGD",
    "tree": "DP-FTRL (tree aggregation)",
    "bandmf": "BandMF (banded matrix factorization)",
}


def write_report(
    cfg: TrainConfig,
    notes: Mapping[str, Any],
    data: DataSplits,
    private,
    directory: Path,
    sections: Sequence[ReportSection] = (),
) -> float:
    """Write the report files into ``directory``; return the final ε (``cfg.accountant``).

    ``sections``: extra report sections (a tuning grid, an audit, per-group budgets)."""
    assert cfg.delta is not None, "resolve() set δ"
    ledger = private.optimizer.ledger
    sampler = private.optimizer.sampler
    users = sampler.units.name == "user"
    if users:
        sections = (user_section(cfg, private, ledger), *sections)
    PrivacyReport.from_ledger(
        ledger,
        delta=cfg.delta,
        accountant=cfg.accountant,
        released=RELEASED,
        dataset_size=sampler.dataset_size if users else data.num_train,  # U or N
        model_description=_describe(cfg, notes, data, private),
        layer_table=private.optimizer.grads.explain_planned(),  # per layer: rule, route (R7)
        # the unit of privacy and the sampling note, from the run spec
        **report_context(private.optimizer.spec, steps_per_epoch=private.steps_per_epoch),
        warnings=(SEED_WARNING,) if cfg.reproducible else (),
        not_released=NOT_RELEASED,
        methods=methods_ran(private.optimizer.method, private.noise_multiplier),
        public_data="; ".join(
            filter(
                None,
                [
                    public_data(cfg, private.optimizer.method, data.num_test),
                    public_statistics_statement(private.optimizer.spec),
                ],
            )
        )
        or None,
        sections=sections,
    ).write(directory)
    return float(ledger_epsilon(ledger, delta=cfg.delta, accountant=cfg.accountant))
