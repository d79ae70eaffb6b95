"""Regression tests for the step as a trust boundary (issue 10 §1.4–1.6, §4 first bullet).

Each failed on the code before the method interface: GDP calibrated the noise, weights above
their declared sensitivity and extra releases above theirs were accepted, a schedule built for
other facts ran silently, and ``epochs=`` planned fewer steps than the loader yields.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.types import Clip, ReleaseSpec, RunFacts, Sampling
from dpfy.adaptive import Method, make
from dpfy.errors import PrivacyRefusal


def _setup(n=200, batch=20, **kwargs):
    torch.manual_seed(0)
    ds = TensorDataset(torch.randn(n, 6), torch.randint(0, 2, (n,)))
    model = nn.Sequential(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 2))
    kwargs.setdefault("seed", 0)
    return (model,) + dpfy.make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(ds, batch_size=batch),
        **kwargs)[1:]


def _one_step(model, opt, loader):
    x, y = next(iter(loader))
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()


class DoubleWeights(Method):
    """Claims sensitivity C but gives each example weight 2·min(1, C/‖g‖): norm up to 2C."""

    def clipping(self, state, norms, plan):
        return Clip(2 * torch.clamp(plan.clip / norms.total, max=1.0), sensitivity=plan.clip)


class LoudCount(Method):
    """Declares a count of sensitivity ½ but releases 0/1 indicators (sensitivity 1)."""

    def releases(self, state, plan):
        return {"count": ReleaseSpec(
            sensitivity=0.5, noise_std=1.0,
            values=lambda norms: torch.ones_like(norms.total, dtype=torch.float64))}


def test_weights_above_their_sensitivity_are_refused_naming_the_method():
    model, opt, loader = _setup(noise_multiplier=1.0, method=DoubleWeights(), max_grad_norm=1e-3)
    with pytest.raises(PrivacyRefusal, match="DoubleWeights.*nothing of this step was released"):
        _one_step(model, opt, loader)
    assert opt.ledger.num_steps == 0


def test_extra_release_above_its_sensitivity_is_refused():
    model, opt, loader = _setup(noise_multiplier=1.0, method=LoudCount())
    with pytest.raises(PrivacyRefusal, match="release 'count'.*LoudCount"):
        _one_step(model, opt, loader)
    assert opt.ledger.num_steps == 0


def test_a_schedule_calibrated_for_other_facts_is_refused():
    # Built for q = 0.01; the run's sampler has q = 20/200 = 0.1.
    sched = make("noise_decay", kind="exponential", rate=0.3).calibrate(RunFacts(
        sampling=Sampling.POISSON, sample_rate=0.01, steps=10, steps_per_epoch=10, delta=1e-5,
        target_epsilon=1.0, accountant="rdp", max_grad_norm=1.0))
    with pytest.raises(PrivacyRefusal, match="sample_rate: 0.01 .method. vs 0.1 .run."):
        _setup(method=sched, max_grad_norm=1.0)


@pytest.mark.parametrize("kwargs", [dict(target_epsilon=3.0, target_delta=1e-5, epochs=1),
                                    dict(noise_multiplier=1.0, epsilon_cap=3.0,
                                         target_delta=1e-5)])
def test_gdp_never_decides_the_noise(kwargs):
    with pytest.raises(ValueError, match="accountant must be one of \\['pld', 'rdp'\\]"):
        _setup(accountant="gdp", **kwargs)


def test_gdp_stays_readable():
    model, opt, loader = _setup(noise_multiplier=1.0, accountant="gdp")
    _one_step(model, opt, loader)
    with pytest.raises(ValueError, match="approximate=True"):   # issue 30 §4: an opt-in
        opt.epsilon(1e-5)
    approx = opt.epsilon(1e-5, approximate=True)
    assert approx > 0 and approx.rigorous == opt.epsilon(1e-5, accountant="pld") > 0


def test_epochs_plan_every_logical_batch_the_loader_yields():
    # N = 1000, b = 64: the loader yields ⌈1000/64⌉ = 16 logical batches per epoch, 48 in 3
    # epochs (⌈3/q⌉ = ⌈46.875⌉ = 47 crashed the last epoch).
    model, opt, loader = _setup(n=1000, batch=64, target_epsilon=3.0, target_delta=1e-5,
                                epochs=3)
    assert len(loader) == 16 and opt.max_steps == 48
    for _ in range(3):
        for x, y in loader:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    assert opt.step_count == 48 and opt.epsilon(1e-5) <= 3.0 + 1e-9


def test_a_method_with_its_own_clipping_refuses_another_requested_policy():
    # quantile clips flat at its own C_t; per_layer clipping would be silently ignored.
    with pytest.raises(ValueError, match="clipping must be 'flat'.*'quantile'"):
        _setup(noise_multiplier=1.0, method="quantile", clipping="per_layer")


def test_a_non_finite_contribution_is_refused_as_divergence_not_as_a_weight_bug():
    """Regression (lr-fmnist: a HyFreeDP run whose η reached 6.5 diverged and was refused with
    "fix the method's weights or declare the true sensitivity", which points at the wrong
    fix). A NaN or inf contribution is refused naming what is not finite and the likely cause."""
    import math

    from dpfy.step.sums import check_bound

    for bad in (math.nan, math.inf):
        with pytest.raises(PrivacyRefusal, match="not finite.*diverged") as err:
            check_bound(torch.tensor([0.25, bad]), 1.0, what="the clipped gradient sum",
                        owner="method 'hyfree'")
        assert "method 'hyfree'" in str(err.value)
    check_bound(torch.tensor([0.25, 1.0]), 1.0, what="x", owner="y")        # within: accepted
