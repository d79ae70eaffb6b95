"""Accountants: the only code in dpfy that turns a ledger into (ε, δ).

Minimal first version (RDP and PLD through dp_accounting); the accounting issue extends it.
"""

from __future__ import annotations

import dp_accounting
from dp_accounting import pld, rdp

from dpfy._validate import require
from dpfy.privacy.ledger import Ledger

__all__ = ["ACCOUNTANTS", "epsilon", "delta"]

ACCOUNTANTS = ("rdp", "pld")


def _check_accountant(name: str) -> None:
    require(name in ACCOUNTANTS, "accountant", name, f"one of {sorted(ACCOUNTANTS)}")


def _make(name: str) -> dp_accounting.PrivacyAccountant:
    _check_accountant(name)
    if name == "rdp":
        return rdp.RdpAccountant()
    return pld.PLDAccountant(value_discretization_interval=1e-4)


def epsilon(ledger: Ledger, *, delta: float, accountant: str = "rdp") -> float:
    """ε(δ) of everything recorded in ``ledger``."""
    require(0 < delta < 1, "delta", delta, "in (0, 1)", "The guide's convention is δ ≪ 1/N")
    acc = _make(accountant)
    acc.compose(ledger.dp_event())
    return float(acc.get_epsilon(delta))


def delta(ledger: Ledger, *, epsilon: float, accountant: str = "rdp") -> float:
    """δ(ε) of everything recorded in ``ledger``."""
    require(epsilon > 0, "epsilon", epsilon, "> 0")
    acc = _make(accountant)
    acc.compose(ledger.dp_event())
    return float(acc.get_delta(epsilon))
