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
4. ``update(state, released) -> state``: reads a :class:`Released`: the plan, the released
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
from dpfy.plan import StepPlan
from dpfy.privacy.ledger import Sampling

__all__ = ["Method", "AdaptiveMethod", "Needs", "Norms", "Clip", "ReleaseSpec", "Released",
           "RunFacts", "Deferred", "bind_facts", "prepare", "REGISTRY", "register", "make", "PLAN_FIELDS"]

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
class RunFacts:
    """The facts of one run, fixed by ``make_private`` from its sampler and arguments.

    A method reads them; it never takes them from the user a second time.
    """

    sampling: Sampling
    sample_rate: float                    # q, the sampler's rate
    steps: int | None                     # T, the budget guard's horizon (None: unbounded)
    dataset_size: int | None = None       # N
    steps_per_epoch: int | None = None    # logical batches per pass of the loader
    normalizer: float | None = None       # b, the public batch-size normalizer
    delta: float | None = None
    target_epsilon: float | None = None
    accountant: str = "pld"
    max_grad_norm: float | None = None    # C (C_0 of a clip schedule); None: per-layer etc.
    num_groups: int | None = None         # clipping groups (layers) of the model
    inner_optimizer: str | None = None    # class name of the torch optimizer make_private wraps
    inner_hyperparameters: Mapping[str, Any] | None = None   # its first param group, minus params

    def differences(self, other: "RunFacts") -> list[str]:
        """The facts that differ, as ``name: mine vs other`` strings."""
        out = []
        for f in ("sampling", "sample_rate", "steps", "delta", "target_epsilon"):
            a, b = getattr(self, f), getattr(other, f)
            if a is not None and b is not None and a != b:
                out.append(f"{f}: {a} (method) vs {b} (run)")
        return out


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


@dataclass(frozen=True)
class Norms:
    """Per-example gradient norms of one physical batch. Sensitive: never leaves the step.

    ``per_parameter`` maps each trainable parameter name to ‖∂ℓ_i/∂θ_k‖² (B,);
    ``total`` is ‖∂ℓ_i/∂θ‖ (B,); ``groups`` lists the parameter names of each clipping group.
    """

    total: torch.Tensor                              # (B,) sensitive
    per_parameter_sq: Mapping[str, torch.Tensor]     # name -> (B,) sensitive
    groups: tuple[tuple[str, ...], ...]
    indices: torch.Tensor | None = None              # (B,) dataset indices, public

    def per_group(self) -> torch.Tensor:
        """‖g_ik‖ for each group k, (B, K). Sensitive."""
        cols = [torch.sqrt(sum(self.per_parameter_sq[n] for n in g)) for g in self.groups]
        return torch.stack(cols, dim=1) if cols else self.total.new_zeros(len(self.total), 0)


@dataclass(frozen=True)
class Clip:
    """A method's clipping: per-example weights and the sensitivity they guarantee.

    ``weights`` is (B,) (one weight per example for all parameters) or {parameter name: (B,)}.
    ``sensitivity`` is Δ: the step asserts ‖Σ_k w_ik g_ik‖ ≤ Δ for every example i and adds
    noise N(0, (σ·Δ)²) to the weighted sum.
    """

    weights: torch.Tensor | Mapping[str, torch.Tensor]   # sensitive
    sensitivity: float

    def __post_init__(self) -> None:
        require(self.sensitivity > 0, "Clip.sensitivity", self.sensitivity, "> 0")


KINDS = ("values", "gradient", "loss")
# A loss probe's offsets: fixed {name: Δθ}, or a function of the step's released gradient.
Offsets = (Mapping[str, torch.Tensor]
           | Callable[[Mapping[str, torch.Tensor]], Mapping[str, torch.Tensor]])


@dataclass(frozen=True)
class ReleaseSpec:
    """An extra release declared from public values: Σ_i v_i + N(0, noise_std²).

    Args:
      sensitivity: Δ, the L2 bound on one example's v_i (add/remove one), > 0; asserted.
      noise_std: standard deviation of the Gaussian on the sum, > 0.
      kind: ``"values"`` (v_i is a scalar or a vector given by ``release_values``),
        ``"gradient"`` (v_i = w_i g_i, per-sample gradients weighted by the method's w_i: a
        parameter-shaped release formed by the engine's book-keeping), or ``"loss"`` (a
        **probe**: v_i = clip(ℓ_i(θ + offsets), −Δ, Δ), example i's loss on the same batch at
        perturbed parameters, from ``make_private(loss_fn=...)``; HyFreeDP, ADADP, line
        searches). Loss probes are released like any other value and recorded in the ledger.
      offsets: for ``kind="loss"``: {parameter name: Δθ} (public: from the method's state,
        itself built from released values); parameters not named stay at θ. Or a callable
        ``released_gradient -> {name: Δθ}``: a **post-release probe**, evaluated after this
        step's gradient is released (noise added), at offsets that are a function of that
        released gradient {name: S̃/b} only (post-processing; see ``Method.postprocess_probed``).
    """

    sensitivity: float
    noise_std: float
    kind: Literal["values", "gradient", "loss"] = "values"
    offsets: Offsets | None = None

    def __post_init__(self) -> None:
        require(self.sensitivity > 0, "sensitivity", self.sensitivity, "> 0")
        require(self.noise_std > 0, "noise_std", self.noise_std, "> 0",
                "An extra release without noise is not private")
        require(self.kind in KINDS, "kind", self.kind, f"one of {list(KINDS)}")
        require((self.offsets is not None) == (self.kind == "loss"), "offsets",
                "given" if self.offsets is not None else None,
                "given exactly for kind='loss'",
                "A loss probe says where to evaluate: offsets {parameter name: Δθ}")

    @property
    def noise_multiplier(self) -> float:
        return self.noise_std / self.sensitivity

    @property
    def after_release(self) -> bool:
        """True for a post-release probe (``offsets`` a function of the released gradient)."""
        return self.kind == "loss" and callable(self.offsets)


@dataclass(frozen=True)
class Released:
    """Everything ``update`` may read after a step: the plan and privatized values only.

    ``gradient`` is the released update direction {name: (Σ_i w_i g_i + noise)/b}; ``sums``
    holds each extra release, noisy (a float for a scalar, a tensor otherwise).
    ``noisy_gradient`` is the gradient exactly as released, before ``postprocess``
    (``gradient`` is what the optimizer stepped on; the two are the same without postprocess).
    ``parameters`` are the trainable parameters after the inner optimizer's step
    {name: θ_{t+1}} (read-only views: copy what you keep). They are public — a function of
    the released values and the data-independent initialization — so a method may read the
    update the optimizer actually applied (θ_{t+1} − θ_t: momentum, Adam's preconditioning and
    weight decay included) without re-running the optimizer (HyFreeDP's probe direction).
    """

    plan: StepPlan
    expected_batch_size: float            # b, public
    sums: Mapping[str, Any] = field(default_factory=dict)
    gradient: Mapping[str, torch.Tensor] = field(default_factory=dict)
    parameters: Mapping[str, torch.Tensor] = field(default_factory=dict)
    noisy_gradient: Mapping[str, torch.Tensor] = field(default_factory=dict)


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
        unchanged. ``Released.gradient`` then holds what the optimizer stepped on.
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

    def update(self, state: S, released: Released) -> S:
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
