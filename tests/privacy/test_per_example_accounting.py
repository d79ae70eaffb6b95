"""Individual accounting (Yu et al.): each example's ε from its clipped-norm ratio, checked
against dp_accounting's RDP accountant composing the example's own events directly.
`dpfy account --individual`: tests/cli/test_per_example_accounting_cli.py."""

import dp_accounting
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from dp_accounting.rdp import RdpAccountant
from torch import nn
from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS

from dpfy.privacy import Ledger
from dpfy.privacy.per_example_accounting import (
    DATA_DEPENDENT_WARNING,
    per_example_epsilons,
    round_up,
)
from dpfy.types.sampling import Sampling

Q, SIGMA, T, K, DELTA = 0.1, 1.1, 20, 5, 1e-5
RATIOS = np.array(
    [
        [1.0, 0.5, 0.0, 0.23, 1.7, 0.9],
        [1.0, 0.4, 0.0, 0.23, 0.2, 0.9],
        [1.0, 0.3, 0.0, 0.51, 0.2, 0.1],
        [1.0, 0.2, 0.0, 0.77, 0.2, 0.1],
    ]
)


INTEGER = [a for a in DEFAULT_RDP_ORDERS if a == int(a)]


def _direct(ratios_of_example, rounded_grid=None, orders=DEFAULT_RDP_ORDERS):
    """dp_accounting's RDP accountant over the example's own per-step events."""
    acc = RdpAccountant(orders=list(orders))
    for rho in ratios_of_example:
        rho = min(rho, 1.0)
        if rounded_grid is not None:
            rho = min(1.0, np.ceil(round(rho / rounded_grid, 9)) * rounded_grid)
        if rho == 0:
            continue
        event = dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(SIGMA / rho))
        acc.compose(event, K)
    return acc.get_epsilon(DELTA)


def _ledger(sampling=Sampling.POISSON):
    return Ledger.homogeneous(sample_rate=Q, noise_multiplier=SIGMA, steps=T, sampling=sampling,
                              dataset_size=100)  # fmt: skip


def test_against_direct_rdp_computation():
    got = per_example_epsilons(_ledger(), RATIOS, refresh_every=K, delta=DELTA, orders="all")
    for i in range(RATIOS.shape[1]):
        # the same orders and the same RDP terms: equal up to float summation order
        assert got.epsilons[i] == pytest.approx(_direct(RATIOS[:, i]), rel=1e-9, abs=1e-12)
    run = RdpAccountant(orders=list(DEFAULT_RDP_ORDERS))
    run.compose(dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(SIGMA)), T)
    assert got.run_epsilon == pytest.approx(run.get_epsilon(DELTA), rel=1e-9)
    assert got.epsilons.max() <= got.run_epsilon * (1 + 1e-12)
    assert got.epsilons[0] == pytest.approx(got.run_epsilon, rel=1e-12)  # always at C
    assert got.epsilons[2] == 0.0  # a zero gradient never reveals anything of the example


def test_rounding_up_is_conservative_and_matches_direct():
    plain = per_example_epsilons(_ledger(), RATIOS, refresh_every=K, delta=DELTA, orders="all")
    rounded = per_example_epsilons(_ledger(), RATIOS, refresh_every=K, delta=DELTA,
                                   rounding=0.25, orders="all")  # fmt: skip
    assert np.all(rounded.epsilons >= plain.epsilons - 1e-12)
    for i in range(RATIOS.shape[1]):
        assert rounded.epsilons[i] == pytest.approx(_direct(RATIOS[:, i], 0.25), rel=1e-9,
                                                    abs=1e-12)  # fmt: skip
    # 0.23 → 0.25, 0.51 → 0.75, 0.5 stays (a grid point), above 1 → 1
    assert list(round_up(np.array([0.23, 0.51, 0.5, 1.7]), 0.25)) == [0.25, 0.75, 0.5, 1.0]


def test_the_default_integer_orders_match_dp_accounting_capped_at_the_runs_epsilon():
    """The default composes at the integer orders only: dp_accounting's accountant restricted
    to those orders, then capped at the run's ε (all orders), which bounds every example."""
    got = per_example_epsilons(_ledger(), RATIOS, refresh_every=K, delta=DELTA)
    full = per_example_epsilons(_ledger(), RATIOS, refresh_every=K, delta=DELTA, orders="all")
    assert got.run_epsilon == full.run_epsilon
    for i in range(RATIOS.shape[1]):
        want = min(_direct(RATIOS[:, i], orders=INTEGER), got.run_epsilon)
        # the same terms summed in another order (log-sum-exp against dp_accounting's
        # pairwise log-add): float64 rounding, a relative 1e-9 leaves room
        assert got.epsilons[i] == pytest.approx(want, rel=1e-9, abs=1e-12)
        assert got.epsilons[i] >= full.epsilons[i] - 1e-12  # fewer orders: never smaller
    assert got.epsilons[0] == got.run_epsilon and got.epsilons[2] == 0.0


@pytest.mark.parametrize("q", [0.0, 1e-4, 0.01, 0.3, 0.99, 1.0])
def test_integer_order_rdp_equals_dp_accountings_term_by_term_sum(q):
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    from dpfy.privacy.rdp_integer import subsampled_gaussian_rdp

    sigmas = np.array([0.5, 0.9, 1.1, 3.0, 40.0, 1e6])
    got = subsampled_gaussian_rdp(q, sigmas, np.array(INTEGER))
    for row, s in zip(got, sigmas):
        want = rdp._compute_rdp_poisson_subsampled_gaussian(q, s, INTEGER)
        # log A_α sums O(α) terms near 1: an absolute rounding of about α·2.2e-16 ≤ 1.2e-13
        # (α ≤ 512) in log A_α, then divided by α − 1; relative 1e-10 where RDP is not tiny
        np.testing.assert_allclose(row, want, rtol=1e-10, atol=1.2e-13)


def test_report_states_data_dependence_and_correlation():
    got = per_example_epsilons(_ledger(), RATIOS, refresh_every=K, delta=DELTA)
    losses = RATIOS.mean(axis=0)
    text = got.report(losses)
    assert DATA_DEPENDENT_WARNING in text and "Spearman" in text
    c = got.loss_correlation(losses)
    assert -1 <= c["pearson"] <= 1 and -1 <= c["spearman"] <= 1


def test_refusals():
    with pytest.raises(ValueError, match="ledger sampling must be 'poisson'"):
        per_example_epsilons(_ledger(Sampling.SHUFFLE), RATIOS, refresh_every=K, delta=DELTA)
    with pytest.raises(ValueError, match=r"norm_ratios must be \(⌈T/K⌉ = 4, N\)"):
        per_example_epsilons(_ledger(), RATIOS[:3], refresh_every=K, delta=DELTA)
    with pytest.raises(ValueError, match="rounding must be None or in"):
        per_example_epsilons(_ledger(), RATIOS, refresh_every=K, delta=DELTA, rounding=0)
    with pytest.raises(ValueError, match="orders must be 'integer' or 'all'"):
        per_example_epsilons(_ledger(), RATIOS, refresh_every=K, delta=DELTA, orders="even")


def test_norm_tracker_matches_closed_form_softmax_gradient():
    import torch
    import torch.nn.functional as F
    from torch import nn

    from dpfy.norm_tracker import NormTracker

    torch.manual_seed(0)
    x, y = torch.randn(30, 5, dtype=torch.float64), torch.randint(0, 3, (30,))
    model = nn.Linear(5, 3).double()
    clip = 0.8
    tracker = NormTracker(model, F.cross_entropy, x, y, clip=clip, refresh_every=2, chunk=7)
    for _ in range(3):
        tracker.before_step()
    assert len(tracker.ratios) == 2  # steps 0 and 2
    # softmax regression: ∇_W = (p − e_y) xᵀ, ∇_b = p − e_y, so ‖g‖ = ‖p − e_y‖·√(‖x‖² + 1)
    with torch.no_grad():
        p = torch.softmax(model(x), 1)
    g = (p - F.one_hot(y, 3)).norm(dim=1) * (x.square().sum(1) + 1).sqrt()
    expected = torch.clamp(g / clip, max=1.0).numpy()
    assert np.allclose(tracker.ratios[0], expected, rtol=1e-10, atol=0)  # float64 sums
    ledger = Ledger.homogeneous(sample_rate=0.1, noise_multiplier=1.0, steps=3)
    res = tracker.epsilons(ledger, delta=1e-5)
    assert res.epsilons.shape == (30,) and res.epsilons.max() <= res.run_epsilon * (1 + 1e-12)
    with pytest.raises(ValueError, match="ledger steps must be the 3 steps"):
        tracker.epsilons(Ledger.homogeneous(sample_rate=0.1, noise_multiplier=1.0, steps=4),
                         delta=1e-5)  # fmt: skip


def test_norm_tracker_on_a_private_model():
    # regression: the private model's gradient taps broke torch.func on the model itself
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import dpfy
    from dpfy.norm_tracker import NormTracker

    torch.manual_seed(0)
    x, y = torch.randn(60, 1, 3, 3), torch.randint(0, 3, (60,))
    base = nn.Sequential(nn.Flatten(), nn.Linear(9, 3))
    model, opt, loader = dpfy.make_private(
        base, torch.optim.SGD(base.parameters(), lr=1.0),
        DataLoader(TensorDataset(x, y), batch_size=20), target_epsilon=3.0, target_delta=1e-5,
        epochs=1, max_grad_norm=1.0, accountant="rdp")  # fmt: skip
    tracker = NormTracker(model, F.cross_entropy, x, y, clip=1.0, refresh_every=2)
    for xb, yb in loader:
        tracker.before_step()
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
    res = tracker.epsilons(opt.ledger, delta=1e-5)
    assert res.epsilons.max() <= res.run_epsilon * (1 + 1e-12)


class _TrainOnlyScale(nn.Module):
    """Doubles its input in training mode only: train- and eval-mode gradients differ by a
    known factor, so the mode the tracker measures in shows in its norms."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return 2 * h if self.training else h


def test_norms_are_measured_in_the_mode_the_run_clips():
    """Regression (adversarial review): the tracker measured eval-mode norms, smaller than the
    training-mode gradients the run clips (dropout on), so every ε_i was under-stated. Expected
    values: a float64 per-example autograd loop in training mode, written here."""
    from dpfy.norm_tracker import NormTracker

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), _TrainOnlyScale(), nn.Tanh(), nn.Linear(8, 3)).train()
    x, y = torch.randn(20, 6), torch.randint(0, 3, (20,))
    clip = 100.0  # no clipping saturates: ratio = norm / C
    tracker = NormTracker(
        model, lambda o, t: F.cross_entropy(o, t), x, y, clip=clip, refresh_every=1
    )
    state = torch.get_rng_state()
    tracker.before_step()
    assert torch.equal(state, torch.get_rng_state())  # the run's random stream is untouched
    ref = model.double()
    want = []
    for i in range(20):
        ref.zero_grad()
        F.cross_entropy(ref(x[i : i + 1].double()), y[i : i + 1]).backward()
        want.append(float(torch.sqrt(sum(p.grad.square().sum() for p in ref.parameters()))) / clip)
    # float32 per-example gradients of a 2-layer net against float64: a few ulps relative
    np.testing.assert_allclose(tracker.ratios[0], want, rtol=1e-5)
