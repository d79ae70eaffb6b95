"""The fixed sentences of the privacy report (:mod:`dpfy.privacy.report`): the default DP
setting, each adjacency, each sampling and correlated noise mechanism in words, the guide's
ε tiers, and a run's sampling note and unit of privacy from the run spec's values
(:func:`sampling_note`, :func:`unit_text`; :func:`dpfy.spec.report_context` reads them off a
:class:`~dpfy.spec.RunSpec`)."""

from __future__ import annotations

from dpfy.privacy.ledger import Sampling
from dpfy.privacy.user_level import USER_UNIT

__all__ = [
    "DEFAULT_DP_SETTING",
    "ADJACENCY_TEXT",
    "USER_ADJACENCY_TEXT",
    "SAMPLING_TEXT",
    "NOISE_TEXT",
    "NOISE_HELD",
    "TIER_TEXT",
    "tier",
    "SAMPLER_WORDS",
    "sampling_note",
    "unit_text",
]

DEFAULT_DP_SETTING = (
    "Central differential privacy: the party that trains the model is trusted to "
    "run the mechanism as described and sees the raw data; the guarantee is "
    "about what the released output reveals."
)

ADJACENCY_TEXT = {
    "add_or_remove": "add-or-remove one unit of privacy (the datasets differ by one record)",
    "replace_one": (
        "replace-one: the datasets have the same size N and differ in one record "
        "(roughly twice as strong as add-or-remove at the same ε)"
    ),
}
USER_ADJACENCY_TEXT = (
    "add-or-remove one user: the datasets differ by all of one user's "
    "examples, however many they are"
)

SAMPLING_TEXT = {
    Sampling.POISSON: (
        "Poisson sampling: each example joined each batch independently with "
        "probability q (dpfy's sampler recorded this). Amplification by sampling "
        "is claimed; the assumption held by construction."
    ),
    Sampling.FIXED_SIZE: (
        "Fixed-size batches drawn uniformly without replacement at every step. "
        "Amplification by sampling without replacement is claimed "
        "(replace-one adjacency)."
    ),
    Sampling.SHUFFLE: (
        "Fixed-size batches from dpfy's own permutation sampler: one random "
        "permutation per pass, cut into batches of b; restarts continue the pass. "
        "No amplification is claimed: each example is charged once per pass at "
        "the worst position, with replace-one sensitivity."
    ),
    Sampling.NONE: "No sampling: every example took part in every such step.",
    Sampling.ULS: (
        "User-level sampling (ULS, Charles et al. 2024): each user joined each step "
        "independently with probability q (the user rate; dpfy's sampler recorded "
        "it), and a sampled user's examples were clipped together as one unit. "
        "Amplification by sampling is claimed at the user level (a Poisson-"
        "subsampled Gaussian); the assumption held by construction."
    ),
    Sampling.ELS: (
        "Example-level sampling with contribution bounding (ELS, Charles et al. "
        "2024): every user kept at most k examples (the ledger records k), each "
        "example joined each step independently with probability q and was clipped "
        "alone. Accounted at the user level: a user's examples enter a step "
        "Binomial(k, q) times, a mixture of Gaussians (PLD: the mixture; RDP: an "
        "upper bound on it)."
    ),
    Sampling.CYCLIC_POISSON: (
        "Cyclic Poisson sampling (b-min-separation): dpfy's sampler split "
        "the examples once into b balanced groups and step t drew each "
        "example of group t mod b independently with probability q. "
        "Amplification by sampling is claimed for each participation."
    ),
}

# The correlated noise mechanisms: what each assumes about participation (privacy.correlated).
NOISE_TEXT = {
    "tree": (
        "DP-FTRL tree aggregation (Kairouz et al. 2021), the honest tree restarted every "
        "{period} steps (one pass); assumes each example takes part at most once per "
        "tree; each tree is charged as one Gaussian release at σ/√depth"
    ),
    "bandmf": (
        "banded matrix factorization (Choquette-Choo et al. 2023) with b = {period} "
        "bands and unit-norm strategy columns; assumes an example's participations are "
        "multiples of b steps apart; each participation is charged as one "
        "Poisson-subsampled Gaussian"
    ),
}
NOISE_HELD = (
    "held by construction: dpfy's sampler drew every batch and the mechanism checked "
    "the sampler's position at every release"
)


def tier(eps: float) -> int:
    """The guide's ε tier: 1 (ε ≤ 1, strong), 2 (ε ≤ 10, reasonable), 3 (weak to none)."""
    return 1 if eps <= 1 else 2 if eps <= 10 else 3


TIER_TEXT = {
    1: "Tier 1 (ε ≤ 1): strong formal privacy guarantee.",
    2: "Tier 2 (ε ≤ 10): reasonable privacy guarantee for many applications.",
    3: (
        "Tier 3 (ε > 10): weak to no formal guarantee. The DP guarantee alone is not sufficient "
        "evidence of anonymization; additional measures (e.g. empirical privacy auditing, "
        "demonstrated robustness to attacks, removing privacy-sensitive data) may be necessary."
    ),
}


# The sampler's scheme, first words of a run's sampling note. User-level sampling draws users
# (ULS) or examples (ELS) by Poisson sampling; the note says "(per user)" for ULS's rate.
SAMPLER_WORDS = {
    Sampling.POISSON: "Poisson sampling",
    Sampling.ULS: "Poisson sampling",
    Sampling.ELS: "Poisson sampling",
    Sampling.SHUFFLE: "Shuffled passes (one per epoch)",
    Sampling.CYCLIC_POISSON: "Cyclic Poisson sampling (Poisson within each band's group)",
    Sampling.FIXED_SIZE: "Fixed-size batches drawn without replacement",
    Sampling.NONE: "No sampling (every example in every step)",
}


def sampling_note(
    sampling: Sampling | str, sample_rate: float, steps_per_epoch: int | None = None
) -> str:
    """A run's sampling note: what dpfy's sampler did, from the facts the built sampler put in
    the run spec (``spec.sampling.resolved``: its sampling and q), and the loader's steps per
    epoch (``None``: not known, left out). Every kind has its own words, so a run that did
    not Poisson-sample is never said to have."""
    sampling = Sampling(sampling)
    per_user = " (per user)" if sampling is Sampling.ULS else ""
    steps = "" if steps_per_epoch is None else f", {steps_per_epoch} steps per epoch"
    return f"{SAMPLER_WORDS[sampling]} by dpfy's sampler, q = {sample_rate:.5g}{per_user}{steps}"


def unit_text(unit: str) -> str:
    """The unit of privacy in the report's words, from the unit's name (``spec.unit.name``,
    ``ledger.unit()``): ``"user"`` is one user with all of their examples, else one example."""
    return USER_UNIT if unit == "user" else "one example"
