"""HyFreeDP warns when the expected batch is too small for its loss probes to see anything: each
probe's noise on the batch's mean loss has std σ_l·R_l/b (Bu & Liu 2025, Algorithm 1: clip at
R_l, add N(0, (σ_l R_l)²), divide by b)."""

import warnings

import pytest

from dpfy.adaptive.hyfree import PROBE_NOISE_WARNING, HyFreeDP
from dpfy.types import RunFacts, Sampling


def _calibrated(batch: int, n: int = 1438):
    facts = RunFacts(sampling=Sampling.POISSON, sample_rate=batch / n, steps=200,
                     dataset_size=n, delta=1e-5, target_epsilon=3.0, accountant="rdp",
                     inner_hyperparameters={"lr": 1e-4})
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        method = HyFreeDP().calibrate(facts)
    return method, [str(w.message) for w in seen if "hyfree" in str(w.message)]


def test_a_small_batch_is_warned_with_the_batch_to_use():
    method, seen = _calibrated(16)
    assert method.loss_noise / 16 > PROBE_NOISE_WARNING          # the condition, from σ_l
    assert len(seen) == 1 and "--batch-size" in seen[0] and "b = 16" in seen[0]


def test_a_large_batch_is_not():
    method, seen = _calibrated(1024)
    assert method.loss_noise / 1024 <= PROBE_NOISE_WARNING and seen == []
