"""What a privacy report holds (:class:`ReportFields`, the base of
:class:`dpfy.privacy.report.PrivacyReport`) and what follows from those values alone: the
headline statement, the ε tier and the δ convention. Building it from a ledger and writing it
out are :mod:`dpfy.privacy.report`'s; the Markdown is :mod:`dpfy.privacy.report_markdown`'s."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from dpfy.privacy.accountants import APPROXIMATE
from dpfy.privacy.report_text import ADJACENCY_TEXT, USER_ADJACENCY_TEXT, tier
from dpfy.privacy.section import ReportSection
from dpfy.privacy.statement import stated_delta, stated_epsilon

__all__ = ["TuningCost", "MechanismShare", "ReportFields"]


@dataclass(frozen=True)
class TuningCost:
    """The privacy cost of the hyperparameter search that chose this run's settings.

    Args:
      method: how tuning was accounted, e.g. "Papernot-Steinke, Poisson K, mean 100".
      epsilon: ε of tuning *including* the released run, at ``delta``.
      delta: δ of that statement.
      details: anything a reviewer needs (the search space, adaptive or not, ...).
    """

    method: str
    epsilon: float
    delta: float
    details: str = ""


@dataclass(frozen=True)
class MechanismShare:
    """One mechanism of the ledger.

    Attributes:
      mechanism: its name in the ledger (``"gradient"``, ``"quantile_count"``, ...).
      steps: steps in which it was released.
      epsilon_alone: ε(δ) of this mechanism's releases alone.
      noise_share: its share of Σ_t Σ_i σ_{t,i}⁻², the budget that releases made on one batch
        split exactly (ν⁻² = Σ ν_i⁻²); 1.0 when it is the only mechanism.
    """

    mechanism: str
    steps: int
    epsilon_alone: float
    noise_share: float


@dataclass(frozen=True)
class ReportFields:
    """The values of one run's privacy statement (see :class:`~dpfy.privacy.report.PrivacyReport`,
    which adds building it from a ledger and writing it)."""

    """A privacy statement for one run, built by :meth:`from_ledger`."""

    epsilon: float
    delta: float
    accountant: str
    steps: int
    dataset_size: int | None
    adjacency: str
    samplings: tuple[str, ...]
    sample_rates: tuple[float, float]
    noise_multipliers: tuple[float, float]
    epsilons: Mapping[str, float | None]  # None: that accountant refused (PLD floor)
    epsilon_without_amplification: float
    coarsened: float | None
    curve: tuple[tuple[int, float], ...]
    mechanisms: tuple[MechanismShare, ...]
    released: str
    unit_of_privacy: str
    protects: str
    dp_setting: str
    data_accesses: str
    tuning: TuningCost | None = None
    group_size: int | None = None
    group_statement: tuple[float, float] | None = None
    layer_table: tuple[Mapping[str, Any], ...] = ()
    model_description: str | None = None
    sampling_note: str | None = None
    versions: Mapping[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    not_released: str | None = None
    methods: tuple[Mapping[str, str], ...] = ()
    public_data: str | None = None
    sections: tuple[ReportSection, ...] = ()
    unit: str = "example"  # the ledger's unit of privacy: "example" or "user"
    noise_mechanisms: tuple[Mapping[str, Any], ...] = ()  # correlated noise only
    left_out: Mapping[str, str] = field(default_factory=dict)  # accountant -> why it does not apply

    @property
    def approximate(self) -> bool:
        return self.accountant in APPROXIMATE

    @property
    def tier(self) -> int:
        worst = max(self.epsilon, self.tuning.epsilon if self.tuning else 0.0)
        return tier(worst)

    def delta_convention(self) -> dict[str, Any]:
        """The guide's δ ≪ 1/N convention, checked against N."""
        if not self.dataset_size:
            return {
                "dataset_size": None,
                "ok": None,
                "note": "N unknown: cannot check δ ≪ 1/N (set dataset_size)",
            }
        n = self.dataset_size
        ok = self.delta <= n**-1.1
        if self.unit == "user":  # the units are users: δ is judged against 1/U
            note = (
                f"δ = {self.delta:.3g} {'≤' if ok else '>'} 1/U^1.1 = {n**-1.1:.3g}, U = "
                f"{n} users"
                + (
                    ""
                    if ok
                    else f": the guide recommends δ ≪ 1/U = {1 / n:.3g}"
                    f"; with δ ≥ 1/U the guarantee can allow revealing one "
                    f"user's data"
                )
            )
        else:
            note = (
                f"δ = {self.delta:.3g} ≤ 1/N^1.1 = {n**-1.1:.3g} (the guide's recommendation)"
                if ok
                else f"δ = {self.delta:.3g} > 1/N^1.1 = {n**-1.1:.3g}: the guide recommends δ ≪ "
                f"1/N = {1 / n:.3g}; with δ ≥ 1/N the guarantee can allow revealing one record"
            )
        return {
            "dataset_size": n,
            "one_over_n": 1 / n,
            "recommended": n**-1.1,
            "ok": ok,
            "note": note,
        }

    def statement(self) -> str:
        """One sentence a reviewer can quote."""
        approx = " (GDP CLT approximation, not a guarantee)" if self.approximate else ""
        return (
            f"Training satisfies ({stated_epsilon(self.epsilon)}, {stated_delta(self.delta)})"
            "-differential privacy"
            f"{approx} for {self.unit_of_privacy} under {self.adjacency.replace('_', '-')} "
            f"adjacency, over {self.steps} steps, by the {self.accountant.upper()} "
            f"accountant."
        )

    def _adjacency_text(self) -> str:
        """The neighbouring relation in words (one user's examples for a user-level run)."""
        return USER_ADJACENCY_TEXT if self.unit == "user" else ADJACENCY_TEXT[self.adjacency]

    def _methods_lines(self) -> list[str]:
        """Section 2's list of the adaptive methods that ran (none: plain DP-SGD)."""
        if not self.methods:
            return []
        lines = [
            "- **Adaptive methods** (in the order they ran in each step; each release is a "
            "row of the mechanisms table, section 5):"
        ]
        for r in self.methods:
            releases = r.get("releases") or "not stated by the method"
            lines.append(f"  - `{r['name']}` — releases per step: {releases.rstrip('.')}.")
        return lines
