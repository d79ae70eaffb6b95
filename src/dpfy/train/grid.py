"""Hyperparameter tuning under one budget: run a grid, compose its runs, report the winner.

Galli, Palamidessi & Cucinotta 2024 (after Mohapatra et al. 2022) compares methods at equal
**per-grid** ε: a grid
of k configurations is one access to the private data, so its k runs together spend the
target ε and each run gets the budget of one run out of k composed runs.
:func:`run_grid` does this for ``dpfy train`` configurations (``dpfy tune``):

1. the validation data is fixed first: a random fraction of the training split held out (never
   trained on), or the test split when the user declares it public
   (``public_validation="test"``);
2. σ is calibrated so that k identical runs on the remaining training examples spend the
   target ε (:func:`dpfy.privacy.tuning.calibrate_grid_noise_multiplier`, the same ledger a run
   writes, composed k times);
3. every configuration trains at that σ through :func:`dpfy.train.train` (its own ledger);
4. the grid's ε is the accountant's ε of **all k ledgers composed**
   (:func:`dpfy.privacy.tuning.grid_epsilon`), never k·ε_run;
5. the winner (best final-epoch validation metric) keeps its run directory; its privacy report
   states the whole grid's ε as the tuning cost and lists every configuration in a
   "Tuning grid" section. The other runs' directories are deleted (their ledgers are in the
   composition; their models are not published).

What is not protected: the validation examples choose the winner without noise. Held-out
examples are outside the training set the ε is about; the report says so (section 2, "Public
data") and the tuning statement repeats it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch.utils.data import Subset

from dpfy._require import require
from dpfy.adaptive.base import method_name
from dpfy.data import DataSplits, load_dataset
from dpfy.errors import PrivacyRefusal
from dpfy.models import build_model
from dpfy.privacy.ledger import Ledger
from dpfy.privacy.statement import stated_delta, stated_epsilon
from dpfy.privacy.tuning import (
    calibrate_grid_noise_multiplier,
    grid_epsilon,
)
from dpfy.sampling import PoissonSampler
from dpfy.train.config import SEED_WARNING, TrainConfig, resolve
from dpfy.train.evaluate import evaluate
from dpfy.train.grid_axes import GRIDDABLE, GridAxis, GridRun, configurations, parse_axis
from dpfy.train.grid_report import publish_grid, republish_report
from dpfy.train.private import build_methods
from dpfy.train.trainer import train

__all__ = [
    "GridAxis",
    "GridRun",
    "GridResult",
    "parse_axis",
    "configurations",
    "run_grid",
    "SELECT",
    "GRIDDABLE",
    "validation_split",
    "republish_report",
]

# Selection metrics on the validation data: name -> (metrics column, higher is better).
SELECT = {"accuracy": ("test_acc", True), "loss": ("test_loss", False)}
Echo = Callable[[str], None]


@dataclass(frozen=True)
class GridResult:
    """The finished grid: the winner's run directory, every run, and the grid's ε."""

    out: Path
    runs: tuple[GridRun, ...]
    winner: GridRun
    epsilon: float  # all runs' ledgers composed
    delta: float
    noise_multiplier: float
    selected_on: str
    winner_on_test: dict | None = None  # the winner on the test split, when not selected on it

    @property
    def report(self) -> Path:
        return self.out / "privacy_report.md"


def validation_split(data: DataSplits, cfg: TrainConfig, fraction: float) -> tuple[DataSplits, str]:
    """(splits with ``test`` = the selection data, what the selection was made on): a random
    ``fraction`` of the training split held out (never trained on), or the test split when
    ``cfg.public_validation == "test"``. Which examples are held out is secret."""
    if cfg.public_validation == "test":
        return data, (
            f"the test split ({data.num_test} examples), which the user declared "
            f"public (--public-validation test); it chose the winner without noise, so "
            f"the guarantee does not cover it and it must not hold private data"
        )
    require(0 < fraction < 1, "validation_fraction", fraction, "in (0, 1)")
    n = data.num_train
    n_val = int(round(fraction * n))
    require(
        1 <= n_val < n,
        "validation_fraction",
        fraction,
        f"leaving at least one validation and one training example (N = {n})",
    )
    # Which examples are held out is drawn independently of the data (secret, never published).
    gen = torch.Generator().manual_seed(cfg.seed if cfg.seed is not None else secrets.randbits(63))
    order = torch.randperm(n, generator=gen)
    val = Subset(data.train, order[:n_val].tolist())
    kept = Subset(data.train, order[n_val:].tolist())
    held = dataclasses.replace(
        data,
        train=kept,
        test=val,
        description=f"{data.description}; {n_val} training examples held out for validation",
    )
    return held, (
        f"a validation split of {n_val} examples held out of the training data "
        f"(never trained on); they choose the winner without noise, so the guarantee "
        f"covers the other {n - n_val} training examples, not them"
    )


def _check_methods(
    cfg: TrainConfig, axes: Sequence[GridAxis], configs: Sequence[tuple[dict, TrainConfig]]
) -> None:
    """Refuse what the per-grid calibration cannot account, and axes a method would ignore;
    build every configuration's methods once, so a bad option fails before any run."""
    if not cfg.method:
        return
    for _, each in configs[1:]:
        build_methods(each)
    for m in build_methods(cfg) or ():
        require(
            "noise_multiplier" not in m.sets,
            "method",
            method_name(m),
            "a method that keeps the run's σ for dpfy tune",
            "It sets σ_t itself (a schedule calibrates σ_t to one run's ε), which the "
            "per-grid calibration cannot account. Use a method that keeps the run's σ "
            "(e.g. oso, quantile)",
        )
        for a in axes:
            require(
                a.name != "clip" or "clip" not in m.sets,
                "grid name",
                a.name,
                f"not 'clip' with method {method_name(m)!r}, which sets C_t itself",
                f"Grid its own option instead, e.g. {m.registry_name}.initial_clip",
            )


def _metric(run_dir: Path, column: str) -> float:
    rows = json.loads((run_dir / "metrics.json").read_text())
    return float(rows[-1][column])


def run_grid(
    base: TrainConfig,
    axes: Sequence[GridAxis],
    *,
    out: str | Path,
    data: DataSplits | None = None,
    select: str = "accuracy",
    validation_fraction: float = 0.1,
    progress: bool = False,
    echo: Echo = print,
) -> GridResult:
    """Train every configuration of the grid under one budget and publish the winner in ``out``.

    Args:
      base: the configuration every run starts from. ``base.epsilon`` is the **whole grid's**
        target ε (σ is calibrated for k composed runs); with ``base.noise_multiplier`` every run
        uses that σ and the grid's ε is only computed. ``base.public_validation == "test"``
        selects on the test split (declared public), otherwise on a held-out validation split.
      axes: the gridded hyperparameters (:func:`parse_axis`); the grid is their product.
      out: the winner's run directory (must not exist; runs are trained in ``<out>.grid/``).
      data: your own splits (default: ``load_dataset(base.dataset)``).
      select: ``"accuracy"`` (highest) or ``"loss"`` (lowest), final epoch, validation data.
      validation_fraction: share of the training split held out when the test split is not
        declared public.

    Returns the :class:`GridResult`; the winner's ``privacy_report.md`` holds the tuning cost
    (all k ledgers composed) and a "Tuning grid" table, and ``grid.json`` the same numbers.
    """
    require(select in SELECT, "select", select, f"one of {sorted(SELECT)}")
    out = Path(out)
    staging = out.with_name(out.name + ".grid")
    require(not out.exists(), "out", str(out), "a new directory", "Choose another --out")
    require(
        not staging.exists(),
        "out",
        str(out),
        f"without an interrupted grid ({staging} exists)",
        "An interrupted grid already used the data: running it again spends more than its "
        "ε. Delete that directory only if you accept that, or choose another --out",
    )
    configs = configurations(base, axes)
    _check_methods(base, axes, configs)
    k = len(configs)
    data = data if data is not None else load_dataset(base.dataset, data_dir=base.data_dir)
    held, selected_on = validation_split(data, base, validation_fraction)
    resolved, _ = resolve(base, num_examples=held.num_train, reference_delta=held.reference_delta)
    assert resolved.delta is not None and resolved.batch_size is not None, "resolve() set them"
    delta = float(resolved.delta)
    sampler = PoissonSampler(held.num_train, sample_rate=resolved.batch_size / held.num_train)
    steps = base.epochs * sampler.steps_per_epoch
    if base.epsilon is not None:
        sigma = calibrate_grid_noise_multiplier(
            target_epsilon=base.epsilon,
            delta=delta,
            sample_rate=sampler.sample_rate,
            steps=steps,
            runs=k,
            accountant=base.accountant,
            dataset_size=held.num_train,
        )
    else:
        assert base.noise_multiplier is not None, "the config gives ε or σ"
        sigma = float(base.noise_multiplier)
    echo(
        f"dpfy tune: {k} configurations, σ = {sigma:.4g} for each "
        f"({'grid target ε = %g' % base.epsilon if base.epsilon is not None else 'fixed σ'}, "
        f"δ = {stated_delta(delta)}, q = {sampler.sample_rate:.5g}, {steps} steps per run); "
        f"selecting "
        f"on {select} of {selected_on.split(' (')[0]}"
    )
    if base.reproducible:
        echo(f"dpfy tune: WARNING: {SEED_WARNING}.")
    column, higher = SELECT[select]
    staging.mkdir(parents=True)
    runs, ledgers = [], []
    for i, (settings, cfg) in enumerate(configs):
        cfg = dataclasses.replace(cfg, epsilon=None, noise_multiplier=sigma, delta=delta)
        result = train(
            cfg, out=staging / f"run-{i:02d}", data=held, progress=progress, echo=lambda s: None
        )
        ledgers.append(Ledger.from_json((result.out / "ledger.json").read_text()))
        if i == 0 and base.epsilon is not None:
            _check_first_run(ledgers[0], k, base, delta)
        runs.append(
            GridRun(
                index=i,
                settings=settings,
                metric=_metric(result.out, column),
                epsilon=result.epsilon,
            )
        )
        echo(
            f"dpfy tune: run {i + 1}/{k} {settings}: {select} {runs[-1].metric:.4g}, "
            f"ε of this run {stated_epsilon(result.epsilon)}"
        )
    eps_grid = grid_epsilon(ledgers, delta=delta, accountant=base.accountant)
    finite = [r for r in runs if math.isfinite(r.metric)]
    require(
        bool(finite),
        "grid",
        "every run",
        "at least one run with a finite metric",
        "Every configuration diverged; widen or move the grid",
    )
    winner = (max if higher else min)(finite, key=lambda r: r.metric)
    win_dir = staging / f"run-{winner.index:02d}"
    test = _winner_on_test(win_dir, base, data) if base.public_validation != "test" else None
    publish_grid(
        win_dir,
        runs,
        winner,
        eps_grid,
        delta,
        sigma,
        base,
        select,
        selected_on,
        axes,
        ledgers,
        test,
    )
    win_dir.rename(out)
    shutil.rmtree(staging)
    echo(
        f"dpfy tune: winner {winner.settings} ({select} {winner.metric:.4g}); the grid of {k} "
        f"runs spent ε = {stated_epsilon(eps_grid)} at δ = {stated_delta(delta)} "
        f"({base.accountant.upper()}); "
        f"privacy report: {out / 'privacy_report.md'}"
    )
    return GridResult(
        out=out,
        runs=tuple(runs),
        winner=winner,
        epsilon=eps_grid,
        delta=delta,
        noise_multiplier=sigma,
        selected_on=selected_on,
        winner_on_test=test,
    )


def _winner_on_test(win_dir: Path, cfg: TrainConfig, data: DataSplits) -> dict[str, float]:
    """The published model's loss and accuracy on the test split (reported only: the winner
    was chosen on the held-out validation split, so this is an unbiased estimate)."""
    model = build_model(cfg.model, input_shape=data.input_shape, num_classes=data.num_classes)
    model.load_state_dict(torch.load(win_dir / "model.pt", weights_only=True))
    loss, acc = evaluate(model, data.test)
    return {"loss": loss, "accuracy": acc, "examples": data.num_test}


def _check_first_run(ledger: Ledger, k: int, base: TrainConfig, delta: float) -> None:
    """Refuse before the other k − 1 runs when k copies of the first run's real ledger spend
    more than the target (a method whose releases compose above the run's σ)."""
    assert base.epsilon is not None, "only a grid with a target ε is checked"
    eps = grid_epsilon([ledger] * k, delta=delta, accountant=base.accountant)
    if eps > base.epsilon * (1 + 1e-3):
        raise PrivacyRefusal(
            f"grid must spend at most target ε = {base.epsilon:g}, got ε = {eps:.4g} for {k} "
            f"copies of the first run's ledger (method {base.method!r} releases more than one "
            f"Gaussian at the run's σ). Use a method that splits the run's σ, or a fixed "
            f"--noise-multiplier"
        )
