"""The guide's tuning recipe (``dpfy tune --recipe guide``): ClipSearch, then a private lr sweep.

Ponomareva et al. 2023, §5.4.1 ("hyperparameter tuning strategy under computation and privacy
constraints"), with the compute fixed by the user:

1. **compute**: the batch size B and the epochs E are the user's; every tuning run takes the
   final run's number of steps S = E·⌈N/B⌉ (N: the whole training split);
2. **non-private learning rate** (the report's search 1): σ = 0 and clipping off; sweep
   ``lr_grid``; α_nop is the best;
3. **ClipSearch** (search 2): σ = 0, clipping on, lr = α_nop; sweep ``clip_grid`` (logarithmic,
   as the guide recommends); C̃ is the **smallest** C whose validation metric is within
   ``tolerance`` of the best validation metric of steps 2 and 3 (the guide: "affected only
   slightly … err on the side of smaller C"; the number is :data:`CLIP_TOLERANCE`'s documented
   choice);
4. **σ** calibrated so that the final run (S steps at q = B/N) spends the target ε;
5. **private lr sweep** (search 3): σ and C̃ fixed, lr = α_nop·f for f in ``lr_factors``, i.e.
   C̃·lr within a band around C̃·α_nop (Kurakin et al. 2022: utility is roughly constant along
   C·lr = const); the best is the final learning rate;
6. **final run**: ``dpfy train`` on the **whole** training split with (lr, C̃, σ); its ledger is
   the one the report states.

Every choice is made on a validation split carved out of the training split
(:func:`dpfy.train.grid.validation_split`) or on the test split when the user declares it public
(``--public-validation test``); the search never reads the test split otherwise. The test split
is read once, by the final run, to report its accuracy.

**What the guarantee covers.** Only the final run. Steps 2 and 3 train models on the private
training examples **without noise** (σ = 0 releases have ε = ∞: nothing can account them), step 5
trains k private models whose composition and selection are not accounted, and the validation
examples choose without noise. The report says so (section "Tuning recipe") and leaves its
tuning statement "not covered". The guide's default is to tune on public data; if a public
dataset stands in for the private one, run the recipe on it and pass its lr and C to the private
run. ``--private-selection`` (:func:`dpfy.train.grid.run_grid`, per-grid budget) accounts the
search instead; it refuses the σ = 0 steps, which no accountant can cover.

**Cheap tuning at fixed noise** (Sander et al. 2023, "TAN without a burn", §3): with
``tan_batch`` B', the search-3 runs use batch B' and σ' = σ·B'/B for the same S steps, so the noise
on the *average* gradient, Σ̄ = σC/B, is the final run's, at B'/B of its compute. σ' is smaller
than σ: a proxy run is **not** private at the target ε (its own ε, reported per run, is much
larger) and, like every tuning run here, not covered by the guarantee.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from dpfy._require import require
from dpfy.data import DataSplits, load_dataset
from dpfy.privacy.calibration import Target, sigma_for
from dpfy.privacy.events import Poisson
from dpfy.privacy.section import ReportSection
from dpfy.privacy.statement import stated_delta, stated_epsilon
from dpfy.privacy.tuning import log_grid
from dpfy.sampling import PoissonSampler
from dpfy.train.config import SEED_WARNING, TrainConfig, resolve
from dpfy.train.grid import SELECT, republish_report, validation_split
from dpfy.train.probe import Probe, ProbeResult, run_probe
from dpfy.train.rundir import write_atomic
from dpfy.train.trainer import TrainResult, train, usable_cores

__all__ = [
    "CLIP_TOLERANCE",
    "CLIPPING_OFF",
    "DEFAULT_LR_GRID",
    "DEFAULT_CLIP_GRID",
    "DEFAULT_LR_FACTORS",
    "RecipeResult",
    "clip_search",
    "tan_noise_multiplier",
    "final_noise_multiplier",
    "run_recipe",
]

# ClipSearch's tolerance, in units of the selection metric (accuracy: 0.01 = one percentage
# point). The guide gives no number ("affected only slightly"). Chosen before any measurement and
# never tuned on test data: about twice the standard error of an accuracy near 0.85 measured on
# Fashion-MNIST's 6000-example validation split (√(0.85·0.15/6000) ≈ 0.0046), so a C within it is
# not distinguishable from the best on that split.
CLIP_TOLERANCE = 0.01
# "Clipping off" for the non-private lr search: a threshold no finite gradient reaches, so
# g / max(1, ‖g‖/C) = g. (An infinite C would make the noise σ·C = 0·∞ undefined.)
CLIPPING_OFF = 1e30
# Default sweeps: half-decades of lr, the guide's decades of C ({…, 0.01, 0.1, 1, 10, 100, …}),
# and step 5's factors of α_nop (C̃·lr from a tenth to ten times C̃·α_nop).
DEFAULT_LR_GRID = tuple(float(v) for v in log_grid(-3, 1, 9))
DEFAULT_CLIP_GRID = tuple(float(v) for v in log_grid(-2, 2, 5))
DEFAULT_LR_FACTORS = tuple(float(v) for v in log_grid(-1, 1, 5))
Echo = Callable[[str], None]


def tan_noise_multiplier(noise_multiplier: float, batch_size: int, tan_batch: int) -> float:
    """σ' = σ·B'/B: the noise multiplier at batch B' that keeps Σ̄ = σC/B (Sander et al. 2023)."""
    require(
        1 <= tan_batch <= batch_size,
        "tan_batch",
        tan_batch,
        f"in [1, --batch-size = {batch_size}]",
        "A fixed-noise proxy is a smaller batch than the final run's",
    )
    return noise_multiplier * tan_batch / batch_size


def clip_search(
    results: Sequence[ProbeResult],
    *,
    reference: float,
    tolerance: float,
    select: str,
) -> ProbeResult:
    """ClipSearch's choice: the probe with the **smallest** C whose validation metric is within
    ``tolerance`` of ``reference`` (the best seen, clipped or not). Refuses when none is."""
    higher = SELECT[select][1]
    ok = [
        r
        for r in results
        if math.isfinite(r.metric(select))
        and (
            r.metric(select) >= reference - tolerance
            if higher
            else r.metric(select) <= reference + tolerance
        )
    ]
    require(
        bool(ok),
        "clip_grid",
        [r.probe.clip for r in results],
        f"at least one C within {tolerance:g} of the best {select} ({reference:.4g})",
        "Extend --clip-grid upward (a C above the gradients' norms clips nothing), or raise "
        "--clip-tolerance",
    )
    return min(ok, key=lambda r: r.probe.clip)


# RecipeResult's fields the recipe decides, in the order recipe.json lists them
CHOICES = ("lr_nonprivate", "clip", "noise_multiplier", "lr")


@dataclass(frozen=True)
class RecipeResult:
    """What the recipe chose, every tuning run, and the final run."""

    final: TrainResult
    lr_nonprivate: float
    clip: float
    noise_multiplier: float
    lr: float
    nonprivate: tuple[ProbeResult, ...]
    clip_sweep: tuple[ProbeResult, ...]
    private_sweep: tuple[ProbeResult, ...]
    selected_on: str
    tan_batch: int | None

    @property
    def out(self) -> Path:
        return self.final.out

    def choices(self) -> dict[str, float]:
        """The recipe's decisions, for comparing two runs of it."""
        return {name: getattr(self, name) for name in CHOICES}


def run_recipe(
    base: TrainConfig,
    *,
    out: str | Path,
    data: DataSplits | None = None,
    lr_grid: Sequence[float] = DEFAULT_LR_GRID,
    clip_grid: Sequence[float] = DEFAULT_CLIP_GRID,
    lr_factors: Sequence[float] = DEFAULT_LR_FACTORS,
    tolerance: float = CLIP_TOLERANCE,
    select: str = "accuracy",
    validation_fraction: float = 0.1,
    tan_batch: int | None = None,
    progress: bool = False,
    echo: Echo = print,
) -> RecipeResult:
    """Run the guide's recipe (module docstring) and train the final model into ``out``.

    Args:
      base: the fixed compute and everything not searched: ``batch_size`` (B), ``epochs`` (E),
        model, optimizer, momentum, ``epsilon`` (the final run's target) or a fixed
        ``noise_multiplier``. Its ``lr`` and ``clip`` are ignored (they are searched).
      out: the final run's directory (must not exist).
      data: your own splits (default: ``load_dataset(base.dataset)``).
      lr_grid: step 2's learning rates (σ = 0, clipping off).
      clip_grid: step 3's clipping norms (σ = 0, lr = α_nop).
      lr_factors: step 5's learning rates as multiples of α_nop (σ > 0, C̃).
      tolerance: ClipSearch's tolerance in units of ``select`` (:data:`CLIP_TOLERANCE`).
      select: ``"accuracy"`` (highest) or ``"loss"`` (lowest) on the validation data.
      validation_fraction: share of the training split held out for the choices.
      tan_batch: B' for step 5's fixed-noise proxies (σ' = σB'/B, same S steps); ``None``: B.
    """
    require(select in SELECT, "select", select, f"one of {sorted(SELECT)}")
    require(
        math.isfinite(tolerance) and tolerance >= 0,
        "clip_tolerance",
        tolerance,
        ">= 0",
        f"The default {CLIP_TOLERANCE:g} is documented in docs/guide/tuning_recipe.md",
    )
    for name, grid in (("lr_grid", lr_grid), ("clip_grid", clip_grid), ("lr_factors", lr_factors)):
        require(
            len(grid) >= 1 and all(math.isfinite(v) and v > 0 for v in grid),
            name,
            list(grid),
            "at least one value, all > 0",
        )
    extras = {
        "--method": base.method,
        "--clipping": None if base.clipping == "flat" else base.clipping,
        "--individual": base.individual,
        "--user-ids": base.user_ids,
        "--noise": None if base.noise == "gaussian" else base.noise,
    }
    given = [flag for flag, value in extras.items() if value is not None]
    require(
        not given,
        "method",
        ", ".join(f"{f} {extras[f]}" for f in given),
        "plain DP-SGD with flat clipping and Gaussian noise for --recipe guide",
        f"ClipSearch tunes one flat C of example-level DP-SGD; drop {', '.join(given)}",
    )
    out = Path(out)
    require(not out.exists(), "out", str(out), "a new directory", "Choose another --out")
    torch.set_num_threads(base.threads or usable_cores())  # as dpfy train: set before any run
    data = data if data is not None else load_dataset(base.dataset, data_dir=base.data_dir)
    held, _ = validation_split(data, base, validation_fraction)
    selected_on = (
        f"the test split ({data.num_test} examples), which the user declared public "
        f"(--public-validation test)"
        if base.public_validation == "test"
        else f"a validation split of {data.num_train - held.num_train} examples held out of "
        f"the training data (the tuning runs never trained on them; the final run does)"
    )
    final_cfg, _ = resolve(base, num_examples=data.num_train, reference_delta=data.reference_delta)
    assert final_cfg.delta is not None and final_cfg.batch_size is not None, "resolve() set them"
    delta, batch = float(final_cfg.delta), int(final_cfg.batch_size)
    sampler = PoissonSampler(data.num_train, sample_rate=batch / data.num_train)
    steps = base.epochs * sampler.steps_per_epoch
    sigma = final_noise_multiplier(base, delta, sampler.sample_rate, steps, data.num_train)
    if tan_batch is not None:
        sweep_batch, sweep_sigma = tan_batch, tan_noise_multiplier(sigma, batch, tan_batch)
    else:
        sweep_batch, sweep_sigma = batch, sigma
    echo(
        f"dpfy tune --recipe guide: compute fixed at batch {batch}, {base.epochs} epochs "
        f"({steps} steps per run); choosing on {select} of {selected_on.split(' (')[0]}"
    )
    if base.reproducible:
        echo(f"dpfy tune: WARNING: {SEED_WARNING}.")

    def probe(p: Probe, phase: str) -> ProbeResult:
        r = run_probe(
            final_cfg,
            p,
            held.train,
            held.test,
            input_shape=data.input_shape,
            num_classes=data.num_classes,
            delta=delta,
        )
        clip = "off" if p.clip == CLIPPING_OFF else f"{p.clip:.4g}"
        echo(
            f"dpfy tune: {phase}: lr {p.lr:.4g}, C {clip}, σ {p.noise_multiplier:.4g}, "
            f"batch {p.batch_size}: {select} {r.metric(select):.4g}"
        )
        return r

    nonprivate = [
        probe(Probe(lr, CLIPPING_OFF, 0.0, batch, steps), "search 1 (lr, σ=0)") for lr in lr_grid
    ]
    best_nop = _best(nonprivate, select)
    lr_nop = best_nop.probe.lr
    clips = [
        probe(Probe(lr_nop, c, 0.0, batch, steps), "search 2 (ClipSearch, σ=0)") for c in clip_grid
    ]
    reference = _best([best_nop, *clips], select).metric(select)
    clip = clip_search(clips, reference=reference, tolerance=tolerance, select=select).probe.clip
    echo(
        f"dpfy tune: α_nop = {lr_nop:.4g}; ClipSearch chose C = {clip:.4g} (smallest within "
        f"{tolerance:g} of the best {select} {reference:.4g}); σ = {sigma:.4g} for the final run"
        + (f"; sweep at B' = {sweep_batch}, σ' = {sweep_sigma:.4g}" if tan_batch else "")
    )
    sweep = [
        probe(Probe(lr_nop * f, clip, sweep_sigma, sweep_batch, steps), "search 3 (lr, σ>0)")
        for f in lr_factors
    ]
    lr = _best(sweep, select).probe.lr
    cfg = dataclasses.replace(
        base, lr=lr, clip=clip, epsilon=None, noise_multiplier=sigma, delta=delta
    )
    final = train(cfg, out=out, data=data, progress=progress, echo=lambda s: None)
    result = RecipeResult(
        final=final,
        lr_nonprivate=lr_nop,
        clip=clip,
        noise_multiplier=sigma,
        lr=lr,
        nonprivate=tuple(nonprivate),
        clip_sweep=tuple(clips),
        private_sweep=tuple(sweep),
        selected_on=selected_on,
        tan_batch=tan_batch,
    )
    _publish(result, base, held, data, delta, select, tolerance, reference, steps, batch)
    echo(
        f"dpfy tune: final run lr {lr:.4g}, C {clip:.4g}, σ {sigma:.4g}: ε = "
        f"{stated_epsilon(final.epsilon)} at δ = {stated_delta(delta)} for the final run ONLY; "
        f"test accuracy {final.test_acc:.4g}"
    )
    echo(
        f"dpfy tune: NOT covered by that ε: searches 1-2 trained {len(nonprivate) + len(clips)} "
        f"models on {held.num_train} private training examples with σ = 0 (ε = ∞); search 3's "
        f"{len(sweep)} noisy runs and the selections are not accounted (use public data, or "
        f"--private-selection). Privacy report: {final.report}"
    )
    return result


def final_noise_multiplier(
    base: TrainConfig, delta: float, sample_rate: float, steps: int, n: int
) -> float:
    """σ of the final run (``steps`` Poisson steps at ``sample_rate`` on ``n`` examples),
    calibrated to ``base.epsilon`` with ``base.accountant``; ``base.noise_multiplier`` if fixed."""
    if base.epsilon is None:
        assert base.noise_multiplier is not None, "the config gives ε or σ"
        return float(base.noise_multiplier)
    target = Target(base.epsilon, delta, base.accountant)
    return sigma_for(Poisson(sample_rate, dataset_size=n), steps, target)


def _best(results: Sequence[ProbeResult], select: str) -> ProbeResult:
    """The best finite validation metric (first on ties, so the order of the grid decides)."""
    finite = [r for r in results if math.isfinite(r.metric(select))]
    require(
        bool(finite),
        "lr_grid",
        [r.probe.lr for r in results],
        "at least one run with a finite validation metric",
        "Every run diverged; move --lr-grid (or --lr-factors) lower",
    )
    higher = SELECT[select][1]
    return (max if higher else min)(finite, key=lambda r: r.metric(select))


def _row(r: ProbeResult, select: str, chosen: bool) -> dict:
    p = r.probe
    return {
        "lr": p.lr,
        "clip": None if p.clip == CLIPPING_OFF else p.clip,
        "noise_multiplier": p.noise_multiplier,
        "batch_size": p.batch_size,
        "steps": p.steps,
        select: r.metric(select),
        "epsilon_alone": None if math.isinf(r.epsilon) else r.epsilon,
        "accountant": r.accountant,
        "chosen": chosen,
    }


def _table(rows: Sequence[dict], select: str) -> list[str]:
    lines = [
        f"| lr | C | σ | batch | {select} | ε of the run alone |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        alone = row["epsilon_alone"]
        eps = "∞ (no noise)" if alone is None else stated_epsilon(alone)
        clip = "off" if row["clip"] is None else f"{row['clip']:.4g}"
        mark = " (chosen)" if row["chosen"] else ""
        lines.append(
            f"| {row['lr']:.4g}{mark} | {clip} | {row['noise_multiplier']:.4g} | "
            f"{row['batch_size']} | {row[select]:.4g} | {eps} |"
        )
    return lines


def _publish(
    result: RecipeResult,
    base: TrainConfig,
    held: DataSplits,
    data: DataSplits,
    delta: float,
    select: str,
    tolerance: float,
    reference: float,
    steps: int,
    batch: int,
) -> None:
    """Add the "Tuning recipe" section (what touched private data, and how) to the final run's
    report, leave its tuning statement "not covered", and write ``recipe.json``."""
    phases = {
        "nonprivate_lr": [
            _row(r, select, r.probe.lr == result.lr_nonprivate) for r in result.nonprivate
        ],
        "clip_search": [_row(r, select, r.probe.clip == result.clip) for r in result.clip_sweep],
        "private_lr": [_row(r, select, r.probe.lr == result.lr) for r in result.private_sweep],
    }
    k0 = len(result.nonprivate) + len(result.clip_sweep)
    k1 = len(result.private_sweep)
    n_probe = held.num_train
    public = base.public_validation == "test"
    not_covered = (
        f"**Not covered by the guarantee.** The ε of this report is the final run's alone. "
        f"Searches 1 and 2 trained {k0} models on {n_probe} private training examples with "
        f"σ = 0 (no noise, no clipping in search 1): non-private uses of those examples, with "
        f"ε = ∞, that no accountant can cover. Search 3 trained {k1} models with noise; their "
        f"composition and the selection among them are not accounted. The choices were made on "
        f"{result.selected_on}. Only if these searches had run on public data would the final "
        f"run's ε be the whole story; to account a search on private data, use "
        f"--private-selection (σ = 0 steps refused; lr and C from public data)."
    )
    tan = ""
    sigma_tan = result.private_sweep[0].probe.noise_multiplier
    if result.tan_batch is not None:
        tan = (
            f" Search 3 used fixed-noise proxies (Sander et al. 2023): batch B' = "
            f"{result.tan_batch} with σ' = σ·B'/B = {sigma_tan:.4g} for the same {steps} "
            f"steps, so Σ̄ = σC/B matches the final run; σ' < σ, so these proxies are not "
            f"private at the target ε (their own ε is in the table)."
        )
    lines = [
        f"The guide's tuning recipe (Ponomareva et al. 2023, §5.4.1): compute fixed at batch "
        f"{batch} and {base.epochs} epochs ({steps} steps, every tuning run too); every choice "
        f"on the final epoch's validation {select}.",
        "",
        "Search 1, non-private learning rate (σ = 0, clipping off):",
        "",
        *_table(phases["nonprivate_lr"], select),
        "",
        f"Search 2, ClipSearch (σ = 0, lr = {result.lr_nonprivate:.4g}): the smallest C whose "
        f"{select} is within {tolerance:g} of the best of searches 1–2 ({reference:.4g}).",
        "",
        *_table(phases["clip_search"], select),
        "",
        f"Search 3, learning rate at σ = {result.noise_multiplier:.4g} (calibrated for the final "
        f"run) and C = {result.clip:.4g}.{tan}",
        "",
        *_table(phases["private_lr"], select),
        "",
        f"Final run: lr {result.lr:.4g}, C {result.clip:.4g}, σ "
        f"{result.noise_multiplier:.4g}, trained on all {data.num_train} training examples "
        f"(its ledger is this report's).",
        "",
        not_covered,
    ]
    record = {
        "recipe": "guide",
        "select": select,
        "clip_tolerance": tolerance,
        "clip_reference": reference,
        "batch_size": batch,
        "epochs": base.epochs,
        "steps": steps,
        "tan_batch": result.tan_batch,
        "target_epsilon": base.epsilon,
        "delta": delta,
        "choices": result.choices(),
        "selected_on": result.selected_on,
        "validation_examples": None if public else data.num_train - held.num_train,
        "phases": phases,
        "covered_by_guarantee": "the final run only",
        "not_covered": {
            "sigma_zero_runs": k0,
            "noisy_tuning_runs": k1,
            "examples_trained_on_without_noise": n_probe,
        },
        "final": {
            "epsilon": result.final.epsilon,
            "delta": result.final.delta,
            "test_accuracy": result.final.test_acc,
        },
    }
    section = ReportSection("Tuning recipe", tuple(lines), record)
    public_data = (
        f"the tuning recipe chose lr and C on {result.selected_on}, without noise; its σ = 0 "
        f"runs trained on {n_probe} private training examples without noise. Neither use is "
        f"covered by the guarantee (see 'Tuning recipe')"
    )
    republish_report(result.out, delta=delta, section=section, tuning=None, public_data=public_data)
    write_atomic(result.out / "recipe.json", json.dumps(record, indent=1) + "\n")
