"""The privacy report's section for a user-level run: the unit, the users, the algorithm and,
for ELS, the group-privacy bound beside the tight accounting.

The unit of privacy is one user, with all of their examples; adjacency is add-or-remove one
user. :func:`user_level_section` states that and the counts a reader needs (users, examples,
the cap k), never the user ids. Any user-level algorithm can use it (ULS, ELS, DP-FedAvg): the
caller names the algorithm and adds its own lines.

For ELS the section also shows what the tight accounting buys: the same steps accounted per
example (Poisson at q, the step's σ) give ε_ex at δ, and group privacy for k examples turns
that into (k·ε_ex, k·e^{k·ε_ex}·δ) (Vadhan 2017, Lemma 2.2, the form the guide quotes), the
guarantee one would state without a user-level accountant.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from dpfy.privacy.accountants import epsilon
from dpfy.privacy.ledger import Ledger, Sampling
from dpfy.privacy.section import ReportSection
from dpfy.privacy.statement import stated_delta, stated_epsilon

__all__ = [
    "USER_UNIT",
    "USER_ADJACENCY",
    "user_level_section",
    "example_level_ledger",
    "group_privacy_bound",
]

USER_UNIT = "one user, with all of their examples"
USER_ADJACENCY = "add or remove one user (all of their examples)"


def group_privacy_bound(epsilon_example: float, delta: float, k: int) -> tuple[float, float]:
    """(k·ε, k·e^{k·ε}·δ): an (ε, δ) example-level guarantee for groups of k examples (the
    guide's form of Vadhan 2017, Lemma 2.2; δ capped at 1, where it says nothing)."""
    ke = k * epsilon_example
    return ke, (1.0 if ke > 700 else min(1.0, k * math.exp(ke) * delta))


def example_level_ledger(ledger: Ledger) -> Ledger:
    """The ELS steps of ``ledger`` accounted per example: Poisson at q with the same releases."""
    out = Ledger(ledger.dataset_size)
    for g in ledger.step_groups:
        sampling = Sampling.POISSON if g.sampling is Sampling.ELS else g.sampling
        out.record_step(
            sampling=sampling, sample_rate=g.sample_rate, releases=g.releases, count=g.count
        )
    return out


def user_level_section(
    ledger: Ledger,
    *,
    delta: float,
    accountant: str,
    num_users: int,
    num_examples: int,
    algorithm: str,
    details: Sequence[str] = (),
    data: Mapping[str, Any] | None = None,
) -> ReportSection:
    """The report section "Unit of privacy: users" for a user-level run's ``ledger``.

    Args:
      ledger, delta, accountant: the run's ledger and the report's δ and accountant.
      num_users, num_examples: U and N (counts only; the ids stay secret).
      algorithm: e.g. "ULS (user-level sampling, Charles et al. 2024)".
      details: more bullet lines (sampling rate, cap, clipping of the user's mean or sum).
      data: machine-readable facts kept in the JSON.
    """
    out = dict(data or {})
    out.update(
        {
            "unit": "user",
            "description": USER_UNIT,
            "adjacency": USER_ADJACENCY,
            "num_users": num_users,
            "num_examples": num_examples,
            "algorithm": algorithm,
        }
    )
    lines = [
        f"- **Unit:** {USER_UNIT}. Adjacency: {USER_ADJACENCY}: the guarantee holds for "
        f"everything one person contributed, however many examples that is.",
        f"- **Users:** {num_users:,} ({num_examples:,} examples); δ is judged against "
        f"1/U = {1 / num_users:.3g}.",
        f"- **Algorithm:** {algorithm}.",
        *[f"- {d}" for d in details],
    ]
    # StepGroup refuses an ELS step without k, so the None test drops nothing
    ks = {
        g.max_examples_per_user
        for g in ledger.step_groups
        if g.sampling is Sampling.ELS and g.max_examples_per_user is not None
    }
    if ks:
        k = int(max(ks))
        eps_user = epsilon(ledger, delta=delta, accountant=accountant)
        eps_ex = epsilon(example_level_ledger(ledger), delta=delta, accountant=accountant)
        ge, gd = group_privacy_bound(eps_ex, delta, k)
        lines += [
            f"- **Accounting (ELS):** a user's k = {k} examples enter each step "
            f"Binomial(k, q) times, so every step is a mixture of Gaussians with "
            f"sensitivities 0..k·C (PLD: dp_accounting's MixtureOfGaussiansDpEvent; "
            f"RDP: an upper bound, order by order the smaller of k composed subsampled "
            f"Gaussians at σ/√k and the subsampled Gaussian at rate 1 − (1 − q)^k and "
            f"σ/k, both of which bound the mixture).",
            f"- **User-level ε** ({accountant.upper()}"
            + (
                ", the mixture: tight"
                if accountant == "pld"
                else ", an upper bound: looser; PLD accounts the mixture itself"
            )
            + f"): ({stated_epsilon(eps_user)}, {stated_delta(delta)}).",
            f"- **Group privacy instead** (the same steps per example: "
            f"({stated_epsilon(eps_ex)}, {stated_delta(delta)}); for groups of k = {k}: "
            f"(kε, k·e^{{kε}}·δ)): ({stated_epsilon(ge)}, {stated_delta(gd)})"
            + (" — δ ≥ 1: no guarantee at all" if gd >= 1 else "")
            + ".",
        ]
        out.update(
            {
                "max_examples_per_user": k,
                "epsilon_user": eps_user,
                "epsilon_example": eps_ex,
                "group_privacy": {"epsilon": ge if math.isfinite(ge) else "inf", "delta": gd},
            }
        )
    return ReportSection(title="Unit of privacy: users", lines=tuple(lines), data=out)
