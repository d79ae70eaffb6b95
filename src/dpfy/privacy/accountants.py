"""Accountants: the only code in dpfy that turns a ledger into (ε, δ).

Three accountants read a ledger, all through its canonical form
(:mod:`dpfy.privacy.canonical`: composed releases collapsed, adjacency and participation
applied, identical steps merged):

- ``"rdp"``: Rényi DP via dp_accounting (an upper bound; loose by ~5–100 % vs PLD).
- ``"pld"``: privacy loss distributions via dp_accounting (an upper bound, the tightest).
- ``"gdp"``: the Gaussian-DP central-limit-theorem formula of Bu et al. / Dynamic DP-SGD
  Eq. (9). **An approximation, not a bound**: it under-reports ε for small σ.

Speed: a ledger with many distinct sampled steps (a σ decay schedule) is coarsened before RDP
or PLD accounting when it has more than :data:`AUTO_EXACT_LIMIT` distinct sampled atoms
(``sigma_resolution="auto"``): σ's are rounded *down* to a geometric grid (1 % for RDP, 2 % for
PLD, :data:`DEFAULT_RESOLUTION`), which keeps ε an upper bound (see
:func:`dpfy.privacy.canonical.coarsen`); PLD then also uses a 1e-3 discretization
(``value_discretization="auto"``; 1e-4 otherwise), which is pessimistic too. Pass
``sigma_resolution=None`` for the exact value, or a float r for a grid of your choice. GDP is a
closed form and is never coarsened. docs/accounting.md lists the measured gaps.

Bounded input (PLD): the grid of one Poisson-subsampled Gaussian step covers privacy losses up
to about 1/(2σ²) + z/σ with z = 10 (dp_accounting keeps tails down to mass e^-50), so it holds
about ``(1/(2σ²) + 10/σ) / Δ`` points for a discretization interval Δ (measured on this code:
within 3 % above dp_accounting's own count at σ = 0.1 … 1, q = 0.01 and 0.5; about 5 µs per
point to build). PLD therefore refuses a sampled step whose grid would exceed
:data:`PLD_MAX_GRID_POINTS` = 4·10⁵ points (≈ 2 s): σ ≥ :func:`pld_min_noise_multiplier` (Δ),
which is 0.293 at Δ = 1e-4 and 0.0500 at Δ = 1e-3. Below it σ = 0.05 would need 2.4·10⁷ points
per step and, composed, terabytes. RDP handles any σ in milliseconds, so the error points there.
Unsampled Gaussian steps are closed-form and have no floor.
"""

from __future__ import annotations

import functools
import math
from typing import Union

from dpfy._require import require
from dpfy.errors import PrivacyRefusal
from dpfy.privacy import gdp as _gdp
from dpfy.privacy import pld as _pld
from dpfy.privacy import rdp as _rdp
from dpfy.privacy.canonical import GAUSSIAN, MIXTURE, Atom, CanonicalForm, canonical_form, coarsen
from dpfy.privacy.mixture import els_rdp_dominating_pair
from dpfy.privacy.ledger import Ledger

__all__ = [
    "ACCOUNTANTS",
    "APPROXIMATE",
    "RIGOROUS",
    "AUTO",
    "AUTO_EXACT_LIMIT",
    "DEFAULT_RESOLUTION",
    "PLD_MAX_GRID_POINTS",
    "PLD_MAX_COMPOSED_POINTS",
    "composed_pld_width",
    "accountant_label",
    "pld_discretization",
    "pld_min_noise_multiplier",
    "check_pld_grid",
    "check_delta",
    "prepare",
    "prepare_form",
    "epsilon",
    "delta",
    "epsilon_curve",
    "epsilon_from_form",
    "delta_from_form",
    "rdp_integer_orders_epsilon",
]

ACCOUNTANTS = ("rdp", "pld", "gdp")
APPROXIMATE = frozenset({"gdp"})
RIGOROUS = ("pld", "rdp")  # the only accountants that may decide noise (calibration, caps)
AUTO = "auto"
AUTO_EXACT_LIMIT = 64
DEFAULT_RESOLUTION = {"rdp": 0.01, "pld": 0.02}
AUTO_PLD_FINE_LIMIT = 8  # at most this many sampled atoms: PLD at 1e-4, else 1e-3
PLD_FINE, PLD_COARSE = 1e-4, 1e-3

PLD_MAX_GRID_POINTS = 4e5  # points of one sampled step's PLD grid (≈ 2 s to build)
PLD_MAX_COMPOSED_POINTS = 1e8  # points of a whole run's composed PLD grid (≈ 1 GB)
_PLD_TAIL_Z = 10.0  # √(2·50): dp_accounting truncates tails below mass e^-50

Resolution = Union[float, str, None]
Discretization = Union[float, str]


def accountant_label(name: str) -> str:
    """How an accountant is named in reports; GDP always carries its caveat."""
    check_accountant(name)
    return {
        "rdp": "RDP (dp_accounting, upper bound)",
        "pld": "PLD (dp_accounting, upper bound)",
        "gdp": "GDP CLT (approximation, may under-report ε)",
    }[name]


def check_accountant(name: str) -> None:
    """Raise unless ``name`` is one of ACCOUNTANTS (the check every entry point shares)."""
    require(
        name in ACCOUNTANTS,
        "accountant",
        name,
        f"one of {list(ACCOUNTANTS)}",
        "Use 'pld' (the default: numerical and tight, where Opacus has 'prv') or 'rdp'",
    )


def check_delta(delta: float) -> None:
    """Refuse a δ outside (0, 1)."""
    require(
        isinstance(delta, (int, float)) and 0 < delta < 1,
        "delta",
        delta,
        "in (0, 1)",
        "The guide's convention is δ ≪ 1/N, e.g. 1/N^1.1",
    )


def _check_epsilon(epsilon: float) -> None:
    """Refuse an ε that is not a number > 0 (the δ(ε) entry points)."""
    require(isinstance(epsilon, (int, float)) and epsilon > 0, "epsilon", epsilon, "> 0")


def _sampled_atoms(form: CanonicalForm) -> int:
    return sum(1 for a in form.atoms if a.kind != GAUSSIAN)


def prepare(
    ledger: Ledger,
    *,
    accountant: str = "rdp",
    amplify: bool = True,
    sigma_resolution: Resolution = AUTO,
) -> CanonicalForm:
    """The canonical form ``accountant`` will read, coarsened as ``sigma_resolution`` says."""
    require(isinstance(ledger, Ledger), "ledger", type(ledger).__name__, "a dpfy Ledger")
    return prepare_form(
        canonical_form(ledger, amplify=amplify),
        accountant=accountant,
        sigma_resolution=sigma_resolution,
    )


def prepare_form(
    form: CanonicalForm, *, accountant: str = "rdp", sigma_resolution: Resolution = AUTO
) -> CanonicalForm:
    """``form`` as ``accountant`` will read it, coarsened as ``sigma_resolution`` says (what
    :func:`prepare` does after reducing a ledger; a grid's composed runs start here)."""
    check_accountant(accountant)
    if sigma_resolution is None:
        return form
    if sigma_resolution == AUTO:
        if accountant == "gdp" or _sampled_atoms(form) <= AUTO_EXACT_LIMIT:
            return form
        return coarsen(form, DEFAULT_RESOLUTION[accountant])
    require(
        isinstance(sigma_resolution, float),
        "sigma_resolution",
        sigma_resolution,
        "None, 'auto' or a float in (0, 1)",
    )
    return coarsen(form, float(sigma_resolution))


def pld_discretization(form: CanonicalForm, value_discretization: Discretization = AUTO) -> float:
    """The PLD discretization interval used for ``form`` ("auto": 1e-4 unless many atoms)."""
    if value_discretization == AUTO:
        if any(a.kind == MIXTURE for a in form.atoms):
            return PLD_COARSE  # a mixture's PLD takes ~10 s per atom at 1e-3, minutes at 1e-4
        return PLD_FINE if _sampled_atoms(form) <= AUTO_PLD_FINE_LIMIT else PLD_COARSE
    require(
        isinstance(value_discretization, float) and 0 < value_discretization <= 0.1,
        "value_discretization",
        value_discretization,
        "'auto' or a float in (0, 0.1]",
    )
    return float(value_discretization)


def pld_min_noise_multiplier(discretization: float = PLD_FINE) -> float:
    """Smallest σ of a sampled step PLD accepts at ``discretization`` (module docstring).

    Solves (1/(2σ²) + z/σ) / Δ = PLD_MAX_GRID_POINTS for u = 1/σ: u²/2 + z·u − G·Δ = 0.
    """
    g = PLD_MAX_GRID_POINTS * discretization
    u = -_PLD_TAIL_Z + math.sqrt(_PLD_TAIL_Z**2 + 2 * g)
    return 1.0 / u


def check_pld_grid(form: CanonicalForm, discretization: float) -> None:
    """Refuse (quickly, before any grid is built) a form whose PLD would not fit in memory/time.

    Raises :class:`~dpfy.errors.PrivacyRefusal` naming the smallest σ, the floor and the fix.
    """
    sampled = [
        _worst_case(a)[1] for a in form.atoms if a.kind != GAUSSIAN and a.noise_multiplier > 0
    ]
    if not sampled:
        return
    floor = pld_min_noise_multiplier(discretization)
    sigma = min(sampled)
    if sigma < floor:
        raise PrivacyRefusal(
            f"noise_multiplier must be >= {floor:.3g} for the PLD accountant (its grid at "
            f"discretization {discretization:g} would exceed {PLD_MAX_GRID_POINTS:.0e} points "
            f"per step), got noise_multiplier = {sigma:.4g}. Use accountant 'rdp' "
            f"(--accountant rdp), which handles any σ in milliseconds, or more noise"
        )
    points = composed_pld_width(form) / discretization
    if points > PLD_MAX_COMPOSED_POINTS:
        raise PrivacyRefusal(
            f"the composed privacy loss must fit the PLD accountant's grid "
            f"({PLD_MAX_COMPOSED_POINTS:.0e} points at discretization {discretization:g}), got "
            f"about {points:.2g} points ({sum(a.count for a in form.atoms):,} steps at σ down "
            f"to {sigma:.4g}: ε is far beyond any meaningful guarantee). Use accountant 'rdp' "
            f"(--accountant rdp), which composes any number of steps in milliseconds"
        )


def _worst_case(atom: Atom) -> tuple[float, float]:
    """(q, σ) of the subsampled Gaussian that bounds ``atom``'s grid: itself, or for an ELS
    mixture the dominating pair (rate 1 − (1 − q)^k, σ/k; :mod:`dpfy.privacy.mixture`)."""
    if atom.kind == MIXTURE:
        k = atom.max_examples_per_user
        assert k is not None  # a mixture atom is built from an ELS group, which records k
        return els_rdp_dominating_pair(atom.sample_rate, atom.noise_multiplier, int(k))
    return (1.0 if atom.kind == GAUSSIAN else atom.sample_rate), atom.noise_multiplier


def composed_pld_width(form: CanonicalForm) -> float:
    """An estimate of the width of the composed privacy-loss distribution's support.

    Per step, a (subsampled) Gaussian's privacy loss has mean KL ≤ log(1 + q²χ²) with
    χ² = e^{1/σ²} − 1 (KL ≤ log(1 + χ²), and subsampling scales χ² by q²; q = 1 without
    sampling) and a standard deviation ≤ q·√χ²; neither exceeds the one-step support width
    1/(2σ²) + 8/σ. Composing ``count`` steps adds the means and the variances, and a PLD grid
    spans about the mean plus ten standard deviations. Used only to refuse, before any grid
    is built, compositions that could never fit (e.g. 10¹⁴ steps): ordinary runs are orders
    of magnitude below the bound.
    """
    width = 0.0
    for a in form.atoms:
        if a.noise_multiplier <= 0:
            continue
        q, sigma = _worst_case(a)
        support = 1 / (2 * sigma**2) + 8 / sigma
        chi2 = math.expm1(min(sigma**-2, 700.0))
        mean = min(math.log1p(q * q * chi2), support)
        std = min(q * math.sqrt(chi2), support)
        width += a.count * mean + 10 * math.sqrt(a.count) * std
    return width


def epsilon_from_form(
    form: CanonicalForm,
    *,
    delta: float,
    accountant: str = "rdp",
    value_discretization: Discretization = AUTO,
) -> float:
    """ε(δ) of an already prepared canonical form (memoised: forms are immutable)."""
    check_accountant(accountant)
    check_delta(delta)
    disc = pld_discretization(form, value_discretization)
    if accountant == "pld":
        check_pld_grid(form, disc)
    return _epsilon_cached(form, float(delta), accountant, disc)


@functools.lru_cache(maxsize=256)
def _epsilon_cached(
    form: CanonicalForm, delta: float, accountant: str, discretization: float
) -> float:
    if accountant == "rdp":
        return _rdp.epsilon(form, delta)
    if accountant == "pld":
        return _pld.epsilon(form, delta, discretization)
    return _gdp.epsilon_of_form(form, delta)


def delta_from_form(
    form: CanonicalForm,
    *,
    epsilon: float,
    accountant: str = "rdp",
    value_discretization: Discretization = AUTO,
) -> float:
    """δ(ε) of an already prepared canonical form."""
    check_accountant(accountant)
    _check_epsilon(epsilon)
    if accountant == "rdp":
        return _rdp.delta(form, epsilon)
    if accountant == "pld":
        disc = pld_discretization(form, value_discretization)
        check_pld_grid(form, disc)
        return _pld.delta(form, epsilon, disc)
    return _gdp.delta_of_form(form, epsilon)


def epsilon(
    ledger: Ledger,
    *,
    delta: float,
    accountant: str = "rdp",
    amplify: bool = True,
    sigma_resolution: Resolution = AUTO,
    value_discretization: Discretization = AUTO,
) -> float:
    """ε(δ) of everything recorded in ``ledger``.

    Args:
      ledger: the run's ledger.
      delta: target δ in (0, 1).
      accountant: ``"rdp"``, ``"pld"`` or ``"gdp"`` (GDP is an approximation).
      amplify: False gives the guarantee without amplification by sampling.
      sigma_resolution: ``"auto"`` (coarsen only big heterogeneous ledgers), None (exact), or a
        grid ratio r in (0, 1); coarsening only rounds σ down, so ε stays an upper bound.
      value_discretization: PLD discretization interval; "auto" is 1e-4, or 1e-3 for ledgers
        with more than 8 distinct sampled atoms (both pessimistic; smaller is tighter, slower).

    Returns ``inf`` if any release had no noise, 0 for an empty ledger.
    """
    check_accountant(accountant)
    check_delta(delta)
    form = prepare(
        ledger, accountant=accountant, amplify=amplify, sigma_resolution=sigma_resolution
    )
    return epsilon_from_form(
        form, delta=delta, accountant=accountant, value_discretization=value_discretization
    )


def rdp_integer_orders_epsilon(ledger: Ledger, *, delta: float) -> float:
    """RDP ε(δ) of ``ledger`` over the integer orders alone (``rdp.INTEGER_ORDERS``).

    A valid upper bound, looser than ``epsilon(ledger, accountant="rdp")`` (fewer orders to
    minimise over) and up to ~10x cheaper where dp_accounting's series for fractional orders
    runs its 1000 terms (large σ or q). For the brackets of searches only; never reported.
    """
    check_delta(delta)
    return _rdp.epsilon(prepare(ledger, accountant="rdp"), delta, integer_orders=True)


def delta(
    ledger: Ledger,
    *,
    epsilon: float,
    accountant: str = "rdp",
    amplify: bool = True,
    sigma_resolution: Resolution = AUTO,
    value_discretization: Discretization = AUTO,
) -> float:
    """δ(ε) of everything recorded in ``ledger`` (arguments as in :func:`epsilon`)."""
    check_accountant(accountant)
    _check_epsilon(epsilon)
    form = prepare(
        ledger, accountant=accountant, amplify=amplify, sigma_resolution=sigma_resolution
    )
    return delta_from_form(
        form, epsilon=epsilon, accountant=accountant, value_discretization=value_discretization
    )


def _checkpoints(num_steps: int, num_points: int) -> list[int]:
    if num_steps <= num_points:
        return list(range(1, num_steps + 1))
    pts = {max(1, round(num_steps * i / num_points)) for i in range(1, num_points + 1)}
    return sorted(pts | {num_steps})


def epsilon_curve(
    ledger: Ledger,
    *,
    delta: float,
    accountant: str = "rdp",
    num_points: int | None = 50,
    amplify: bool = True,
    sigma_resolution: Resolution = AUTO,
    value_discretization: Discretization = AUTO,
) -> list[tuple[int, float]]:
    """ε after step t for about ``num_points`` values of t (always including the last step).

    ``num_points=None`` gives every step (one accountant call per step: fine for RDP and GDP,
    slow for long PLD ledgers).

    Returns a list of (t, ε(δ) of the first t steps), t counted from 1. Each point is the ε of
    the ledger's prefix, so the curve is exactly what :func:`epsilon` would say at that step.
    For PLD on ledgers without shuffled steps, prefixes are composed incrementally.
    """
    check_accountant(accountant)
    check_delta(delta)
    require(num_points is None or num_points >= 1, "num_points", num_points, ">= 1 or None")
    if ledger.num_steps == 0:
        return []
    points = _checkpoints(ledger.num_steps, num_points or ledger.num_steps)
    incremental = (
        accountant == "pld"  # shuffled and cyclic charges need the whole run
        and all(g.sampling.value not in ("shuffle", "cyclic_poisson") for g in ledger.step_groups)
    )
    out: list[tuple[int, float]] = []
    if not incremental:
        for t in points:
            form = prepare(
                ledger.prefix(t),
                accountant=accountant,
                amplify=amplify,
                sigma_resolution=sigma_resolution,
            )
            out.append(
                (
                    t,
                    epsilon_from_form(
                        form,
                        delta=delta,
                        accountant=accountant,
                        value_discretization=value_discretization,
                    ),
                )
            )
        return out
    running, done = None, 0
    # Decide coarsening and discretization once, for the whole ledger, so every point of the
    # curve is computed the same way (the last point agrees with epsilon(ledger) up to PLD
    # discretization, since segments are composed one after another).
    whole = prepare(
        ledger, accountant=accountant, amplify=amplify, sigma_resolution=sigma_resolution
    )
    resolution = whole.resolution
    disc = (
        PLD_COARSE
        if value_discretization == AUTO
        else pld_discretization(whole, value_discretization)
    )
    check_pld_grid(whole, pld_discretization(whole, value_discretization))
    for t in points:
        segment = ledger.segment(done, t)
        form = prepare(segment, accountant=accountant, amplify=amplify, sigma_resolution=resolution)
        if form.non_private:
            out.extend((tt, math.inf) for tt in points[len(out) :])
            return out
        running = _pld.build(form, disc, start=running) if form.atoms else running
        eps = 0.0 if running is None else float(running.get_epsilon_for_delta(delta))
        out.append((t, eps))
        done = t
    return out
