"""What correlated-noise steps cost: tree aggregation (DP-FTRL) and banded matrix factorization.

A step whose release carries ``noise="tree"`` or ``noise="bandmf"`` (:class:`Release`) is not
an independent Gaussian mechanism: its noise is correlated with other steps' noise. This module
turns such steps into *charges* — independent Gaussian mechanisms, subsampled or not — that
:func:`dpfy.privacy.canonical.canonical_form` adds to the ledger's atoms. Both reductions are
exact for the worst-case example, not bounds by approximation:

- **Tree aggregation** (Kairouz et al. 2021, "Practical and private (deep) learning without
  sampling or shuffling", Appendix D). The honest tree restarts every ``period`` steps (one
  pass of the shuffled sampler): an example takes part at most once per tree, so its gradient
  enters at most ``depth = ⌈log2(L + 1)⌉`` released nodes of a tree with L leaves, each with
  noise N(0, (σΔ)²). All node releases together are a Gaussian mechanism with sensitivity
  √depth·Δ (adaptive composition of Gaussian mechanisms composes their μ's in quadrature,
  exactly), i.e. one Gaussian release at σ/√depth per tree. dp_accounting's
  ``SingleEpochTreeAggregationDpEvent`` computes the same RDP (α·depth/(2σ²)); stating it as
  a Gaussian also gives the exact PLD. Trees are independent, so several epochs compose.
- **Banded matrix factorization with cyclic Poisson sampling** (Choquette-Choo et al. 2023,
  "Amplified banded matrix factorization", Theorem 4). Step t uses only group t mod b, so an
  example's participations are exactly b apart; with a b-banded strategy C their columns of C
  have disjoint row supports, and with every column norm ≤ 1 each participation is one
  Poisson-subsampled Gaussian at σ. Over c steps, the worst group is visited ⌈c/b⌉ times.
  b = 1 is DP-SGD with Poisson sampling, step for step.

Steps of one tree (or one run of cyclic steps) with different σ are charged at their smallest
σ's, which can only overstate ε.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

from dpfy._require import require
from dpfy.errors import PrivacyRefusal
from dpfy.privacy.ledger import Release, StepGroup
from dpfy.types.sampling import Sampling

__all__ = ["Charge", "correlated_release", "tree_depth", "tree_charges", "cyclic_charges"]


@dataclass(frozen=True)
class Charge:
    """``count`` independent Gaussian mechanisms at ``noise_multiplier`` (before adjacency),
    Poisson-subsampled at ``sample_rate`` when ``sampled``."""

    sampled: bool
    sample_rate: float
    noise_multiplier: float
    count: int


def correlated_release(group: StepGroup) -> Release | None:
    """The group's correlated release, or None when all its releases are independent.

    A correlated mechanism accounts exactly one release per step (the gradient sum): other
    releases composed with it would need their own correlated analysis, so they are refused.
    """
    correlated = [r for r in group.releases if r.noise != "gaussian"]
    if not correlated:
        if group.sampling is Sampling.CYCLIC_POISSON:
            raise PrivacyRefusal(
                f"cyclic Poisson steps must carry BandMF's band count, got steps "
                f"{group.first_step}..{group.last_step} with independent Gaussian releases "
                f"and no period. Record them with Release(..., noise='bandmf', period=b) "
                f"(b = 1 for DP-SGD noise)"
            )
        return None
    if len(group.releases) != 1:
        raise PrivacyRefusal(
            f"a step with correlated noise ({correlated[0].noise}) must release only its "
            f"gradient sum, got {[r.mechanism for r in group.releases]} at steps "
            f"{group.first_step}..{group.last_step}. Use a method without extra releases, "
            f"or noise='gaussian'"
        )
    return correlated[0]


def tree_depth(leaves: int) -> int:
    """Released nodes an example's leaf can enter in an honest tree of ``leaves`` leaves:
    ⌈log2(leaves + 1)⌉ (one per level, as in dp_accounting's tree accountant)."""
    require(leaves >= 1, "leaves", leaves, ">= 1")
    return math.ceil(math.log2(leaves + 1))


def tree_charges(groups: Sequence[StepGroup]) -> list[Charge]:
    """One unsampled Gaussian per tree, at σ_min/√depth (module docstring).

    Tree k holds the ledger's steps [kP, (k+1)P), P the release's ``period`` (the shuffled
    sampler's pass length: the mechanism restarts with each pass). Only shuffled steps are
    accepted: the sampler is what guarantees one participation per pass.
    """
    periods = {correlated_release(g).period for g in groups}  # type: ignore[union-attr]
    require(
        len(periods) <= 1,
        "tree periods",
        sorted(periods),
        "one restart length for the whole ledger",
        "Account runs with different shuffled passes separately",
    )
    trees: dict[int, list[float]] = defaultdict(lambda: [math.inf, 0])  # k -> [σ_min, leaves]
    for g in groups:
        release = correlated_release(g)
        assert release is not None and release.period is not None
        if g.sampling is not Sampling.SHUFFLE:
            raise PrivacyRefusal(
                f"tree aggregation is accounted for shuffled passes only (one participation "
                f"per tree), got sampling {g.sampling.value!r} at steps {g.first_step}.."
                f"{g.last_step}. Use dpfy's shuffled sampler (make_private(noise='tree') "
                f"builds it)"
            )
        p = release.period
        for k in range(g.first_step // p, g.last_step // p + 1):
            tree = trees[k]
            tree[0] = min(tree[0], release.noise_multiplier)
            tree[1] = max(tree[1], min(g.last_step, (k + 1) * p - 1) - k * p + 1)
    return [
        Charge(False, 1.0, sigma / math.sqrt(tree_depth(int(leaves))), 1)
        for sigma, leaves in trees.values()
    ]


def cyclic_charges(groups: Sequence[StepGroup]) -> list[Charge]:
    """⌈c/b⌉ Poisson-subsampled Gaussians per run of c consecutive cyclic steps (module
    docstring), charged at the run's smallest σ's."""
    runs: list[list[StepGroup]] = []
    for g in groups:
        release = correlated_release(g)
        assert release is not None
        if g.sampling is not Sampling.CYCLIC_POISSON:
            raise PrivacyRefusal(
                f"BandMF is accounted with cyclic Poisson sampling only (b-min-separation), "
                f"got sampling {g.sampling.value!r} at steps {g.first_step}..{g.last_step}. "
                f"Use make_private(noise='bandmf', bands=b), which builds that sampler; for "
                f"shuffled data use noise='tree'"
            )
        last = runs[-1][-1] if runs else None
        if (
            last is not None
            and last.last_step + 1 == g.first_step
            and last.sample_rate == g.sample_rate
            and last.releases[0].period == release.period
        ):
            runs[-1].append(g)
        else:
            runs.append([g])
    out: list[Charge] = []
    for run in runs:
        bands = run[0].releases[0].period
        assert bands is not None
        left = -(-sum(g.count for g in run) // bands)
        for g in sorted(run, key=lambda g: g.releases[0].noise_multiplier):
            if left <= 0:
                break
            n = min(left, g.count)
            out.append(Charge(True, g.sample_rate, g.releases[0].noise_multiplier, n))
            left -= n
    return out
