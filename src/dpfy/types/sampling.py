"""How the examples of one step were chosen: the sampler's fact that the ledger records."""

from __future__ import annotations

import enum

__all__ = ["Sampling"]


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

    - ``CYCLIC_POISSON``: b-min-separation ("cyclic Poisson", Choquette-Choo et al. 2023): the
      examples are split once into b balanced groups; step t draws from group t mod b only,
      each example of that group independently with probability q (the rate recorded). An
      example can take part only in steps b apart. Adjacency: add-or-remove one example.
      Amplified: with a b-banded strategy (or independent noise) whose columns have norm ≤ 1,
      c steps charge ⌈c/b⌉ compositions of ``PoissonSampledDpEvent(q, Gaussian(σ))``; the
      band count b travels in each release's ``period``.

    A ledger whose steps need different adjacencies (Poisson with fixed-size or shuffled) is
    refused by the accountants: the two guarantees are not about the same neighbouring relation.
    """

    POISSON = "poisson"
    FIXED_SIZE = "fixed_size"
    SHUFFLE = "shuffle"
    NONE = "none"
    CYCLIC_POISSON = "cyclic_poisson"

    @property
    def adjacency(self) -> str | None:
        """The neighbouring relation this sampling is analysed under (None: either)."""
        return {"poisson": "add_or_remove", "fixed_size": "replace_one",
                "shuffle": "replace_one", "none": None,
                "cyclic_poisson": "add_or_remove"}[self.value]

    @property
    def amplified(self) -> bool:
        """True when the accountant claims privacy amplification by sampling."""
        return self in (Sampling.POISSON, Sampling.FIXED_SIZE, Sampling.CYCLIC_POISSON)
