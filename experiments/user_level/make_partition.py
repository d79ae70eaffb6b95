"""Write the federated partition of Fashion-MNIST's training set used by run.py: one user id
per line (example 0 first), plus its description and fingerprint.

    PYTHONPATH=src python experiments/user_level/make_partition.py \
        --out experiments/user_level/data/fmnist_users_u1000_a0.5_seed0.txt

The images are real (Fashion-MNIST, Xiao et al. 2017); the users are synthetic: power-law
sizes and Dirichlet(α) label mixes from a public seed (dpfy.data.user_partition).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dpfy.data.user_partition import federated_fashion_mnist


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--num-users", type=int, default=1000)
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    _, partition = federated_fashion_mnist(num_users=args.num_users, alpha=args.alpha,
                                           seed=args.seed)
    partition.save(args.out)
    meta = {"description": partition.describe(), "sha256_int32_le": partition.sha256(),
            "file": args.out.name}
    args.out.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
