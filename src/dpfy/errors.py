"""dpfy's own exception types, so callers can tell a spent budget from bad input.

- ``ValueError`` (Python's): bad input; the message names the parameter, the constraint, the
  value and the fix (CONTRIBUTING.md, code rule 2). The CLI prints it and exits 2.
- :class:`BudgetExhausted`: the run's privacy budget (``max_steps`` or the ε cap) is used up;
  nothing of the refused step was released. Not a mistake in the input: training is over. The
  CLI exits 3.
- :class:`PrivacyRefusal`: dpfy cannot prove what it would account (a sampler it did not build,
  a buffer that learns from data, weights above their declared sensitivity, ...). A
  ``ValueError`` subclass, since the fix is always a change to the input.
- :class:`SeedWarning`: a run was given a seed, so its noise can be reproduced and undone.
"""

from __future__ import annotations

__all__ = ["BudgetExhausted", "PrivacyRefusal", "SeedWarning"]


class BudgetExhausted(RuntimeError):
    """The planned budget is spent: the next step would exceed ``max_steps`` or the ε cap."""


class PrivacyRefusal(ValueError):
    """dpfy refuses something it cannot account; the message names what and the fix."""


class SeedWarning(UserWarning):
    """A seeded run: anyone who knows the seed can reproduce its noise and undo the privacy."""
