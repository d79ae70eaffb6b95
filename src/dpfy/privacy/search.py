"""One calibration search: the parameter whose ledger spends the target ε.

:func:`calibrate` takes ``make_event``, a function from the searched parameter (σ, a sample
rate, a number of steps) to the ledger the run would record with it (a nested privacy event:
:meth:`~dpfy.privacy.ledger.Ledger.dp_event` is its dp_accounting ``DpEvent``, and the sampling
kinds of :mod:`dpfy.privacy.events` build it), and returns the extreme parameter whose ε is at
most the target, on the safe side. ε is read by dpfy's accountants from the ledger itself, the
formula the run's ε is stated with (CONTRIBUTING.md, privacy rule 2), not from a second one.
What differs between the calibrators of :mod:`dpfy.privacy.calibration` is the parameter and
where the search starts (a :class:`Search`), never how ε is computed.

Monotonicity used: ε falls as σ grows and rises with q and with the number of steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal

from dpfy.privacy.accountants import epsilon, epsilon_from_form, pld_discretization, prepare
from dpfy.privacy.calibration_inputs import MAX_NOISE_MULTIPLIER
from dpfy.privacy.ledger import Ledger

__all__ = ["Search", "calibrate", "search_epsilon", "solve_decreasing", "last_passing"]


@dataclass(frozen=True)
class Search:
    """Where and how finely :func:`calibrate` searches; none of it weakens the result's bound.

    Args:
      direction: ``"decreasing"``: ε falls with the parameter (σ), the smallest safe value is
        returned; ``"increasing"``: ε rises with it (q), the largest safe value in
        [lower, upper]; ``"steps"``: ε rises with an integer (steps), the largest safe one,
        exactly.
      guess: where the bracket starts.
      tol: relative tolerance of the continuous searches (the result is on the safe side).
      bracket: a known (lo, hi) around the answer, checked before it is used.
      lower, upper: the admissible range (σ: the PLD floor and MAX_NOISE_MULTIPLIER).
      straddle: for expensive accountants (PLD): see :func:`solve_decreasing`.
      discretization: PLD only: the grid ε is evaluated on, or the run's own where coarser.
    """

    direction: Literal["decreasing", "increasing", "steps"] = "decreasing"
    guess: float = 1.0
    tol: float = 1e-3
    bracket: tuple[float, float] | None = None
    lower: float = 0.0
    upper: float = MAX_NOISE_MULTIPLIER
    straddle: bool = False
    discretization: float | None = None


def search_epsilon(
    ledger: Ledger, *, delta: float, accountant: str, discretization: float | None = None
) -> float:
    """ε of ``ledger`` as a search reads it.

    With PLD and ``discretization``, ε is evaluated on that grid or on the run's own,
    whichever is coarser (both pessimistic: the coarser one bounds the finer one's ε from
    above, :mod:`dpfy.privacy.calibration`), so a search never relies on a grid finer than the
    run's.
    """
    if accountant != "pld" or discretization is None:
        return epsilon(ledger, delta=delta, accountant=accountant)
    form = prepare(ledger, accountant=accountant)
    grid = max(float(discretization), pld_discretization(form))
    return epsilon_from_form(form, delta=delta, accountant=accountant, value_discretization=grid)


def calibrate(
    make_event: Callable[[float], Ledger],
    target_epsilon: float,
    delta: float,
    accountant: str,
    *,
    search: Search = Search(),
    fail: Callable[[], None],
    fail_low: Callable[[], None] | None = None,
) -> float:
    """The extreme parameter whose ledger ``make_event(x)`` spends at most ``target_epsilon``.

    ``"decreasing"``: the smallest x (to relative ``search.tol``), bracketed from
    ``search.guess`` and searched by :func:`solve_decreasing`; ``fail`` is called (and must
    raise) when even ``search.upper`` overspends, ``fail_low`` when ``search.lower`` already
    meets the target (the answer lies below the admissible range). ``"increasing"``: the largest
    x in [lower, upper] (``upper`` itself if it meets the target; ``fail_low`` when ``lower``
    overspends), searched over 1/x. ``"steps"``: the largest integer in [lower, upper] by
    doubling and bisection (``fail_low`` when ``lower`` overspends). The caller checks its
    inputs first (:mod:`dpfy.privacy.calibration_inputs`).
    """

    def eps(x: float) -> float:
        return search_epsilon(
            make_event(x), delta=delta, accountant=accountant, discretization=search.discretization
        )

    if search.direction == "decreasing":
        return solve_decreasing(
            eps,
            target_epsilon,
            search.guess,
            rel_tol=search.tol,
            x_max=search.upper,
            fail=fail,
            bracket=search.bracket,
            x_min=search.lower,
            fail_low=fail_low,
            straddle=search.straddle,
        )
    assert fail_low is not None, "an increasing search needs fail_low"
    if search.direction == "steps":
        return _largest_integer(
            lambda n: eps(n) <= target_epsilon, int(search.lower), int(search.upper), fail_low
        )
    if eps(search.upper) <= target_epsilon:
        return search.upper
    if eps(search.lower) > target_epsilon:
        fail_low()

    # ε grows with x, so it falls with y = 1/x: the smallest safe y is the largest safe x.
    def eps_y(y: float) -> float:
        return eps(1.0 / y) if y >= 1 / search.upper else math.inf

    y = solve_decreasing(
        eps_y,
        target_epsilon,
        1.0 / search.guess,
        rel_tol=search.tol,
        x_max=1 / search.lower * 1.0001,
        fail=lambda: None,  # eps(lower) meets the target: the bracket closes by 1/lower
    )
    return 1.0 / y


def _largest_integer(
    ok: Callable[[int], bool], lower: int, upper: int, fail_low: Callable[[], None]
) -> int:
    """Largest n in [lower, upper] with ok(n) (``ok`` holds up to some n, then fails)."""
    if not ok(lower):
        fail_low()
    lo, hi = lower, 2 * lower
    while hi <= upper and ok(hi):
        lo, hi = hi, hi * 2
    if hi > upper:
        if ok(upper):
            return upper
        hi = upper
    return last_passing(ok, lo, hi)


def last_passing(ok: Callable[[int], bool], lo: int, hi: int) -> int:
    """Largest integer n in [lo, hi) with ok(n), by bisection.

    ``ok`` must hold up to some n and fail after it (e.g. "ε after n steps ≤ target"), with
    ok(lo) true and ok(hi) false, or taken as such: neither end is evaluated.
    """
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def solve_decreasing(
    eps: Callable[[float], float],
    target: float,
    x0: float,
    *,
    rel_tol: float,
    x_max: float,
    fail: Callable[[], None],
    bracket: tuple[float, float] | None = None,
    x_min: float = 0.0,
    fail_low: Callable[[], None] | None = None,
    straddle: bool = False,
) -> float:
    """Smallest x > 0 (to relative ``rel_tol``, on the safe side) with eps(x) <= target.

    With ``x_min > 0`` no x below it is evaluated: if eps(x_min) already meets the target (the
    answer lies below x_min), ``fail_low`` is called (it must raise).

    ``straddle=True`` (for expensive ``eps``, PLD) moves each interpolated point by 0.45·rel_tol
    towards the bracket end that is farther from it: once the interpolation is accurate to
    about rel_tol/2, one evaluation then lands on that end's side and closes the bracket, where
    plain interpolation tends to land on the near side again (two more evaluations).

    ``eps`` must be non-increasing in x. The search brackets the root around ``x0`` and then
    runs the Illinois variant of regula falsi on log ε against log x (ε is close to a power law
    in σ, so this needs a handful of accountant calls instead of ~20 bisections), falling back to
    bisection whenever an interpolation step would not shrink the bracket enough.
    """

    def f(x: float) -> float:
        v = eps(x)
        if v <= 0:
            return -math.inf
        return math.inf if math.isinf(v) else math.log(v / target)

    lo, hi = bracket if bracket is not None else (x0 / 1.25, x0 * 1.25)
    lo = max(lo, x_min)
    hi = max(hi, lo * 1.25)
    f_lo, f_hi = f(lo), f(hi)
    while f_hi > 0:
        lo, f_lo, hi = hi, f_hi, hi * 2
        if hi > x_max:
            fail()
        f_hi = f(hi)
    while f_lo <= 0:
        if lo <= x_min:
            assert fail_low is not None, "x_min needs fail_low"
            fail_low()
        hi, f_hi, lo = lo, f_lo, max(lo / 2, x_min)
        if lo < 1e-12:
            return hi
        f_lo = f(lo)
    side = 0
    while hi / lo - 1 > rel_tol:
        u_lo, u_hi = math.log(lo), math.log(hi)
        width = u_hi - u_lo
        if math.isfinite(f_lo) and math.isfinite(f_hi) and f_lo != f_hi:
            u = u_hi - f_hi * width / (f_hi - f_lo)
            u = min(max(u, u_lo + 0.02 * width), u_hi - 0.02 * width)
        else:
            u = (u_lo + u_hi) / 2
        if straddle:
            nudge = 0.45 * math.log1p(rel_tol)
            u = u + nudge if u_hi - u > u - u_lo else u - nudge
            u = min(max(u, u_lo + 0.02 * width), u_hi - 0.02 * width)
        if side == 2 or side == -2:  # two steps on one side in a row: bisect instead
            u, side = (u_lo + u_hi) / 2, 0
        x = math.exp(u)
        fx = f(x)
        if fx <= 0:
            hi, f_hi = x, fx
            f_lo = f_lo / 2 if side > 0 else f_lo
            side = side + 1 if side > 0 else 1
        else:
            lo, f_lo = x, fx
            f_hi = f_hi / 2 if side < 0 else f_hi
            side = side - 1 if side < 0 else -1
    return hi
