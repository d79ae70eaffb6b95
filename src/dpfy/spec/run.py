"""The run spec: what a run's privacy guarantee is made of, as one frozen value.

A :class:`RunSpec` names the five things an (ε, δ) statement of DP-SGD depends on, each a small
frozen value carrying exactly its own parameters:

- **sampling** (:class:`SamplingSpec`): how units enter a step, as one of the sampling kinds of
  :mod:`dpfy.privacy.events` (Poisson, shuffled passes, cyclic Poisson), per-example rates,
  the data-parallel ranks sharing each batch; once the sampler is built, its facts (q, N, the
  user cap, the bands) as the kind's value (:meth:`RunSpec.with_sampling`);
- **unit of privacy** (:class:`ExampleUnit`, :class:`UserUnit`): one example (clipped over
  its ``augmult`` augmented rows) or one user with their cap and reduction;
- **noise mechanism** (:class:`Gaussian`, :class:`Tree`, :class:`BandMF`) with σ (``None``
  until calibrated: :meth:`RunSpec.with_noise_multiplier`) and its own parameters;
- **clipping** (:class:`ClippingSpec`): the policy, C (one, per layer, or per example) and the
  microbatch size of microbatch clipping (which changes the sensitivity to 2C, so it is part
  of the guarantee, unlike ``max_physical_batch_size``);
- **accounting** (:class:`AccountingSpec`): the accountant, δ, a target ε, the ε cap, the
  run's length, individualized budgets;
- **BatchNorm statistics** (:class:`BatchNormStatistics`, or None): public, or privatized
  releases that the ledger records beside the gradient's;

plus the adaptive method, whose declarations (what it sets, releases and needs) are read by
the checker (:mod:`dpfy.spec.check`). What never changes ε is a separate value,
:class:`dpfy.spec.PerformanceOptions`. :meth:`RunSpec.to_dict` is the spec as JSON-readable
values, for ``config.json`` and the privacy report.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self, Sequence

import numpy as np

from dpfy._require import require
from dpfy.adaptive.base import method_name
from dpfy.privacy.calibration_inputs import Target
from dpfy.privacy.events import CyclicPoisson, Poisson, SamplingKind, Shuffled
from dpfy.privacy.ledger import Ledger
from dpfy.privacy.sigma_calibration import sigma_for

__all__ = [
    "SamplingSpec",
    "ExampleUnit",
    "UserUnit",
    "Unit",
    "Gaussian",
    "Tree",
    "BandMF",
    "Mechanism",
    "ClippingSpec",
    "AccountingSpec",
    "IndividualBudgets",
    "BatchNormStatistics",
    "RunSpec",
    "CLIPPINGS",
    "NOISES",
]

CLIPPINGS = ("flat", "per_layer", "automatic", "individual", "microbatch")


def _summary(value: Any) -> Any:
    """A JSON-readable stand-in for a value: numbers and strings as they are, a sequence of
    numbers as a list when short, else its length (per-example values are data, not spec)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    try:
        n = len(value)
    except TypeError:
        return repr(value)
    if n <= 16:
        return [float(v) for v in value]
    return f"{n} values"


def _by_value(value: Any) -> Any:
    """What a spec compares and hashes in place of a value held as given (per-example rates,
    thresholds or budgets as a list, array or tensor; a method or a chain of them): the
    numbers themselves, so that two specs are equal only when every value is, never because a
    field was left out of the comparison.

    Numbers (a tensor on any device, an array, a sequence of numbers or of 0-d tensors) become
    their float64 values, read once when the spec is built; a dataclass (every dpfy method) its
    type and fields, each by value; a sequence of anything else (a chain of methods) its items
    by value; any other object itself, by identity, so a value :func:`dpfy.spec.check` or the
    builder will refuse still reaches them."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return type(value), tuple(_by_value(getattr(value, f.name)) for f in fields if f.compare)
    if isinstance(value, (list, tuple)):
        if not all(_is_number(v) for v in value):  # a chain of methods, or not numbers
            return tuple(_by_value(v) for v in value)
    elif not _is_number(value):
        return _Identity(value)
    try:
        if isinstance(value, (list, tuple)) and any(hasattr(v, "detach") for v in value):
            value = [float(v.detach().cpu()) if hasattr(v, "detach") else v for v in value]
        if hasattr(value, "detach"):  # a tensor, on any device
            value = value.detach().cpu().double().numpy()
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError, RuntimeError, NotImplementedError):
        return _Identity(value)  # not numbers the spec can read (ragged, meta): their checks say
    return array.shape, array.tobytes()


def _is_number(value: Any) -> bool:
    """A real number, or an array or tensor of them (any shape, any device)."""
    if isinstance(value, (bool, int, float, np.number)):
        return True
    dtype = getattr(value, "dtype", None)  # an ndarray or a tensor
    if dtype is None or not hasattr(value, "shape"):
        return False
    if hasattr(value, "detach"):
        return not dtype.is_complex  # a torch tensor of real numbers
    return np.issubdtype(dtype, np.number) and not np.issubdtype(dtype, np.complexfloating)


class _Identity:
    """A value compared by identity (an object the spec cannot read as numbers)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Identity) and other.value is self.value

    def __hash__(self) -> int:
        return id(self.value)


def _fields(value: Any) -> dict[str, Any]:
    """A dataclass's fields by name, each as it is (``dataclasses.asdict`` would also turn a
    nested spec into its fields, where :meth:`AccountingSpec.to_dict` wants its own names)."""
    return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}


class _Noise:
    """What the noise mechanisms share: each produces its own accounting from σ
    (:meth:`ledger`, :meth:`calibrated`), on the release period its sampler gives it
    (:meth:`period`); :meth:`to_dict` is the mechanism's name, then its fields (σ and its own
    parameters; the class-level sampling is not a field)."""

    name: ClassVar[str]
    noise_multiplier: float | None

    def period(self, sampler: Any) -> int | None:
        """The release's period on the built sampler (independent noise has none)."""
        return None

    def ledger(self, kind: SamplingKind, steps: int, *, period: int | None = None) -> Ledger:
        """The ledger of ``steps`` steps of this mechanism at its σ, sampled as ``kind``
        (:mod:`dpfy.privacy.events`): the accounting event its releases make."""
        require(
            self.noise_multiplier is not None,
            "noise_multiplier",
            self.noise_multiplier,
            "set before the run is accounted",
            "Calibrate it first (calibrated(...)) or pass noise_multiplier=σ",
        )
        assert self.noise_multiplier is not None  # the require above refused None
        return kind.ledger(self.noise_multiplier, steps, noise=self.name, period=period)

    def calibrated(
        self, kind: SamplingKind, steps: int, target: Target, *, period: int | None = None
    ) -> Self:
        """The same mechanism at the smallest σ whose :meth:`ledger` of ``steps`` steps spends
        at most ``target`` (:func:`dpfy.privacy.sigma_calibration.sigma_for`, the one σ
        search)."""
        sigma = sigma_for(kind, steps, target, noise=self.name, period=period)
        return dataclasses.replace(self, noise_multiplier=sigma)  # type: ignore[type-var]

    def to_dict(self) -> dict[str, Any]:
        return {"noise": self.name, **_fields(self)}


@dataclass(frozen=True)
class SamplingSpec:
    """How units enter a step.

    Args:
      kind: the sampling kind asked for (:mod:`dpfy.privacy.events`): :class:`Poisson`
        (default) or :class:`Shuffled` (``poisson_sampling=False``). A mechanism whose
        accounting assumes another sampling replaces it (:attr:`Tree.sampling`,
        :attr:`BandMF.sampling`); a user unit refines Poisson into user- or example-level
        sampling (:class:`UserUnit`).
      sample_rates: per-example Poisson rates q_i, or None (one rate, batch_size / N).
      world_size: data-parallel ranks that share each Poisson batch (1: one process).
      resolved: the built sampler's facts as a kind's value (q, N, the user cap), or None
        before the sampler is built.
    """

    kind: type[SamplingKind] = Poisson
    sample_rates: Any = field(default=None, compare=False)
    world_size: int = 1
    resolved: SamplingKind | None = None
    _sample_rates: Any = field(init=False, repr=False)  # compared in place of sample_rates

    def __post_init__(self) -> None:
        object.__setattr__(self, "_sample_rates", _by_value(self.sample_rates))
        require(
            self.kind in (Poisson, Shuffled),
            "sampling.kind",
            getattr(self.kind, "__name__", self.kind),
            "Poisson or Shuffled (dpfy.privacy.events)",
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind.__name__,
            "sample_rates": None if self.sample_rates is None else _summary(self.sample_rates),
            "world_size": self.world_size,
        }
        if self.resolved is not None:
            r = self.resolved
            out["resolved"] = {
                "kind": type(r).__name__,
                "sampling": r.sampling.value,
                "sample_rate": r.sample_rate,
                "dataset_size": r.dataset_size,
                "max_examples_per_user": r.max_examples_per_user,
                "bands": getattr(r, "bands", None),
            }
        return out


@dataclass(frozen=True)
class ExampleUnit:
    """The unit of privacy is one example (add or remove one); with ``augmult`` = K > 1 each
    sampled example reaches the model as K augmented rows whose gradients are averaged before
    clipping, as one unit (De et al. 2022, §3.1)."""

    name: ClassVar[str] = "example"
    augmult: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {"unit": self.name, "augmult": self.augmult}


@dataclass(frozen=True)
class UserUnit:
    """The unit of privacy is one user with all of their examples (add or remove one user).

    Args:
      sampling: ``"uls"`` (sample users, clip each user's ``reduction`` of their rows) or
        ``"els"`` (cap every user at k examples, sample examples, account per user).
      max_examples_per_user: k, the cap on a user's examples (needed by ELS).
      reduction: ``"mean"`` or ``"sum"`` of a user's gradients (ULS).
      augmult: augmented rows per example (as for :class:`ExampleUnit`; the checker refuses
        K > 1 with users).
    """

    name: ClassVar[str] = "user"
    sampling: str = "uls"
    max_examples_per_user: int | None = None
    reduction: str = "mean"
    augmult: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "unit": self.name,
            "user_sampling": self.sampling,
            "max_examples_per_user": self.max_examples_per_user,
            "user_reduction": self.reduction,
            "augmult": self.augmult,
        }


Unit = ExampleUnit | UserUnit


@dataclass(frozen=True)
class Gaussian(_Noise):
    """Independent Gaussian noise N(0, (σΔ)²) on every step's sum (DP-SGD); σ None until
    calibrated (``target_epsilon``) or set by a method; 0 is allowed for debugging."""

    name: ClassVar[str] = "gaussian"
    sampling: ClassVar[type[SamplingKind] | None] = None  # the spec's sampling, as asked
    noise_multiplier: float | None = None


@dataclass(frozen=True)
class Tree(_Noise):
    """DP-FTRL's tree aggregation over shuffled passes, restarted each pass (Kairouz et al.
    2021); no amplification is claimed."""

    name: ClassVar[str] = "tree"
    sampling: ClassVar[type[SamplingKind] | None] = Shuffled  # one participation per pass
    noise_multiplier: float | None = None

    def period(self, sampler: Any) -> int:
        """The tree restarts every pass: its period is the sampler's steps per pass."""
        return int(sampler.steps_per_epoch)


@dataclass(frozen=True)
class BandMF(_Noise):
    """Banded matrix factorization (Choquette-Choo et al. 2023) with ``bands`` b over cyclic
    Poisson sampling; ``bands=None``: :func:`dpfy.sampling.cyclic.default_bands`."""

    name: ClassVar[str] = "bandmf"
    sampling: ClassVar[type[SamplingKind] | None] = CyclicPoisson  # Poisson inside b groups
    noise_multiplier: float | None = None
    bands: int | None = None

    def period(self, sampler: Any) -> int:
        """The band count the cyclic sampler settled on (``bands=None`` picks a default)."""
        return int(sampler.bands)


Mechanism = Gaussian | Tree | BandMF
NOISES: dict[str, type[Gaussian] | type[Tree] | type[BandMF]] = {
    m.name: m for m in (Gaussian, Tree, BandMF)
}


@dataclass(frozen=True)
class ClippingSpec:
    """The clipping policy (:mod:`dpfy.clipping`) and its thresholds.

    Args:
      kind: one of :data:`CLIPPINGS`.
      max_grad_norm: C; per layer a float (split C/√K) or K floats; ``"individual"``: one C_i
        per example.
      microbatch_size: k for ``kind="microbatch"`` (each microbatch's mean gradient clipped to
        C, sensitivity 2C; k = 1 is per-example clipping).
    """

    kind: str = "flat"
    max_grad_norm: float | Sequence[float] | Any = field(default=1.0, compare=False)
    microbatch_size: int | None = None
    _max_grad_norm: Any = field(init=False, repr=False)  # compared in place of max_grad_norm

    def __post_init__(self) -> None:
        object.__setattr__(self, "_max_grad_norm", _by_value(self.max_grad_norm))

    def to_dict(self) -> dict[str, Any]:
        return {
            "clipping": self.kind,
            "max_grad_norm": _summary(self.max_grad_norm),
            "microbatch_size": self.microbatch_size,
        }


@dataclass(frozen=True)
class IndividualBudgets:
    """Individualized privacy (docs/individual.md): one ε per example and the variant
    (``"sample"``: per-group rates, ``"scale"``: per-group thresholds)."""

    budgets: Any = field(default=None, compare=False)
    variant: str | None = None
    _budgets: Any = field(init=False, repr=False)  # compared in place of budgets

    def __post_init__(self) -> None:
        object.__setattr__(self, "_budgets", _by_value(self.budgets))

    def to_dict(self) -> dict[str, Any]:
        return {"budgets": _summary(self.budgets), "individual": self.variant}


@dataclass(frozen=True)
class AccountingSpec:
    """How the run is accounted and how long it is.

    Args:
      accountant: ``"pld"``, ``"rdp"`` or ``"gdp"`` (the last never decides noise).
      delta: δ (``target_delta``). target_epsilon: calibrate σ to spend it. epsilon_cap: stop
        before a step that would exceed it. epochs, max_steps: the run's length T.
      individual: individualized budgets, or None.
    """

    accountant: str = "pld"
    delta: float | None = None
    target_epsilon: float | None = None
    epsilon_cap: float | None = None
    epochs: float | None = None
    max_steps: int | None = None
    individual: IndividualBudgets | None = None

    def to_dict(self) -> dict[str, Any]:
        individual = None if self.individual is None else self.individual.to_dict()
        return {**_fields(self), "individual": individual}


@dataclass(frozen=True)
class BatchNormStatistics:
    """What normalizes a BatchNorm's training rows (docs/guide/batchnorm.md).

    Args:
      kind: ``"public"`` (statistics of declared public data: nothing private is released) or
        ``"privatized"`` (each layer's batch mean and mean of squares, clipped to ``bound``
        and released with Gaussian noise at every step: more releases in the ledger).
      bound: A, the declared activation bound (privatized).
      share: the statistics' fraction of each step's Gaussian precision (privatized; 0.3 when
        neither it nor σ_bn is given), or None with a declared σ_bn.
      noise_multiplier: σ_bn of each release: declared, or None until the run is built (then
        derived from the share, :func:`dpfy.layers.batchnorm_setup.split_noise_multiplier`).
      releases: k = 2L, the releases per step (two per layer), once the run is built.
      public_data: the public data's name (public), as the privacy report states it.
    """

    kind: str
    bound: float | None = None
    share: float | None = None
    noise_multiplier: float | None = None
    releases: int | None = None
    public_data: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return _fields(self)


@dataclass(frozen=True)
class RunSpec:
    """What the run's privacy guarantee is made of (the module's docstring names each part).

    Built once, before anything trains (``make_private``'s keywords become one,
    :func:`dpfy.spec.from_keywords`), checked by :func:`dpfy.spec.check` and handed to the
    builder; calibration and the sampler fill in σ and the sampler's facts with
    ``dataclasses.replace`` (:meth:`with_noise_multiplier`, :meth:`with_sampling`).
    """

    sampling: SamplingSpec = SamplingSpec()
    unit: Unit = ExampleUnit()
    noise: Mechanism = Gaussian()
    clipping: ClippingSpec = ClippingSpec()
    accounting: AccountingSpec = AccountingSpec()
    method: Any = field(default=None, compare=False)
    batchnorm: BatchNormStatistics | None = None
    _method: Any = field(init=False, repr=False)  # compared in place of method

    def __post_init__(self) -> None:
        object.__setattr__(self, "_method", _by_value(self.method))

    def with_noise_multiplier(self, noise_multiplier: float | None) -> RunSpec:
        """The same spec with σ set (calibrated, or set by a method)."""
        return dataclasses.replace(
            self, noise=dataclasses.replace(self.noise, noise_multiplier=noise_multiplier)
        )

    def with_sampling(self, resolved: SamplingKind) -> RunSpec:
        """The same spec with the built sampler's facts (q, N, the user cap)."""
        return dataclasses.replace(
            self, sampling=dataclasses.replace(self.sampling, resolved=resolved)
        )

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON-readable values (``json.dumps`` takes it as it is)."""
        return {
            "sampling": self.sampling.to_dict(),
            "unit": self.unit.to_dict(),
            "noise": self.noise.to_dict(),
            "clipping": self.clipping.to_dict(),
            "accounting": self.accounting.to_dict(),
            "method": _method_field(self.method),
            "batchnorm": None if self.batchnorm is None else self.batchnorm.to_dict(),
        }


def _method_field(method: Any) -> Any:
    """The spec's ``method`` as JSON: as given when None or a name, else the method's name
    (:func:`dpfy.adaptive.base.method_name`); a list for a chain given as a list."""
    if method is None or isinstance(method, str):
        return method
    if isinstance(method, (list, tuple)):
        return [_method_field(m) for m in method]
    return method_name(method)
