"""How many units ``--batch-size``'s default is computed from: examples, or users.

The default batch (:func:`dpfy.train.config.default_batch_size`) is a quarter of the sampled
population, at most 2048. Which population is sampled depends on the run: ordinary DP-SGD
samples examples; user-level sampling (ULS) samples *users*, so ``batch_size`` is the expected
number of users per step and must not exceed their number; example-level sampling (ELS)
samples the examples left after capping every user at ``--max-examples-per-user``. Applying
the rule to the wrong population gave a default that the sampler refused (issue 35 §3: 359
examples' worth of batch against 150 users on digits).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dpfy.train.config import TrainConfig

__all__ = ["sampled_units"]


def sampled_units(cfg: "TrainConfig", num_examples: int) -> tuple[int, str]:
    """The number of units a step samples from, and their name ("examples" or "users").

    Only reads ``cfg.user_ids`` when user-level sampling is asked for; the count is exact
    (ELS keeps ``min(n_u, k)`` examples of each user, whichever ones it draws).
    """
    if cfg.user_ids is None or cfg.user_sampling not in ("uls", "els"):
        return num_examples, "examples"
    import torch  # local: only user-level runs count users

    from dpfy.train.private import load_user_ids

    ids = load_user_ids(cfg.user_ids)
    _, counts = torch.unique(ids, return_counts=True)
    if cfg.user_sampling == "uls":
        return len(counts), "users"
    k = cfg.max_examples_per_user
    kept = int(counts.clamp(max=k).sum()) if k is not None else len(ids)
    return kept, "examples kept after capping users"
