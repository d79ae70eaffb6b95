"""The record of a label-DP run: each randomized-response release with its ε and relation.

A label-DP guarantee is not about the same neighbouring relation as DP-SGD's ledger
(:class:`dpfy.privacy.ledger.Ledger`: add/remove or replace one *example*, features and
label). Here two datasets are neighbours when one example's **label** differs and the
features are identical and public (``RELATION``). The two kinds of guarantee do not compose
into one number, so a label-DP release is recorded in its own :class:`LabelLedger` and never
mixed into a gradient ledger.

Accounting is exact and pure (δ = 0): each release randomizes every label of its ``parts``
disjoint parts exactly once at ε, so by parallel composition the release costs ε; releases
recorded one after another compose by summing ε (basic composition is tight for pure DP of
arbitrary mechanisms). Plain RR is also handed to dp_accounting as its
``RandomizedResponseDpEvent`` (replace-one relation) to cross-check; RR with a prior, whose
k' differs per example, is the frozen :class:`PureLabelDpEvent`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import dp_accounting

from dpfy._require import require
from dpfy.privacy.statement import stated_epsilon

__all__ = [
    "RELATION",
    "MECHANISMS",
    "PureLabelDpEvent",
    "LabelRelease",
    "LabelLedger",
    "FEATURES_NOT_PROTECTED",
]

RELATION = "replace_one_label"  # neighbours: one example's label differs; features public
MECHANISMS = ("rr", "rr-prior")
FEATURES_NOT_PROTECTED = (
    "This is a label-DP guarantee: it protects each training example's label only. The "
    "features (the inputs, e.g. the images) are treated as public and are NOT protected; "
    "the model may memorize and reveal them. Use example-level DP (dpfy train without "
    "--privacy-unit label) where the features are private too"
)


@dataclass(frozen=True)
class PureLabelDpEvent(dp_accounting.DpEvent):
    """A pure ε-DP release of each label (δ = 0) under the replace-one-label relation.

    dp_accounting has no pure-ε event besides Laplace and randomized response over a fixed
    bucket count; RR with a prior uses a per-example bucket count, so it is this event.
    dp_accounting's accountants do not read it: :meth:`LabelLedger.epsilon` does.
    """

    epsilon: float


@dataclass(frozen=True)
class LabelRelease:
    """One randomization of labels: ``num_labels`` labels in ``parts`` disjoint parts, each once.

    Args:
      mechanism: ``"rr"`` or ``"rr-prior"``.
      epsilon: the ε each label's randomization satisfies.
      num_classes: k.
      num_labels: how many labels were randomized.
      parts: the disjoint stages (1 for plain RR); parallel composition, so the cost is ε.
    """

    mechanism: str
    epsilon: float
    num_classes: int
    num_labels: int
    parts: int = 1

    def __post_init__(self) -> None:
        require(self.mechanism in MECHANISMS, "mechanism", self.mechanism, f"one of {MECHANISMS}")
        require(0 < self.epsilon < math.inf, "epsilon", self.epsilon, "> 0 and finite", "Pass ε")
        require(self.num_classes >= 2, "num_classes", self.num_classes, ">= 2")
        require(self.num_labels >= 1, "num_labels", self.num_labels, ">= 1")
        require(
            1 <= self.parts <= self.num_labels,
            "parts",
            self.parts,
            f"in [1, num_labels = {self.num_labels}]",
            "Each stage holds at least one label",
        )

    def dp_event(self) -> dp_accounting.DpEvent:
        """Plain RR: dp_accounting's RR event (p = k/(e^ε+k−1)); RR with a prior: pure ε."""
        if self.mechanism == "rr":
            k = self.num_classes
            return dp_accounting.RandomizedResponseDpEvent(k / (math.exp(self.epsilon) + k - 1), k)
        return PureLabelDpEvent(self.epsilon)


@dataclass
class LabelLedger:
    """Every label randomization of a run; ε is their sum (each is parallel inside)."""

    releases: list[LabelRelease] = field(default_factory=list)
    relation: str = RELATION

    def record(self, release: LabelRelease) -> None:
        self.releases.append(release)

    def epsilon(self) -> float:
        """The run's pure ε-label-DP (δ = 0): the sum of its releases' ε."""
        return math.fsum(r.epsilon for r in self.releases)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "dpfy-label-ledger/1",
            "relation": self.relation,
            "features_protected": False,
            "epsilon": self.epsilon(),
            "delta": 0.0,
            "releases": [vars(r) for r in self.releases],
        }

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LabelLedger":
        require(
            isinstance(d, dict) and d.get("format") == "dpfy-label-ledger/1",
            "label ledger format",
            d.get("format") if isinstance(d, dict) else d,
            "'dpfy-label-ledger/1'",
            "Pass the label_ledger.json written by dpfy train --privacy-unit label",
        )
        require(d.get("relation") == RELATION, "relation", d.get("relation"), f"'{RELATION}'")
        return cls([LabelRelease(**r) for r in d["releases"]])

    def report(self) -> str:
        """The privacy statement in words (markdown), features-not-protected included."""
        lines = [
            "## Privacy guarantee (label DP)",
            "",
            f"- Guarantee: pure ε-label-DP with ε = {stated_epsilon(self.epsilon())}, δ = 0 "
            "(exact, not a bound from an accountant's approximation).",
            "- Neighbouring relation: two training sets that differ in the label of one "
            "example (replace one label); the features are identical and public.",
            f"- {FEATURES_NOT_PROTECTED}.",
        ]
        for r in self.releases:
            how = (
                "randomized response over all classes"
                if r.mechanism == "rr"
                else f"randomized response with a prior in {r.parts} stages (Ghazi et al. "
                "2021), each stage's prior from a model trained on the earlier stages' "
                "randomized labels"
            )
            lines.append(
                f"- Release: {r.num_labels} labels over {r.num_classes} classes, {how}; each "
                f"label randomized once at ε = {stated_epsilon(r.epsilon)}."
            )
        lines.append(
            "- Training on the randomized labels is post-processing: it reads no true label."
        )
        return "\n".join(lines) + "\n"
