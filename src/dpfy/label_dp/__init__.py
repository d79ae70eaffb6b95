"""Label differential privacy: protect each training label, treat the features as public.

- :mod:`~dpfy.label_dp.mechanism`: randomized response over k classes, RR with a prior.
- :mod:`~dpfy.label_dp.training`: the staged RR-with-prior of Ghazi et al. 2021 and a plain
  trainer for the randomized labels.
- :mod:`~dpfy.label_dp.ledger`: the exact pure ε-label-DP record and its report text.

See docs/label_dp.md. ``dpfy train --privacy-unit label --label-dp rr|rr-prior`` runs it.
"""

from dpfy.label_dp.ledger import (
    FEATURES_NOT_PROTECTED,
    RELATION,
    LabelLedger,
    LabelRelease,
    PureLabelDpEvent,
)
from dpfy.label_dp.mechanism import (
    best_top_k,
    keep_probability,
    randomized_response,
    rr_with_prior,
)
from dpfy.label_dp.training import fit_classifier, randomize_labels

__all__ = [
    "FEATURES_NOT_PROTECTED",
    "RELATION",
    "LabelLedger",
    "LabelRelease",
    "PureLabelDpEvent",
    "best_top_k",
    "keep_probability",
    "randomized_response",
    "rr_with_prior",
    "fit_classifier",
    "randomize_labels",
]
