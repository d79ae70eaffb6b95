"""The method interface: what an adaptive method declares, and what the private step gives it.

Every adaptive method (noise decay, clip schedules, Dynamic DP-SGD, quantile clipping, ...)
is one :class:`Method`. It overrides only what it changes (STYLE.md §8) and **declares** what
it needs in :attr:`Method.needs`; ``make_private`` checks the declaration against the run once,
before training, and the private step (``dpfy.step``) calls the hooks below in this order:

1. ``plan(state, plan) -> StepPlan``: σ_t, C_t (scalar or one per group), lr scale, from
   public values and the method's state (built only from earlier releases).
   (``transform(state, per_sample, plan)``: methods that declare ``needs.per_sample_grads``
   get the materialized per-sample gradients first and return them transformed; the norms
   and the sums below are then those of the transformed gradients.)
2. ``clipping(state, norms, plan) -> Clip | None``: per-example weights *with their
   sensitivity* Δ, read from total / per-group / per-parameter norms. None: the run's clipping
   policy. The step asserts max_i ‖w_i g_i‖ ≤ Δ every step and refuses the method otherwise.
3. ``releases(state, plan) -> {name: ReleaseSpec}``: the extra releases of this step, declared
   from public values only (their noise and sensitivity), so calibration can write the ledger
   a run would write without data; ``release_values(state, norms, plan)`` then gives the
   per-example values: a scalar or vector per example (``kind="values"``), or per-example
   weights whose weighted sum of per-sample gradients is released (``kind="gradient"``, OSO's
   threshold gradient). Each one's L2 bound is asserted like the gradient's.
   ``postprocess(state, gradient, plan)`` may then map the released gradient (post-processing
   only) before the inner optimizer steps on it.
   **Post-release probes** (NoisyMax, NoisyBTLS): a ``kind="loss"`` spec whose ``offsets`` is a
   callable ``released_gradient -> {name: Δθ}`` is evaluated *after* the gradient's noise is
   added, on the same batch, at θ + offsets(g̃) (g̃ = {name: S̃/b}, as released); its noisy sum
   goes to ``postprocess_probed(state, gradient, plan, probed, expected_batch_size)``, which
   maps the gradient the inner optimizer steps on (e.g. scales it by the selected step size).
   Its noise and sensitivity are declared up front like every release, so the ledger and
   calibration are unchanged in kind. A logical batch split over several physical batches is
   refused (the probe would need the whole batch again after the release).
4. ``update(state, released) -> state``: reads a :class:`StepOutcome`: the plan, the released
   (noisy) gradient, every released extra value. Nothing raw reaches it.
5. ``observe(state, *, val_metric)``: for methods that declare ``needs.validation``.

What a step releases is said by one function, :func:`dpfy.step.step_releases`, used by the
optimizer and by calibration alike.

A method built for a run's facts (q, N, steps, sampling, δ, target ε) records them in
``calibrated_for``; ``make_private`` refuses it under a run with other facts. A method built
without facts (``dpfy.adaptive.make(name, ...)``) is calibrated by ``make_private`` through
``calibrate(facts)``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Literal, Mapping, TypeVar

import torch

from dpfy._require import require
from dpfy.errors import PrivacyRefusal
from dpfy.types import Clip, Norms, ReleaseSpec, RunFacts, StepOutcome, StepPlan

__all__ = ["Method", "AdaptiveMethod", "Needs", "Deferred", "bind_facts", "prepare", "REGISTRY",
           "register", "make", "PLAN_FIELDS"]

S = TypeVar("S")

REGISTRY: dict[str, type] = {}

# The plan fields a method may set (``Method.sets``); the sample rate is the sampler's fact.
PLAN_FIELDS = ("noise_multiplier", "clip", "lr_scale")


def register(name: str):
    """Class decorator: make a method available by ``name`` (same word as its file, R1)."""
    def deco(cls: type) -> type:
        if name in REGISTRY:
            raise ValueError(f"adaptive method {name!r} is already registered by {REGISTRY[name]}")
        REGISTRY[name] = cls
        cls.registry_name = name
        return cls
    return deco


def make(name: str, **options: Any) -> "Method":
    """Build the registered method ``name`` from its options (uncalibrated: ``make_private``
    calibrates it for the run's facts)."""
    require(name in REGISTRY, "method", name, f"one of {sorted(REGISTRY)}",
            "Run `dpfy methods` to list them")
    cls = REGISTRY[name]
    builder = getattr(cls, "from_options", None)
    try:
        return builder(**options) if builder is not None else cls(**options)
    except TypeError as e:
        raise ValueError(f"options must be valid for method {name!r}, got {sorted(options)} "
                         f"({e}). See the method's docstring (`dpfy methods`)") from None


@dataclass(frozen=True)
class Needs:
    """What a method needs from the step; checked by ``make_private`` before training.

    Args:
      norms: which per-example norms its hooks read: ``"total"``, ``"per_group"`` (the
        clipping policy's groups) or ``"per_parameter"``.
      per_sample_grads: transforms per-sample gradients coordinate-wise (materialized route
        only; the ghost route is refused).
      validation: ``"public"`` (a metric on data the user declares public) or ``None``.
      indices: reads the dataset indices of the batch (per-example rates or thresholds).
      probes: declares loss probes (releases of kind ``"loss"``); ``make_private`` then needs
        ``loss_fn``.
      whole_batch: declares post-release probes, which evaluate losses on the whole logical
        batch after the gradient is released; ``make_private`` then refuses
        ``max_physical_batch_size`` (a split batch is gone by then).
    """

    norms: Literal["total", "per_group", "per_parameter"] = "total"
    per_sample_grads: bool = False
    validation: Literal["public"] | None = None
    indices: bool = False
    probes: bool = False
    whole_batch: bool = False


class Method(Generic[S]):
    """No-op defaults; a method overrides only what it changes.

    Class attributes a method declares:
      needs: a :class:`Needs`.
      sets: the plan fields it writes (``PLAN_FIELDS``); ``chain`` refuses two methods that
        set the same one.
      calibrated_for: the :class:`RunFacts` it was built for, or None.
      ledger_depends_on_data: True when σ_t or a release spec reacts to released values
        (plateau decay): its ε cannot be calibrated in advance, only guarded.
    """

    registry_name: str = ""
    needs: Needs = Needs()
    sets: frozenset[str] = frozenset()
    calibrated_for: RunFacts | None = None
    ledger_depends_on_data: bool = False

    def init(self) -> S | None:
        return None

    def plan(self, state: S, plan: StepPlan) -> StepPlan:
        return plan

    def clipping(self, state: S, norms: Norms, plan: StepPlan) -> Clip | None:
        return None

    def transform(self, state: S, per_sample: Mapping[str, torch.Tensor], plan: StepPlan
                  ) -> Mapping[str, torch.Tensor]:
        """Per-sample gradients {name: (B, *θ)} transformed coordinate-wise, before norms and
        clipping (AdaClip). Called only when ``needs.per_sample_grads``; sensitive in and out.
        """
        return per_sample

    def releases(self, state: S, plan: StepPlan) -> Mapping[str, ReleaseSpec]:
        return {}

    def release_values(self, state: S, norms: Norms, plan: StepPlan
                       ) -> Mapping[str, torch.Tensor]:
        return {}

    def postprocess(self, state: S, gradient: Mapping[str, torch.Tensor], plan: StepPlan
                    ) -> Mapping[str, torch.Tensor]:
        """The released gradient {name: S̃/b} mapped before the inner optimizer steps on it
        (AdaClip's map back from standardized coordinates, a momentum-only update direction).

        Post-processing: it may read only ``gradient``, the plan and the state. Default:
        unchanged. ``StepOutcome.gradient`` then holds what the optimizer stepped on.
        """
        return gradient

    def postprocess_probed(self, state: S, gradient: Mapping[str, torch.Tensor], plan: StepPlan,
                           probed: Mapping[str, float], expected_batch_size: float
                           ) -> Mapping[str, torch.Tensor]:
        """The released gradient mapped after this step's **post-release probes** (specs whose
        ``offsets`` is a callable of the released gradient; NoisyMax, NoisyBTLS).

        ``probed`` holds each post-release probe's noisy sum Σ_i clip(ℓ_i) + noise (divide by
        ``expected_batch_size`` for a mean loss). Post-processing: it may read only these, the
        gradient, the plan and the state. Called instead of :meth:`postprocess` on steps that
        declare post-release probes; a method declaring them must override it (the optimizer
        refuses otherwise, e.g. a ``chain`` that would drop the selection). Default:
        :meth:`postprocess`.
        """
        return self.postprocess(state, gradient, plan)

    def update(self, state: S, released: StepOutcome) -> S:
        return state

    def observe(self, state: S, *, val_metric: float) -> S:
        return state

    def calibrate(self, facts: RunFacts) -> "Method":
        """This method made ready for ``facts`` (default: unchanged, bound to them)."""
        return bind_facts(self, facts)

    def supplies_clipping(self) -> bool:
        """True when this method's ``clipping`` replaces the run's clipping policy."""
        return type(self).clipping is not Method.clipping

    def is_data_independent(self) -> bool:
        """True when σ_t and every release spec are functions of the step alone (so the run's
        ledger can be written before training); a method whose noise reacts to released
        values sets the class attribute ``ledger_depends_on_data = True``."""
        return not self.ledger_depends_on_data

    def state_dict(self, state: S) -> Any:
        return state

    def load_state_dict(self, saved: Any) -> S:
        return saved


AdaptiveMethod = Method   # the earlier name, kept for existing code


def bind_facts(method: Method, facts: RunFacts) -> Method:
    """``method`` marked as built for ``facts`` (a copy if it is a dataclass)."""
    out = dataclasses.replace(method) if dataclasses.is_dataclass(method) else method
    object.__setattr__(out, "calibrated_for", facts)
    return out


class Deferred(Method):
    """A method whose construction needs the run's facts (its calibration): ``make_private``
    calls :meth:`calibrate`, which builds the real method; nothing else may be called first.

    Args:
      name: the registry name it stands for (shown in errors and ``dpfy methods``).
      build: facts -> the calibrated method.
    """

    def __init__(self, name: str, build: "Callable[[RunFacts], Method]") -> None:
        self.registry_name, self._build = name, build

    def calibrate(self, facts: RunFacts) -> Method:
        return bind_facts(self._build(facts), facts)

    def init(self) -> None:
        raise ValueError(f"method {self.registry_name!r} must be calibrated for the run's facts "
                         f"first, got an uncalibrated one. Pass it to make_private(method=...), "
                         f"which calibrates it")

    def __repr__(self) -> str:
        return f"Deferred({self.registry_name!r})"


def prepare(method: Method, facts: RunFacts) -> Method:
    """``method`` ready for a run with ``facts``: refused if it was calibrated for other facts
    (issue: a schedule built for q = 0.01 run at q = 0.5), otherwise calibrated for them."""
    built = method.calibrated_for
    if built is not None:
        diff = built.differences(facts)
        if diff:
            raise PrivacyRefusal(
                f"method must be calibrated for this run's facts, got method = "
                f"{method.registry_name or type(method).__name__!r} built for other facts "
                f"({'; '.join(diff)}). Build it without facts (dpfy.adaptive.make(name, ...)) "
                f"and let make_private calibrate it, or pass the run's own facts")
        return method
    return method.calibrate(facts)
