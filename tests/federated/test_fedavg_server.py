"""DP-FedAvg's server: sampling, the clipping check, noise once, the ledger, the update.

Expected values are derived in each test: a float64 loop of Algorithm 2 (Ponomareva et al.
2023; McMahan et al. 2018) for the update, dp_accounting's Poisson-subsampled Gaussian for ε,
and Andrew et al. 2021's geometric update for the quantile method.
"""

from __future__ import annotations

import copy
import math

import dp_accounting
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dpfy.adaptive import make
from dpfy.errors import BudgetExhausted, PrivacyRefusal
from dpfy.federated import (USER_UNIT, Contribution, DPFedAvgServer, LocalTraining,
                            clip_delta, local_delta, run_dp_fedavg)

N_USERS = 6


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3))


def _users(n=N_USERS):
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(3 + u, 4, generator=g), torch.randint(0, 3, (3 + u,), generator=g))
            for u in range(n)]


TRAINING = LocalTraining(epochs=2, lr=0.3, batch_size=2)


def _server(**kw):
    args = dict(num_users=N_USERS, user_sample_rate=1.0, clip=0.05, noise_multiplier=0.0,
                rounds=3, seed=0)
    args.update(kw)
    return DPFedAvgServer(_model(), **args)


def test_noise_free_round_equals_a_float64_loop_of_algorithm_2():
    users = _users()
    server = _server(server_lr=0.7)
    ref = copy.deepcopy(server.model).double()
    run_dp_fedavg(server, users, F.cross_entropy, TRAINING, 1)
    # Algorithm 2 with every user sampled (q_u = 1): Δ̄ = Σ_u clip(Δ_u)/(q_u N); θ −= η_s Δ̄
    total = {n: torch.zeros_like(p) for n, p in ref.named_parameters()}
    for x, y in users:
        work = copy.deepcopy(ref)
        delta = local_delta(work, x.double(), y, F.cross_entropy, TRAINING)
        norm = math.sqrt(sum(float(t.square().sum()) for t in delta.values()))
        for n in total:
            total[n] += delta[n] * min(1.0, 0.05 / norm)
    for n, p in server.model.named_parameters():
        expected = dict(ref.named_parameters())[n].detach() - 0.7 * total[n] / N_USERS
        torch.testing.assert_close(p.detach().double(), expected, rtol=1e-5, atol=1e-6)


def test_removing_one_user_moves_the_noise_free_sum_by_at_most_C():
    # Adjacency is add-or-remove one user with all of their examples: with σ = 0 the released
    # sum (the mean × q_u·N_users) of the two populations differs by at most C.
    clip = 0.05
    sums = []
    full = _users()
    for users in (full, full[:2] + full[3:]):
        server = _server(clip=clip, num_users=len(users))
        released = []
        run_dp_fedavg(server, users, F.cross_entropy, TRAINING, 1,
                      on_round=lambda r: released.append(r.mean_delta))
        sums.append(torch.cat([t.flatten() for t in released[0].values()]).double()
                    * server.expected_users)
    gap = float((sums[0] - sums[1]).norm())
    assert 0 < gap <= clip * (1 + 1e-5)


def _ledger_against_dp_accounting(accountants):
    q, sigma, rounds = 0.5, 1.1, 4
    server = _server(user_sample_rate=q, noise_multiplier=sigma, rounds=rounds, clip=1.0)
    run_dp_fedavg(server, _users(), F.cross_entropy, TRAINING, rounds)
    assert server.ledger.num_steps == rounds and server.ledger.dataset_size == N_USERS
    (group,) = server.ledger.step_groups
    assert (group.sample_rate, group.count) == (q, rounds)
    assert [(r.mechanism, r.noise_multiplier) for r in group.releases] == [("gradient", sigma)]
    delta = 1e-3
    for accountant in accountants:
        acc = (dp_accounting.rdp.RdpAccountant() if accountant == "rdp" else
               dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4))
        acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)),
                    rounds)
        assert server.epsilon(delta, accountant) == pytest.approx(acc.get_epsilon(delta),
                                                                  rel=1e-2)


def test_ledger_is_a_user_level_poisson_subsampled_gaussian_per_round():
    _ledger_against_dp_accounting(("rdp",))


@pytest.mark.slow
def test_ledger_epsilon_by_pld_equals_dp_accountings():
    _ledger_against_dp_accounting(("pld",))


def test_sigma_is_calibrated_for_a_target_user_level_epsilon():
    server = _server(user_sample_rate=0.5, noise_multiplier=None, target_epsilon=4.0,
                     rounds=5, accountant="rdp", delta=1e-3, clip=1.0)
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(
        0.5, dp_accounting.GaussianDpEvent(server.noise_multiplier)), 5)
    assert 3.95 <= acc.get_epsilon(1e-3) <= 4.0 + 1e-9


def test_the_clipping_check_refuses_an_unclipped_or_unsampled_contribution():
    server = _server(clip=0.05)
    rp = server.begin_round()
    big = {n: torch.ones_like(p) for n, p in server.params.items()}
    with pytest.raises(PrivacyRefusal, match="clipped to C_t"):
        server.finish_round([Contribution(user=rp.users[0], clipped=big, norm=10.0)])
    small, norm = clip_delta(big, 0.05)
    with pytest.raises(PrivacyRefusal, match="sampled"):
        server.finish_round([Contribution(user=rp.users[0], clipped=small, norm=norm),
                             Contribution(user=rp.users[0], clipped=small, norm=norm)])
    server2 = _server(user_sample_rate=0.01, seed=5)
    rp2 = server2.begin_round()
    outsider = next(u for u in range(N_USERS) if u not in rp2.users)
    with pytest.raises(PrivacyRefusal, match="not sampled"):
        server2.finish_round([Contribution(user=outsider, clipped=small, norm=norm)])


def test_rounds_beyond_the_plan_are_refused_and_empty_rounds_are_recorded():
    server = _server(user_sample_rate=0.01, noise_multiplier=1.0, rounds=2, clip=1.0, seed=1)
    before = {n: p.detach().clone() for n, p in server.model.named_parameters()}
    run_dp_fedavg(server, _users(), F.cross_entropy, TRAINING, 2)
    assert server.ledger.num_steps == 2                       # noise-only rounds count too
    assert any(not torch.equal(before[n], p) for n, p in server.model.named_parameters())
    # the refusal names the server's rounds and a fix that exists on the server (it named
    # "optimizer.max_steps", which a DPFedAvgServer does not have)
    with pytest.raises(BudgetExhausted, match=r"round must be < rounds = 2") as info:
        server.begin_round()
    assert "optimizer" not in str(info.value) and "server.guard.max_steps" in str(info.value)


def test_secure_by_default_and_a_seed_is_warned_in_the_report():
    secure = DPFedAvgServer(_model(), num_users=N_USERS, user_sample_rate=0.5, clip=1.0,
                            noise_multiplier=1.0)
    assert secure.sampler.secure and secure.mechanism.source.secure
    assert secure.delta == pytest.approx(N_USERS ** -1.1)
    seeded = _server(noise_multiplier=2.0, clip=1.0)
    run_dp_fedavg(seeded, _users(), F.cross_entropy, TRAINING, 1)
    report = seeded.privacy_report()
    assert report.unit_of_privacy == USER_UNIT == "one user, with all of their examples"
    text = report.to_markdown()
    assert f"for {USER_UNIT}" in text and "fixed seed" in text
    assert "add or remove one user" in text


def test_quantile_clipping_adapts_C_on_the_user_deltas_and_records_its_count():
    # Andrew et al. 2021: count̃ = Σ_u (1[‖Δ_u‖ ≤ C] − ½) + N(0, σ_b²);
    # C ← C · exp(−η ((count̃ + b/2)/b − γ)), b = q_u N (expected users); the gradient's σ is
    # (σ⁻² − (2σ_b)⁻²)^(−1/2) so the round spends what plain DP-FedAvg at σ would.
    sigma, sb = 1.0, 1.0
    method = make("quantile", initial_clip=0.05, target_quantile=0.5, step_size=0.2,
                  count_noise_std=sb)
    server = _server(clip=None, method=method, noise_multiplier=sigma, rounds=3)
    seen = []
    run_dp_fedavg(server, _users(), F.cross_entropy, TRAINING, 3,
                  on_round=lambda r: seen.append((r.clip, r.extras["unclipped_count"])))
    b = server.expected_users
    for (c0, count), (c1, _) in zip(seen, seen[1:]):
        assert c1 == pytest.approx(c0 * math.exp(-0.2 * ((count + b / 2) / b - 0.5)))
    (group,) = server.ledger.step_groups
    assert [(r.mechanism, r.noise_multiplier) for r in group.releases] == [
        ("gradient", pytest.approx((sigma ** -2 - (2 * sb) ** -2) ** -0.5)),
        ("unclipped_count", pytest.approx(2 * sb))]


def test_quantile_count_reads_the_norm_before_clipping():
    # A near noise-free count: every user's delta is far above C_0, so no user is unclipped:
    # count ≈ −N/2 although every clipped delta has norm C.
    method = make("quantile", initial_clip=1e-6, count_noise_std=1e-9)
    server = _server(clip=None, method=method, noise_multiplier=0.0, rounds=1)
    seen = []
    run_dp_fedavg(server, _users(), F.cross_entropy, TRAINING, 1,
                  on_round=lambda r: seen.append(r.extras["unclipped_count"]))
    assert seen[0] == pytest.approx(-N_USERS / 2, abs=1e-6)


def test_methods_whose_clipping_is_not_one_threshold_are_refused():
    with pytest.raises(PrivacyRefusal, match="one threshold"):
        _server(clip=None, method=make("per_layer_quantile"))
    with pytest.raises(ValueError, match="clip"):
        _server(clip=0.5, method=make("quantile"))
