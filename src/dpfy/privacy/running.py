"""ε of a growing ledger, updated step by step instead of recomputed from scratch.

A training loop that checks its budget (or shows ε) every step would otherwise re-account the
whole ledger each time: cheap for a homogeneous run (one atom), but with a σ schedule every
step is new and a PLD recomputation costs about a second. :class:`RunningEpsilon` keeps the
composed RDP curve or PLD of the steps it has already seen and composes only the new ones;
:meth:`RunningEpsilon.with_extra` answers "what would ε be after these further steps" without
committing them (for an ε guard).

The numbers are the accountants' own (same canonical form, same dp_accounting calls, no
coarsening), so for RDP and GDP they equal :func:`dpfy.privacy.epsilon` exactly; for PLD they
differ only by the discretization of composing in pieces (both are upper bounds). Ledgers with
shuffled steps are not incremental (their charge depends on the whole run): they are
re-accounted in full on each call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import math


from dpfy._lazy import LazyModule
from dpfy._require import require
from dpfy.privacy import gdp as _gdp
from dpfy.privacy import pld as _pld
from dpfy.privacy import rdp as _rdp
from dpfy.privacy.accountants import PLD_COARSE, check_accountant, epsilon
from dpfy.privacy.canonical import CanonicalForm, canonical_form
from dpfy.privacy.ledger import Ledger, Sampling

if TYPE_CHECKING:
    from dp_accounting.rdp import rdp_privacy_accountant as _rdp_acc
else:  # imported on first read, for start-up time only (dpfy._lazy)
    _rdp_acc = LazyModule("dp_accounting.rdp.rdp_privacy_accountant")

__all__ = ["RunningEpsilon"]

# Samplings whose charge depends on the whole run (participations per pass or per band
# cycle), not on a sum over segments: such ledgers are accounted whole.
_WHOLE = {Sampling.SHUFFLE, Sampling.CYCLIC_POISSON}


class RunningEpsilon:
    """Incremental ε(δ) of one run's ledger (which only ever grows).

    Args:
      delta: δ of the ε reported.
      accountant: ``"rdp"``, ``"pld"`` or ``"gdp"`` (GDP is an approximation).
      value_discretization: PLD discretization interval (default 1e-3: a new σ every step
        means a new PLD every step, ~10× cheaper to build at 1e-3; still an upper bound).

    Call ``running(ledger)`` after each step; pass the same ledger object every time.
    """

    def __init__(
        self, *, delta: float, accountant: str = "rdp", value_discretization: float = PLD_COARSE
    ) -> None:
        require(0 < delta < 1, "delta", delta, "in (0, 1)")
        check_accountant(accountant)
        self.delta = float(delta)
        self.accountant = accountant
        self.discretization = float(value_discretization)
        self._done = 0
        self._adjacency: str | None = None
        self._rdp = None  # (orders,) running RDP curve
        self._pld = None  # running PrivacyLossDistribution
        self._mu2 = 0.0  # running μ_tot² for GDP
        self._non_private = False

    # -- pieces -----------------------------------------------------------------------------
    def _form(self, segment: Ledger, ledger: Ledger) -> CanonicalForm:
        form = canonical_form(segment)
        if segment.step_groups:
            require(
                self._adjacency in (None, form.adjacency) or not form.atoms,
                "ledger samplings",
                sorted(s.value for s in ledger.samplings()),
                "all analysed under one neighbouring relation",
                "Account Poisson and fixed-size/shuffled parts separately",
            )
        return form

    def _value(self, rdp, pld, mu2: float, non_private: bool) -> float:
        if non_private:
            return math.inf
        if self.accountant == "rdp":
            return (
                0.0
                if rdp is None
                else float(_rdp_acc.compute_epsilon(_rdp.ORDERS, rdp, self.delta)[0])
            )
        if self.accountant == "pld":
            return 0.0 if pld is None else float(pld.get_epsilon_for_delta(self.delta))
        return 0.0 if mu2 == 0 else _gdp.epsilon_for_delta(self.delta, math.sqrt(mu2))

    def _add(self, form: CanonicalForm, rdp, pld, mu2: float):
        if self.accountant == "rdp" and form.atoms:
            curve = _rdp.rdp_curve(form)
            rdp = curve if rdp is None else rdp + curve
        elif self.accountant == "pld" and form.atoms:
            pld = _pld.build(form, self.discretization, start=pld)
        elif self.accountant == "gdp" and form.atoms:
            mu2 += _gdp.mu_of_form(form) ** 2
        return rdp, pld, mu2

    # -- public -----------------------------------------------------------------------------
    def __call__(self, ledger: Ledger) -> float:
        """ε(δ) of ``ledger``, composing only the steps added since the last call."""
        require(
            ledger.num_steps >= self._done,
            "ledger.num_steps",
            ledger.num_steps,
            f">= {self._done} (the ledger only grows)",
            "Use a new RunningEpsilon",
        )
        ledger.unit()  # one unit of privacy (users or examples) for the whole ledger
        if ledger.samplings() & _WHOLE:
            return epsilon(
                ledger,
                delta=self.delta,
                accountant=self.accountant,
                sigma_resolution=None,
                value_discretization=self.discretization,
            )
        form = self._form(ledger.segment(self._done), ledger)
        if form.atoms:
            self._adjacency = self._adjacency or form.adjacency
        self._non_private |= form.non_private
        self._rdp, self._pld, self._mu2 = self._add(form, self._rdp, self._pld, self._mu2)
        self._done = ledger.num_steps
        return self._value(self._rdp, self._pld, self._mu2, self._non_private)

    def with_extra(self, ledger: Ledger, extra: Ledger) -> float:
        """ε(δ) if the steps of ``extra`` were appended to ``ledger`` (nothing is committed)."""
        self(ledger)
        ledger.followed_by(extra).unit()  # refuses user-level steps after example-level ones
        if (ledger.samplings() | extra.samplings()) & _WHOLE:
            return epsilon(
                ledger.followed_by(extra),
                delta=self.delta,
                accountant=self.accountant,
                sigma_resolution=None,
                value_discretization=self.discretization,
            )
        form = self._form(extra, extra)
        rdp, pld, mu2 = self._add(form, self._rdp, self._pld, self._mu2)
        return self._value(rdp, pld, mu2, self._non_private or form.non_private)
