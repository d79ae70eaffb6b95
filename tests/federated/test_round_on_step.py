"""A DP-FedAvg round on the private step's pieces: every user's delta goes through the step's
``check_bound`` before the sum, the noise is one draw over one flat buffer by the mechanism's
generator (OS-keyed without a seed), and a seed is split as make_private splits it.

Expected values are derived here: the users' squared norms as a float64 sum over their
clipped deltas, the noise's standard deviation σ·C/b from the definition of the release."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dpfy.step.sums as step_sums
from dpfy.errors import PrivacyRefusal
from dpfy.federated import Contribution, DPFedAvgServer, LocalTraining, clip_delta, run_dp_fedavg
from dpfy.noise import NoiseSource
from dpfy.noise.seeds import derive_seeds

N_USERS, CLIP = 4, 0.05
TRAINING = LocalTraining(epochs=1, lr=0.3, batch_size=2)


def _model(width=5):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, width), nn.Tanh(), nn.Linear(width, 3))


def _users():
    g = torch.Generator().manual_seed(3)
    return [
        (torch.randn(3 + u, 4, generator=g), torch.randint(0, 3, (3 + u,), generator=g))
        for u in range(N_USERS)
    ]


def _server(model=None, **kw):
    args = dict(
        num_users=N_USERS, user_sample_rate=1.0, clip=CLIP, noise_multiplier=1.0, rounds=2, seed=0
    )
    args.update(kw)
    return DPFedAvgServer(model or _model(), **args)


def _spy_check_bound(monkeypatch):
    calls = []
    real = step_sums.check_bound

    def spy(sq, bound, *, what, owner, **rest):
        calls.append((sq.detach().double().cpu().clone(), bound, what))
        return real(sq, bound, what=what, owner=owner, **rest)

    monkeypatch.setattr(step_sums, "check_bound", spy)
    return calls


def _deltas(server, scale):
    g = torch.Generator().manual_seed(7)
    return [
        {n: scale * torch.randn(p.shape, generator=g) for n, p in server.params.items()}
        for _ in range(N_USERS)
    ]


def test_every_users_delta_goes_through_the_steps_check_bound(monkeypatch):
    calls = _spy_check_bound(monkeypatch)
    server = _server()
    rp = server.begin_round()
    contributions = []
    for u, delta in zip(rp.users, _deltas(server, 0.1)):
        clipped, norm = clip_delta(delta, CLIP)
        contributions.append(Contribution(user=u, clipped=clipped, norm=norm))
    server.finish_round(contributions)
    ((sq, bound, what),) = [c for c in calls if c[1] == CLIP]
    # ‖Δ̃_u‖² as a float64 sum over the clipped tensors: the check sees each user's norm
    expected = torch.tensor(
        [sum(float(t.double().square().sum()) for t in c.clipped.values()) for c in contributions],
        dtype=torch.float64,
    )
    torch.testing.assert_close(sq, expected, rtol=1e-12, atol=0)  # float64 sums of float32 data
    assert "gradient sum" in what


def test_a_delta_above_the_bound_is_refused_by_check_bound_and_nothing_is_released(monkeypatch):
    calls = _spy_check_bound(monkeypatch)
    server = _server()
    before = {n: p.detach().clone() for n, p in server.params.items()}
    rp = server.begin_round()
    deltas = _deltas(server, 0.1)
    contributions = [
        Contribution(user=u, clipped=clip_delta(d, CLIP)[0], norm=1.0)
        for u, d in zip(rp.users, deltas)
    ]
    # user rp.users[2] sends an unclipped delta: its norm is far above C
    contributions[2] = Contribution(user=rp.users[2], clipped=deltas[2], norm=1.0)
    with pytest.raises(PrivacyRefusal, match="clipped to C_t") as err:
        server.finish_round(contributions)
    assert f"user {rp.users[2]}'s delta" in str(err.value)
    assert "within its declared sensitivity" in str(err.value)  # check_bound's own refusal
    assert any(b == CLIP and float(sq.max().sqrt()) > CLIP for sq, b, _ in calls)
    assert server.ledger.num_steps == 0
    assert all(torch.equal(before[n], p) for n, p in server.params.items())
    # the round is still open: the clipped reply is accepted and released
    contributions[2] = Contribution(
        user=rp.users[2], clipped=clip_delta(deltas[2], CLIP)[0], norm=1.0
    )
    server.finish_round(contributions)
    assert server.ledger.num_steps == 1


def test_a_secure_server_draws_once_per_round_from_the_os_keyed_generator(monkeypatch):
    keys = []
    real_urandom = os.urandom
    monkeypatch.setattr(os, "urandom", lambda n: keys.append(n) or real_urandom(n))
    server = _server(seed=None)
    assert keys  # the noise (and the sampler's masks) are keyed from os.urandom
    draws = []
    real = NoiseSource.noisy_mean

    def spy(self, total, std, normalizer, *args, **kwargs):
        draws.append((self, total.numel(), self.secure, self.generator_for(total.device)))
        return real(self, total, std, normalizer, *args, **kwargs)

    monkeypatch.setattr(NoiseSource, "noisy_mean", spy)
    run_dp_fedavg(server, _users(), F.cross_entropy, TRAINING, 2)
    size = sum(p.numel() for p in server.params.values())
    # one flat draw per round, over every parameter, by the server's own mechanism
    assert [(s is server.mechanism.source, n) for s, n, _, _ in draws] == [(True, size)] * 2
    secure = {"chacha20", "urandom", "torch-chacha20", "triton-chacha20"}
    assert all(is_secure and name in secure for _, _, is_secure, name in draws)


def test_the_flat_draw_has_the_releases_standard_deviation():
    # Δ̄ = (Σ_u Δ̃_u + N(0, (σC)² I)) / b: the difference from the noise-free release of the
    # same replies, times b, is N(0, (σC)²) in every one of the d = 40·40 + 40 = 1640
    # coordinates: the sample std's relative standard error is 1/√(2d) ≈ 1.7 %, so 10 % is
    # over 5 SE, and the mean's standard error is σC/√d (5 SE allowed).
    sigma, released = 2.0, []
    for noise in (sigma, 0.0):
        torch.manual_seed(0)
        server = _server(nn.Linear(40, 40), noise_multiplier=noise, seed=1)
        rp = server.begin_round()
        replies = [clip_delta(d, CLIP) for d in _deltas(server, 0.1)]
        result = server.finish_round(
            [Contribution(user=u, clipped=c, norm=n) for u, (c, n) in zip(rp.users, replies)]
        )
        released.append(result.mean_delta)
    b = server.expected_users
    noise = torch.cat(
        [(released[0][n] - released[1][n]).flatten().double() * b for n in released[0]]
    )
    assert noise.numel() == 1640
    assert float(noise.std()) == pytest.approx(sigma * CLIP, rel=0.1)
    assert abs(float(noise.mean())) < 5 * sigma * CLIP / noise.numel() ** 0.5


def test_a_seed_is_split_as_make_private_splits_it():
    server = _server(seed=123)
    sampling_seed, noise_seed = derive_seeds(123)
    # the two generators start where make_private's would for seed=123
    mine, theirs = server.mechanism.source.state_dict(), NoiseSource(noise_seed).state_dict()
    assert sorted(mine) == sorted(theirs) and mine["backend"] == theirs["backend"]
    key = "state" if "state" in mine else "generator"
    assert torch.equal(torch.as_tensor(mine[key]), torch.as_tensor(theirs[key]))
    assert torch.equal(
        server.sampler.generator.get_state(),
        torch.Generator().manual_seed(sampling_seed).get_state(),
    )
    again = _server(seed=123)
    run_dp_fedavg(server, _users(), F.cross_entropy, TRAINING, 1)
    run_dp_fedavg(again, _users(), F.cross_entropy, TRAINING, 1)
    for p, q in zip(server.params.values(), again.params.values()):
        assert torch.equal(p, q)


def test_a_reply_tensor_that_would_broadcast_is_refused():
    # a (1,)-shaped reply for a (5, 4) weight has norm |x| but would add x to all 20 entries
    # (norm √20·|x|) if broadcast into the sum: more than the bound the check measured
    server = _server()
    rp = server.begin_round()
    clipped = {n: torch.zeros_like(p) for n, p in server.params.items()}
    clipped["0.weight"] = torch.full((1,), CLIP)
    with pytest.raises(ValueError, match="shaped as the parameters"):
        server.finish_round([Contribution(user=rp.users[0], clipped=clipped, norm=CLIP)])
    assert server.ledger.num_steps == 0
