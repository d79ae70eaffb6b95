"""Per-group ledgers: the individualized guarantee of each privacy group, read like any ledger.

Individualized DP-SGD (Boenisch et al. 2023; Monir, Fauzan & Ghinita
2023, §5) gives every example a budget ε_p of its group p. The run's own ledger records
the worst case over all examples (the largest rate q = max q_p, the noise relative to the largest
threshold Δ = max c_p); that bounds everyone, but it is the *largest* group's guarantee. A group's
own guarantee is the ledger of the same steps seen from one of its examples:

- its inclusion probability is the group's own rate q_p (Sample: per-group Poisson rates);
- its contribution to the gradient sum is bounded by its own threshold c_p = f_p·Δ (Scale:
  per-group clip thresholds), so the noise std σ_t·Δ on the sum is σ_t / f_p times its
  sensitivity: the group's effective noise multiplier is σ_p = σ_t / f_p
  (:func:`group_noise_multiplier`);
- every other release of the step (a method's extra release) has one sensitivity for all
  examples and is recorded unchanged.

So each group gets an ordinary :class:`~dpfy.privacy.ledger.Ledger` with (q_p, σ_t / f_p, extras),
and ε per group comes from the same accountants (PLD, RDP) as any ledger. Nothing here computes ε.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from dpfy._require import require, require_extra
from dpfy.privacy.accountants import accountant_label, epsilon, epsilon_curve
from dpfy.privacy.ledger import Ledger, Release, Sampling
from dpfy.privacy.section import ReportSection
from dpfy.privacy.statement import stated_epsilon

__all__ = ["PrivacyGroup", "GroupLedgers", "group_noise_multiplier"]


def group_noise_multiplier(noise_multiplier: float, clip_fraction: float) -> float:
    """σ_p = σ / f_p: the noise multiplier of a release relative to a group's sensitivity f_p·Δ.

    The noise std on the sum is σ·Δ; a group whose contributions are bounded by f_p·Δ sees it as
    (σ / f_p)·(f_p·Δ). The one formula the optimizer and the calibration both use.
    """
    return float(noise_multiplier) / float(clip_fraction)


@dataclass(frozen=True)
class PrivacyGroup:
    """One privacy group: its budget, its public facts in the run.

    Args:
      budget: ε_p the group's examples were promised (at the run's δ).
      sample_rate: q_p, the Poisson rate of each of its examples.
      clip_fraction: f_p = c_p / Δ in (0, 1]: its examples' contributions to the gradient sum
        are bounded by f_p times the step's sensitivity Δ (1 when every example is clipped to Δ).
      size: number of its examples (public: the assignment of budgets is not private data).
    """

    budget: float
    sample_rate: float
    clip_fraction: float
    size: int

    def __post_init__(self) -> None:
        require(
            isinstance(self.budget, (int, float)) and 0 < self.budget < math.inf,
            "budget",
            self.budget,
            "> 0 and finite",
            "Give every group a positive ε",
        )
        require(0 < self.sample_rate <= 1, "sample_rate", self.sample_rate, "in (0, 1]")
        require(
            0 < self.clip_fraction <= 1,
            "clip_fraction",
            self.clip_fraction,
            "in (0, 1]",
            "A group's threshold cannot exceed the step's sensitivity",
        )
        require(isinstance(self.size, int) and self.size >= 1, "size", self.size, ">= 1")


class GroupLedgers:
    """One :class:`Ledger` per privacy group, written step by step next to the run's ledger.

    Args:
      groups: the privacy groups, in a fixed order (index p).
      dataset_size: N, as in the run's ledger.
    """

    def __init__(self, groups: Sequence[PrivacyGroup], dataset_size: int | None = None) -> None:
        require(len(groups) >= 1, "groups", groups, "at least one PrivacyGroup")
        self.groups = tuple(groups)
        self.ledgers = [Ledger(dataset_size) for _ in self.groups]

    @property
    def clip_fractions(self) -> tuple[float, ...]:
        return tuple(g.clip_fraction for g in self.groups)

    @property
    def num_steps(self) -> int:
        return self.ledgers[0].num_steps

    def record_step(self, *, sampling: Sampling, releases: Sequence[Sequence[Release]]) -> None:
        """Record one step: ``releases[p]`` is what group p's examples see (its own σ_p)."""
        require(
            len(releases) == len(self.groups),
            "len(releases)",
            len(releases),
            f"{len(self.groups)} (one tuple of releases per group)",
        )
        for group, ledger, rs in zip(self.groups, self.ledgers, releases):
            ledger.record_step(sampling=sampling, sample_rate=group.sample_rate, releases=rs)

    def epsilons(self, *, delta: float, accountant: str) -> list[float]:
        """ε(δ) of each group's ledger, in group order (PLD or RDP decide; GDP only reads)."""
        return [epsilon(ledger, delta=delta, accountant=accountant) for ledger in self.ledgers]

    def curves(
        self, *, delta: float, accountant: str, num_points: int = 30
    ) -> list[list[tuple[int, float]]]:
        """ε over steps of each group (Monir et al. 2023, Figs. 13/14), in group order."""
        return [
            epsilon_curve(ledger, delta=delta, accountant=accountant, num_points=num_points)
            for ledger in self.ledgers
        ]

    def report_section(self, *, delta: float, accountant: str) -> ReportSection:
        """The privacy report's per-group table: budget, ε spent, δ, examples, q_p, σ_p.

        Pass it as ``PrivacyReport.from_ledger(..., sections=[...])`` or
        ``dpfy.train.report.write_report(..., sections=[...])``.
        """
        spent = self.epsilons(delta=delta, accountant=accountant)
        rows, data = [], []
        for p, (group, eps, ledger) in enumerate(zip(self.groups, spent, self.ledgers)):
            sigmas = sorted(
                {
                    r.noise_multiplier
                    for g in ledger.step_groups
                    for r in g.releases
                    if r.mechanism == "gradient"
                }
            )
            sigma = f"{sigmas[0]:.4g}" if len(sigmas) == 1 else "varies"
            rows.append(
                f"| {p} | {group.budget:g} | {stated_epsilon(eps)} | {delta:g} | {group.size} | "
                f"{group.sample_rate:.4g} | {sigma} |"
            )
            data.append({**asdict(group), "epsilon": eps, "delta": delta})
        lines = (
            f"Individualized privacy: each example is protected at its own group's budget. "
            f"Group p's examples satisfy (ε_p, δ = {delta:g})-DP, ε_p as spent below "
            f"({accountant_label(accountant)}), read from the group's own ledger: its sample "
            f"rate q_p and its effective noise multiplier σ_p (noise std over its clip "
            f"threshold). The run-level statement above is the worst case over all groups.",
            "",
            "| group | budget ε | ε spent | δ | examples | q_p | σ_p |",
            "|---|---|---|---|---|---|---|",
            *rows,
        )
        return ReportSection(
            title="Per-group privacy budgets",
            lines=lines,
            data={"accountant": accountant, "groups": data},
        )

    def plot(self, path: Any, *, delta: float, accountant: str) -> None:
        """Each group's ε over steps, with its budget dashed (Monir et al. 2023, Figs. 13/14)."""
        matplotlib = require_extra("matplotlib", feature="the per-group ε plot")
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for p, (group, curve) in enumerate(
            zip(self.groups, self.curves(delta=delta, accountant=accountant))
        ):
            (line,) = ax.plot(
                [t for t, _ in curve],
                [e for _, e in curve],
                label=f"group {p} (budget ε = {group.budget:g})",
            )
            ax.axhline(group.budget, ls="--", lw=0.8, color=line.get_color())
        ax.set_xlabel("step")
        ax.set_ylabel(f"ε at δ = {delta:g} ({accountant})")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "dpfy-group-ledgers/1",
            "groups": [asdict(g) for g in self.groups],
            "ledgers": [ledger.to_dict() for ledger in self.ledgers],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "GroupLedgers":
        require(
            d.get("format") == "dpfy-group-ledgers/1",
            "format",
            d.get("format"),
            "'dpfy-group-ledgers/1'",
            "This is not a dpfy per-group ledger",
        )
        groups = [
            PrivacyGroup(
                float(g["budget"]),
                float(g["sample_rate"]),
                float(g["clip_fraction"]),
                int(g["size"]),
            )
            for g in d["groups"]
        ]
        ledgers = [Ledger.from_dict(x) for x in d["ledgers"]]
        require(
            len(ledgers) == len(groups),
            "number of group ledgers",
            len(ledgers),
            f"{len(groups)} (one per group)",
            "The checkpoint is corrupt",
        )
        out = cls(groups, ledgers[0].dataset_size)
        out.ledgers = ledgers
        return out
