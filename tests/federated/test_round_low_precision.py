"""A DP-FedAvg round for a model in half precision (bfloat16): the sum the noise is added to
must differ between neighbouring rounds by at most C, and a delta clipped by dpfy's client
must pass the server's check.

Every expected value is derived here from bfloat16's grid (8 significant bits: numbers in
[2^k, 2^(k+1)) are spaced 2^(k−7)) and float32's (24 bits); the sums are captured where the
noise is added (``NoiseSource.noisy_mean``), before any noise, and compared in float64."""

from __future__ import annotations

import math

import torch
from torch import nn

from dpfy.federated import Contribution, DPFedAvgServer, clip_delta
from dpfy.noise import NoiseSource

# check_bound's relative slack (dpfy.step.sums._SLACK): what a sum may exceed C by
SLACK = 1e-5


class _Vector(nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.v = nn.Parameter(torch.zeros(size, dtype=torch.bfloat16))


def _capture_sums(monkeypatch) -> list[torch.Tensor]:
    """The sensitive sums S the server noises, in float64, in the order drawn."""
    sums: list[torch.Tensor] = []
    real = NoiseSource.noisy_mean

    def spy(self, total, std, normalizer, *args, **kwargs):
        sums.append(total.detach().double().cpu().clone())
        return real(self, total, std, normalizer, *args, **kwargs)

    monkeypatch.setattr(NoiseSource, "noisy_mean", spy)
    return sums


def _server(size: int, num_users: int, clip: float) -> DPFedAvgServer:
    return DPFedAvgServer(
        _Vector(size),
        num_users=num_users,
        user_sample_rate=1.0,
        clip=clip,
        noise_multiplier=1.0,
        rounds=2,
        delta=1e-5,
        seed=0,
    )


def test_neighbouring_rounds_sums_differ_by_at_most_c_in_a_bfloat16_model(monkeypatch):
    # 256 users send (1, 0); one more user sends (C, 0) with C = 1 + 2^-7 (a bfloat16 value).
    # Exactly, the two neighbouring sums are (256, 0) and (257 + 2^-7, 0): they differ by C.
    # Summed in bfloat16, 256 + C lands between 256 and 258 (the grid's spacing there is 2)
    # and rounds up to 258: the neighbours would differ by 2 ≈ 1.98·C, a sensitivity the
    # ledger does not hold. (In float32 every partial sum here is exact: at most 16
    # significant bits.)
    clip = 1 + 2**-7
    sums = _capture_sums(monkeypatch)
    server = _server(2, 257, clip)
    ones = torch.tensor([1.0, 0.0], dtype=torch.bfloat16)
    for with_last in (True, False):  # round 1: the last user dropped out (contributes 0)
        rp = server.begin_round()
        assert rp.users == tuple(range(257))
        replies = [Contribution(user=u, clipped={"v": ones}, norm=1.0) for u in range(256)]
        if with_last:
            last = torch.tensor([clip, 0.0], dtype=torch.bfloat16)
            replies.append(Contribution(user=256, clipped={"v": last}, norm=clip))
        server.finish_round(replies)
    with_last_sum, without = sums
    gap = float(torch.linalg.vector_norm(with_last_sum - without))
    assert gap <= clip * (1 + SLACK), f"neighbouring sums differ by {gap}, C = {clip}"


def test_a_float32_reply_is_summed_as_measured_in_a_bfloat16_model(monkeypatch):
    # A float32 reply of 64 entries v = 1 + 2^-8 + 2^-14 has norm exactly C = 8v, which the
    # check accepts. bfloat16's grid near 1 is spaced 2^-7, so v rounds up to 1 + 2^-7: if
    # the reply were converted to bfloat16 after the check, the sum would hold a delta of
    # norm 8(1 + 2^-7) ≈ 1.0039·C. The sum must hold what was measured.
    v = 1 + 2**-8 + 2**-14
    clip = 8 * v
    sums = _capture_sums(monkeypatch)
    server = _server(64, 1, clip)
    rp = server.begin_round()
    reply = torch.full((64,), v, dtype=torch.float32)
    server.finish_round([Contribution(user=rp.users[0], clipped={"v": reply}, norm=clip)])
    (total,) = sums
    assert float(torch.linalg.vector_norm(total)) <= clip * (1 + SLACK)


def test_clip_delta_of_a_bfloat16_delta_is_within_c_and_the_server_accepts_it():
    # An 8×8 bfloat16 delta of ones has norm 8; C = 8s with s = 1/2 + 2^-9 + 2^-15 scales
    # it by s. bfloat16's grid in [1/2, 1) is spaced 2^-8, so s·1 rounded to bfloat16 is
    # 1/2 + 2^-8 ≈ 1.0039·s: a clip computed in bfloat16 lands at ≈ 1.0039·C, and the server
    # (rightly) refuses it. dpfy's own client must produce a delta within C.
    s = 0.5 + 2**-9 + 2**-15
    clip = 8 * s
    delta = {"v": torch.ones(64, dtype=torch.bfloat16)}
    clipped, norm = clip_delta(delta, clip)
    assert norm == 8.0  # the norm before clipping: ones, exactly
    measured = math.sqrt(sum(float(t.double().square().sum()) for t in clipped.values()))
    assert measured <= clip * (1 + SLACK)
    server = _server(64, 1, clip)
    rp = server.begin_round()
    result = server.finish_round([Contribution(user=rp.users[0], clipped=clipped, norm=norm)])
    assert result.mean_delta["v"].dtype == torch.bfloat16  # released in the model's dtype
    assert server.ledger.num_steps == 1
