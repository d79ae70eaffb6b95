"""One checker for a run spec: each component declares what it cannot be combined with.

A run is a set of *features*, each named by the flag that turns it on (:func:`features`):
``user_ids``, ``noise='tree'``, ``clipping='microbatch'``, ``augmult=2``, data-parallel ranks,
individualized budgets, ``batchnorm='privatized'``, a method and what its declarations say (it
sets σ, it releases per-row values, it clips, it probes after the release). Each feature that
constrains others declares a :class:`Refusal`: the features it cannot be combined with and the
error that says why, with the fix. :func:`check` intersects the run's features with every
declaration, in :data:`DECLARATIONS`' order, and raises the first refusal that applies, naming
all of the offending flags. Every pair of features is declared once (a test holds this), so
the table is the one statement of what dpfy cannot account together.

The method's declarations need the method calibrated for the run's facts, so :func:`check` runs
twice: on the spec as the keywords give it (``method=None``), and with
:func:`declare_method`'s view of the calibrated method before anything trains.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from dpfy._require import require
from dpfy.adaptive.base import Method, method_name
from dpfy.errors import PrivacyRefusal
from dpfy.privacy.accountants import RIGOROUS
from dpfy.privacy.events import Shuffled
from dpfy.spec.performance import PerformanceOptions
from dpfy.spec.run import Gaussian, RunSpec, UserUnit
from dpfy.step.private_step import require_loss_fn, split_batch_refusal
from dpfy.types import ReleaseSpec, StepPlan

__all__ = ["MethodDeclaration", "Refusal", "DECLARATIONS", "declare_method", "features", "check"]


@dataclass(frozen=True)
class MethodDeclaration:
    """What a calibrated method declares, read from what it implements and releases at the
    first step (never from flags): the plan fields it sets, a per-sample transform, per-row
    loss-probe releases, its own clipping, post-release probes."""

    name: str
    sets: frozenset[str]
    transform: bool
    loss_probes: tuple[str, ...]
    clips: bool
    post_release: bool
    releases: Mapping[str, ReleaseSpec]


def declare_method(method: Method, plan: StepPlan) -> MethodDeclaration:
    """The declarations of ``method`` at the first step's ``plan`` (q, σ, the default C)."""
    state = method.init()
    specs = method.releases(state, method.plan(state, plan))
    return MethodDeclaration(
        name=method_name(method),
        sets=frozenset(method.sets),
        transform=method.implements("transform"),
        loss_probes=tuple(n for n, s in specs.items() if s.kind == "loss"),
        clips=method.implements("clipping"),
        post_release=any(s.after_release for s in specs.values()),
        releases=specs,
    )


@dataclass(frozen=True)
class _Run:
    """What an error message may read: the spec, the performance options, the method."""

    spec: RunSpec
    performance: PerformanceOptions
    method: MethodDeclaration | None


@dataclass(frozen=True)
class Refusal:
    """``owner`` cannot be combined with any of ``refuses``; ``error(run, flags)`` is the
    exception naming the offending flags (in the order :func:`features` lists them)."""

    owner: str
    refuses: frozenset[str]
    error: Callable[[_Run, list[str]], Exception]


def features(
    spec: RunSpec, performance: PerformanceOptions, method: MethodDeclaration | None = None
) -> dict[str, str]:
    """The run's features: tag -> the flag the user spelled it with."""
    unit, noise, acc = spec.unit, spec.noise, spec.accounting
    on: dict[str, str] = {}

    def add(tag: str, flag: str, present: bool) -> None:
        if present:
            on[tag] = flag

    add("noise_multiplier", "noise_multiplier", noise.noise_multiplier is not None)
    add("target_epsilon", "target_epsilon", acc.target_epsilon is not None)
    add("epsilon_cap", "epsilon_cap", acc.epsilon_cap is not None)
    add("approximate", f"accountant={acc.accountant!r}", acc.accountant not in RIGOROUS)
    add("shuffle", "poisson_sampling=False", spec.sampling.kind is Shuffled)
    add("sample_rates", "sample_rates", spec.sampling.sample_rates is not None)
    add("data_parallel", "data-parallel ranks", spec.sampling.world_size > 1)
    add("users", "user_ids", isinstance(unit, UserUnit))
    add("uls", "user_sampling='uls'", isinstance(unit, UserUnit) and unit.sampling == "uls")
    add("augmult", f"augmult={unit.augmult}", unit.augmult > 1)
    add("budgets", "budgets / individual", acc.individual is not None)
    add("correlated", f"noise={noise.name!r}", not isinstance(noise, Gaussian))
    add("individual_clipping", "clipping='individual'", spec.clipping.kind == "individual")
    add("microbatch", "clipping='microbatch'", spec.clipping.kind == "microbatch")
    add("not_flat", f"clipping={spec.clipping.kind!r}", spec.clipping.kind != "flat")
    add("method", "method", spec.method is not None)
    bn, clip = spec.batchnorm, spec.clipping
    privatized = bn is not None and bn.kind == "privatized"
    add("bn_privatized", "batchnorm='privatized'", privatized)
    add("bn_share", "bn_share", privatized and bn is not None and bn.share is not None)
    add("no_noise", "noise_multiplier=0", noise.noise_multiplier == 0)
    # microbatch units: k = 1 clips each row alone (per-example clipping, dpfy.sampling.microbatch)
    add(
        "microbatch_units",
        "clipping='microbatch'",
        clip.kind == "microbatch" and clip.microbatch_size != 1,
    )
    add("ghost", "route='ghost'", performance.route == "ghost")
    add("split", "max_physical_batch_size", bool(performance.max_physical_batch_size))
    if method is not None:
        add("sets_sigma", "a method that sets σ", "noise_multiplier" in method.sets)
        add("transform", "a per-sample transform", method.transform)
        add("per_row", "per-row releases", method.transform or bool(method.loss_probes))
        add("clips", "a method's own clipping", method.clips)
        add("post_release", "post-release probes", method.post_release)
        add("loss_probes", "loss probes", bool(method.loss_probes))
    return on


# -- the messages: one per declaration, each with its fix ----------------------------------------


def _one_sigma(run: _Run, flags: list[str]) -> Exception:
    values = (run.spec.noise.noise_multiplier, run.spec.accounting.target_epsilon)
    return ValueError(
        f"noise_multiplier / target_epsilon must be not both given, got noise_multiplier / "
        f"target_epsilon = {values!r}. Pass σ directly or a target ε to calibrate it, not both."
    )


def _rigorous(run: _Run, flags: list[str]) -> Exception:
    return ValueError(
        f"accountant must be one of {list(RIGOROUS)} when it decides the noise (target_"
        f"epsilon, epsilon_cap), got accountant = {run.spec.accounting.accountant!r}. The GDP "
        f"CLT can under-report ε; calibrate with 'pld' and read GDP afterwards with "
        f"optimizer.epsilon(delta, accountant='gdp', approximate=True)"
    )


def _user_level(run: _Run, flags: list[str]) -> Exception:
    return PrivacyRefusal(
        f"user-level DP (user_ids) must use dpfy's user-level Poisson sampler in one "
        f"process with one threshold per unit, got {', '.join(flags)}: those are per "
        f"example and cannot be accounted per user. Drop them (individualized budgets per "
        f"user are not built), or drop user_ids for example-level DP"
    )


def _correlated(run: _Run, flags: list[str]) -> Exception:
    return ValueError(
        f"arguments must be none of them with noise={run.spec.noise.name!r}, got arguments = "
        f"{flags!r}. Correlated noise is single-process, for uniform budgets and rates; use "
        f"noise='gaussian' for these."
    )


def _cannot_combine(owner: str, flags: list[str], why: str, instead: str) -> Exception:
    """The refusal of a feature that ``flags`` cannot join: why, and what to do instead."""
    return PrivacyRefusal(
        f"{owner} cannot be combined with {flags}: {why}. Drop them, or {instead}"
    )


def _microbatch(run: _Run, flags: list[str]) -> Exception:
    why = "they act on single examples, and the unit clipped here is a microbatch"
    return _cannot_combine(
        "clipping='microbatch'", flags, why, "use per-example clipping (clipping='flat')"
    )


def _augmult(run: _Run, flags: list[str]) -> Exception:
    k = run.spec.unit.augmult
    why = (
        f"augmentation multiplicity clips an example's {k} copies as one unit of Poisson- or "
        f"shuffle-sampled examples with independent Gaussian noise, and those act on other units "
        f"(users, microbatches, rows) or on other mechanisms"
    )
    return _cannot_combine(f"augmult={k}", flags, why, "drop augmult")


def _individual(run: _Run, flags: list[str]) -> Exception:
    name = flags[0]
    spec = run.spec
    given = {  # what the user gave, as they gave it
        "noise_multiplier": spec.noise.noise_multiplier,
        "target_epsilon": spec.accounting.target_epsilon,
        "sample_rates": "per-example rates",
        "method": spec.to_dict()["method"],
        "data-parallel ranks": spec.sampling.world_size,
    }.get(name, "given")
    return ValueError(
        f"{name} must be None with budgets (individualized privacy decides σ, the rates and "
        f"the thresholds), got {name} = {given!r}. "
        + ("Run it in one process." if name == "data-parallel ranks" else f"Drop {name}=.")
    )


def _budgets_flat(run: _Run, flags: list[str]) -> Exception:
    return ValueError(
        f"clipping must be 'flat' with budgets (individualized privacy samples or scales "
        f"around the base flat threshold c = max_grad_norm), got clipping = "
        f"{run.spec.clipping.kind!r}. Drop clipping=; individual='scale' gives each group its "
        f"own threshold."
    )


def _budgets_poisson(run: _Run, flags: list[str]) -> Exception:
    return ValueError(
        "poisson_sampling must be True with budgets (each group's ε is accounted for Poisson "
        "sampling at its own rate), got poisson_sampling = False. Drop poisson_sampling=False."
    )


def _budgets_rigorous(run: _Run, flags: list[str]) -> Exception:
    return ValueError(
        f"accountant must be one of {list(RIGOROUS)} with budgets (it calibrates every "
        f"group's σ or rate), got accountant = {run.spec.accounting.accountant!r}. Calibrate "
        f"with 'rdp' or 'pld'."
    )


def _sets_sigma(run: _Run, flags: list[str]) -> Exception:
    name = run.method.name if run.method is not None else "method"
    noise = run.spec.noise.name
    return ValueError(
        f"method must be a method that does not set σ with noise={noise!r}, got method = "
        f"{name!r}. Correlated noise needs one σ for the whole run: use noise='gaussian'."
    )


def _what_per_row(method: MethodDeclaration | None, join: str, probes: str) -> str:
    assert method is not None, "per-row releases are declared by a method"
    parts = ["a per-sample transform"] if method.transform else []
    if method.loss_probes:
        parts.append(f"{probes} loss probes {list(method.loss_probes)}")
    return join.join(parts)


def _augmult_rows(run: _Run, flags: list[str]) -> Exception:
    assert run.method is not None
    k = run.spec.unit.augmult
    return PrivacyRefusal(
        f"method {run.method.name!r} must release per-unit values with augmult={k}, got "
        f"{_what_per_row(run.method, ' ', 'per-row')}: they act on each of an example's {k} "
        f"augmented rows, not on the example. Drop augmult, or use a method without them"
    )


def _uls_rows(run: _Run, flags: list[str]) -> Exception:
    assert run.method is not None
    return PrivacyRefusal(
        f"method {run.method.name!r} must release per-user values under user_sampling='uls', "
        f"got {_what_per_row(run.method, ' and ', 'per-example')}: their sensitivity is per "
        f"example, not per user. Use user_sampling='els' (each example clipped alone, "
        f"accounted per user), or a method without them"
    )


def _transform_route(run: _Run, flags: list[str]) -> Exception:
    assert run.method is not None
    return ValueError(
        f"route must be 'auto' or 'vmap' for method {run.method.name!r} (it transforms "
        f"per-sample gradients coordinate-wise, which the ghost route never forms), got route = "
        f"'ghost'. Drop route='ghost'; every layer then takes the materialized route "
        f"(memory: B × parameters)."
    )


def _own_clipping(run: _Run, flags: list[str]) -> Exception:
    assert run.method is not None
    return ValueError(
        f"clipping must be 'flat' (the default) with method {run.method.name!r}, which supplies "
        f"its own clipping, got clipping = {run.spec.clipping.kind!r}. Drop clipping=, or drop "
        f"the method: dpfy never replaces a clipping policy you asked for silently."
    )


def _loss_fn(run: _Run, flags: list[str]) -> Exception:
    assert run.method is not None
    try:  # the message of the check every step that declares loss probes repeats
        require_loss_fn(run.method.releases, None, run.method.name)
    except ValueError as e:
        return e
    raise AssertionError("loss probes were declared")


def _post_release(run: _Run, flags: list[str]) -> Exception:
    assert run.method is not None
    return split_batch_refusal(run.method.name)


def _privatized_batchnorm(run: _Run, flags: list[str]) -> Exception:
    why = (
        "its statistics are released once per logical batch, from all of it, with one example "
        "per row, as independent Gaussians in one process and one budget"
    )
    instead = "use GroupNorm (dpfy.validate(model, fix=True)) or batchnorm='public'"
    return _cannot_combine("batchnorm='privatized'", flags, why, instead)


def _share_and_fix(run: _Run, sep: str) -> str:
    """The BatchNorm share as given, its default and the fix: the tail of both refusals of
    ``bn_share`` (``sep`` joins the share to the default's note)."""
    bn = run.spec.batchnorm
    return (
        f"{bn.share if bn is not None else None!r}{sep}0.3 when neither bn_share nor "
        f"bn_noise_multiplier is given). Declare the statistics' own σ with bn_noise_multiplier="
    )


def _bn_share(run: _Run, flags: list[str]) -> Exception:
    name = run.method.name if run.method is not None else "method"
    return ValueError(
        f"bn_share must be None with method {name!r}, which sets σ every step, got bn_share = "
        f"{_share_and_fix(run, ' (')}."
    )


def _share_of_nothing(run: _Run, flags: list[str]) -> Exception:
    return ValueError(
        f"noise_multiplier must be > 0 to derive σ_bn from bn_share, got noise_multiplier = 0 "
        f"(bn_share = {_share_and_fix(run, '; ')}"
    )


def _refusal(owner: str, refuses: str, error: Callable[[_Run, list[str]], Exception]) -> Refusal:
    return Refusal(owner, frozenset(refuses.split()), error)


# In the order they are checked; a pair refused by an earlier entry is not repeated later.
DECLARATIONS: tuple[Refusal, ...] = (
    _refusal("noise_multiplier", "target_epsilon", _one_sigma),
    _refusal(
        "users", "shuffle sample_rates data_parallel budgets individual_clipping", _user_level
    ),
    _refusal("correlated", "data_parallel budgets sample_rates users microbatch", _correlated),
    _refusal("microbatch", "users sample_rates method budgets data_parallel", _microbatch),
    _refusal(  # microbatch_units: at k = 1 each example is clipped alone (flat), as augmult asks
        "augmult",
        "users microbatch_units individual_clipping budgets data_parallel correlated",
        _augmult,
    ),
    _refusal("approximate", "target_epsilon epsilon_cap", _rigorous),
    _refusal(
        "budgets", "noise_multiplier target_epsilon sample_rates method data_parallel", _individual
    ),
    _refusal("budgets", "not_flat", _budgets_flat),
    _refusal("budgets", "shuffle", _budgets_poisson),
    _refusal("budgets", "approximate", _budgets_rigorous),
    _refusal(
        "bn_privatized",
        "split correlated budgets data_parallel users augmult microbatch_units",
        _privatized_batchnorm,
    ),
    _refusal("bn_share", "no_noise", _share_of_nothing),
    # the method's declarations (the second pass)
    _refusal("sets_sigma", "correlated", _sets_sigma),
    _refusal("sets_sigma", "bn_share", _bn_share),
    _refusal("augmult", "per_row", _augmult_rows),
    _refusal("uls", "per_row", _uls_rows),
    _refusal("transform", "ghost", _transform_route),
    _refusal("clips", "not_flat", _own_clipping),
    _refusal("loss_probes", "no_loss_fn", _loss_fn),
    _refusal("post_release", "split", _post_release),
)


def check(
    spec: RunSpec,
    performance: PerformanceOptions | None = None,
    *,
    method: MethodDeclaration | None = None,
    loss_fn: Any = None,
) -> None:
    """Raise the first declared refusal that applies to the run; return None if admitted.

    The run must have a source of σ (σ, a target ε, a method or budgets); with ``method``,
    its loss-probe releases need ``loss_fn``.
    """
    performance = performance if performance is not None else PerformanceOptions()
    on = features(spec, performance, method)
    if not callable(loss_fn):
        on["no_loss_fn"] = "no loss_fn"
    require(
        any(tag in on for tag in ("noise_multiplier", "target_epsilon", "method", "budgets")),
        "noise_multiplier",
        None,
        "given (or target_epsilon, or a method that sets σ)",
        "Pass noise_multiplier=σ or target_epsilon=..., target_delta=..., epochs=...",
    )
    run = _Run(spec, performance, method)
    for refusal in DECLARATIONS:
        if refusal.owner in on:
            hit = [flag for tag, flag in on.items() if tag in refusal.refuses]
            if hit:
                raise refusal.error(run, hit)
