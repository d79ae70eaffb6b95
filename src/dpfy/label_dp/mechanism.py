"""Randomized response on labels (label DP): plain RR over k classes, and RR with a prior.

Label DP (Chaudhuri & Hsu 2011; the guide's Definition 5): two training sets are neighbours
when they differ in the *label* of one example; the features are public and not protected.
A mechanism that replaces each label y by a random label ỹ with

    P(ỹ = o | y) <= e^ε · P(ỹ = o | y')   for all o, y, y'

is ε-label-DP (pure, δ = 0) for one release of that label, and any training on
(features, ỹ) is post-processing.

- :func:`randomized_response`: keep the true label with probability e^ε/(e^ε + k − 1), else
  output one of the k − 1 other labels uniformly. The likelihood ratio of any output between
  two labels is at most e^ε and equals it exactly (the output equals one of the two labels).
- :func:`rr_with_prior` (Ghazi et al. 2021, "Deep learning with label differential
  privacy"): given a prior p over the k classes for each example (computed *without* that
  example's label: from public features and a model trained on other examples' randomized
  labels), restrict RR to the k' most likely classes, k' chosen to maximize the probability
  of outputting the true label, e^ε/(e^ε + k' − 1) · Σ_{top k'} p. A true label outside the
  top k' yields a uniform draw from them. Every output probability is one of
  e^ε/(e^ε+k'−1), 1/(e^ε+k'−1), 1/k' or 0 (for all y alike), so the ratio is at most e^ε.
"""

from __future__ import annotations

import math

import torch

from dpfy._require import require
from dpfy.noise.generator import secure_uniform

__all__ = ["keep_probability", "randomized_response", "rr_with_prior", "best_top_k"]


def _check_epsilon(epsilon: float) -> None:
    require(
        isinstance(epsilon, (int, float)) and 0 < epsilon < math.inf,
        "epsilon",
        epsilon,
        "> 0 and finite",
        "Pass the label-DP budget ε (ε = ∞ would keep every label: drop --privacy-unit label)",
    )


def keep_probability(epsilon: float, num_classes: int) -> float:
    """P(ỹ = y) of k-ary randomized response at ε: e^ε / (e^ε + k − 1)."""
    _check_epsilon(epsilon)
    require(num_classes >= 2, "num_classes", num_classes, ">= 2", "Label DP needs two labels")
    # 1 / (1 + (k − 1)e^{−ε}): the same value without overflowing e^ε at ε > 709
    return 1.0 / (1.0 + (num_classes - 1) * math.exp(-epsilon))


def _check_labels(labels: torch.Tensor, num_classes: int) -> None:
    require(
        labels.dtype in (torch.int64, torch.int32, torch.uint8) and labels.dim() == 1,
        "labels",
        f"{labels.dtype} of shape {tuple(labels.shape)}",
        "a 1-D integer tensor",
        "Pass class indices, not one-hot rows",
    )
    if labels.numel():
        lo, hi = int(labels.min()), int(labels.max())
        require(
            lo >= 0 and hi < num_classes,
            "labels",
            f"values in [{lo}, {hi}]",
            f"in [0, {num_classes - 1}] (num_classes = {num_classes})",
            "Pass the dataset's number of classes",
        )


def _uniforms(shape: torch.Size, generator: torch.Generator | None) -> torch.Tensor:
    """Float64 uniforms in [0, 1): from ``generator`` when given (a seeded, reproducible run
    whose seed is a secret), else from the operating system's entropy through ChaCha20
    (:func:`dpfy.noise.generator.secure_uniform`), the secure default like the gradient noise."""
    if generator is None:
        return secure_uniform(math.prod(shape)).reshape(shape)
    return torch.rand(shape, generator=generator, dtype=torch.float64)


def randomized_response(
    labels: torch.Tensor, epsilon: float, num_classes: int, *, generator: torch.Generator | None
) -> torch.Tensor:
    """Each label kept with probability e^ε/(e^ε+k−1), else a uniform *other* label.

    ``generator=None`` draws the randomness from the OS (secure); a generator makes it
    reproducible, and anyone who knows its seed can undo the randomization.
    """
    keep = keep_probability(epsilon, num_classes)
    _check_labels(labels, num_classes)
    y = labels.long()
    u = _uniforms(y.shape, generator)
    # a uniform other label: y + 1 + U{0..k−2} (mod k), U from a second uniform
    v = _uniforms(y.shape, generator)
    shift = (v * (num_classes - 1)).floor().long().clamp(max=num_classes - 2) + 1
    return torch.where(u < keep, y, (y + shift) % num_classes)


def best_top_k(prior: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Ghazi et al.'s k' per row: argmax_{k'} e^ε/(e^ε+k'−1) · (sum of the k' largest priors)."""
    _check_epsilon(epsilon)
    k = prior.shape[1]
    sorted_p = prior.double().sort(dim=1, descending=True).values
    mass = sorted_p.cumsum(dim=1)
    ks = torch.arange(1, k + 1, dtype=torch.float64)
    keep = 1.0 / (1.0 + (ks - 1) * math.exp(-epsilon))  # e^ε/(e^ε+k'−1), overflow-free
    return (mass * keep).argmax(dim=1) + 1


def rr_with_prior(
    labels: torch.Tensor,
    prior: torch.Tensor,
    epsilon: float,
    *,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """RR restricted to each example's top-k' classes of ``prior`` (rows: n × k, sum 1).

    The prior of an example must not depend on its own label (else the guarantee fails):
    :func:`dpfy.label_dp.training.staged_label_dp` computes it from a model trained on the
    earlier stages' randomized labels only.
    """
    require(
        prior.dim() == 2 and prior.shape[0] == labels.shape[0] and prior.shape[1] >= 2,
        "prior",
        f"shape {tuple(prior.shape)}",
        f"(n, k) with n = {labels.shape[0]} rows and k >= 2 classes",
        "Pass one probability row per label",
    )
    require(
        bool(torch.isfinite(prior).all()) and bool((prior >= 0).all()),
        "prior",
        "a row with a negative or non-finite entry",
        "non-negative and finite",
        "Pass softmax probabilities",
    )
    k = prior.shape[1]
    _check_labels(labels, k)
    y = labels.long()
    kp = best_top_k(prior, epsilon)
    # ties broken by class index, so the order is a function of the prior only
    order = torch.sort(prior.double(), dim=1, descending=True, stable=True).indices
    rank_of_y = (order == y[:, None]).float().argmax(dim=1) + 1  # 1-based rank of the label
    inside = rank_of_y <= kp
    u = _uniforms(y.shape, generator)
    keep = 1.0 / (1.0 + (kp.double() - 1) * math.exp(-epsilon))
    # other label inside the top k': a uniform position among the k'−1 others
    r = _uniforms(y.shape, generator)
    other = (r * (kp - 1).double()).floor().long().clamp(max=k - 2)
    other_pos = other + (other >= rank_of_y - 1).long()  # skip the label's own position
    # label outside the top k': a uniform position among all k'
    anywhere = (r * kp.double()).floor().long().clamp(max=k - 1)
    pos = torch.where(inside, torch.where(u < keep, rank_of_y - 1, other_pos), anywhere)
    pos = torch.minimum(pos, kp - 1)
    return order.gather(1, pos[:, None]).squeeze(1)
