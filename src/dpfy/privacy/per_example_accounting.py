"""Individual (per-example) accounting of a finished DP-SGD run (Yu et al., output-specific
individual DP; the review's §4.5): an analysis for the data holder, not a guarantee.

DP-SGD's guarantee charges every example as if its clipped gradient always had norm C. An
example whose clipped gradient norm is ‖clip(g_i)‖ = ρ_i·C (ρ_i ≤ 1) enters the noisy sum with
sensitivity ρ_i·C, so its own privacy loss in a step is that of the subsampled Gaussian with
noise multiplier σ/ρ_i. Composing each example's per-step RDP over the run and converting at
the run's δ gives a per-example ε_i ≤ the run's ε (RDP is monotone in the noise multiplier).

How it is computed here (Yu et al.'s two cost controls):

- the norms ρ_i are refreshed every ``K`` steps (the caller computes them on the model of step
  jK, for every example, and passes one row per refresh); steps jK … (j+1)K−1 are charged at
  row j;
- each ρ_i is rounded **up** to the grid r·⌈ρ_i/r⌉ (capped at 1), so that few distinct noise
  multipliers need an RDP curve, and the rounding can only raise ε_i.

**These values are data-dependent**: each ε_i is a function of the private data (through the
norms) and of estimated norms between refreshes; publishing them, or choosing what to publish
by them, leaks information and is not covered by the run's guarantee. They tell the data
holder which examples the run was riskier for (Yu et al. find ε_i correlates with the training
loss). The run's published guarantee stays the ledger's ε.

Only Poisson-sampled runs with one Gaussian gradient release per step are analysed (the
relation is add/remove one example); anything else is refused with the fix.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant as _rdp

from dpfy._require import require, require_extra
from dpfy.privacy.canonical import POISSON
from dpfy.privacy.ledger import Ledger
from dpfy.privacy.rdp import INTEGER_ORDERS, ORDERS, atom_rdp
from dpfy.privacy.statement import stated_epsilon
from dpfy.privacy.rdp_integer import epsilons_from_rdp, subsampled_gaussian_rdp
from dpfy.types.sampling import Sampling

__all__ = ["PerExampleEpsilons", "per_example_epsilons", "round_up", "DATA_DEPENDENT_WARNING"]

DATA_DEPENDENT_WARNING = (
    "These per-example ε values are data-dependent: they are computed from the private "
    "examples' gradient norms (estimated every K steps). They are an analysis for the data "
    "holder, not a privacy guarantee: do not publish them or select by them. The run's "
    "guarantee is the single ε of its ledger"
)


_ORDER_WORDS = {
    "integer": "the integer orders among them (a bound a few percent above all orders')",
    "all": "all of them",
}


def round_up(ratios: np.ndarray, r: float | None) -> np.ndarray:
    """ρ rounded up to the grid r·⌈ρ/r⌉, capped at 1 (``r=None``: unchanged, capped at 1)."""
    rho = np.minimum(np.asarray(ratios, dtype=float), 1.0)
    if r is None:
        return rho
    # ρ/r is rounded in float64, so ⌈ρ/r⌉ can be one off either way (0.3·(1 + 1e-13) / 0.1
    # lands on 3.0): one step up where k·r < ρ, one down where (k − 1)·r is still ≥ ρ, so the
    # result is the smallest grid point k·r (as float64 writes it) that is not below ρ
    k = np.ceil(rho / r)
    k = np.where(k * r < rho, k + 1, k)
    k = np.where((k >= 1) & ((k - 1) * r >= rho), k - 1, k)
    return np.minimum(k * r, 1.0)


def _schedule(ledger: Ledger) -> list[tuple[float, float, int]]:
    """(q, σ, count) of each step group, refusing what this analysis cannot account."""
    out = []
    for g in ledger.step_groups:
        require(
            g.sampling is Sampling.POISSON,
            "ledger sampling",
            g.sampling.value,
            "'poisson' for individual accounting",
            "Per-example RDP is derived for Poisson-subsampled Gaussian steps (add/remove one "
            "example); train with Poisson sampling",
        )
        require(
            len(g.releases) == 1 and g.releases[0].noise == "gaussian",
            "ledger releases",
            [r.to_dict() for r in g.releases],
            "one independent Gaussian gradient release per step",
            "Adaptive methods' extra releases and correlated noise are not analysed per "
            "example; account the run with dpfy account instead",
        )
        sigma = g.releases[0].noise_multiplier
        require(sigma > 0, "noise_multiplier", sigma, "> 0", "A run without noise has ε = ∞")
        out.append((g.sample_rate, sigma, g.count))
    return out


@dataclass(frozen=True)
class PerExampleEpsilons:
    """Per-example ε at ``delta`` (composed at ``orders``, capped at the run's ε), the run's ε
    at all of dp_accounting's orders, and a summary."""

    epsilons: np.ndarray
    run_epsilon: float
    delta: float
    orders: str = "integer"

    def quantiles(self, qs: Sequence[float] = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)) -> dict:
        return {float(q): float(np.quantile(self.epsilons, q)) for q in qs}

    def loss_correlation(self, losses: np.ndarray) -> dict[str, float]:
        """Pearson and Spearman correlation of ε_i with the examples' training losses."""
        e, lo = np.asarray(self.epsilons, float), np.asarray(losses, float)
        require(
            lo.shape == e.shape,
            "losses",
            f"shape {lo.shape}",
            f"one loss per example, shape {e.shape}",
        )

        def ranks(v: np.ndarray) -> np.ndarray:
            return np.argsort(np.argsort(v, kind="stable"), kind="stable").astype(float)

        return {
            "pearson": float(np.corrcoef(e, lo)[0, 1]),
            "spearman": float(np.corrcoef(ranks(e), ranks(lo))[0, 1]),
        }

    def report(self, losses: np.ndarray | None = None) -> str:
        """Markdown: quantiles, correlation with the loss, and the data-dependence statement."""
        lines = [
            "## Individual (per-example) accounting",
            "",
            f"Run's ε = {stated_epsilon(self.run_epsilon)} at δ = {self.delta:g} (RDP, "
            f"dp_accounting's orders). Each ε_i is composed at {_ORDER_WORDS[self.orders]} "
            "and capped at the run's ε.",
            "",
            "| quantile | ε_i |",
            "|---|---|",
        ]
        lines += [f"| {q:g} | {v:.4g} |" for q, v in self.quantiles().items()]
        if losses is not None:
            c = self.loss_correlation(losses)
            lines += [
                "",
                f"Correlation of ε_i with the training loss: Pearson {c['pearson']:.3f}, "
                f"Spearman {c['spearman']:.3f}.",
            ]
        lines += ["", f"**{DATA_DEPENDENT_WARNING}.**"]
        return "\n".join(lines) + "\n"

    def plot(self, path: str | Path) -> None:
        """A histogram of ε_i with the run's ε marked (needs ``dpfy[plots]``)."""
        plt = require_extra("matplotlib.pyplot", feature="the per-example ε histogram")
        fig, ax = plt.subplots(figsize=(5, 3.2))
        ax.hist(self.epsilons, bins=40)
        ax.axvline(self.run_epsilon, color="k", linestyle="--", label="run's ε")
        ax.set_xlabel("per-example ε (data-dependent, not a guarantee)")
        ax.set_ylabel("examples")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)


def per_example_epsilons(
    ledger: Ledger,
    norm_ratios: np.ndarray,
    *,
    refresh_every: int,
    delta: float,
    rounding: float | None = None,
    orders: str = "integer",
) -> PerExampleEpsilons:
    """ε_i at ``delta`` of every example from its clipped-norm ratios ρ = ‖clip(g_i)‖ / C.

    ``norm_ratios``: shape (R, N), row j the ratios measured at step j·K (K =
    ``refresh_every``), R = ⌈T/K⌉ for the ledger's T steps. Values above 1 are capped at 1
    (clipping). ``rounding``: the grid r (rounded up), or None. ``orders``: ``"integer"``
    (default) composes each example's RDP at the integer orders among :data:`ORDERS`, in closed
    form for all examples at once (:mod:`dpfy.privacy.rdp_integer`; seconds where ``"all"``
    took minutes); ``"all"`` adds the fractional orders through dp_accounting, one noise level
    at a time. Either way ε_i is capped at the run's ε (both bound the example's loss), and
    the run's ε uses every order of :data:`ORDERS`, as the ledger does.
    """
    rho = np.asarray(norm_ratios, dtype=float)
    require(
        isinstance(refresh_every, int) and refresh_every >= 1,
        "refresh_every",
        refresh_every,
        "an integer >= 1",
    )
    require(0 < delta < 1, "delta", delta, "in (0, 1)", "Pass the run's δ")
    require(
        rounding is None or 0 < rounding <= 1,
        "rounding",
        rounding,
        "None or in (0, 1]",
        "Pass a grid such as 0.01",
    )
    steps = ledger.num_steps
    rows = math.ceil(steps / refresh_every)
    require(
        rho.ndim == 2 and rho.shape[0] == rows,
        "norm_ratios",
        f"shape {rho.shape}",
        f"(⌈T/K⌉ = {rows}, N) for T = {steps} steps and K = {refresh_every}",
        "Pass one row of every example's ratio per refresh",
    )
    require(
        bool(np.all(np.isfinite(rho))) and bool(np.all(rho >= 0)),
        "norm_ratios",
        "a negative or non-finite value",
        "finite and >= 0",
    )
    require(
        orders in ("integer", "all"),
        "orders",
        orders,
        "'integer' or 'all'",
        "'integer' is the fast default; 'all' adds dp_accounting's fractional orders",
    )
    rho = round_up(rho, rounding)
    schedule = _schedule(ledger)
    run_total = np.zeros(len(ORDERS))
    for q, sigma, count in schedule:  # the run charges every example at C: σ itself
        run_total += count * atom_rdp(POISSON, q, sigma, None)
    # per step, expand the schedule: (q, σ) of step t
    q_sigma = [(q, s) for q, s, c in schedule for _ in range(c)]
    run_eps = float(_rdp.compute_epsilon(ORDERS, run_total, delta)[0])
    use = INTEGER_ORDERS if orders == "integer" else ORDERS
    total = np.zeros((rho.shape[1], len(use)))
    for j in range(rows):
        block = q_sigma[j * refresh_every : (j + 1) * refresh_every]
        values, inverse = np.unique(rho[j], return_inverse=True)
        moving = values > 0  # a zero gradient adds nothing of the example: no privacy loss
        per_value = np.zeros((len(values), len(use)))
        for (q, sigma), c in Counter(block).items():
            per_value[moving] += c * _rdp_of(q, sigma / values[moving], orders == "integer")
        total += per_value[inverse]
    eps = epsilons_from_rdp(use, total, delta)
    # each ε_i and the run's ε bound the example's loss (the run charges every example at C):
    # the smaller is a bound too; with the integer orders alone ε_i can exceed the run's ε
    return PerExampleEpsilons(np.minimum(eps, run_eps), run_eps, delta, orders)


def _rdp_of(q: float, sigmas: np.ndarray, integer: bool) -> np.ndarray:
    """RDP curves (len(sigmas), orders) of Poisson-subsampled Gaussian steps at rate q."""
    if integer:
        return subsampled_gaussian_rdp(q, sigmas, INTEGER_ORDERS)
    curves = [atom_rdp(POISSON, q, float(s), None) for s in sigmas]
    return np.stack(curves) if curves else np.zeros((0, len(ORDERS)))
