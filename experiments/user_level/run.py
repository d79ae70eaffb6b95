"""User-level DP on a federated partition of real Fashion-MNIST: example-level DP-SGD read at
the user level by group privacy, ELS, ULS and DP-FedAvg, at user-level ε ∈ {1, 3, 8}.

Run from the repository root (see README.md in this folder for the command, the machine and
the results):

    PYTHONPATH=src python experiments/user_level/run.py --out experiments/user_level/results

Cells (every ε reported by PLD, δ = 1/U^1.1 at the user level, the unit stated in every row;
σ calibrated by --calibrate-with, PLD by default):
  a  example-level DP-SGD at example ε ∈ {1, 3, 8}, its user-level ε by group privacy at the
     largest user's size (what people report today);
  b  ELS, k ∈ {1, 4, 16}    } through make_private(user_ids=..., user_sampling=...), when the
  c  ULS                    } installed dpfy has it (else the row says "not available");
  d  DP-FedAvg, 1 and 5 local epochs, quantile adaptive clipping on the user deltas.

No hyperparameter was chosen by test accuracy: every setting below is fixed in advance
(literature defaults: Andrew et al. 2021's quantile clipping, γ = 0.5, η_C = 0.2, C_0 = 0.1,
σ_b = expected users/20; McMahan et al. 2018's server momentum 0.9); the test split is only
read once, at the end of each run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.adaptive import make
from dpfy.data.user_partition import federated_fashion_mnist
from dpfy.federated import DPFedAvgServer, LocalTraining, USER_UNIT, run_dp_fedavg
from dpfy.models.logreg import logreg
from dpfy.privacy import calibrate_noise_multiplier
from dpfy.privacy.tuning import group_privacy

EPSILONS = (1.0, 3.0, 8.0)
EXAMPLE_UNIT = "one example"


def accuracy(model, test) -> float:
    x, y = test.tensors
    with torch.no_grad():
        return float((model(x).argmax(1) == y).double().mean())


def _row(cell, seed, eps_target, acc, eps_user, unit, secs, **extra):
    return {"cell": cell, "seed": seed, "target_user_epsilon": eps_target,
            "test_accuracy": acc, "user_level_epsilon": eps_user, "unit": unit,
            "seconds": round(secs, 1), **extra}


def cell_a(splits, partition, seed, args):
    """Example-level DP-SGD at example ε, read at the user level by group privacy."""
    rows = []
    n = len(splits.train)
    k_max = int(partition.sizes.max())
    delta_ex = n ** -1.1
    for eps in args.epsilons:
        t0 = time.time()
        torch.manual_seed(seed)
        model = logreg(splits.input_shape, splits.num_classes)
        opt = torch.optim.SGD(model.parameters(), lr=args.dpsgd_lr)
        loader = DataLoader(splits.train, batch_size=args.dpsgd_batch)
        model, opt, loader = dpfy.make_private(
            model, opt, loader, target_epsilon=eps, target_delta=delta_ex,
            epochs=args.dpsgd_epochs, max_grad_norm=1.0, seed=seed,
            accountant=args.calibrate_with)
        for _ in range(args.dpsgd_epochs):
            for x, y in loader:
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
        eps_ex = opt.epsilon(delta_ex, accountant="pld")
        eps_user, delta_user = group_privacy(eps_ex, delta_ex, group_size=k_max)
        rows.append(_row("a: example-level DP-SGD + group privacy", seed, eps,
                         accuracy(model, splits.test), eps_user, USER_UNIT, time.time() - t0,
                         example_level_epsilon=eps_ex, example_level_delta=delta_ex,
                         group_size=k_max, user_level_delta=delta_user))
    return rows


def _user_level_make_private(splits, partition, seed, args, sampling, k, eps):
    """(b)/(c): make_private with user ids (the user-level API of dpfy)."""
    torch.manual_seed(seed)
    model = logreg(splits.input_shape, splits.num_classes)
    opt = torch.optim.SGD(model.parameters(), lr=args.dpsgd_lr)
    # ULS: batch_size is the expected number of users per step (q_u = batch / U); ELS: the
    # expected number of examples, users_per_round·k, so both take U/users_per_round steps
    # per epoch, as many as DP-FedAvg's rounds per pass over the users.
    batch = round(args.users_per_round) * (1 if sampling == "uls" else k)
    loader = DataLoader(splits.train, batch_size=batch)
    delta_user = partition.num_users ** -1.1
    model, opt, loader = dpfy.make_private(
        model, opt, loader, target_epsilon=eps, target_delta=delta_user,
        epochs=args.user_epochs, max_grad_norm=1.0, seed=seed, accountant=args.calibrate_with,
        user_ids=partition.user_ids, user_sampling=sampling, max_examples_per_user=k)
    for _ in range(args.user_epochs):
        for x, y in loader:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    return accuracy(model, splits.test), opt.epsilon(delta_user, accountant="pld")


def cells_bc(splits, partition, seed, args):
    rows = []
    settings = [("b: ELS", "els", k) for k in (1, 4, 16)] + [("c: ULS", "uls", None)]
    for name, sampling, k in settings:
        for eps in args.epsilons:
            t0 = time.time()
            label = f"{name} k={k}" if k else name
            try:
                acc, eps_user = _user_level_make_private(splits, partition, seed, args,
                                                         sampling, k, eps)
            except TypeError as err:      # make_private without user_ids: not in this build
                rows.append(_row(label, seed, eps, None, None, USER_UNIT, time.time() - t0,
                                 status=f"not available in this dpfy ({err})"))
                continue
            rows.append(_row(label, seed, eps, acc, eps_user, USER_UNIT, time.time() - t0))
    return rows


_SIGMAS: dict = {}


def fedavg_sigma(eps, q, rounds, delta, accountant):
    key = (eps, q, rounds, delta, accountant)
    if key not in _SIGMAS:
        _SIGMAS[key] = calibrate_noise_multiplier(target_epsilon=eps, delta=delta,
                                                  sample_rate=q, steps=rounds,
                                                  accountant=accountant)
    return _SIGMAS[key]


def cell_d(splits, partition, seed, args):
    rows = []
    x, y = splits.train.tensors
    users = [(x[ix], y[ix]) for ix in partition.users()]
    q = args.users_per_round / partition.num_users
    delta_user = partition.num_users ** -1.1
    for epochs in args.local_epochs:
        for eps in args.epsilons:
            t0 = time.time()
            torch.manual_seed(seed)
            model = logreg(splits.input_shape, splits.num_classes)
            server = DPFedAvgServer(
                model, num_users=partition.num_users, user_sample_rate=q,
                noise_multiplier=fedavg_sigma(eps, q, args.rounds, delta_user,
                                              args.calibrate_with),
                delta=delta_user, rounds=args.rounds, server_lr=1.0, server_momentum=0.9,
                method=make("quantile", initial_clip=0.1, target_quantile=0.5,
                            step_size=0.2), seed=seed)
            run_dp_fedavg(server, users, F.cross_entropy,
                          LocalTraining(epochs=epochs, lr=args.local_lr,
                                        batch_size=args.local_batch),
                          args.rounds, local_seed=seed)
            rows.append(_row(f"d: DP-FedAvg, {epochs} local epoch(s)", seed, eps,
                             accuracy(server.model, splits.test), server.epsilon(),
                             USER_UNIT, time.time() - t0,
                             noise_multiplier=server.noise_multiplier,
                             final_clip=server.method_state.clip[0]))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--cells", default="abcd")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--epsilons", type=float, nargs="+", default=list(EPSILONS))
    p.add_argument("--num-users", type=int, default=1000)
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--partition-seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=20,
                   help="DP-FedAvg rounds (U / users-per-round = one pass over the users)")
    p.add_argument("--user-epochs", type=int, default=1,
                   help="ULS/ELS epochs (each U / users-per-round steps)")
    p.add_argument("--users-per-round", type=float, default=50.0)
    p.add_argument("--local-epochs", type=int, nargs="+", default=[1, 5])
    p.add_argument("--local-lr", type=float, default=0.1)
    p.add_argument("--local-batch", type=int, default=16)
    p.add_argument("--dpsgd-epochs", type=int, default=1)
    p.add_argument("--dpsgd-batch", type=int, default=600)
    p.add_argument("--dpsgd-lr", type=float, default=0.5)
    p.add_argument("--calibrate-with", choices=("pld", "rdp"), default="pld",
                   help="the accountant that calibrates σ (rdp: faster, a safe upper bound, "
                        "so the PLD ε reported is at or below the target)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    splits, partition = federated_fashion_mnist(num_users=args.num_users, alpha=args.alpha,
                                                seed=args.partition_seed)
    meta = {"partition": partition.describe(), "partition_sha256": partition.sha256(),
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "user_level_delta": args.num_users ** -1.1, "unit": USER_UNIT,
            "torch_threads": 1, "cpu_count": os.cpu_count()}
    (args.out / "meta.json").write_text(json.dumps(meta, indent=1))
    print(meta["partition"], flush=True)
    cells = {"a": cell_a, "b": cells_bc, "d": cell_d}
    with open(args.out / "rows.jsonl", "a") as f:
        for seed in args.seeds:
            for key, fn in cells.items():
                if key not in args.cells and not (key == "b" and "c" in args.cells):
                    continue
                try:
                    rows = fn(splits, partition, seed, args)
                except Exception as err:      # recorded, not hidden: the table says so
                    rows = [{"cell": key, "seed": seed, "status": f"failed: {err!r}"}]
                for row in rows:
                    f.write(json.dumps(row) + "\n")
                    f.flush()
                    print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
