"""``dpfy train --method hyfree`` with HyFreeDP's probe rounds traced, and the trace's plots.

    .venv/bin/python benchmarks/hyfree_fmnist.py run TRACE.jsonl -- <dpfy train flags>
    .venv/bin/python benchmarks/hyfree_fmnist.py plot TRACE.jsonl OUT_PREFIX

``run`` is exactly ``dpfy train <flags>`` (same parser, same pipeline, same report) with one
line per probe round appended to TRACE.jsonl: the step, η before and after the round, R_l used
and the next R_l, the three released mean losses (at θ, θ − c·η·d, θ + c·η·d), and the fit
(a, b) with the noise stds the rule compared them to. Everything traced is a function of
released values (post-processing), so the trace is publishable like the report. ``plot`` draws
η_t and R_l,t (``OUT_PREFIX_lr.png``, ``OUT_PREFIX_loss_clip.png``), the plots the reproduction
of seed 004 (Figure 4) asks for. Results: docs/results/hyfree_fmnist.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dpfy.adaptive.hyfree import PROBES, HyFreeDP


def _traced(path: Path):
    """HyFreeDP._after_probes wrapped to append each round to ``path``."""
    inner = HyFreeDP._after_probes

    def after_probes(self, state, released):
        new = inner(self, state, released)
        b_size = released.expected_batch_size
        _, std_a, std_b = self.round_noise(state, b_size)
        pool = new.pool
        row = {"step": int(released.plan.step), "lr_before": state.lr, "lr_after": new.lr,
               "loss_clip": state.loss_clip, "next_loss_clip": new.loss_clip,
               "fit": list(new.last_fit) if state.direction is not None else None,
               "std_a": std_a, "std_b": std_b,
               "losses": [float(released.sums[n]) / b_size for n in PROBES],
               "pooled": (None if pool is None or pool.rounds == 0 else
                          [pool.a, pool.b, pool.std_a, pool.std_b])}
        with path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        return new

    return after_probes


def run(trace: Path, flags: list[str]) -> int:
    from dpfy.cli import main

    HyFreeDP._after_probes = _traced(trace)   # type: ignore[method-assign]
    return main(["train", *flags])


def plot(trace: Path, prefix: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
    steps = [r["step"] for r in rows]
    for key, label, name in (("lr_after", "η_t (after the round)", "lr"),
                             ("next_loss_clip", "R_l,t (for the next round)", "loss_clip")):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot(steps, [r[key] for r in rows], lw=1)
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        ax.set_title(f"HyFreeDP on Fashion-MNIST: {label}")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(f"{prefix}_{name}.png", dpi=110)
        plt.close(fig)


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["run"] and "--" in args:
        sys.exit(run(Path(args[1]), args[args.index("--") + 1:]))
    if args[:1] == ["plot"] and len(args) == 3:
        plot(Path(args[1]), args[2])
        sys.exit(0)
    sys.exit(__doc__)
