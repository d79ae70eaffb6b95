"""The ledger in the form accountants read: a multiset of independent Gaussian "atoms".

A ledger records what the run did (per step: sampling, q, and the releases). Before any ε is
computed it is reduced to *atoms* — ``count`` copies of one (possibly subsampled) Gaussian
mechanism with noise multiplier σ relative to the sensitivity under the ledger's neighbouring
relation. The reduction applies, in order:

1. **Composed releases of a step collapse exactly.** Releases computed on one batch stack into
   one Gaussian mechanism with σ_eff = (Σ_i σ_i⁻²)^(−1/2) (see
   :meth:`~dpfy.privacy.ledger.StepGroup.effective_noise_multiplier`).
2. **Adjacency.** Poisson ↔ add-or-remove; fixed-size and shuffled batches ↔ replace-one,
   where the sensitivity of every release doubles, so σ is halved (Ponomareva et al. 2023, §2.1.1,
   footnote 7; replace = remove + add, so Δ_replace ≤ 2Δ by the triangle inequality).
3. **Participation.** Poisson and fixed-size steps are amplified by sampling; so are user-level
   steps: ULS as a Poisson-subsampled Gaussian at the user rate, ELS as a mixture of Gaussians
   with Binomial(k, q) weights (:mod:`dpfy.privacy.mixture`; without amplification, the
   Gaussian at σ/k). Shuffled steps are not (no amplification is claimed for shuffling, the
   guide's §4.3 and Table 3): each example is in at most one batch per epoch, so only the
   worst-case number of participations is charged, at the smallest σ's (see
   :class:`~dpfy.privacy.ledger.Sampling`). Unsampled steps are all charged. Correlated noise
   (DP-FTRL's tree, BandMF) is reduced to independent Gaussians by
   :mod:`dpfy.privacy.correlated` (per tree; per cyclic-Poisson participation).
4. **Order does not matter.** Composition of the privacy-loss distributions (and the sum of RDP
   curves) is commutative, so identical atoms anywhere in the run merge, and all unsampled
   Gaussian atoms merge into one Gaussian with σ = (Σ_k c_k/σ_k²)^(−1/2), exactly.
5. **Optional coarsening** (:func:`coarsen`): σ of sampled atoms is rounded *down* to a geometric
   grid σ_k = (1 + r)^k. A smaller σ can only cost more privacy (the subsampled Gaussian's
   privacy curve is monotone in σ), so ε computed on the coarsened form is an upper bound on
   the exact ε; with r = 0.01 at most 1 % less noise is charged per step.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

from dpfy._require import require
from dpfy.privacy._dp_accounting import dp_accounting
from dpfy.privacy.correlated import correlated_release, cyclic_charges, tree_charges
from dpfy.privacy.ledger import Ledger, Sampling, StepGroup
from dpfy.privacy.mixture import els_dp_event

__all__ = [
    "POISSON",
    "WITHOUT_REPLACEMENT",
    "GAUSSIAN",
    "MIXTURE",
    "Atom",
    "CanonicalForm",
    "canonical_form",
    "accounted_dp_event",
    "coarsen",
    "shuffle_participations",
    "pass_length",
    "independent_runs",
]

POISSON = "poisson"
WITHOUT_REPLACEMENT = "without_replacement"
GAUSSIAN = "gaussian"
MIXTURE = "mixture"  # one ELS step at the user level (dpfy.privacy.mixture)


@dataclass(frozen=True)
class Atom:
    """``count`` compositions of one Gaussian mechanism, subsampled or not.

    Args:
      kind: ``"poisson"`` (Poisson-subsampled Gaussian, add/remove), ``"without_replacement"``
        (fixed-size batch without replacement, replace-one) or ``"gaussian"`` (no sampling).
      sample_rate: q (1.0 for ``"gaussian"``).
      noise_multiplier: σ relative to the sensitivity under the ledger's adjacency (already
        halved for replace-one).
      count: number of compositions.
      dataset_size: N, only for ``"without_replacement"``.
      max_examples_per_user: k, only for ``"mixture"`` (an ELS step: Gaussians with
        sensitivities 0..k, weights Binomial(k, q)).
    """

    kind: str
    sample_rate: float
    noise_multiplier: float
    count: int
    dataset_size: int | None = None
    max_examples_per_user: int | None = None

    @property
    def key(self) -> tuple:
        return (
            self.kind,
            self.sample_rate,
            self.noise_multiplier,
            self.dataset_size,
            self.max_examples_per_user,
        )

    def step_event(self) -> dp_accounting.DpEvent:
        """The dp_accounting event of one composition of this atom."""
        gauss = dp_accounting.GaussianDpEvent(self.noise_multiplier)
        if self.kind == MIXTURE:
            k = self.max_examples_per_user
            assert k is not None  # a mixture atom is built from an ELS group, which records k
            return els_dp_event(self.sample_rate, self.noise_multiplier, int(k))
        if self.kind == POISSON:
            return dp_accounting.PoissonSampledDpEvent(self.sample_rate, gauss)
        if self.kind == WITHOUT_REPLACEMENT:
            n = int(self.dataset_size)  # type: ignore[arg-type]
            return dp_accounting.SampledWithoutReplacementDpEvent(
                n, max(1, round(self.sample_rate * n)), gauss
            )
        return gauss

    def dp_event(self) -> dp_accounting.DpEvent:
        step = self.step_event()
        return step if self.count == 1 else dp_accounting.SelfComposedDpEvent(step, self.count)


@dataclass(frozen=True)
class CanonicalForm:
    """A ledger reduced to atoms (see the module docstring).

    Attributes:
      adjacency: ``"add_or_remove"`` or ``"replace_one"``.
      atoms: merged atoms; at most one ``"gaussian"`` atom.
      non_private: True if any release had no noise (ε = ∞).
      resolution: the coarsening grid ratio r if σ's were rounded down, else None.
    """

    adjacency: str
    atoms: tuple[Atom, ...]
    non_private: bool = False
    resolution: float | None = None

    @property
    def is_empty(self) -> bool:
        return not self.atoms and not self.non_private

    def dp_event(self) -> dp_accounting.DpEvent:
        if self.non_private:
            return dp_accounting.NonPrivateDpEvent()
        if not self.atoms:
            return dp_accounting.NoOpDpEvent()
        events = [a.dp_event() for a in self.atoms]
        return events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)


def shuffle_participations(runs: Iterable[tuple[float, int]]) -> int:
    """Worst-case participations of one example in consecutive shuffled runs.

    Each run is (q, c): c steps with batch fraction q = b/N. An epoch has at least
    L = floor(1/q) steps (``drop_last=True`` gives floor(N/b), otherwise ceil(N/b)), and an
    example is in at most one batch per epoch, so a run starting at an epoch boundary has at
    most ceil(c / L) participations. A run that starts mid-epoch can add one more, hence
    ``+ (runs − 1)``. The ledger starts at step 0, which is an epoch boundary.
    """
    total, n_runs = 0, 0
    for q, c in runs:
        total += -(-c // pass_length(q))
        n_runs += 1
    return total + max(0, n_runs - 1)


def pass_length(sample_rate: float) -> int:
    """L = ⌊1/q⌋, the fewest steps a shuffled pass at batch fraction q has
    (:func:`shuffle_participations`)."""
    return max(1, math.floor(1 / sample_rate + 1e-9))


def independent_runs(forms: Sequence[CanonicalForm]) -> CanonicalForm:
    """The composition of runs that each start afresh, as a grid's configurations do (each
    with its own sampler from the first step of a pass, its own tree): every run's form as its
    own ledger gives it, all composed. One ledger of their steps end to end cannot say this: it
    would read a shuffled run that ends mid-pass as continued by the next run's first steps,
    and charge fewer participations than the runs make."""
    require(len(forms) >= 1, "forms", len(forms), "at least one run's form")
    adjacency = {f.adjacency for f in forms if not f.is_empty} or {forms[0].adjacency}
    require(
        len(adjacency) == 1,
        "runs",
        sorted(adjacency),
        "of one adjacency (add-or-remove or replace-one)",
        "A grid's runs are sampled the same way",
    )
    return CanonicalForm(
        adjacency.pop(),
        _merge(a for f in forms for a in f.atoms),
        any(f.non_private for f in forms),
    )


def _merge(atoms: Iterable[Atom]) -> tuple[Atom, ...]:
    counts: dict[tuple, int] = defaultdict(int)
    first: dict[tuple, Atom] = {}
    gauss_inv_var = 0.0
    for a in atoms:
        if a.kind == GAUSSIAN:
            gauss_inv_var += a.count / a.noise_multiplier**2
            continue
        counts[a.key] += a.count
        first.setdefault(a.key, a)
    out = [replace(first[k], count=c) for k, c in counts.items()]
    out.sort(key=lambda a: (a.kind, a.sample_rate, a.noise_multiplier))
    if gauss_inv_var > 0:
        out.append(Atom(GAUSSIAN, 1.0, gauss_inv_var**-0.5, 1))
    return tuple(out)


def _shuffle_atoms(groups: list[StepGroup], factor: float) -> list[Atom]:
    """Charge the worst-case participations of the shuffled groups at their smallest σ's."""
    runs: list[list] = []
    for g in groups:
        if runs and runs[-1][0] == g.sample_rate and runs[-1][2] == g.first_step:
            runs[-1][1] += g.count
            runs[-1][2] = g.last_step + 1
        else:
            runs.append([g.sample_rate, g.count, g.last_step + 1])
    left = shuffle_participations((q, c) for q, c, _ in runs)
    out = []
    for g in sorted(groups, key=lambda g: g.effective_noise_multiplier()):
        if left <= 0:
            break
        n = min(left, g.count)
        out.append(Atom(GAUSSIAN, 1.0, g.effective_noise_multiplier() * factor, n))
        left -= n
    return out


def canonical_form(ledger: Ledger, *, amplify: bool = True) -> CanonicalForm:
    """Reduce ``ledger`` to atoms (exact; see the module docstring).

    Args:
      ledger: the run's ledger.
      amplify: False charges every Poisson and fixed-size step as an unsampled release (the
        guarantee "without amplification" that the guide asks reports to show when the sampling
        assumption may not have held).
    """
    if not ledger.step_groups:
        return CanonicalForm("add_or_remove", ())
    adjacency = ledger.adjacency()
    factor = 0.5 if adjacency == "replace_one" else 1.0
    atoms: list[Atom] = []
    shuffled: list[StepGroup] = []
    correlated: dict[str, list[StepGroup]] = {"tree": [], "bandmf": []}
    non_private = False
    for g in ledger.step_groups:
        sigma = g.effective_noise_multiplier()
        if sigma == 0:
            non_private = True
            continue
        release = correlated_release(g)
        if release is not None:
            correlated[release.noise].append(g)
            continue
        sampled = amplify and g.sample_rate < 1
        if g.sampling is Sampling.SHUFFLE:
            shuffled.append(g)
        elif g.sampling in (Sampling.POISSON, Sampling.ULS) and sampled:
            atoms.append(Atom(POISSON, g.sample_rate, sigma * factor, g.count))
        elif g.sampling is Sampling.ELS:
            assert g.max_examples_per_user is not None  # StepGroup refuses ELS steps without it
            k = int(g.max_examples_per_user)
            atoms.append(
                Atom(MIXTURE, g.sample_rate, sigma * factor, g.count, max_examples_per_user=k)
                if sampled
                else Atom(GAUSSIAN, 1.0, sigma * factor / k, g.count)
            )
        elif g.sampling is Sampling.FIXED_SIZE and sampled:
            require(
                ledger.dataset_size is not None,
                "dataset_size",
                ledger.dataset_size,
                "set for fixed-size sampling",
                "Pass Ledger(dataset_size=N): the batch size is q·N",
            )
            atoms.append(
                Atom(
                    WITHOUT_REPLACEMENT, g.sample_rate, sigma * factor, g.count, ledger.dataset_size
                )
            )
        else:
            atoms.append(Atom(GAUSSIAN, 1.0, sigma * factor, g.count))
    if shuffled:
        atoms.extend(_shuffle_atoms(shuffled, factor))
    charges = (tree_charges(correlated["tree"]) if correlated["tree"] else []) + (
        cyclic_charges(correlated["bandmf"]) if correlated["bandmf"] else []
    )
    for c in charges:  # correlated noise as independent Gaussians (privacy.correlated)
        sampled = amplify and c.sampled and c.sample_rate < 1
        atoms.append(
            Atom(POISSON, c.sample_rate, c.noise_multiplier * factor, c.count)
            if sampled
            else Atom(GAUSSIAN, 1.0, c.noise_multiplier * factor, c.count)
        )
    return CanonicalForm(adjacency, _merge(atoms), non_private)


def accounted_dp_event(ledger: Ledger) -> dp_accounting.DpEvent:
    """The dp_accounting event the accountants compose for ``ledger``.

    Releases of a step collapsed into one Gaussian; under replace-one adjacency every σ is
    halved (sensitivity 2Δ) and fixed-size steps are ``SampledWithoutReplacementDpEvent``s
    whose inner σ is relative to that doubled sensitivity, as dp_accounting's RDP accountant
    expects; shuffled steps are charged as unsampled Gaussians, once per epoch. The faithful
    record, every release its own event, is :meth:`Ledger.dp_event`.
    """
    return canonical_form(ledger).dp_event()


def _round_down(sigma: float, resolution: float) -> float:
    step = math.log1p(resolution)
    k = math.floor(math.log(sigma) / step)
    value = math.exp(k * step)
    while value > sigma:  # guard against rounding in exp/log
        k -= 1
        value = math.exp(k * step)
    return value


def coarsen(form: CanonicalForm, resolution: float) -> CanonicalForm:
    """Round σ of every sampled atom down to the grid (1 + r)^k; ε can only grow.

    Args:
      form: an exact canonical form.
      resolution: r > 0, the relative grid spacing; each σ loses less than a factor 1/(1 + r).
    """
    require(
        0 < resolution < 1,
        "sigma_resolution",
        resolution,
        "in (0, 1)",
        "Use e.g. 0.01 (σ rounded down by at most 1 %)",
    )
    atoms = [
        a
        if a.kind == GAUSSIAN
        else replace(a, noise_multiplier=_round_down(a.noise_multiplier, resolution))
        for a in form.atoms
    ]
    return replace(form, atoms=_merge(atoms), resolution=resolution)
