"""``dpfy calibrate``: the noise multiplier (or sample rate, or steps) for a target (ε, δ).

Give three of {noise multiplier, sample rate, steps}; the missing one is solved:

    dpfy calibrate --target-epsilon 3 --delta 1e-5 --sample-rate 0.004 --steps 3000
    dpfy calibrate --target-epsilon 3 --delta 1e-5 --noise-multiplier 1 --steps 3000   # q
    dpfy calibrate --target-epsilon 3 --delta 1e-5 --noise-multiplier 1 --sample-rate 0.004

The GDP CLT is an approximation that can under-report ε, so ``--accountant gdp`` is refused
unless ``--approximate`` is given (to reproduce a paper's GDP calibration); the answer then
also states the rigorous PLD ε of the calibrated run. Targets above ε = 100 are refused (see
:mod:`dpfy.privacy.calibration`).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from dpfy._require import require
from dpfy.cli.account import add_run_shape_arguments, resolve_run_shape
from dpfy.privacy.accountants import ACCOUNTANTS, accountant_label, epsilon
from dpfy.privacy.calibration import (calibrate_noise_multiplier, calibrate_sample_rate,
                                      calibrate_steps)
from dpfy.privacy.ledger import Ledger, Sampling

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "calibrate", help="noise multiplier (or sample rate, or steps) for a target (ε, δ)",
        description=__doc__.splitlines()[0],
        epilog="Example: dpfy calibrate --target-epsilon 3 --delta 1e-5 --sample-rate 0.004 "
               "--steps 3000")
    p.add_argument("--target-epsilon", type=float, required=True, metavar="E")
    p.add_argument("--delta", type=float, required=True, metavar="D")
    add_run_shape_arguments(p)
    p.add_argument("--noise-multiplier", type=float, metavar="S",
                   help="give σ to solve for the sample rate or the number of steps instead")
    p.add_argument("--accountant", choices=ACCOUNTANTS, default="rdp",
                   help="rdp (default), pld, or gdp (an approximation; needs --approximate)")
    p.add_argument("--approximate", action="store_true",
                   help="allow --accountant gdp (the CLT approximation); the rigorous PLD ε "
                        "is printed next to it")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    sampling = Sampling(args.sampling)
    common = dict(target_epsilon=args.target_epsilon, delta=args.delta,
                  accountant=args.accountant, sampling=sampling,
                  dataset_size=args.dataset_size, approximate=args.approximate)
    if args.noise_multiplier is None:
        q, steps = resolve_run_shape(args)
        sigma = calibrate_noise_multiplier(sample_rate=q, steps=steps, **common)
        solved = "noise_multiplier"
    else:
        require(args.noise_multiplier > 0, "noise_multiplier", args.noise_multiplier, "> 0")
        sigma = args.noise_multiplier
        q, steps = resolve_run_shape(args, need_steps=False, need_rate=False)
        require((q is None) != (steps is None), "--sample-rate/--steps", (q, steps),
                "exactly one of them given with --noise-multiplier",
                "Omit the one you want solved")
        if q is None:
            q = calibrate_sample_rate(noise_multiplier=sigma, steps=steps, **common)
            solved = "sample_rate"
        else:
            require(0 < q <= 1, "sample_rate", q, "in (0, 1]")
            steps = calibrate_steps(noise_multiplier=sigma, sample_rate=q, **common)
            solved = "steps"
    ledger = Ledger.homogeneous(sample_rate=q, noise_multiplier=sigma, steps=steps,
                                sampling=sampling, dataset_size=args.dataset_size)
    reached = epsilon(ledger, delta=args.delta, accountant=args.accountant)
    out: dict[str, Any] = {"solved": solved, "noise_multiplier": sigma, "sample_rate": q,
                           "steps": steps, "epsilon": reached, "target_epsilon":
                           args.target_epsilon, "delta": args.delta,
                           "accountant": args.accountant,
                           "accountant_label": accountant_label(args.accountant),
                           "approximate": args.accountant == "gdp", "sampling": sampling.value}
    if args.accountant == "gdp":
        out["epsilon_pld"] = epsilon(ledger, delta=args.delta, accountant="pld")
    if args.dataset_size and solved == "sample_rate":
        out["batch_size"] = int(q * args.dataset_size)
    if args.json:
        print(json.dumps(out))
        return 0
    rigorous = (f"; rigorous PLD ε of this run = {out['epsilon_pld']:.4g}"
                if "epsilon_pld" in out else "")
    print(f"{solved} = {out[solved]:.6g}: {steps} steps at q = {q:.6g} with σ = {sigma:.6g} "
          f"spend ε = {reached:.4g} ≤ {args.target_epsilon:g} at δ = {args.delta:.3g} "
          f"[{out['accountant_label']}]{rigorous}")
    return 0

