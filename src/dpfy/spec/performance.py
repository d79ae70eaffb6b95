"""Performance options: how a run is computed, never what it releases.

Nothing here changes the mechanism or ε: the route decides how per-unit norms and sums are
computed (the same sums, up to float rounding), and a physical batch only splits a logical one
for memory (each unit is still clipped alone and the noise is added once per logical batch).
Microbatch clipping is *not* here: it clips the mean gradient of a microbatch, which doubles the
sensitivity, so it is part of the guarantee (:class:`dpfy.spec.ClippingSpec`). A performance
option can still be refused with a method that needs another one (a per-sample transform needs
materialized gradients; post-release probes need whole logical batches): the checker says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpfy._require import require

__all__ = ["PerformanceOptions", "ROUTES"]

ROUTES = ("auto", "ghost", "vmap")


@dataclass(frozen=True)
class PerformanceOptions:
    """How the run is computed.

    Args:
      route: ``"auto"`` (layer rules, vmap for other modules), ``"ghost"`` (layer rules only)
        or ``"vmap"`` (materialized per-sample gradients).
      max_physical_batch_size: split logical batches into physical ones of at most this many
        rows; ``"auto"``: the largest whose memory estimate fits ``memory_limit``; None: one
        physical batch per logical batch.
      memory_limit: bytes for ``"auto"`` (None: half the memory available now).
    """

    route: str = "auto"
    max_physical_batch_size: int | str | None = None
    memory_limit: int | None = None

    def __post_init__(self) -> None:
        if self.max_physical_batch_size == "auto":
            return
        require(
            self.memory_limit is None,
            "memory_limit",
            self.memory_limit,
            "None unless max_physical_batch_size='auto'",
            "Pass one of them",
        )
        require(
            not isinstance(self.max_physical_batch_size, str),
            "max_physical_batch_size",
            self.max_physical_batch_size,
            "an int >= 1, None or 'auto'",
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "route": self.route,
            "max_physical_batch_size": self.max_physical_batch_size,
            "memory_limit": self.memory_limit,
        }
