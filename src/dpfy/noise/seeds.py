"""One run seed → the seeds of the run's two generators: the sampler's and the noise's.

Every entry point that takes ``seed=<int>`` (``make_private``, the DP-FedAvg server) derives
both seeds here, so one seed means the same two streams wherever it is given, and the two are
independent of each other (numpy's ``SeedSequence`` spawns unrelated states from one entropy
value), where ``seed`` and ``seed + 1`` would be two seeds a user might also pick for two runs.
"""

from __future__ import annotations

import numpy as np

__all__ = ["derive_seeds"]


def derive_seeds(seed: int) -> tuple[int, int]:
    """Independent (sampling, noise) generator seeds from one run seed."""
    s, n = np.random.SeedSequence(seed).generate_state(2, dtype=np.uint64)
    return int(s), int(n)
