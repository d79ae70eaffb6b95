"""ε of a ledger by dp_accounting, from the ledger's raw numbers (never dpfy's accountants).

Each step group becomes ``SelfComposed(PoissonSampled(q, Gaussian(σ_eff)), count)``. The releases
of one step see the same Poisson sample, so together they are one Gaussian mechanism on the
concatenated output: whitening each part by its noise std, one example moves the tuple by
sqrt(Σ_r Δ_r²/std_r²) = sqrt(Σ_r σ_r⁻²), i.e. a Gaussian with σ_eff = (Σ_r σ_r⁻²)^(−1/2)
(dp_accounting takes no composition inside a Poisson event). Poisson-sampled ledgers only.
"""

from __future__ import annotations

import dp_accounting


def effective_sigma(group) -> float:
    """σ_eff of one step's releases taken together (derivation in the module docstring)."""
    return sum(r.noise_multiplier ** -2 for r in group.releases) ** -0.5


def dp_accounting_epsilon(ledger, delta: float, accountant: str) -> float:
    """ε(δ) of ``ledger`` by dp_accounting's RDP or PLD (value interval 1e-4) accountant."""
    events = [dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        g.sample_rate, dp_accounting.GaussianDpEvent(effective_sigma(g))), g.count)
        for g in ledger.step_groups]
    acc = (dp_accounting.rdp.RdpAccountant() if accountant == "rdp" else
           dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4))
    acc.compose(dp_accounting.ComposedDpEvent(events))
    return acc.get_epsilon(delta)


def grid_ledger(grid: dict):
    """The runs' ledgers of a tuning grid (``grid.json``'s ``ledgers``) composed into one, each
    run's steps after the previous run's: what the grid's ε is spent on."""
    from dpfy.privacy.ledger import Ledger

    ledgers = [Ledger.from_dict(d) for d in grid["ledgers"]]
    out = Ledger(ledgers[0].dataset_size)
    for one in ledgers:
        out.extend(one)
    return out
