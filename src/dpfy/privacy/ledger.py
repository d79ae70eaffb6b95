"""The privacy ledger: a record of every noisy release a run makes.

Every noisy release (a clipped-gradient sum, a quantile count, a threshold gradient, a loss
probe, ...) is written here, and nothing else in dpfy is allowed to know how much privacy a run
spent: accountants read a ledger (``dpfy.privacy.accountants``), calibration searches over
ledgers that *would* be written, and the privacy report is rendered from one.

A ledger is a list of :class:`StepGroup` records. A group is a run of consecutive, identical
steps (same sampling, same rate, same releases), so 100,000 steps at one σ are one record and a
1,000-step decay schedule is at most 1,000 records. Each step is turned into a ``dp_accounting``
``DpEvent`` by :meth:`StepGroup.step_event`; the whole ledger by :meth:`Ledger.dp_event`. The
records (:class:`Release`, :class:`StepGroup`) live in :mod:`dpfy.privacy.ledger_records`, the
checked reading of a ledger file in :mod:`dpfy.privacy.ledger_json`; both are importable from
here.

Sampling semantics (CONTRIBUTING.md, privacy rule 3: the sampler and the accountant's
assumption are the same object's facts): the sampler hands its :class:`Sampling` and rate to
``record_step``; the
ledger never guesses them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace as dataclasses_replace
from typing import Any, Iterable, Iterator, Protocol, Sequence

from dpfy._renamed import renamed_attribute
from dpfy._require import require
from dpfy.privacy._dp_accounting import dp_accounting
from dpfy.privacy.ledger_json import LEDGER_FORMAT, checked_ledger_fields, parse_ledger_json
from dpfy.privacy.ledger_records import NOISES, Release, StepGroup
from dpfy.types.sampling import Sampling

__all__ = ["Sampling", "Release", "StepGroup", "Ledger", "NOISES"]


class StepFacts(Protocol):
    """What one recorded step is: a :class:`StepGroup`'s facts without its place and count."""

    @property
    def sampling(self) -> Sampling: ...
    @property
    def sample_rate(self) -> float: ...
    @property
    def releases(self) -> Sequence[Release]: ...
    @property
    def max_examples_per_user(self) -> int | None: ...


@dataclass
class Ledger:
    """Every noisy release of a run, as run-length-encoded step groups.

    Use :meth:`record_step` once per optimizer update (one logical batch). ``dataset_size`` is
    the number of private examples N; it is public and needed by reports and by accountants of
    shuffled sampling.
    """

    dataset_size: int | None = None
    step_groups: list[StepGroup] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.dataset_size is not None:
            require(self.dataset_size >= 1, "dataset_size", self.dataset_size, ">= 1")

    # "groups" also names clipping and privacy groups: the old name reads the same list
    groups = renamed_attribute(
        "Ledger.groups", "step_groups", "Ledger.step_groups (the run-length-encoded step groups)"
    )

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
        if self.step_groups and self.step_groups[-1].same_step_as(group):
            last = self.step_groups[-1]
            self.step_groups[-1] = dataclasses_replace(last, count=last.count + count)
        else:
            self.step_groups.append(group)

    def record_like(self, step: StepFacts, count: int = 1) -> None:
        """Record ``count`` steps like ``step``: its sampling, rate, releases and k.

        ``step`` is a group of another ledger (or of a ledger file) or what a noise mechanism
        says its step releases (:class:`dpfy.noise.StepRecord`); every copy of steps from one
        ledger to another goes through here."""
        self.record_step(
            sampling=step.sampling,
            sample_rate=step.sample_rate,
            releases=step.releases,
            count=count,
            max_examples_per_user=step.max_examples_per_user,
        )

    def extend(self, other: "Ledger") -> None:
        """Append every step of ``other`` after this ledger's steps."""
        for g in other.step_groups:
            self.record_like(g, g.count)

    def followed_by(self, other: "Ledger") -> "Ledger":
        """A new ledger: this one's steps, then every step of ``other`` (neither is changed)."""
        out = Ledger(self.dataset_size)
        out.extend(self)
        out.extend(other)
        return out

    # -- reading ---------------------------------------------------------------------------
    @property
    def num_steps(self) -> int:
        return self.step_groups[-1].last_step + 1 if self.step_groups else 0

    def __len__(self) -> int:
        return self.num_steps

    def __iter__(self) -> Iterator[StepGroup]:
        return iter(self.step_groups)

    def mechanisms(self) -> list[str]:
        """Names of all mechanisms released, in first-seen order."""
        seen: dict[str, None] = {}
        for g in self.step_groups:
            for r in g.releases:
                seen.setdefault(r.mechanism, None)
        return list(seen)

    def samplings(self) -> set[Sampling]:
        return {g.sampling for g in self.step_groups}

    def is_private(self) -> bool:
        """False if any release had no noise (then ε is infinite)."""
        return all(r.noise_multiplier > 0 for g in self.step_groups for r in g.releases)

    def prefix(self, num_steps: int) -> "Ledger":
        """The ledger of the first ``num_steps`` steps (for ε-over-steps curves)."""
        require(
            0 <= num_steps <= self.num_steps, "num_steps", num_steps, f"in [0, {self.num_steps}]"
        )
        return self.segment(0, num_steps)

    def segment(self, start: int, stop: int | None = None) -> "Ledger":
        """Steps [start, stop) as a ledger of their own (to the last step when ``stop`` is
        None): what a running or incremental accountant composes next."""
        stop = self.num_steps if stop is None else stop
        out = Ledger(self.dataset_size)
        for g in self.step_groups:
            lo, hi = max(g.first_step, start), min(g.last_step + 1, stop)
            if lo < hi:
                out.record_like(g, hi - lo)
        return out

    def only(self, mechanism: str) -> "Ledger":
        """The ledger restricted to one mechanism (for each mechanism's share of the budget)."""
        out = Ledger(self.dataset_size)
        for g in self.step_groups:
            rs = tuple(r for r in g.releases if r.mechanism == mechanism)
            if rs:
                out.record_like(dataclasses_replace(g, releases=rs), g.count)
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
        if not self.step_groups:
            return dp_accounting.NoOpDpEvent()
        events = [g.dp_event(self.dataset_size) for g in self.step_groups]
        return events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)

    # -- serialization ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": LEDGER_FORMAT,
            "dataset_size": self.dataset_size,
            "num_steps": self.num_steps,
            "groups": [g.to_dict() for g in self.step_groups],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, source: str = "ledger") -> "Ledger":
        """The ledger :meth:`to_dict` wrote. Every field is checked; a wrong, missing or
        inconsistent one raises a one-line ``ValueError`` naming ``source`` (e.g. the file)
        and the field, e.g. ``groups[2].sample_rate``."""
        size, groups = checked_ledger_fields(d, source)
        out = cls(size)
        for g in groups:
            out.record_like(g, g.count)
        return out

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_json(cls, text: str, *, source: str = "ledger") -> "Ledger":
        """The ledger :meth:`to_json` wrote; errors name ``source`` and the line or field."""
        return cls.from_dict(parse_ledger_json(text, source), source=source)

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
