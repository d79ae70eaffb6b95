"""The method interface: what an adaptive method declares, and what the private step gives it.

Every adaptive method (noise decay, Dynamic DP-SGD, quantile clipping, OSO, ...) is one
:class:`Method` with five core hooks; it overrides only what it changes (CONTRIBUTING.md, "Adding
an adaptive method"). Each
step, the private step (``dpfy.step``) calls them in this order:

1. ``plan(state, plan) -> StepPlan``: σ_t, C_t (a scalar or one per group), the lr scale,
   from public values and the state (itself built only from earlier releases). The method
   declares in ``sets`` which plan fields it writes; :func:`check_plan` refuses a plan that
   changes any other, so the declaration cannot disagree with the code.
2. ``clipping(state, norms, plan) -> Clip | None``: per-unit weights *with their sensitivity*
   Δ, read from total / per-group / per-parameter norms; None: the run's clipping policy. The
   step asserts max_u ‖w_u g_u‖ ≤ Δ every step.
3. ``releases(state, plan) -> {name: ReleaseSpec}``: the step's extra releases, declared from
   public values only (noise and sensitivity), so calibration writes the ledger a run would
   write without data. Each spec says how its per-unit values are formed: ``values(norms)``
   for kind ``"values"`` (a scalar or vector per unit) and ``"gradient"`` (weights on the
   per-unit gradients); a ``"loss"`` spec is a loss probe at ``offsets`` (a callable of the
   released gradient: a **post-release probe**, evaluated after the gradient's noise is added,
   on the same batch). The step asserts each unit's bound, sums, noises and records them.
4. ``update(state, outcome) -> state``: reads a :class:`~dpfy.types.StepOutcome` (the plan,
   the released gradient, every released extra value); nothing raw reaches it.
5. ``calibrate(facts) -> Method``: the method made ready for a run's :class:`RunFacts` (q, N,
   steps, δ, target ε, accountant, C, the inner optimizer, ...), once, by ``make_private``;
   a method solves its own noise there (noise decay's σ_0, Dynamic DP-SGD's μ_0).

Optional capabilities, declared by implementing them (no flags; :meth:`Method.implements`
says which a method has, and the step derives what it must provide from that and the specs):

- ``transform(state, per_sample, plan) -> per_sample``: the per-sample gradients
  {name: (B, *θ)} mapped coordinate-wise before norms and clipping (AdaClip); the step then
  takes the materialized route. Sensitive in and out.
- ``postprocess(state, gradient, plan, probed, expected_batch_size) -> gradient``: the released
  gradient {name: S̃/b} mapped before the inner optimizer steps on it. ``probed`` holds the
  noisy sums of this step's post-release probes ({} when none). Post-processing: it may read
  only these, the plan and the state. A method that declares post-release probes must
  implement it (else the probes would be paid for and never used).
- ``observe(state, *, val_metric) -> state``: a metric on data the user declared public
  (plateau decay); the trainer calls it after each evaluation.

What a step releases is said by one function, :func:`dpfy.privacy.releases.step_releases`,
used by the step and by calibration alike. A checkpoint pickles the method's state as it is.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Generic, Mapping, TypeVar

import torch

from dpfy._require import require
from dpfy.errors import PrivacyRefusal
from dpfy.privacy.releases import method_name
from dpfy.types import PLAN_FIELDS, Clip, Norms, ReleaseSpec, RunFacts, StepOutcome, StepPlan

__all__ = [
    "Method",
    "method_name",
    "setting",
    "run_steps",
    "run_clip",
    "calibrated",
    "noisy_step",
    "inner_lr",
    "bind_facts",
    "calibrate_for_run",
    "check_plan",
    "plan_changes",
    "REGISTRY",
    "register",
    "make",
    "PLAN_FIELDS",
    "NOISE_SPLIT",
    "SETS",
    "CORE_HOOKS",
    "OPTIONAL_HOOKS",
    "HOOKS",
]

S = TypeVar("S")
T = TypeVar("T")
M = TypeVar("M", bound="Method")

REGISTRY: dict[str, type[Method]] = {}

# ``Method.sets`` holds plan fields a method writes (``PLAN_FIELDS``: σ_t, C_t, the lr scale;
# the step and the sample rate are facts), and
# in ``sets``: the method divides the σ it receives between the gradient and its own releases
# (the step still spends what the gradient alone at that σ would): it may raise σ, never lower
# it, and in a chain it comes after any method that sets σ.
NOISE_SPLIT = "noise_split"
SETS = PLAN_FIELDS + (NOISE_SPLIT,)
CORE_HOOKS = ("init", "plan", "clipping", "releases", "update", "calibrate")
OPTIONAL_HOOKS = ("transform", "postprocess", "observe")
HOOKS = CORE_HOOKS + OPTIONAL_HOOKS


def register(name: str):
    """Class decorator: make a method available by ``name`` (same word as its file, R1)."""

    def deco(cls: type[M]) -> type[M]:
        if name in REGISTRY:
            raise ValueError(f"adaptive method {name!r} is already registered by {REGISTRY[name]}")
        sets = cls.__dict__.get("sets", getattr(cls, "sets", frozenset()))
        if isinstance(sets, frozenset):  # a property (OSO's) is checked by check_plan
            require(sets <= set(SETS), f"{name}.sets", sorted(sets), f"a subset of {list(SETS)}")
        REGISTRY[name] = cls
        cls.registry_name = name
        return cls

    return deco


def make(name: str, **options: Any) -> "Method":
    """Build the registered method ``name`` from its options (uncalibrated: ``make_private``
    calibrates it for the run's facts)."""
    require(
        name in REGISTRY,
        "method",
        name,
        f"one of {sorted(REGISTRY)}",
        "Run `dpfy methods` to list them",
    )
    cls = REGISTRY[name]
    if dataclasses.is_dataclass(cls):
        valid = sorted(f.name for f in dataclasses.fields(cls) if f.init)
        unknown = sorted(set(options) - set(valid))
        require(
            not unknown,
            "options",
            unknown,
            f"among {valid} for method {name!r}",
            "See the method's docstring (`dpfy methods` names its file)",
        )
    try:
        return cls(**options)
    except TypeError as e:
        raise ValueError(
            f"options must be valid for method {name!r}, got {sorted(options)} "
            f"({e}). See the method's docstring (`dpfy methods`)"
        ) from None


class Method(Generic[S]):
    """No-op defaults; a method overrides only what it changes (module docstring).

    Class attributes a method declares:
      sets: the plan fields it writes (``PLAN_FIELDS``, or ``NOISE_SPLIT`` for a method that
        divides the incoming σ with its own releases); ``chain`` refuses two methods that set
        the same one, and :func:`check_plan` refuses a plan that changes another.
      ledger_depends_on_data: True when σ_t or a release spec reacts to released values
        (plateau decay): its ε cannot be calibrated in advance, only guarded.
      example_options: the options ``dpfy methods`` and the registry's contract test build it
        with (only what it cannot default, e.g. plateau's σ_0).
    Set for it:
      registry_name: by :func:`register`.
      calibrated_for: the :class:`RunFacts` it was calibrated for, by :func:`bind_facts`.
    """

    registry_name: str = ""
    sets: frozenset[str] = frozenset()
    calibrated_for: RunFacts | None = None
    ledger_depends_on_data: bool = False
    example_options: ClassVar[Mapping[str, Any]] = {}

    def init(self) -> S:
        return None  # type: ignore[return-value]

    def plan(self, state: S, plan: StepPlan) -> StepPlan:
        return plan

    def clipping(self, state: S, norms: Norms, plan: StepPlan) -> Clip | None:
        return None

    def releases(self, state: S, plan: StepPlan) -> Mapping[str, ReleaseSpec]:
        return {}

    def update(self, state: S, outcome: StepOutcome) -> S:
        return state

    def calibrate(self, facts: RunFacts) -> "Method":
        """This method made ready for ``facts`` (default: unchanged, bound to them)."""
        return bind_facts(self, facts)

    def implements(self, hook: str) -> bool:
        """True when this method's class overrides ``hook`` (one of ``HOOKS``): a core hook
        other than the no-op default, or an optional capability it defines."""
        require(hook in HOOKS, "hook", hook, f"one of {list(HOOKS)}")
        mine = getattr(type(self), hook, None)
        return callable(mine) and mine is not getattr(Method, hook, None)

    def is_data_independent(self) -> bool:
        """True when σ_t and every release spec are functions of the step alone (so the run's
        ledger can be written before training); a method whose noise reacts to released
        values sets the class attribute ``ledger_depends_on_data = True``."""
        return not self.ledger_depends_on_data


def setting(value: T | None, name: str, fix: str, constraint: str = "set") -> T:
    """``value``, refused while it is None: a setting the user gives or ``make_private`` fills
    in from the run (when it calibrates the method), which a hook needs; the refusal says
    ``name`` must be ``constraint`` and ``fix`` says how to give it."""
    require(value is not None, name, None, constraint, fix)
    assert value is not None  # the require above refused None
    return value


def run_steps(total_steps: int | None, facts: RunFacts, method: str) -> int:
    """T: ``total_steps`` when the user fixed it, else the run's steps; refused when neither is
    known (a method planned over a horizon, named ``method`` in the refusal)."""
    steps = total_steps if total_steps is not None else facts.steps
    return setting(
        steps, "steps", "Pass epochs= or max_steps= to make_private", f"known for method {method!r}"
    )


def run_clip(clip: float | None, facts: RunFacts, name: str, fix: str, constraint: str) -> float:
    """C_0: ``clip`` when the user gave it, else the run's ``max_grad_norm``; refused when
    neither is set (``name``, ``fix`` and ``constraint`` word it as :func:`setting` does)."""
    return setting(clip if clip is not None else facts.max_grad_norm, name, fix, constraint)


_CALIBRATES = "Pass it to make_private(method=...), which calibrates it for the run's facts"


def calibrated(value: T | None, method: str, fix: str = _CALIBRATES, known: str = "") -> T:
    """``value``, which calibrating ``method`` for the run sets (``known`` names it in the
    refusal); refused while it is None, as when the method is used without ``make_private``."""
    constraint = f"calibrated for the run ({known} known)" if known else "calibrated for the run"
    require(value is not None, method, "uncalibrated", constraint, fix)
    assert value is not None  # the require above refused None
    return value


def noisy_step(sigma: float, method: str, fix: str) -> float:
    """``sigma``, the step's noise multiplier, refused unless > 0: ``method`` needs noise (a
    release of its own takes a share of it, or its step size is scaled by it)."""
    require(sigma > 0, "noise_multiplier", sigma, f"> 0 for {method}", fix)
    return sigma


def inner_lr(facts: RunFacts, name: str, constraint: str, fix: str) -> float:
    """The wrapped optimizer's learning rate from ``facts``, refused unless it is a number > 0
    (a method that scales or steps by it reads it here; ``name``, ``constraint`` and ``fix``
    word the refusal in the method's own terms)."""
    lr = (facts.inner_hyperparameters or {}).get("lr")
    require(isinstance(lr, (int, float)) and lr > 0, name, lr, constraint, fix)
    assert isinstance(lr, (int, float))  # the require above refused others
    return float(lr)


def bind_facts(method: M, facts: RunFacts) -> M:
    """``method`` marked as calibrated for ``facts`` (a copy if it is a dataclass)."""
    out = dataclasses.replace(method) if dataclasses.is_dataclass(method) else method
    object.__setattr__(out, "calibrated_for", facts)
    return out


def calibrate_for_run(method: Method, facts: RunFacts) -> Method:
    """``method`` ready for a run with ``facts``: refused if it was calibrated for other facts
    (a schedule built for q = 0.01 run at q = 0.5), otherwise calibrated for them."""
    built = method.calibrated_for
    if built is not None:
        diff = built.differences(facts)
        if diff:
            raise PrivacyRefusal(
                f"method must be calibrated for this run's facts, got method = "
                f"{method_name(method)!r} built for other facts "
                f"({'; '.join(diff)}). Build it without facts (dpfy.adaptive.make(name, ...)) "
                f"and let make_private calibrate it, or pass the run's own facts"
            )
        return method
    return method.calibrate(facts)


def _same_clip(a: float | torch.Tensor, b: float | torch.Tensor) -> bool:
    if a is b:
        return True
    if torch.is_tensor(a) or torch.is_tensor(b):
        return (
            torch.is_tensor(a)
            and torch.is_tensor(b)
            and a.shape == b.shape
            and bool(torch.equal(a, b.to(a)))
        )
    return a == b


def plan_changes(before: StepPlan, after: StepPlan) -> set[str]:
    """The fields of ``after`` that differ from ``before``."""
    out = {
        f
        for f in ("step", "sample_rate", "noise_multiplier", "lr_scale")
        if getattr(before, f) != getattr(after, f)
    }
    if not _same_clip(before.clip, after.clip):
        out.add("clip")
    return out


def check_plan(method: Method, before: StepPlan, after: StepPlan) -> None:
    """Refuse ``after = method.plan(state, before)`` if it changes a field ``method.sets`` does
    not declare (a ``NOISE_SPLIT`` method may raise σ, never lower it)."""
    sets = frozenset(method.sets)
    name = method_name(method)
    require(sets <= set(SETS), f"{name}.sets", sorted(sets), f"a subset of {list(SETS)}")
    allowed = set(sets) & set(PLAN_FIELDS)
    if NOISE_SPLIT in sets and "noise_multiplier" not in sets:
        allowed.add("noise_multiplier")
        if after.noise_multiplier < before.noise_multiplier:
            raise PrivacyRefusal(
                f"a noise split must not lower σ, got method = {name!r} planning σ = "
                f"{after.noise_multiplier:g} from σ = {before.noise_multiplier:g}. It divides "
                f"the step's σ between the gradient and its own releases: the gradient's share "
                f"is at least σ. Declare 'noise_multiplier' in sets if it sets σ itself"
            )
    extra = sorted(plan_changes(before, after) - allowed)
    if extra:
        raise PrivacyRefusal(
            f"a method's plan must change only the fields it declares in `sets`, got method = "
            f"{name!r} changing {extra} (sets = {sorted(sets)}). Add the field to its `sets` "
            f"(a chain then refuses a second method setting it) or leave it unchanged"
        )
