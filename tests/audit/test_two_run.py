"""The two-run Clopper–Pearson audit on a tiny model whose answer is known analytically."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn
from torch.utils.data import TensorDataset

from dpfy.audit.two_run import canary_run_score, clopper_pearson_upper, two_run_epsilon
from dpfy.privacy import Ledger, epsilon

SIGMA, RUNS, DELTA = 0.5, 100, 1e-5


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)          # hundreds of tiny runs: threads only cost here
    yield
    torch.set_num_threads(before)


def _build():
    # Four real examples with zero input: a bias-free linear layer gets zero gradient from
    # them, so a run's released sum is exactly C·[canary in] + N(0, σ²C²) on the canary's
    # direction (the first weight), and its score is that sum (T = 1 step, q = 1, C = 1).
    model = nn.Linear(1, 2, bias=False)
    data = TensorDataset(torch.zeros(4, 1), torch.zeros(4, dtype=torch.long))
    return model, torch.optim.SGD(model.parameters(), lr=0.1), data


def test_clopper_pearson_upper_against_the_binomial() -> None:
    for k, n in [(0, 50), (7, 150), (120, 150)]:
        p = clopper_pearson_upper(k, n, 0.025)
        assert stats.binom.cdf(k, n, p) == pytest.approx(0.025, rel=1e-6)
    assert clopper_pearson_upper(5, 5, 0.025) == 1.0


def test_two_run_bound_on_a_tiny_model(one_thread) -> None:
    torch.manual_seed(0)
    runs = {inc: [canary_run_score(_build, include=inc, epochs=1, noise_multiplier=SIGMA,
                                   max_grad_norm=1.0, seed=1000 * inc + i)
                  for i in range(RUNS)] for inc in (True, False)}
    ins, outs = np.array(runs[True]), np.array(runs[False])
    # the scores follow N(1, σ²) and N(0, σ²) (derivation in _build)
    assert stats.kstest(ins - 1, "norm", args=(0, SIGMA)).pvalue > 1e-3
    assert stats.kstest(outs, "norm", args=(0, SIGMA)).pvalue > 1e-3
    # Threshold fixed in advance at τ = 1: FPR = Φ̄(2), TPR = ½, so no test at τ can show more
    # than ln((½ − δ)/Φ̄(2)) ≈ 3.09; the Gaussian mechanism's ε itself is larger still.
    bound = two_run_epsilon(ins, outs, delta=DELTA, threshold=1.0)
    at_tau = math.log((0.5 - DELTA) / stats.norm.sf(2.0))
    claimed = epsilon(Ledger.homogeneous(sample_rate=1.0, noise_multiplier=SIGMA, steps=1),
                      delta=DELTA, accountant="pld")
    assert 1.0 < bound.epsilon <= at_tau < claimed
    # the best threshold, with its Bonferroni correction, is a valid bound too
    assert 0 < two_run_epsilon(ins, outs, delta=DELTA).epsilon <= claimed
