"""What a calibration accepts: the bounds on its inputs and the refusals that name them.

Shared by every search of :mod:`dpfy.privacy.calibration`, :mod:`dpfy.privacy.tuning` and
:mod:`dpfy.privacy.individual`, so that a mistyped target fails in milliseconds, before any
accountant runs, with the same message wherever it is given (the bounds are explained in the
docstring of :mod:`dpfy.privacy.calibration`). The keywords every calibrator takes its target
by are declared here once (:class:`TargetKeywords` and its extensions with the sampling), and
:func:`target_from` turns them into a checked :class:`Target`.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable, TypedDict, TypeVar

from dpfy._require import require
from dpfy.privacy import gdp
from dpfy.privacy.accountants import (
    PLD_COARSE,
    PLD_FINE,
    check_accountant,
    check_delta,
    pld_min_noise_multiplier,
)
from dpfy.privacy.ledger import Sampling

__all__ = [
    "MAX_NOISE_MULTIPLIER",
    "MAX_TARGET_EPSILON",
    "MIN_TARGET_EPSILON",
    "PLD_SEARCH_DISCRETIZATION",
    "Target",
    "TargetKeywords",
    "SampledTargetKeywords",
    "UserTargetKeywords",
    "target_from",
    "check_rigorous",
    "check_target",
    "check_rate",
    "check_steps",
    "check_noise_multiplier",
    "sigma_floor",
    "unreachable",
    "refuse_below_pld_floor",
    "pld_bracket",
    "gdp_sigma_guess",
    "shows_keywords",
    "KEYWORD_DEFAULTS",
]

MAX_NOISE_MULTIPLIER = 1e4
MAX_TARGET_EPSILON = 100.0
# Below this, σ is so large that the accountants' ε underflows (dp_accounting's RDP returns 0
# for "negative Rényi divergence" at σ ~ 1e6): a calibration there would trust a rounding error.
MIN_TARGET_EPSILON = 1e-3
# The PLD grid a σ search evaluates ε on (module docstring, "Speed"): coarser than the run's
# 1e-4, pessimistic, so the σ found is safe on the run's grid too.
PLD_SEARCH_DISCRETIZATION = PLD_COARSE


def check_rigorous(accountant: str, approximate: bool) -> None:
    """Refuse the GDP approximation for a calibration unless ``approximate=True`` opts in."""
    check_accountant(accountant)
    require(
        accountant != "gdp" or approximate is True,
        "accountant",
        accountant,
        "'pld' or 'rdp' for a calibration (GDP is a CLT approximation that can under-report ε)",
        "Use accountant='pld'; to reproduce a paper's GDP calibration pass "
        "approximate=True and state the rigorous PLD ε next to it",
    )


def check_target(
    target_epsilon: float, delta: float, accountant: str, approximate: bool = False
) -> None:
    """Refuse a target ε outside [MIN_TARGET_EPSILON, MAX_TARGET_EPSILON], a δ outside (0, 1)
    and the GDP approximation without its opt-in."""
    require(
        isinstance(target_epsilon, (int, float)) and 0 < target_epsilon < math.inf,
        "target_epsilon",
        target_epsilon,
        "> 0 and finite",
    )
    require(
        target_epsilon <= MAX_TARGET_EPSILON,
        "target_epsilon",
        target_epsilon,
        f"<= {MAX_TARGET_EPSILON:g} (larger ε is no meaningful guarantee and drives σ to 0)",
        "Lower the target ε, or give a fixed noise multiplier instead of a target",
    )
    require(
        target_epsilon >= MIN_TARGET_EPSILON,
        "target_epsilon",
        target_epsilon,
        f">= {MIN_TARGET_EPSILON:g} (below it the accountants' ε underflows to 0 and a "
        f"calibration would rest on rounding error)",
        "Raise the target ε; ε < 0.001 is indistinguishable from not training",
    )
    check_delta(delta)
    check_rigorous(accountant, approximate)


@dataclass(frozen=True)
class Target:
    """What a calibration must meet: ε at δ, stated by one accountant.

    One value for the four inputs every search takes, so that a caller names the target once
    (``Target(3.0, 1e-5, "pld")``) instead of repeating them as keywords. ``approximate`` is
    the opt-in for the GDP approximation (:func:`check_rigorous`).
    """

    epsilon: float
    delta: float
    accountant: str = "rdp"
    approximate: bool = False

    def check(self) -> None:
        """Refuse the target as :func:`check_target` does."""
        check_target(self.epsilon, self.delta, self.accountant, self.approximate)


class _RequiredTargetKeywords(TypedDict):
    target_epsilon: float
    delta: float


# The optional keywords are declared by ``total=False`` classes, not ``NotRequired[...]``: under
# ``from __future__ import annotations`` Python 3.11 cannot see ``NotRequired`` at run time and
# lists such keys in ``__required_keys__``, which :func:`target_from` reads.
class TargetKeywords(_RequiredTargetKeywords, total=False):
    """A :class:`Target` as the keywords of a calibrator (``**target: Unpack[TargetKeywords]``).

    ``target_epsilon`` (ε, > 0) and ``delta`` (δ in (0, 1)) are required; ``accountant``
    (``"rdp"``, ``"pld"``, or ``"gdp"`` with ``approximate=True`` only) defaults to ``"rdp"``
    (``"pld"`` for :func:`~dpfy.privacy.calibration_schedule.calibrate_schedule_scale`), and
    ``approximate``, the opt-in for the GDP approximation (:func:`check_rigorous`), to False.
    """

    accountant: str
    approximate: bool


class SampledTargetKeywords(TargetKeywords, total=False):
    """The target and how the run samples: ``sampling`` (default ``Sampling.POISSON``), the
    sampler the run will use, which decides amplification and adjacency, and ``dataset_size``
    (default None), N, required for ``Sampling.FIXED_SIZE``."""

    sampling: Sampling
    dataset_size: int | None


class UserTargetKeywords(SampledTargetKeywords, total=False):
    """The sampled target and ``max_examples_per_user`` (default None): k, the cap on one
    user's examples that ``Sampling.ELS`` accounts (the target is then a user-level ε)."""

    max_examples_per_user: int | None


# the optional target keywords' defaults: what target_from and kind_from apply, and what
# shows_keywords writes into the calibrators' signatures
KEYWORD_DEFAULTS: dict[str, Any] = {
    "accountant": "rdp",
    "approximate": False,
    "sampling": Sampling.POISSON,
    "dataset_size": None,
    "max_examples_per_user": None,
}
F = TypeVar("F", bound=Callable[..., Any])


def shows_keywords(group: Any, **defaults: Any) -> Callable[[F], F]:
    """Give a calibrator declared with ``**target: Unpack[group]`` the signature its callers
    read in ``help()`` and ``inspect.signature``: the group's keywords spelled out, keyword-only,
    with their defaults (:data:`KEYWORD_DEFAULTS`, overridden by ``defaults``, e.g.
    ``accountant="pld"``). The function itself is unchanged; :func:`target_from` still refuses
    an undeclared keyword."""

    def wrap(fn: F) -> F:
        signature = inspect.signature(fn)
        own = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
        values = {**KEYWORD_DEFAULTS, **defaults}

        def spelled(required: bool) -> list[inspect.Parameter]:
            return [
                inspect.Parameter(
                    name,
                    inspect.Parameter.KEYWORD_ONLY,
                    default=inspect.Parameter.empty if required else values[name],
                    # under `from __future__ import annotations` the group holds ForwardRefs
                    annotation=getattr(annotation, "__forward_arg__", annotation),
                )
                for name, annotation in group.__annotations__.items()
                if (name in group.__required_keys__) == required
            ]

        positional = [p for p in own if p.kind is not p.KEYWORD_ONLY]
        keyword = [p for p in own if p.kind is p.KEYWORD_ONLY]
        parameters = positional + spelled(True) + keyword + spelled(False)
        fn.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        return fn

    return wrap


def target_from(
    caller: str,
    group: Any,
    given: TargetKeywords,
    *,
    default_accountant: str = KEYWORD_DEFAULTS["accountant"],
) -> Target:
    """The checked :class:`Target` that a calibrator's keyword group ``given`` names.

    ``group`` is the TypedDict the calibrator's ``**target`` is declared with (Any: mypy has no
    type for a TypedDict class), ``caller`` the calibrator's name. A ``**target: Unpack[...]``
    takes any keyword at run time (only mypy checks it), so this raises the TypeError Python
    raises for a named keyword: one the group does not declare, or a required one missing.
    Then the defaults (:data:`KEYWORD_DEFAULTS`; ``accountant`` = ``default_accountant``) and
    :func:`check_target`'s refusals.
    """
    declared = list(group.__annotations__)  # the group's keys, bases first
    for name in given:
        if name not in declared:
            raise TypeError(f"{caller}() got an unexpected keyword argument {name!r}")
    missing = [n for n in declared if n in group.__required_keys__ and n not in given]
    if missing:
        s = "s" if len(missing) > 1 else ""
        names = " and ".join(repr(n) for n in missing)
        raise TypeError(
            f"{caller}() missing {len(missing)} required keyword-only argument{s}: {names}"
        )
    target = Target(
        given["target_epsilon"],
        given["delta"],
        given.get("accountant", default_accountant),
        given.get("approximate", KEYWORD_DEFAULTS["approximate"]),
    )
    target.check()
    return target


def sigma_floor(accountant: str, sampling: Sampling) -> float:
    """Smallest σ a calibration may try: PLD's grid floor for sampled steps, else 0."""
    if accountant == "pld" and sampling is not Sampling.NONE:
        return pld_min_noise_multiplier(PLD_FINE)
    return 0.0


def unreachable(target_epsilon: float, constraint: str, fix: str) -> Callable[[], None]:
    """What a search calls (its ``fail`` or ``fail_low``) when no admissible value meets the
    target: raise "target_epsilon must be <constraint>, got ...", with the fix."""

    def fail() -> None:
        require(False, "target_epsilon", target_epsilon, constraint, fix)

    return fail


def refuse_below_pld_floor(target_epsilon: float, floor: float) -> None:
    """Raise: the target needs a σ below the PLD grid's floor (RDP can go lower)."""
    unreachable(
        target_epsilon,
        f"reachable with a noise multiplier >= {floor:.3g} (the PLD accountant's floor)",
        "Lower the target ε, or calibrate with accountant 'rdp' (--accountant rdp)",
    )()


def pld_bracket(
    target_epsilon: float, guess: float, rdp_sigma: float, floor: float
) -> tuple[float, float]:
    """Where a PLD σ search starts, from RDP's σ for the same target and the GDP CLT guess.

    PLD is tighter than RDP, so RDP's σ is a safe upper end; the GDP CLT value is usually just
    below PLD's. The search checks both ends before it uses them. RDP's σ below the PLD floor
    means PLD's is below it too: refused here, before any PLD grid is built."""
    if rdp_sigma < floor:
        refuse_below_pld_floor(target_epsilon, floor)
    return min(guess, rdp_sigma) * 0.98, rdp_sigma


def check_rate(sample_rate: float) -> None:
    """Refuse a sample rate outside [1e-100, 1]."""
    require(
        isinstance(sample_rate, (int, float)) and 0 < sample_rate <= 1,
        "sample_rate",
        sample_rate,
        "in (0, 1]",
        "Use batch_size / dataset_size",
    )
    # (μ/q)² in the search's starting guess overflows below this; no dataset is that large
    require(
        sample_rate >= 1e-100,
        "sample_rate",
        sample_rate,
        ">= 1e-100",
        "Use batch_size / dataset_size",
    )


def check_steps(steps: int) -> None:
    """Refuse a number of steps that is not an integer >= 1."""
    require(isinstance(steps, int) and steps >= 1, "steps", steps, "an integer >= 1")


def check_noise_multiplier(noise_multiplier: float) -> None:
    """Refuse a fixed σ that is not > 0 (the searches over q and steps hold σ fixed)."""
    require(noise_multiplier > 0, "noise_multiplier", noise_multiplier, "> 0")


def gdp_sigma_guess(target_epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
    """σ that the GDP CLT gives for homogeneous Poisson steps: a starting point, not a result."""
    try:
        mu = gdp.mu_for_epsilon(target_epsilon, delta)
    except ValueError:
        return 1.0
    ratio = (mu / sample_rate) ** 2 / steps
    return 1.0 / math.sqrt(math.log1p(ratio)) if ratio > 0 else 1.0
