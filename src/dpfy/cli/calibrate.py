"""``dpfy calibrate``: the noise multiplier (or sample rate, or steps) for a target (ε, δ).

Give three of {noise multiplier, sample rate, steps}; the missing one is solved:

    dpfy calibrate --target-epsilon 3 --delta 1e-5 --sample-rate 0.004 --steps 3000
    dpfy calibrate --target-epsilon 3 --delta 1e-5 --noise-multiplier 1 --steps 3000   # q
    dpfy calibrate --target-epsilon 3 --delta 1e-5 --noise-multiplier 1 --sample-rate 0.004

With ``--grid-runs K`` the noise multiplier is calibrated for a grid of K configurations under
one budget (Galli et al. 2024, per-grid ε): K runs of T steps each, composed, spend the target;
each run gets the share of one run out of K:

    dpfy calibrate --target-epsilon 3 --delta 1e-5 --sample-rate 0.008533 --steps 1172 \
        --grid-runs 49 --accountant rdp                            # σ = 3.141 (RDP)

The GDP CLT is an approximation that can under-report ε, so ``--accountant gdp`` is refused
unless ``--approximate`` is given (to reproduce a paper's GDP calibration); the answer then
also states the rigorous PLD ε of the calibrated run. Targets above ε = 100 are refused (see
:mod:`dpfy.privacy.calibration`).
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from dpfy.cli import add_command
from dpfy._require import require
from dpfy.cli.account import (
    DEFAULT_ACCOUNTANT,
    add_run_shape_arguments,
    resolve_noise,
    resolve_run_shape,
    shape_ledger,
)
from dpfy.privacy.accountants import ACCOUNTANTS, accountant_label, epsilon
from dpfy.privacy.calibration import (
    calibrate_noise_multiplier,
    calibrate_sample_rate,
    calibrate_steps,
)
from dpfy.privacy.ledger import Ledger, Sampling
from dpfy.privacy.tuning import calibrate_grid_noise_multiplier, grid_epsilon

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(
        subparsers,
        "calibrate",
        __doc__,
        "dpfy calibrate --target-epsilon 3 --delta 1e-5 --sample-rate 0.004 --steps 3000",
    )
    p.add_argument("--target-epsilon", type=float, required=True, metavar="E")
    p.add_argument("--delta", type=float, required=True, metavar="D")
    add_run_shape_arguments(p)
    p.add_argument(
        "--noise-multiplier",
        type=float,
        metavar="S",
        help="give σ to solve for the sample rate or the number of steps instead",
    )
    p.add_argument(
        "--grid-runs",
        type=int,
        metavar="K",
        help="calibrate σ so that K runs (a hyperparameter grid of K configurations, "
        "each of the given run shape) together spend the target ε",
    )
    p.add_argument(
        "--accountant",
        choices=ACCOUNTANTS,
        default=DEFAULT_ACCOUNTANT,
        help="pld (default, as dpfy train), rdp, or gdp (an approximation; needs --approximate)",
    )
    p.add_argument(
        "--approximate",
        action="store_true",
        help="allow --accountant gdp (the CLT approximation); the rigorous PLD ε "
        "is printed next to it",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.noise != "gaussian":
        return _run_correlated(args)
    sampling = Sampling(args.sampling)
    common = _targets(args, sampling)
    runs = args.grid_runs
    k = {"max_examples_per_user": args.max_examples_per_user}  # ELS's k (else None)
    if runs is not None:
        require(
            args.max_examples_per_user is None,
            "--max-examples-per-user",
            args.max_examples_per_user,
            "omitted with --grid-runs",
            "Calibrate an ELS grid's runs one at a time",
        )
        require(runs >= 1, "grid_runs", runs, "an integer >= 1 (configurations in the grid)")
        require(
            args.noise_multiplier is None,
            "--noise-multiplier",
            args.noise_multiplier,
            "omitted with --grid-runs (it solves for the noise multiplier)",
            "Give --sample-rate and --steps (or --batch-size, --dataset-size, --epochs)",
        )
    if runs is not None:
        q, steps = resolve_run_shape(args)
        assert q is not None and steps is not None  # resolve_run_shape required both
        sigma = calibrate_grid_noise_multiplier(sample_rate=q, steps=steps, runs=runs, **common)
        solved = "noise_multiplier"
    elif args.noise_multiplier is None:
        q, steps = resolve_run_shape(args)
        assert q is not None and steps is not None  # resolve_run_shape required both
        sigma = calibrate_noise_multiplier(sample_rate=q, steps=steps, **common, **k)
        solved = "noise_multiplier"
    else:
        require(
            math.isfinite(args.noise_multiplier) and args.noise_multiplier > 0,
            "noise_multiplier",
            args.noise_multiplier,
            "> 0 and finite",
        )
        sigma = args.noise_multiplier
        q, steps = resolve_run_shape(args, need_steps=False, need_rate=False)
        require(
            (q is None) != (steps is None),
            "--sample-rate/--steps",
            (q, steps),
            "exactly one of them given with --noise-multiplier",
            "Omit the one you want solved",
        )
        if q is None:
            assert steps is not None  # exactly one of q, steps is None
            q = calibrate_sample_rate(noise_multiplier=sigma, steps=steps, **common, **k)
            solved = "sample_rate"
        else:
            require(0 < q <= 1, "sample_rate", q, "in (0, 1]")
            steps = calibrate_steps(noise_multiplier=sigma, sample_rate=q, **common, **k)
            solved = "steps"
    single_run = shape_ledger(args, sampling, q, sigma, steps, **k)
    runs_ledgers = [single_run] * (runs or 1)  # the grid's runs, each from a fresh sampler

    def spent(accountant: str) -> float:
        return grid_epsilon(runs_ledgers, delta=args.delta, accountant=accountant)

    reached = spent(args.accountant)
    out = _solution(args, solved, sigma, q, steps, reached, sampling)
    if runs is not None:
        # "epsilon" is the whole grid's; each run alone spends the per-run share below (at the
        # same δ; under composition it is more than target/K).
        out["runs"] = runs
        out["steps_per_run"] = steps
        out["total_steps"] = runs * single_run.num_steps
        out["epsilon_per_run"] = epsilon(single_run, delta=args.delta, accountant=args.accountant)
        out["budget_share_per_run"] = 1.0 / runs  # each run is 1/K of the composition
    if args.accountant == "gdp":
        out["epsilon_pld"] = spent("pld")
    if args.dataset_size and solved == "sample_rate":
        out["batch_size"] = int(q * args.dataset_size)
    if args.json:
        print(json.dumps(out))
        return 0
    rigorous = (
        f"; rigorous PLD ε of this {'grid' if runs is not None else 'run'} = "
        f"{_stated(out['epsilon_pld'])}"
        if "epsilon_pld" in out
        else ""
    )
    shape = f"at q = {_shown('sample_rate', q)} with σ = {_shown('noise_multiplier', sigma)}"
    if runs is not None:
        print(
            f"{solved} = {_shown(solved, out[solved])}: {runs} runs × {steps} steps {shape} "
            f"spend ε = {_stated(reached)} ≤ {args.target_epsilon:g} at "
            f"δ = {_shown('delta', args.delta)} together for {_relation(single_run)} "
            f"(one run alone: ε = "
            f"{_stated(out['epsilon_per_run'])}) [{out['accountant_label']}]{rigorous}"
        )
        return 0
    print(
        f"{solved} = {_shown(solved, out[solved])}: {steps} steps {shape} spend ε = "
        f"{_stated(reached)} ≤ {args.target_epsilon:g} at δ = {_shown('delta', args.delta)} "
        f"for {_relation(single_run)} [{out['accountant_label']}]{rigorous}"
    )
    return 0


def _shown(name: str, value: float) -> str:
    """A solved value as printed, to 6 significant digits on the side that spends no more than
    the value itself: σ rounded up, q rounded down (a user copies it into a run); steps whole
    (to 6 digits, 3813826 read 3.81383e+06, more steps than solved); δ rounded up to 3 digits,
    as every statement shows it."""
    from dpfy.privacy import statement  # local: not for --help

    if name == "steps":
        return str(int(value))
    if name == "delta":
        return statement.stated_delta(value)
    if name == "noise_multiplier":
        return statement.rounded_up(value, 6)
    assert name == "sample_rate", name  # the four values a calibration prints
    return statement.rounded_down(value, 6)


def _targets(args: argparse.Namespace, sampling: Sampling) -> dict[str, Any]:
    """The calibrations' keywords every search shares: the target, the accountant, the
    sampling and the dataset size."""
    return {
        "target_epsilon": args.target_epsilon,
        "delta": args.delta,
        "accountant": args.accountant,
        "sampling": sampling,
        "dataset_size": args.dataset_size,
        "approximate": args.approximate,
    }


def _stated(epsilon: float) -> str:
    """ε as a statement shows it: rounded up, never smaller than computed."""
    from dpfy.privacy.statement import stated_epsilon  # local: not for --help

    return stated_epsilon(epsilon)


def _relation(ledger: Ledger) -> str:
    """The unit and neighbouring relation the calibrated ε is stated for."""
    from dpfy.privacy.statement import relation  # local: not for --help

    return relation(ledger.unit(), ledger.adjacency())


def _solution(
    args: argparse.Namespace,
    solved: str,
    sigma: float,
    q: float,
    steps: int,
    reached: float,
    sampling: Sampling,
) -> dict[str, Any]:
    """The calibrated run's shape and what it spends: the ``--json`` record (and the line)."""
    return {
        "solved": solved,
        "noise_multiplier": sigma,
        "sample_rate": q,
        "steps": steps,
        "epsilon": reached,
        "target_epsilon": args.target_epsilon,
        "delta": args.delta,
        "accountant": args.accountant,
        "accountant_label": accountant_label(args.accountant),
        "approximate": args.accountant == "gdp",
        "sampling": sampling.value,
    }


def _run_correlated(args: argparse.Namespace) -> int:
    """σ for a target ε with --noise tree or bandmf (the other searches are DP-SGD's only)."""
    require(
        args.grid_runs is None and args.noise_multiplier is None,
        "--grid-runs / --noise-multiplier",
        (args.grid_runs, args.noise_multiplier),
        f"omitted with --noise {args.noise} (it solves for σ)",
        "Give the run's shape and the target; solve q or T with --noise gaussian",
    )
    q, steps = resolve_run_shape(args)
    assert q is not None and steps is not None  # resolve_run_shape required both
    sampling, rate, noise = resolve_noise(args, q)
    sigma = calibrate_noise_multiplier(
        sample_rate=rate, steps=steps, **_targets(args, sampling), **noise
    )
    ledger = shape_ledger(args, sampling, rate, sigma, steps, **noise)
    reached = epsilon(ledger, delta=args.delta, accountant=args.accountant)
    out = {**_solution(args, "noise_multiplier", sigma, rate, steps, reached, sampling), **noise}
    if args.json:
        print(json.dumps(out))
        return 0
    print(
        f"noise_multiplier = {_shown('noise_multiplier', sigma)}: {steps} steps of {args.noise} "
        f"noise (period {noise['period']}) on {sampling.value} sampling at "
        f"q = {_shown('sample_rate', rate)} spend "
        f"ε = {_stated(reached)} ≤ {args.target_epsilon:g} at δ = {_shown('delta', args.delta)} "
        f"for {_relation(ledger)} [{accountant_label(args.accountant)}]"
    )
    return 0
