"""Label-DP training: randomize the labels once (RR, or RR with a prior in stages), then train.

Ghazi et al. 2021's multi-stage RR with a prior: the training set is split into disjoint
stages. Stage 1's labels get plain RR (no prior: a uniform prior makes RR-with-prior plain
RR). Before stage t, a model is trained on the features and *randomized* labels of stages
1..t−1 only; its predicted class probabilities on stage t's (public) features are stage t's
prior. No true label of stage t is read before its own randomization, and every label is
randomized exactly once, so the whole release is ε-label-DP by parallel composition. The final
model is trained on all randomized labels (post-processing).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn

from dpfy._require import require
from dpfy.label_dp.ledger import LabelRelease
from dpfy.label_dp.mechanism import randomized_response, rr_with_prior

__all__ = ["randomize_labels", "fit_classifier", "FitPredict"]

# fit on (indices, their randomized labels), return class probabilities on the query indices
FitPredict = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _stage_sizes(n: int, fractions: Sequence[float]) -> list[int]:
    require(
        len(fractions) >= 1 and all(f > 0 for f in fractions) and abs(sum(fractions) - 1) < 1e-9,
        "stage_fractions",
        list(fractions),
        "positive fractions summing to 1",
        "E.g. [0.4, 0.6] for two stages",
    )
    sizes = [int(round(f * n)) for f in fractions[:-1]]
    sizes.append(n - sum(sizes))
    require(
        min(sizes) >= 1,
        "stage_fractions",
        list(fractions),
        f"fractions that give every stage at least one of the {n} labels",
        "Use fewer stages",
    )
    return sizes


def randomize_labels(
    labels: torch.Tensor,
    epsilon: float,
    num_classes: int,
    *,
    mechanism: str,
    generator: torch.Generator | None,
    fit_predict: FitPredict | None = None,
    stage_fractions: Sequence[float] = (0.5, 0.5),
) -> tuple[torch.Tensor, LabelRelease]:
    """The randomized labels (same order as ``labels``) and the release to record.

    ``mechanism="rr"``: one pass of k-ary RR. ``"rr-prior"``: the staged mechanism above;
    ``fit_predict(train_idx, train_noisy_labels, query_idx)`` trains on the given examples'
    randomized labels and returns class probabilities for ``query_idx`` (it sees features
    by index; it must not read ``labels``). ``generator=None`` (the secure default) draws the
    labels' randomness from the OS; the stage split, which does not depend on labels, then
    comes from torch's global generator.
    """
    require(
        mechanism in ("rr", "rr-prior"),
        "label_dp",
        mechanism,
        "'rr' or 'rr-prior'",
        "Pass --label-dp rr or --label-dp rr-prior",
    )
    n = labels.shape[0]
    if mechanism == "rr":
        noisy = randomized_response(labels, epsilon, num_classes, generator=generator)
        return noisy, LabelRelease("rr", float(epsilon), num_classes, n, 1)
    require(
        fit_predict is not None,
        "fit_predict",
        fit_predict,
        "a function for rr-prior",
        "Pass fit_predict(train_idx, noisy_labels, query_idx) -> probabilities",
    )
    assert fit_predict is not None
    sizes = _stage_sizes(n, stage_fractions)
    order = torch.randperm(n, generator=generator)
    noisy = torch.empty(n, dtype=torch.long)
    start = 0
    for t, size in enumerate(sizes):
        idx = order[start : start + size]
        if t == 0:
            noisy[idx] = randomized_response(labels[idx], epsilon, num_classes, generator=generator)
        else:
            seen = order[:start]
            with torch.no_grad():
                prior = fit_predict(seen, noisy[seen].clone(), idx)
            noisy[idx] = rr_with_prior(labels[idx], prior, epsilon, generator=generator)
        start += size
    return noisy, LabelRelease("rr-prior", float(epsilon), num_classes, n, len(sizes))


def fit_classifier(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    generator: torch.Generator,
) -> nn.Module:
    """Plain (non-private) minibatch Adam on cross-entropy: labels are already private."""
    require(epochs >= 1, "epochs", epochs, ">= 1")
    require(batch_size >= 1, "batch_size", batch_size, ">= 1")
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    for _ in range(epochs):
        perm = torch.randperm(x.shape[0], generator=generator)
        for i in range(0, x.shape[0], batch_size):
            b = perm[i : i + batch_size]
            opt.zero_grad()
            loss_fn(model(x[b]), y[b]).backward()
            opt.step()
    model.eval()
    return model
