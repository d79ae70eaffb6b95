"""Fay et al.'s data-dependent PUR rule: the norm estimate is a noisy release in the ledger, the
step's two releases spend what plain DP-SGD at the run's σ would, and the noise added on top
follows σ_t = σ_g·max(1, r/r_min) from released values only."""

import math

import dp_accounting
import pytest
import torch
import torch.nn.functional as F
from dp_accounting.rdp import RdpAccountant
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.adaptive import REGISTRY, check_plan, make
from dpfy.adaptive.base import calibrate_for_run
from dpfy.adaptive.pur_data import NORM_RELEASE, DataPURState
from dpfy.privacy.accountants import epsilon
from dpfy.types import RunFacts, Sampling, StepOutcome, StepPlan

N, BATCH, STEPS, LR, EPS, DELTA = 200, 20, 6, 0.1, 4.0, 1e-5
Q = BATCH / N


def _facts(lr=LR):
    return RunFacts(sampling=Sampling.POISSON, sample_rate=Q, steps=STEPS, dataset_size=N,
                    delta=DELTA, target_epsilon=EPS, accountant="rdp", max_grad_norm=1.0,
                    inner_hyperparameters=None if lr is None else {"lr": lr})  # fmt: skip


def _run(**options):
    torch.manual_seed(0)
    ds = TensorDataset(torch.randn(N, 6), torch.randint(0, 2, (N,)))
    model = nn.Sequential(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 2))
    model, opt, loader = dpfy.make_private(
        model,
        torch.optim.SGD(model.parameters(), lr=LR),
        DataLoader(ds, batch_size=BATCH),
        method=make("pur_data", smoothness=2.0, **options),
        target_epsilon=EPS,
        target_delta=DELTA,
        max_steps=STEPS,
        max_grad_norm=1.0,
        seed=1,
        accountant="rdp",
    )
    batches = iter(loader)
    for _ in range(STEPS):
        x, y = next(batches)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return opt


def test_registered_and_listed_with_hong_explained():
    assert "pur_data" in REGISTRY
    from dpfy.cli.methods import markdown

    text = markdown()
    assert "`pur_data`" in text and "Hong et al." in text


def test_ledger_holds_both_releases_and_its_epsilon_is_dp_accountings():
    opt = _run(norm_budget_fraction=0.1)
    steps = [g for g in opt.ledger.step_groups for _ in range(g.count)]
    assert len(steps) == STEPS
    acc = RdpAccountant()
    for group in steps:
        names = [r.mechanism for r in group.releases]
        assert names == ["gradient", NORM_RELEASE]
        sigma_g, sigma_n = (r.noise_multiplier for r in group.releases)
        # the two releases on the same Poisson batch, each Gaussian relative to its own
        # sensitivity: one subsampled event of both
        acc.compose(
            dp_accounting.PoissonSampledDpEvent(
                Q,
                dp_accounting.ComposedDpEvent(
                    [dp_accounting.GaussianDpEvent(sigma_g), dp_accounting.GaussianDpEvent(sigma_n)]
                ),
            )
        )
    ours = epsilon(opt.ledger, delta=DELTA, accountant="rdp")
    theirs = acc.get_epsilon(DELTA)
    # same RDP orders and the same closed forms: agree to float rounding of the orders' sum
    assert ours == pytest.approx(theirs, rel=1e-9)
    # and the split spends the target exactly: σ_g⁻² + σ_n⁻² is the σ plain DP-SGD needs for
    # (ε, δ) over these steps, which dp_accounting's RDP gives back as ε = target
    sigma = (sigma_g**-2 + sigma_n**-2) ** -0.5
    assert sigma_g == pytest.approx(sigma / math.sqrt(0.9), rel=1e-12)
    assert sigma_n == pytest.approx(sigma / math.sqrt(0.1), rel=1e-12)
    plain = RdpAccountant()
    plain.compose(dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(sigma)),
                  STEPS)  # fmt: skip
    assert plain.get_epsilon(DELTA) == pytest.approx(EPS, rel=0.02)  # calibration's tolerance
    assert plain.get_epsilon(DELTA) <= EPS * (1 + 1e-6)


def test_plan_passes_check_plan_in_every_state():
    s = calibrate_for_run(make("pur_data", smoothness=5.0), _facts())
    before = StepPlan(3, Q, 1.3, 1.0)
    for state in (DataPURState(), DataPURState(0.2, 0.8), DataPURState(-0.1, 0.5)):
        after = s.plan(state, before)
        check_plan(s, before, after)  # raises on an undeclared change or a lowered σ
        assert after.noise_multiplier == pytest.approx(1.3 / math.sqrt(0.95), rel=1e-12)
        assert LR * after.lr_scale == pytest.approx(1 / (2 * 5.0), rel=1e-12)


def test_update_is_the_moving_average_of_released_means():
    s = make("pur_data", smoothness=1.0, smoothing=0.75)
    plan = StepPlan(0, Q, 1.0, 1.0)
    st = s.update(DataPURState(), StepOutcome(plan, 20.0, sums={NORM_RELEASE: 16.0}))
    assert (st.estimate, st.largest) == (0.8, 0.8)
    st = s.update(st, StepOutcome(plan, 20.0, sums={NORM_RELEASE: 4.0}))
    # 0.75·0.8 + 0.25·0.2 = 0.65; the largest stays 0.8
    assert st.estimate == pytest.approx(0.65, rel=1e-12) and st.largest == 0.8


@pytest.mark.parametrize("estimate, expected", [(0.8, 1.6), (0.4, 1.0), (1.0, 2.0)])
def test_added_noise_follows_the_pur_rule(estimate, expected):
    s = make("pur_data", smoothness=1.0, min_ratio=0.5)
    plan, b, clip = StepPlan(2, Q, 1.5, 2.0), 50.0, 2.0
    state = DataPURState(estimate=estimate, largest=1.0)
    # σ_t/σ_g = max(1, r/r_min) with r = estimate/1
    assert s.pur_noise_multiplier(state, plan) == pytest.approx(1.5 * expected, rel=1e-12)
    zero = {"w": torch.zeros(200_000, dtype=torch.float64)}
    out = s.postprocess(state, zero, plan, {}, b)["w"]
    std = clip * 1.5 * math.sqrt(expected**2 - 1) / b
    if expected == 1.0:
        assert torch.equal(out, zero["w"])
    else:
        # sample std of 200,000 normals: relative standard error 1/√(2n) ≈ 0.0016; 5 of them
        assert float(out.std()) == pytest.approx(std, rel=0.008)


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(smoothness=-1.0), "smoothness must be > 0"),
        (dict(min_ratio=0.0), "min_ratio must be in"),
        (dict(min_ratio=1.5), "min_ratio must be in"),
        (dict(norm_budget_fraction=1.0), "norm_budget_fraction must be in"),
        (dict(smoothing=1.0), "smoothing must be in"),
    ],
)
def test_refusals(options, message):
    with pytest.raises(ValueError, match=message):
        make("pur_data", **options)


def test_refuses_a_noiseless_run():
    s = calibrate_for_run(make("pur_data"), _facts())
    with pytest.raises(ValueError, match="noise_multiplier must be > 0 for pur_data"):
        s.plan(DataPURState(), StepPlan(0, Q, 0.0, 1.0))
