"""The audit at its default settings (1,000 Dirac canaries, per-step scores, 95 %) through
dpfy's real training path (``audit_config``: make_private, the Poisson sampler, the private
step, the ledger): a correct run's GDP estimate is within ±30 % of its claimed ε with the
lower bounds below it; a run whose noise is cut to ×0.5, or to zero, behind the ledger's back
is flagged. Logistic regression on scikit-learn's digits, b = 256, 5 epochs, σ = 1."""

from __future__ import annotations

import inspect

import pytest
import torch
from dp_accounting import dp_event, pld

import dpfy
from dpfy.audit.run import DEFAULT_CANARIES, DEFAULT_KIND, audit_config
from dpfy.audit.sink import CanarySink
from dpfy.train.config import TrainConfig

DIGITS_TRAIN = 1438      # dpfy's digits training split
CFG = TrainConfig(dataset="digits", model="logreg", epochs=5, batch_size=256, seed=0,
                  threads=1, epsilon=None, noise_multiplier=1.0)


@pytest.fixture(scope="module")
def runs():
    return {scale: audit_config(CFG, plant_noise_scale=scale, echo=lambda _: None)
            for scale in (None, 0.5, 0.0)}


def test_defaults_are_dirac_and_1000() -> None:
    assert (DEFAULT_KIND, DEFAULT_CANARIES) == ("dirac", 1000)


def test_claim_is_the_pld_of_the_audited_run(runs) -> None:
    r = runs[None]
    n = DIGITS_TRAIN + r.canaries_in                      # the canaries are rows of the run
    assert r.steps == 5 * -(-n // 256)
    acc = pld.PLDAccountant(value_discretization_interval=1e-3)
    acc.compose(dp_event.PoissonSampledDpEvent(256 / n, dp_event.GaussianDpEvent(1.0)), r.steps)
    assert r.claimed_epsilon == pytest.approx(acc.get_epsilon(r.delta), rel=2e-2)


def test_correct_run_estimate_within_30_percent_and_bounds_below(runs) -> None:
    r = runs[None]
    assert r.canary_kind == "dirac" and r.planted_noise_scale is None
    assert 0.7 * r.claimed_epsilon <= r.gdp.epsilon <= 1.3 * r.claimed_epsilon
    assert r.one_run.epsilon <= r.claimed_epsilon and r.fdp.epsilon <= r.claimed_epsilon
    assert not r.flagged


def test_half_noise_behind_the_ledgers_back_is_flagged(runs) -> None:
    r = runs[0.5]
    assert r.claimed_epsilon == runs[None].claimed_epsilon   # the ledger did not see it
    assert r.gdp.epsilon_low > r.claimed_epsilon and r.flagged
    assert r.to_dict()["published"] is False


def test_zero_noise_is_flagged_by_the_estimate_and_the_fdp_bound(runs) -> None:
    r = runs[0.0]
    assert r.gdp.epsilon_low > r.claimed_epsilon
    assert r.fdp.epsilon > r.claimed_epsilon                  # a rigorous bound, too
    assert r.exceeded and r.flagged


def test_the_sink_changes_no_output_and_no_real_gradient() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    wrapped = CanarySink(model, 11)
    with torch.no_grad():
        wrapped.sink.weight.normal_()                         # noise landed on it
    x = torch.randn(4, 5)
    assert torch.equal(wrapped(x), model(x))
    wrapped(x).square().sum().backward()
    assert torch.equal(wrapped.sink.weight.grad, torch.zeros(1, 11))


def test_planting_is_not_reachable_from_training() -> None:
    assert "plant" not in " ".join(inspect.signature(dpfy.make_private).parameters)
    from dpfy.cli import build_parser
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--plant-noise-scale", "0.5"])
