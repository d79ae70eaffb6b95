"""One sentence for every ε dpfy states: the value, δ, the unit of privacy and the neighbouring
relation, and which accountants apply to a ledger at all.

An ε without its unit and relation is not a guarantee anyone can check: ε = 3 for add-or-remove
of one *user* (all their examples) protects far more than ε = 3 for one example. So every
statement reads like "ε = 2.998 at δ = 1e-05 for user-level add-or-remove adjacency (one user
added or removed, with all of their examples) [PLD]".
"""

from __future__ import annotations

import math

from dpfy.privacy.ledger import Ledger, Sampling

__all__ = [
    "relation",
    "epsilon_statement",
    "ledger_statement",
    "inapplicable",
    "rounded_up",
    "rounded_down",
    "stated_epsilon",
    "stated_delta",
]

_WHAT = {
    ("example", "add_or_remove"): "one example added or removed",
    ("example", "replace_one"): "one example replaced by another",
    ("user", "add_or_remove"): "one user added or removed, with all of their examples",
    ("user", "replace_one"): "one user replaced by another, with all of their examples",
}


def relation(unit: str, adjacency: str) -> str:
    """``"user-level add-or-remove adjacency (one user added or removed, with all ...)"``."""
    what = _WHAT.get((unit, adjacency), f"one {unit} differs")
    return f"{unit}-level {adjacency.replace('_', '-')} adjacency ({what})"


def epsilon_statement(
    epsilon: float, delta: float, *, unit: str, adjacency: str, accountant_label: str | None = None
) -> str:
    """ "ε = … at δ = … for <unit>-level <relation> adjacency (…)", with ``[accountant]``."""
    value = stated_epsilon(epsilon)
    tail = f" [{accountant_label}]" if accountant_label else ""
    return f"ε = {value} at δ = {stated_delta(delta)} for {relation(unit, adjacency)}{tail}"


def stated_epsilon(epsilon: float) -> str:
    """ε as every statement and report shows it: 4 significant digits rounded up, or ∞."""
    return "∞" if math.isinf(epsilon) else rounded_up(epsilon, 4)


def stated_delta(delta: float) -> str:
    """δ as every statement and report shows it: 3 significant digits rounded up."""
    return rounded_up(delta, 3)


def rounded_up(x: float, digits: int) -> str:
    """``x`` to ``digits`` significant digits, rounded *up*: a statement never shows a smaller
    ε or δ than the accountant computed (1.00049 reads 1.001, not 1).

    A value within a few units in the last place above the shown one is that value up to the
    float arithmetic that produced it (3 runs at δ = 1e-5 compose to 3 × 1e-5 =
    3.0000000000000004e-05): it reads 3e-05, not 3.01e-05. The gap (≤ 2^-50 relative) is far
    below the accountants' own numerical error."""
    text = f"{x:.{digits}g}"
    if x <= 0 or not math.isfinite(x) or float(text) * (1 + 2**-50) >= x:
        return text
    return f"{float(text) + _last_place(x, digits):.{digits}g}"


def rounded_down(x: float, digits: int) -> str:
    """``x`` to ``digits`` significant digits, rounded *down*: for a value whose larger
    neighbour would spend more (a sample rate a user copies into a run)."""
    text = f"{x:.{digits}g}"
    if x <= 0 or not math.isfinite(x) or float(text) <= x:
        return text
    return f"{float(text) - _last_place(x, digits):.{digits}g}"


def _last_place(x: float, digits: int) -> float:
    """One unit in the last of ``digits`` significant digits of ``x`` (> 0)."""
    return 10 ** (math.floor(math.log10(x)) - digits + 1)


def ledger_statement(
    ledger: Ledger, epsilon: float, delta: float, accountant_label: str | None = None
) -> str:
    """:func:`epsilon_statement` with the unit and relation that ``ledger`` records."""
    return epsilon_statement(
        epsilon,
        delta,
        unit=ledger.unit(),
        adjacency=ledger.adjacency(),
        accountant_label=accountant_label,
    )


def inapplicable(ledger: Ledger, accountant: str) -> str | None:
    """Why ``accountant`` does not apply to what ``ledger`` records, or None when it does.

    The GDP central limit theorem (Bu et al. 2020) is derived for the Poisson-subsampled
    Gaussian. An ELS step is, for one user, a mixture of Gaussians of sensitivities 0, C, …, kC;
    GDP can only read it through a dominating subsampled Gaussian of σ/k, which overstates ε
    many times over (68.42 against PLD's exact 2.998 on one run of issue 35): a number
    that describes no mechanism that ran.
    """
    if accountant == "gdp" and Sampling.ELS in ledger.samplings():
        return (
            "the GDP CLT is derived for the subsampled Gaussian; an ELS step is a mixture of "
            "Gaussians (sensitivities 0 to kC), which it can only bound through σ/k, far "
            "above the exact ε: read PLD or RDP"
        )
    return None
