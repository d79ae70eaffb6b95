"""The audit's power on the default Fashion-MNIST CNN, through dpfy's real training path.

`audit_config` (make_private, the Poisson sampler, the private step, the ledger) on the default
`dpfy train` configuration — Fashion-MNIST (60,000 training images), the tanh CNN, b = 2,048,
C = 0.1, SGD lr 4 momentum 0.9, σ calibrated by PLD to ε = 3 at δ = 1e-5 — with 1,000 Dirac
canaries, seed 0, one thread, **scaled down to EPOCHS epochs** (the default is 40; an audited
epoch costs about a CPU-minute here), with the noise std multiplied by F behind the ledger's
back for F in SCALES (F = 1: the correct run).

Each run's per-canary scores and secret inclusion bits are saved to fmnist_cnn_scores.npz,
so that fmnist_cnn_curve.py can read them with every statistic. Usage (repository root):

    PYTHONPATH=src python experiments/audit_power/fmnist_cnn_runs.py
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

import numpy as np

import dpfy.audit.run as audit_run
from dpfy.train.config import TrainConfig

EPOCHS = 1
SCALES = (1.0, 0.75, 0.5, 0.25, 0.1, 0.0)
HERE = Path(__file__).resolve().parent

saved: dict[str, np.ndarray] = {}
_original = audit_run.audit_scores


def _keep(scores, included, **kwargs):  # records what the audit tests, then tests it
    saved["scores"], saved["included"] = np.array(scores), np.array(included, dtype=bool)
    return _original(scores, included, **kwargs)


audit_run.audit_scores = _keep


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    cfg = TrainConfig(epochs=EPOCHS, seed=0, threads=1)  # every other setting: the default
    arrays, rows = {}, []
    for scale in SCALES:
        cpu, wall = cpu_seconds(), time.time()
        r = audit_run.audit_config(
            cfg,
            plant_noise_scale=None if scale == 1.0 else scale,
            echo=lambda line: print(line, file=sys.stderr),
        )
        key = f"F{scale:g}"
        arrays[f"{key}_scores"], arrays[f"{key}_included"] = saved["scores"], saved["included"]
        rows.append(
            {
                "F": scale,
                "claimed_epsilon": r.claimed_epsilon,
                "delta": r.delta,
                "steps": r.steps,
                "canaries_in": r.canaries_in,
                "one_run_hull": r.one_run.epsilon,
                "fdp_hull": r.fdp.epsilon,
                "gdp_estimate": r.gdp.epsilon if r.gdp else None,
                "gdp_estimate_low": r.gdp.epsilon_low if r.gdp else None,
                "cpu_s": round(cpu_seconds() - cpu, 1),
                "wall_s": round(time.time() - wall, 1),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
        np.savez_compressed(HERE / "fmnist_cnn_scores.npz", **arrays)
    (HERE / "fmnist_cnn_runs.json").write_text(
        json.dumps(
            {
                "settings": {
                    "epochs": EPOCHS,
                    "seed": 0,
                    "threads": 1,
                    "canaries": 1000,
                    "canary_kind": "dirac",
                    "other": "TrainConfig defaults",
                },
                "runs": rows,
            },
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
