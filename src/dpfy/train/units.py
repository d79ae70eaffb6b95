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

import torch

from dpfy._require import require

__all__ = ["sampled_units", "load_user_ids"]


def sampled_units(
    num_examples: int,
    user_ids: str | None = None,
    user_sampling: str | None = None,
    max_examples_per_user: int | None = None,
) -> tuple[int, str]:
    """The number of units a step samples from, and their name ("examples" or "users"), for
    ``dpfy train``'s ``--user-ids FILE --user-sampling S --max-examples-per-user K``.

    Only reads the file of ids when user-level sampling is asked for; the count is exact (ELS
    keeps ``min(n_u, k)`` examples of each user, whichever ones it draws).
    """
    if user_ids is None or user_sampling not in ("uls", "els"):
        return num_examples, "examples"
    ids = load_user_ids(user_ids)
    _, counts = torch.unique(ids, return_counts=True)
    if user_sampling == "uls":
        return len(counts), "users"
    k = max_examples_per_user
    kept = int(counts.clamp(max=k).sum()) if k is not None else len(ids)
    return kept, "examples kept after capping users"


def load_user_ids(path: str) -> torch.Tensor:
    """(N,) integer user ids from a ``.npy`` file or a text/``.csv`` file of integers (one per
    example, any layout, read in row order), for ``dpfy train --user-ids``. Read once: the ids
    of a run never change."""
    import numpy as np  # local: only --user-ids reads files of ids

    try:
        arr = (
            np.load(path, allow_pickle=False)
            if str(path).lower().endswith(".npy")
            else np.loadtxt(path, delimiter=",", dtype=np.int64, ndmin=1)
        )
    except (OSError, ValueError) as err:
        require(False, "user_ids", path, "a readable file of integer ids", str(err))
        raise
    arr = np.asarray(arr).reshape(-1)
    require(
        np.issubdtype(arr.dtype, np.integer),
        "user_ids",
        f"{path} ({arr.dtype})",
        "integer ids",
        "Save one integer user id per training example",
    )
    return torch.as_tensor(arr.astype(np.int64))
