"""δ against the number of units of privacy: warn at δ ≥ 1/N, refuse δ ≥ 1/√N.

The "How to DP-fy ML" guide (Ponomareva et al. 2023, §2 "Choosing δ", and its convention box)
asks for δ ≪ 1/N, N counted in units of privacy (users for user-level DP), "for example
δ = 1/N^1.1". Its reason: (ε, δ)-DP allows each unit's record to be revealed outright with
probability δ, so about δ·N units may be exposed. δ ≥ 1/N expects at least one: dpfy warns
(:class:`DeltaWarning`), as the guide's checklist says. δ ≥ 1/√N expects at least √N of them
(20 of 400 examples at δ = 1/20), a guarantee that protects no one in particular: dpfy
refuses it. Between the two a user may have a reason (a tiny N in a test), so it runs.
"""

from __future__ import annotations

import math
import warnings

__all__ = ["DeltaWarning", "check_delta"]


class DeltaWarning(UserWarning):
    """δ ≥ 1/N: more than one unit of privacy may be revealed outright."""


def check_delta(
    delta: float | None, num_units: int, unit: str = "examples", name: str = "target_delta"
) -> None:
    """Warn at δ ≥ 1/N and refuse δ ≥ 1/√N (module docstring), N = ``num_units`` ``unit``;
    ``name`` is what the caller's keyword for δ is called."""
    if delta is None or num_units < 1:
        return
    guide = float(num_units) ** -1.1
    if delta >= 1 / math.sqrt(num_units):
        raise ValueError(
            f"{name} must be < 1/√N = {1 / math.sqrt(num_units):.3g} for N = {num_units} "
            f"{unit} (δ·N = {delta * num_units:.3g} {unit} could be revealed outright; the "
            f"guide asks δ ≪ 1/N), got {name} = {delta!r}. Use δ = 1/N^1.1 = {guide:.3g}."
        )
    if delta >= 1 / num_units:
        warnings.warn(
            f"{name} = {delta!r} is >= 1/N = {1 / num_units:.3g} for N = {num_units} "
            f"{unit}: about δ·N = {delta * num_units:.3g} {unit} may be revealed outright. The "
            f"guide asks δ ≪ 1/N, e.g. δ = 1/N^1.1 = {guide:.3g}.",
            DeltaWarning,
            stacklevel=3,
        )
