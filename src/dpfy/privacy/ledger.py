"""The privacy ledger: a record of every noisy release a run makes.

Every noisy release (a clipped-gradient sum, a quantile count, a threshold gradient, a loss
probe, ...) is written here, and nothing else in dpfy is allowed to know how much privacy a run
spent: accountants read a ledger (``dpfy.privacy.accountants``), calibration searches over
ledgers that *would* be written, and the privacy report is rendered from one.

A ledger is a list of :class:`StepGroup` records. A group is a run of consecutive, identical
steps (same sampling, same rate, same releases), so 100,000 steps at one σ are one record and a
1,000-step decay schedule is at most 1,000 records. Each step is turned into a ``dp_accounting``
``DpEvent`` by :meth:`StepGroup.step_event`; the whole ledger by :meth:`Ledger.dp_event`.

Sampling semantics (CONTRIBUTING.md, privacy rule 3: the sampler and the accountant's
assumption are the same object's facts): the sampler hands its :class:`Sampling` and rate to
``record_step``; the
ledger never guesses them.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace as dataclasses_replace
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence


from dpfy._lazy import LazyModule
from dpfy._require import require
from dpfy.privacy.mixture import els_dp_event
from dpfy.types.sampling import Sampling

if TYPE_CHECKING:
    import dp_accounting
else:  # imported on first read, for start-up time only (dpfy._lazy)
    dp_accounting = LazyModule("dp_accounting")

__all__ = ["Sampling", "Release", "StepGroup", "Ledger", "NOISES"]

# How the noise of successive steps is related (see Release.noise).
NOISES = ("gaussian", "tree", "bandmf")


@dataclass(frozen=True)
class Release:
    """One noisy Gaussian release inside a step: Σ_i v_i + N(0, (σ·Δ)²).

    Args:
      mechanism: what was released, e.g. ``"gradient"``, ``"quantile_count"``,
        ``"threshold_gradient"``, ``"loss_probe"``.
      noise_multiplier: σ, the noise std divided by the release's L2 sensitivity Δ
        (add/remove one example). 0 means no noise: the release is not private.
      noise: how the noise of successive steps is related: ``"gaussian"`` (independent each
        step), ``"tree"`` (DP-FTRL's tree aggregation, Kairouz et al. 2021: σ is per tree node,
        the tree restarts every ``period`` steps) or ``"bandmf"`` (banded matrix
        factorization, Choquette-Choo et al. 2023: σ relative to a strategy whose columns have
        norm ≤ 1, ``period`` = the band count b). Accounted by
        :mod:`dpfy.privacy.correlated`.
      period: the tree's restart length or BandMF's band count (None for ``"gaussian"``).
    """

    mechanism: str
    noise_multiplier: float
    noise: str = "gaussian"
    period: int | None = None

    def __post_init__(self) -> None:
        require(
            isinstance(self.mechanism, str) and self.mechanism != "",
            "mechanism",
            self.mechanism,
            "a non-empty name",
            "Name what is released, e.g. 'gradient'",
        )
        require(
            self.noise_multiplier >= 0 and math.isfinite(self.noise_multiplier),
            "noise_multiplier",
            self.noise_multiplier,
            ">= 0 and finite",
            "Pass the noise std divided by the release's sensitivity",
        )
        # Outside [1e-100, 1e100] the accountants' σ² underflows (dp_accounting divides by it)
        # or overflows; ε would be above 1e200, or 0 to every printed digit, anyway.
        require(
            self.noise_multiplier == 0 or 1e-100 <= self.noise_multiplier <= 1e100,
            "noise_multiplier",
            self.noise_multiplier,
            "0 or in [1e-100, 1e100]",
            "Pass 0 for a release without noise",
        )
        require(self.noise in NOISES, "noise", self.noise, f"one of {list(NOISES)}")
        require(
            (self.period is None) == (self.noise == "gaussian")
            and (self.period is None or isinstance(self.period, int) and self.period >= 1),
            "period",
            self.period,
            "an integer >= 1 for correlated noise, None otherwise",
        )

    def to_dict(self) -> dict[str, Any]:
        """The serialized release (``noise`` and ``period`` only when correlated)."""
        d: dict[str, Any] = {"mechanism": self.mechanism, "noise_multiplier": self.noise_multiplier}
        if self.noise != "gaussian":
            d.update(noise=self.noise, period=self.period)
        return d

    def dp_event(self) -> dp_accounting.DpEvent:
        """The unsampled event of this release."""
        if self.noise_multiplier == 0:
            return dp_accounting.NonPrivateDpEvent()
        if self.noise == "tree":
            return dp_accounting.SingleEpochTreeAggregationDpEvent(
                self.noise_multiplier, self.period
            )
        return dp_accounting.GaussianDpEvent(self.noise_multiplier)


@dataclass(frozen=True)
class StepGroup:
    """``count`` consecutive identical steps starting at ``first_step`` (0-based).

    Args:
      first_step: index of the first step of the run.
      count: number of identical steps (>= 1).
      sampling: how the batch of each step was formed.
      sample_rate: q, the probability an example is in a step's batch (Poisson), or
        batch_size / dataset_size for shuffled batches (informational only: not amplified).
      releases: the noisy releases of one step; composed within the step.
      max_examples_per_user: k, the most examples one user holds in the training set, for
        ``Sampling.ELS`` steps (their user-level accounting needs it); None for every other
        sampling. The sampler reports it; the accountant never guesses it.
    """

    first_step: int
    count: int
    sampling: Sampling
    sample_rate: float
    releases: tuple[Release, ...]
    max_examples_per_user: int | None = None

    def __post_init__(self) -> None:
        require(self.first_step >= 0, "first_step", self.first_step, ">= 0")
        require(self.count >= 1, "count", self.count, ">= 1")
        require(
            isinstance(self.sampling, Sampling),
            "sampling",
            self.sampling,
            f"one of {[s.value for s in Sampling]}",
        )
        require(
            0 < self.sample_rate <= 1,
            "sample_rate",
            self.sample_rate,
            "in (0, 1]",
            "Use batch_size / dataset_size",
        )
        require(len(self.releases) >= 1, "releases", self.releases, "at least one Release")
        k = self.max_examples_per_user
        if self.sampling.needs_max_examples_per_user:
            require(
                isinstance(k, int) and not isinstance(k, bool) and k >= 1,
                "max_examples_per_user",
                k,
                f"an integer >= 1 for {self.sampling.value} steps",
                "Record the cap k the sampler applied (dpfy's ELS sampler reports it)",
            )
        else:
            require(
                k is None,
                "max_examples_per_user",
                k,
                f"None for {self.sampling.value} steps (only ELS records k)",
            )

    @property
    def last_step(self) -> int:
        return self.first_step + self.count - 1

    def same_step_as(self, other: "StepGroup") -> bool:
        return (self.sampling, self.sample_rate, self.releases, self.max_examples_per_user) == (
            other.sampling,
            other.sample_rate,
            other.releases,
            other.max_examples_per_user,
        )

    def effective_noise_multiplier(self) -> float:
        """σ_eff of one step's releases taken together (0 if any release has no noise).

        The releases of one step are computed on the same batch, so stacking them, each
        divided by its σ_i·Δ_i, is one Gaussian mechanism whose sensitivity is
        sqrt(Σ σ_i⁻²). Its noise multiplier is σ_eff = (Σ_i σ_i⁻²)^(−1/2): exact, not a bound
        (Galli et al. 2024, Proposition 1; Andrew et al. 2021).
        """
        sigmas = [r.noise_multiplier for r in self.releases]
        if min(sigmas) == 0:
            return 0.0
        # the same value, scaled by the smallest σ so that σ**-2 cannot overflow (σ = 1e-300)
        low = min(sigmas)
        return low / math.sqrt(sum((low / s) ** 2 for s in sigmas))

    def step_event(self, dataset_size: int | None = None) -> dp_accounting.DpEvent:
        """The DpEvent of *one* step of this group, as recorded (before accounting).

        POISSON and ULS: ``PoissonSampledDpEvent(q, releases)``; ELS: the user-level
        ``MixtureOfGaussiansDpEvent`` at the step's combined σ (:mod:`dpfy.privacy.mixture`);
        FIXED_SIZE:
        ``SampledWithoutReplacementDpEvent(N, b, releases)`` (needs ``dataset_size``);
        SHUFFLE and NONE: the unsampled releases. The accountants do not read these events
        directly; they read :func:`dpfy.privacy.canonical.canonical_form`, which applies the
        adjacency and participation rules of :class:`Sampling`.
        """
        inner = (
            self.releases[0].dp_event()
            if len(self.releases) == 1
            else dp_accounting.ComposedDpEvent([r.dp_event() for r in self.releases])
        )
        if self.sampling is Sampling.ELS:  # the user-level event, the step's σ combined
            k = self.max_examples_per_user
            assert k is not None  # an ELS step group always records k (its constructor checks)
            return els_dp_event(self.sample_rate, self.effective_noise_multiplier(), int(k))
        if self.sampling in (Sampling.POISSON, Sampling.ULS) and self.sample_rate < 1:
            return dp_accounting.PoissonSampledDpEvent(self.sample_rate, inner)
        if self.sampling is Sampling.FIXED_SIZE and dataset_size is not None:
            return dp_accounting.SampledWithoutReplacementDpEvent(
                dataset_size, max(1, round(self.sample_rate * dataset_size)), inner
            )
        return inner

    def dp_event(self, dataset_size: int | None = None) -> dp_accounting.DpEvent:
        """The DpEvent of all ``count`` steps of this group, as recorded."""
        step = self.step_event(dataset_size)
        return step if self.count == 1 else dp_accounting.SelfComposedDpEvent(step, self.count)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["sampling"] = self.sampling.value
        d["releases"] = [r.to_dict() for r in self.releases]
        if self.max_examples_per_user is None:
            del d["max_examples_per_user"]  # example-level ledgers keep their old form
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StepGroup":
        return cls(
            first_step=int(d["first_step"]),
            count=int(d["count"]),
            sampling=Sampling(d["sampling"]),
            sample_rate=float(d["sample_rate"]),
            releases=tuple(_release_from_dict(r) for r in d["releases"]),
            max_examples_per_user=d.get("max_examples_per_user"),
        )


@dataclass
class Ledger:
    """Every noisy release of a run, as run-length-encoded step groups.

    Use :meth:`record_step` once per optimizer update (one logical batch). ``dataset_size`` is
    the number of private examples N; it is public and needed by reports and by accountants of
    shuffled sampling.
    """

    dataset_size: int | None = None
    groups: list[StepGroup] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.dataset_size is not None:
            require(self.dataset_size >= 1, "dataset_size", self.dataset_size, ">= 1")

    # -- writing ---------------------------------------------------------------------------
    def record_step(
        self,
        *,
        sampling: Sampling,
        sample_rate: float,
        releases: Sequence[Release],
        count: int = 1,
        max_examples_per_user: int | None = None,
    ) -> None:
        """Record ``count`` identical steps, each releasing ``releases`` (composed).

        ``max_examples_per_user``: k of an ELS step (see :class:`StepGroup`), else None."""
        group = StepGroup(
            self.num_steps,
            count,
            Sampling(sampling),
            float(sample_rate),
            tuple(releases),
            max_examples_per_user,
        )
        if self.groups and self.groups[-1].same_step_as(group):
            last = self.groups[-1]
            self.groups[-1] = dataclasses_replace(last, count=last.count + count)
        else:
            self.groups.append(group)

    def extend(self, other: "Ledger") -> None:
        """Append every step of ``other`` after this ledger's steps."""
        for g in other.groups:
            self._record_group(g)

    def _record_group(self, g: StepGroup) -> None:
        """Append the steps of group ``g`` (of another ledger, or read from a file)."""
        self.record_step(
            sampling=g.sampling,
            sample_rate=g.sample_rate,
            releases=g.releases,
            count=g.count,
            max_examples_per_user=g.max_examples_per_user,
        )

    def followed_by(self, other: "Ledger") -> "Ledger":
        """A new ledger: this one's steps, then every step of ``other`` (neither is changed)."""
        out = Ledger(self.dataset_size)
        out.extend(self)
        out.extend(other)
        return out

    # -- reading ---------------------------------------------------------------------------
    @property
    def num_steps(self) -> int:
        return self.groups[-1].last_step + 1 if self.groups else 0

    def __len__(self) -> int:
        return self.num_steps

    def __iter__(self) -> Iterator[StepGroup]:
        return iter(self.groups)

    def mechanisms(self) -> list[str]:
        """Names of all mechanisms released, in first-seen order."""
        seen: dict[str, None] = {}
        for g in self.groups:
            for r in g.releases:
                seen.setdefault(r.mechanism, None)
        return list(seen)

    def samplings(self) -> set[Sampling]:
        return {g.sampling for g in self.groups}

    def is_private(self) -> bool:
        """False if any release had no noise (then ε is infinite)."""
        return all(r.noise_multiplier > 0 for g in self.groups for r in g.releases)

    def prefix(self, num_steps: int) -> "Ledger":
        """The ledger of the first ``num_steps`` steps (for ε-over-steps curves)."""
        require(
            0 <= num_steps <= self.num_steps, "num_steps", num_steps, f"in [0, {self.num_steps}]"
        )
        out = Ledger(self.dataset_size)
        for g in self.groups:
            if g.first_step >= num_steps:
                break
            n = min(g.count, num_steps - g.first_step)
            out.record_step(
                sampling=g.sampling,
                sample_rate=g.sample_rate,
                releases=g.releases,
                count=n,
                max_examples_per_user=g.max_examples_per_user,
            )
        return out

    def only(self, mechanism: str) -> "Ledger":
        """The ledger restricted to one mechanism (for each mechanism's share of the budget)."""
        out = Ledger(self.dataset_size)
        for g in self.groups:
            rs = tuple(r for r in g.releases if r.mechanism == mechanism)
            if rs:
                out.record_step(
                    sampling=g.sampling,
                    sample_rate=g.sample_rate,
                    releases=rs,
                    count=g.count,
                    max_examples_per_user=g.max_examples_per_user,
                )
        return out

    def unit(self) -> str:
        """The unit of privacy of the whole ledger: ``"example"`` or ``"user"``.

        Raises ValueError when user-level steps (ULS, ELS) are mixed with example-level ones:
        the two guarantees protect different things, and no accountant composes them.
        """
        return self._one_of_samplings(
            {s.unit for s in self.samplings() if s.unit is not None},
            "example",
            "all accounted for one unit of privacy (users or examples)",
            "A user-level run (ULS, ELS) cannot continue as an example-level one or the "
            "reverse: resume with the same user_ids / --user-ids and user sampling, or "
            "start a new run",
        )

    def adjacency(self) -> str:
        """The neighbouring relation of the whole ledger: ``add_or_remove`` or ``replace_one``.

        Raises ValueError when Poisson steps (add/remove) are mixed with fixed-size or shuffled
        steps (replace-one), or user-level steps with example-level ones (:meth:`unit`).
        """
        self.unit()
        return self._one_of_samplings(
            {s.adjacency for s in self.samplings() if s.adjacency is not None},
            "add_or_remove",
            "all analysed under one neighbouring relation",
            "Poisson steps use add/remove adjacency, fixed-size and shuffled steps use "
            "replace-one: account the two parts separately, or use one sampler for the run",
        )

    def _one_of_samplings(self, values: set[str], default: str, constraint: str, fix: str) -> str:
        """The one value all samplings agree on (``default`` if none says), or a refusal."""
        kinds = sorted(s.value for s in self.samplings())
        require(len(values) <= 1, "ledger samplings", kinds, constraint, fix)
        return values.pop() if values else default

    def dp_event(self) -> dp_accounting.DpEvent:
        """The run as recorded: one dp_accounting event per group, composed (NoOp when empty).

        Every release appears here with its own σ (a step's releases as a ``ComposedDpEvent``),
        inside ``PoissonSampledDpEvent`` / ``SampledWithoutReplacementDpEvent`` for sampled
        steps. Shuffled and unsampled steps appear unsampled. This is the faithful record, not
        what the accountants compose: they apply the adjacency and participation rules of
        :class:`Sampling` (see :func:`dpfy.privacy.canonical.accounted_dp_event`).
        """
        if not self.groups:
            return dp_accounting.NoOpDpEvent()
        events = [g.dp_event(self.dataset_size) for g in self.groups]
        return events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)

    # -- serialization ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "dpfy-ledger/1",
            "dataset_size": self.dataset_size,
            "num_steps": self.num_steps,
            "groups": [g.to_dict() for g in self.groups],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, source: str = "ledger") -> "Ledger":
        """The ledger :meth:`to_dict` wrote. Every field is checked; a wrong, missing or
        inconsistent one raises a one-line ``ValueError`` naming ``source`` (e.g. the file)
        and the field, e.g. ``groups[2].sample_rate``."""
        _expect(isinstance(d, dict), source, "", d, "a JSON object")
        _expect(
            d.get("format") == "dpfy-ledger/1",
            source,
            "format",
            d.get("format"),
            "'dpfy-ledger/1'",
            "This is not a dpfy ledger",
        )
        size = d.get("dataset_size")
        _expect(
            size is None or _is_int(size) and size >= 1,
            source,
            "dataset_size",
            size,
            "null or an integer >= 1",
        )
        groups = d.get("groups")
        _expect(isinstance(groups, list), source, "groups", groups, "a list of step groups")
        assert isinstance(groups, list), "_expect raised otherwise"
        out = cls(size)
        for i, g in enumerate(groups):
            sg = _group_from_dict(g, source, f"groups[{i}]")
            _expect(
                sg.first_step == out.num_steps,
                source,
                f"groups[{i}].first_step",
                sg.first_step,
                f"{out.num_steps} (groups must be contiguous)",
                "The ledger is corrupt: a step is missing or counted twice",
            )
            out._record_group(sg)
        if "num_steps" in d:
            _expect(
                d["num_steps"] == out.num_steps,
                source,
                "num_steps",
                d["num_steps"],
                f"{out.num_steps} (the steps its groups hold)",
                "The ledger is corrupt: a step is missing or counted twice",
            )
        return out

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_json(cls, text: str, *, source: str = "ledger") -> "Ledger":
        """The ledger :meth:`to_json` wrote; errors name ``source`` and the line or field."""
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{source} must be valid JSON, got {e.msg.lower()} at line "
                f"{e.lineno} column {e.colno}. Pass the ledger.json written by "
                f"dpfy train (or Ledger.to_json()); an empty or cut-off file "
                f"comes from a run that did not finish"
            ) from None
        return cls.from_dict(d, source=source)

    @classmethod
    def homogeneous(
        cls,
        *,
        sample_rate: float,
        noise_multiplier: float,
        steps: int,
        sampling: Sampling = Sampling.POISSON,
        dataset_size: int | None = None,
        mechanism: str = "gradient",
        max_examples_per_user: int | None = None,
        noise: str = "gaussian",
        period: int | None = None,
    ) -> "Ledger":
        """A ledger of ``steps`` identical steps (what calibration searches over): DP-SGD's,
        or a correlated mechanism's (``noise``, ``period``: see :class:`Release`)."""
        out = cls(dataset_size)
        out.record_step(
            sampling=sampling,
            sample_rate=sample_rate,
            releases=[Release(mechanism, noise_multiplier, noise, period)],
            count=steps,
            max_examples_per_user=max_examples_per_user,
        )
        return out

    @classmethod
    def from_schedule(
        cls,
        *,
        sample_rates: Iterable[float],
        noise_multipliers: Iterable[float],
        sampling: Sampling = Sampling.POISSON,
        dataset_size: int | None = None,
        mechanism: str = "gradient",
    ) -> "Ledger":
        """A ledger with one step per (q_t, σ_t) pair; equal neighbours are merged."""
        out = cls(dataset_size)
        for q, s in zip(sample_rates, noise_multipliers, strict=True):
            out.record_step(sampling=sampling, sample_rate=q, releases=[Release(mechanism, s)])
        return out


def _release_from_dict(r: dict[str, Any]) -> Release:
    """The release :meth:`Release.to_dict` wrote."""
    return Release(
        r["mechanism"], float(r["noise_multiplier"]), r.get("noise", "gaussian"), r.get("period")
    )


_LEDGER_FIX = "Pass the ledger.json written by dpfy train (or Ledger.to_json()) unchanged"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _expect(
    ok: bool, source: str, field_name: str, value: Any, constraint: str, fix: str = _LEDGER_FIX
) -> None:
    """``require`` for one field of a serialized ledger: the name says file and field."""
    require(ok, f"{source} field {field_name}" if field_name else source, value, constraint, fix)


def _group_from_dict(g: Any, source: str, where: str) -> StepGroup:
    """One step group of a serialized ledger, each field checked before it is used."""
    _expect(isinstance(g, dict), source, where, g, "a JSON object")
    for key in ("first_step", "count"):
        _expect(_is_int(g.get(key)), source, f"{where}.{key}", g.get(key), "an integer")
    _expect(
        g.get("sampling") in [m.value for m in Sampling],
        source,
        f"{where}.sampling",
        g.get("sampling"),
        f"one of {[m.value for m in Sampling]}",
    )
    _expect(
        _is_number(g.get("sample_rate")),
        source,
        f"{where}.sample_rate",
        g.get("sample_rate"),
        "a finite number",
    )
    releases = g.get("releases")
    _expect(
        isinstance(releases, list) and len(releases) >= 1,
        source,
        f"{where}.releases",
        releases,
        "a non-empty list of releases",
    )
    for j, r in enumerate(releases):
        at = f"{where}.releases[{j}]"
        _expect(isinstance(r, dict), source, at, r, "a JSON object")
        _expect(
            isinstance(r.get("mechanism"), str),
            source,
            f"{at}.mechanism",
            r.get("mechanism"),
            "a string",
        )
        _expect(
            _is_number(r.get("noise_multiplier")),
            source,
            f"{at}.noise_multiplier",
            r.get("noise_multiplier"),
            "a finite number",
        )
        _expect(
            r.get("noise", "gaussian") in NOISES,
            source,
            f"{at}.noise",
            r.get("noise"),
            f"one of {list(NOISES)}",
        )
        _expect(
            r.get("period") is None or _is_int(r.get("period")),
            source,
            f"{at}.period",
            r.get("period"),
            "null or an integer",
        )
    k = g.get("max_examples_per_user")
    _expect(
        k is None or _is_int(k),
        source,
        f"{where}.max_examples_per_user",
        k,
        "absent, null or an integer",
    )
    try:
        return StepGroup(
            first_step=g["first_step"],
            count=g["count"],
            sampling=Sampling(g["sampling"]),
            sample_rate=float(g["sample_rate"]),
            releases=tuple(_release_from_dict(r) for r in releases),
            max_examples_per_user=k,
        )
    except ValueError as e:  # the range checks of StepGroup and Release
        raise ValueError(f"{source} field {where}: {e}") from None
