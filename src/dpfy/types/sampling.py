"""How the examples of one step were chosen: the sampler's fact that the ledger records."""

from __future__ import annotations

import enum

from dpfy._require import require

__all__ = ["Sampling", "require_sample_rate"]


class Sampling(str, enum.Enum):
    """How the examples of one step were chosen; decides amplification and adjacency.

    The sampler that formed the batches reports this; the accountant never guesses it.

    - ``POISSON``: each example joins the batch independently with probability q. Adjacency:
      add-or-remove one example. Amplified: ``PoissonSampledDpEvent(q, Gaussian(σ))``.
    - ``FIXED_SIZE``: each step draws a fresh uniformly random batch of exactly b = q·N
      examples without replacement (Balle et al. 2018; the guide's "uniform sampling").
      Adjacency: replace-one (N is public). Amplified by sampling without replacement; needs
      ``Ledger.dataset_size``.
    - ``SHUFFLE``: fixed-size batches from a shuffled pass over the data (a plain
      ``DataLoader(shuffle=True)``). Adjacency: replace-one. **No amplification**: the
      accountant assumes the worst position of the example in every epoch. Each example is in
      at most one batch per epoch, so a run of ``c`` steps at batch fraction q has at most
      ``ceil(c / floor(1/q))`` participations, each a Gaussian release whose replace-one
      sensitivity is twice the add/remove one (σ becomes σ/2). The participations are charged
      at the smallest noise multipliers of the run, which makes the bound hold for every
      ordering.
    - ``NONE``: every example is in every step (full batch, or a release not subsampled);
      no amplification; every step is charged.

    - ``ULS`` (user-level sampling; Charles et al. 2024, "Fine-tuning large language models
      with user-level differential privacy"): each *user* joins the step independently with
      probability q (the recorded rate is the user rate); a sampled user's examples (at most k
      per step) are clipped together as one unit. Adjacency: add-or-remove one user.
      Accounted exactly as ``POISSON`` at the user level: ``PoissonSampledDpEvent(q,
      Gaussian(σ))``.
    - ``ELS`` (example-level sampling with contribution bounding, the same paper): every user
      holds at most k examples of the training set (the step group records k), each example
      joins the step independently with probability q and is clipped alone. A user's k
      examples then enter a step Binomial(k, q) times, so one step is, at the user level, a
      mixture of Gaussians with sensitivities j·Δ and weights Binomial(k, q)(j) (PLD:
      dp_accounting's ``MixtureOfGaussiansDpEvent``). Adjacency: add-or-remove one user.
    - ``CYCLIC_POISSON``: b-min-separation ("cyclic Poisson", Choquette-Choo et al. 2023): the
      examples are split once into b balanced groups; step t draws from group t mod b only,
      each example of that group independently with probability q (the rate recorded). An
      example can take part only in steps b apart. Adjacency: add-or-remove one example.
      Amplified: with a b-banded strategy (or independent noise) whose columns have norm ≤ 1,
      c steps charge ⌈c/b⌉ compositions of ``PoissonSampledDpEvent(q, Gaussian(σ))``; the
      band count b travels in each release's ``period``.

    A ledger whose steps need different adjacencies (Poisson with fixed-size or shuffled) is
    refused by the accountants: the two guarantees are not about the same neighbouring relation.
    Nor may a ledger mix user-level steps (``ULS``, ``ELS``) with example-level ones: the two
    guarantees are not about the same unit of privacy (:attr:`unit`).
    """

    POISSON = "poisson"
    FIXED_SIZE = "fixed_size"
    SHUFFLE = "shuffle"
    NONE = "none"
    ULS = "uls"
    ELS = "els"
    CYCLIC_POISSON = "cyclic_poisson"

    @property
    def adjacency(self) -> str | None:
        """The neighbouring relation this sampling is analysed under (None: either)."""
        return {
            "poisson": "add_or_remove",
            "fixed_size": "replace_one",
            "shuffle": "replace_one",
            "none": None,
            "uls": "add_or_remove",
            "els": "add_or_remove",
            "cyclic_poisson": "add_or_remove",
        }[self.value]

    @property
    def amplified(self) -> bool:
        """True when the accountant claims privacy amplification by sampling."""
        return self in (
            Sampling.POISSON,
            Sampling.FIXED_SIZE,
            Sampling.ULS,
            Sampling.ELS,
            Sampling.CYCLIC_POISSON,
        )

    @property
    def unit(self) -> str | None:
        """The unit of privacy the step is accounted for: ``"user"`` (ULS, ELS) or
        ``"example"`` (None for ``NONE``: a step of every record fits either)."""
        if self in (Sampling.ULS, Sampling.ELS):
            return "user"
        return None if self is Sampling.NONE else "example"

    @property
    def needs_max_examples_per_user(self) -> bool:
        """The step's accounting needs k, the most examples one user holds (ELS)."""
        return self is Sampling.ELS


def require_sample_rate(sample_rate: float) -> None:
    """Refuse a sampling rate q outside (0, 1] (the probability one unit joins a step)."""
    fix = "Use batch_size / dataset_size"
    require(0 < sample_rate <= 1, "sample_rate", sample_rate, "in (0, 1]", fix)
