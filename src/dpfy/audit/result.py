"""What an audit found: the claimed ε beside the two lower bounds, for printing, JSON and the
privacy report (:class:`~dpfy.privacy.report.ReportSection`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dpfy.audit.fdp import fdp_epsilon
from dpfy.audit.stats import AuditBound, one_run_epsilon
from dpfy.privacy.report import ReportSection

__all__ = ["AuditResult", "audit_scores", "SECTION_TITLE"]

SECTION_TITLE = "Empirical privacy audit"


@dataclass(frozen=True)
class AuditResult:
    """The claimed ε of a run (from its ledger) and the audit's lower bounds on it.

    ``exceeded`` is True when a lower bound is above the claim: the run leaked more than its
    ledger says (at the audit's confidence), i.e. a privacy bug.
    """

    claimed_epsilon: float
    delta: float
    accountant: str
    one_run: AuditBound
    fdp: AuditBound
    canaries: int
    canaries_in: int
    steps: int

    @property
    def exceeded(self) -> bool:
        return max(self.one_run.epsilon, self.fdp.epsilon) > self.claimed_epsilon

    def to_dict(self) -> dict[str, Any]:
        return {"claimed_epsilon": self.claimed_epsilon, "delta": self.delta,
                "accountant": self.accountant, "canaries": self.canaries,
                "canaries_in": self.canaries_in, "steps": self.steps,
                "confidence": self.one_run.confidence,
                "lower_bound_one_run": self.one_run.epsilon,
                "lower_bound_fdp": self.fdp.epsilon, "exceeded": self.exceeded,
                "one_run": self.one_run.to_dict(), "fdp": self.fdp.to_dict()}

    def summary(self) -> str:
        """One line: claim and bounds side by side."""
        verdict = ("LOWER BOUND ABOVE THE CLAIM: the run leaks more than its ledger says"
                   if self.exceeded else "consistent with the claim")
        return (f"claimed ε = {self.claimed_epsilon:.4g} ({self.accountant.upper()}, "
                f"δ = {self.delta:.3g}); audit lower bounds at "
                f"{100 * self.one_run.confidence:g} % confidence: one-run "
                f"{self.one_run.epsilon:.4g}, f-DP {self.fdp.epsilon:.4g} "
                f"({self.canaries} canaries, {self.canaries_in} in) — {verdict}")

    def section(self) -> ReportSection:
        """The privacy report's section for this audit."""
        conf = f"{100 * self.one_run.confidence:g} %"
        lines = (
            f"This run was audited with {self.canaries} white-box gradient canaries, each in "
            f"the training set with probability ½ ({self.canaries_in} were), passed through "
            f"the same private step as every example (Steinke, Nasr & Jagielski 2023).",
            "",
            "| | ε |",
            "|---|---:|",
            f"| claimed (ledger, {self.accountant.upper()}, δ = {self.delta:.3g}) | "
            f"{self.claimed_epsilon:.4f} |",
            f"| lower bound, one-run test, {conf} | {self.one_run.epsilon:.4f} |",
            f"| lower bound, f-DP test (Mahloujifar et al. 2024), {conf} | "
            f"{self.fdp.epsilon:.4f} |",
            "",
            ("A lower bound ABOVE the claimed ε means the run leaked more than its ledger "
             "accounts: a privacy bug." if self.exceeded else
             "The lower bounds are below the claim, as they must be for a correct run. "
             "They are evidence, not a guarantee: an audit can only show a claim false."),
            "The audited run trained on the canaries too; its model is not the release.",
        )
        return ReportSection(title=SECTION_TITLE, lines=lines, data=self.to_dict())


def audit_scores(scores: np.ndarray, included: np.ndarray, *, claimed_epsilon: float,
                 delta: float, accountant: str, steps: int,
                 confidence: float = 0.95) -> AuditResult:
    """Both lower bounds from canary scores and their secret inclusion bits."""
    inc = np.asarray(included, dtype=bool)
    return AuditResult(
        claimed_epsilon=float(claimed_epsilon), delta=float(delta), accountant=accountant,
        one_run=one_run_epsilon(scores, inc, delta=delta, confidence=confidence),
        fdp=fdp_epsilon(scores, inc, delta=delta, confidence=confidence),
        canaries=int(inc.size), canaries_in=int(inc.sum()), steps=int(steps))
