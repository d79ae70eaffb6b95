"""dpfy's user-level samplers (issue 26 §1–2): who is sampled, what is kept, what resumes.

ULS draws users (each with probability q_u) and brings a sampled user's rows together (all,
or k uniformly random ones); ELS keeps at most k random examples of every user once and then
samples examples. The expected frequencies below are the definitions', checked empirically
with tolerances of about five standard deviations.
"""

from __future__ import annotations

import pytest
import torch

from dpfy.sampling import UserCappedSampler, UserPoissonSampler, UserUnits

SIZES = [1, 2, 5, 9]
IDS = torch.cat([torch.full((s,), 10 * (u + 1)) for u, s in enumerate(SIZES)])[
    torch.randperm(sum(SIZES), generator=torch.Generator().manual_seed(0))]


CAPPED = torch.tensor([min(3, s) for s in SIZES])


def test_uls_samples_whole_users_at_rate_q_and_at_most_k_random_rows_each():
    units = UserUnits(IDS, clip_per_user=True)
    sampler = UserPoissonSampler(units, sample_rate=0.3, max_examples_per_user=3, seed=0)
    draws, seen = 800, torch.zeros(len(SIZES))
    picked = torch.zeros(len(IDS))
    for _ in range(draws):
        rows = sampler.draw()
        users = units.user_of[rows]
        assert torch.all(users[1:] >= users[:-1]) or len(rows) < 2   # grouped by user
        counts = torch.bincount(users, minlength=len(SIZES))
        assert torch.all((counts == 0) | (counts == CAPPED))
        seen += counts > 0
        picked[rows] += 1
    tolerance = 5 * (0.3 * 0.7 / draws) ** 0.5
    assert torch.all((seen / draws - 0.3).abs() < tolerance)
    # a user with 9 examples: each of them is one of the 3 drawn with probability 3/9
    big = units.user_of == 3
    assert torch.all((picked[big] / draws - 0.3 * 3 / 9).abs() < 0.05)
    assert sampler.normalizer == pytest.approx(0.3 * len(SIZES))
    assert sampler.steps_per_epoch == 4 and sampler.dataset_size == len(SIZES)


def test_els_keeps_at_most_k_random_examples_of_each_user_once():
    units = UserUnits(IDS, clip_per_user=False)
    a = UserCappedSampler(units, max_examples_per_user=2, batch_size=3, seed=5)
    b = UserCappedSampler(units, max_examples_per_user=2, batch_size=3, seed=5)
    assert torch.equal(a.kept, b.kept)          # seeded: reproducible (and secret)
    counts = torch.bincount(units.user_of[a.kept], minlength=len(SIZES))
    assert counts.tolist() == [1, 2, 2, 2]
    assert a.num_kept == 7 and a.sample_rate == pytest.approx(3 / 7)
    assert a.normalizer == pytest.approx(3.0) and a.dataset_size == len(SIZES)
    assert a.units_of(a.kept) is None           # every example clipped alone
    for _ in range(50):
        assert set(a.draw().tolist()) <= set(a.kept.tolist())
    picks = torch.zeros(len(IDS))
    for seed in range(150):   # over seeds, each of the 9-example user's examples is kept 2/9
        s = UserCappedSampler(units, max_examples_per_user=2, batch_size=3, seed=seed)
        picks[s.kept] += 1
    assert torch.all((picks[units.user_of == 3] / 150 - 2 / 9).abs() < 0.17)


def test_user_units_number_the_users_of_a_batch_and_scale_the_mean():
    units = UserUnits(torch.tensor([7, 3, 7, 9, 3, 7]), clip_per_user=True)
    rows = torch.tensor([0, 2, 5, 1])
    unit = units.units_of(rows)
    assert unit.tolist() == [1, 1, 1, 0]
    assert units.unit_scale(unit).tolist() == [1.0, 1 / 3]
    assert UserUnits(torch.tensor([1, 2]), clip_per_user=True,
                     reduction="sum").unit_scale(unit) is None
    with pytest.raises(ValueError, match="user_ids"):
        UserUnits(torch.tensor([0.5, 1.0]), clip_per_user=True)


def test_a_checkpoint_of_another_unit_or_user_sampling_is_refused():
    from dpfy.sampling import PoissonSampler
    uls = UserPoissonSampler(UserUnits(IDS, clip_per_user=True), sample_rate=0.5, seed=0)
    els = UserCappedSampler(UserUnits(IDS, clip_per_user=False), max_examples_per_user=2,
                            batch_size=2, seed=0)
    plain = PoissonSampler(len(IDS), sample_rate=0.5, seed=0)
    with pytest.raises(ValueError, match="unit of privacy"):
        plain.load_state_dict(uls.state_dict())
    with pytest.raises(ValueError, match="unit of privacy"):
        uls.load_state_dict(plain.state_dict())
    with pytest.raises(ValueError, match="unit of privacy"):
        els.load_state_dict(uls.state_dict())
    uls.load_state_dict(uls.state_dict())
    els.load_state_dict(els.state_dict())


def test_a_checkpoint_of_other_user_ids_is_refused():
    uls = UserPoissonSampler(UserUnits(IDS, clip_per_user=True), sample_rate=0.5, seed=0)
    moved = IDS.clone()
    moved[0] = 999   # one example moved to a new user
    other = UserPoissonSampler(UserUnits(moved, clip_per_user=True), sample_rate=0.5, seed=0)
    with pytest.raises(ValueError, match="user ids"):
        other.load_state_dict(uls.state_dict())
    renamed = UserPoissonSampler(UserUnits(IDS + 5, clip_per_user=True), sample_rate=0.5,
                                 seed=0)
    renamed.load_state_dict(uls.state_dict())   # the same grouping under other names is fine
