"""The samplers' randomness, written once for all of them (the package docstring's rule).

``seed=None`` draws from the OS CSPRNG (not reproducible, by design); an int seeds a
``torch.Generator`` (reproducible: anyone with the seed can redraw the batches), whose state is
a secret that goes into checkpoints only. Each draw below takes the sampler's generator, None
for the OS CSPRNG, so every sampler draws the same way from either source.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from dpfy.noise import secure_uniform

__all__ = [
    "generator_state",
    "restore_generator",
    "secure_permutation",
    "seeded_generator",
    "uniform",
    "permutation",
]


def seeded_generator(seed: int | None) -> torch.Generator | None:
    """A seeded torch generator, or None for the OS CSPRNG."""
    return None if seed is None else torch.Generator().manual_seed(seed)


def uniform(n: int, generator: torch.Generator | None) -> torch.Tensor:
    """n uniforms in [0, 1), float64, (n,): the seeded generator's, or the OS CSPRNG's."""
    if generator is None:
        return secure_uniform(n)
    return torch.rand(n, generator=generator, dtype=torch.float64)


def secure_permutation(n: int) -> torch.Tensor:
    """A uniformly random permutation of 0..n-1 from the OS CSPRNG, (n,) int64.

    Sorts n independent 64-bit keys from ``os.urandom``; two equal keys (probability below
    n²/2⁶⁵) only make their relative order deterministic, and any order is still a permutation.
    """
    keys = np.frombuffer(os.urandom(8 * n), dtype=np.int64)  # (n,)
    return torch.from_numpy(np.argsort(keys, kind="stable"))  # numpy's radix sort: ~10x torch's


def permutation(n: int, generator: torch.Generator | None) -> torch.Tensor:
    """A uniformly random permutation of 0..n-1, (n,) int64: the seeded generator's, or the
    OS CSPRNG's."""
    return secure_permutation(n) if generator is None else torch.randperm(n, generator=generator)


def generator_state(generator: torch.Generator | None) -> torch.Tensor | None:
    """The generator's state for a checkpoint (SECRET); None for the OS CSPRNG."""
    return None if generator is None else generator.get_state()


def restore_generator(generator: torch.Generator | None, saved: torch.Tensor | None) -> None:
    """Resume a seeded generator from a checkpoint's state; nothing for the OS CSPRNG (which
    has no state) or a checkpoint that saved none."""
    if generator is not None and saved is not None:
        generator.set_state(saved)
