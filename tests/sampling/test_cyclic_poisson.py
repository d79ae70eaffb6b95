"""The cyclic Poisson sampler: b balanced disjoint groups, step t draws only from group
t mod b at rate b·B/N, and only taken batches move the step."""

import torch

import pytest

from dpfy.sampling import CyclicPoissonSampler
from dpfy.types import Sampling


def test_groups_are_balanced_disjoint_and_cover_the_data():
    s = CyclicPoissonSampler(103, 5, bands=4, seed=0)
    sizes = sorted(len(g) for g in s.groups)
    assert sizes == [25, 26, 26, 26]
    assert torch.equal(torch.cat(s.groups).sort().values, torch.arange(103))
    assert s.sampling is Sampling.CYCLIC_POISSON
    assert s.sample_rate == pytest.approx(5 * 4 / 103) and s.normalizer == 5.0


def test_each_step_draws_from_its_group_at_the_group_rate():
    s = CyclicPoissonSampler(400, 10, bands=4, seed=1)
    counts = torch.zeros(400)
    steps = 2000
    for t in range(steps):
        idx = s.draw(t)
        assert bool(torch.isin(idx, s.groups[t % 4]).all())
        counts[idx] += 1
    # every example is visited steps/4 times at rate q = 0.1: mean count 50, sd ≈ 6.7
    assert abs(float(counts.mean()) - 50) < 1.5
    assert float(counts.std()) < 10


def test_only_taken_batches_move_the_step_and_separation_is_b():
    s = CyclicPoissonSampler(60, 5, bands=3, seed=2)
    first = list(s.chunks(None))
    assert len(first) == s.steps_per_epoch == 12
    s.commit(first[0][2])
    s.commit(first[1][2])
    assert s.step == 2
    again = next(iter(s.chunks(None)))        # a new pass resumes at step 2: group 2
    assert bool(torch.isin(again[0], s.groups[2]).all())
    seen: dict[int, list[int]] = {}
    for t, (idx, _, end) in enumerate(s.chunks(None), start=2):
        for i in idx.tolist():
            seen.setdefault(i, []).append(t)
        s.commit(end)
    gaps = [b - a for ts in seen.values() for a, b in zip(ts, ts[1:])]
    assert gaps and all(g % 3 == 0 for g in gaps)


def test_physical_chunks_keep_the_draw_across_a_restart():
    s = CyclicPoissonSampler(200, 40, bands=2, seed=3)
    idx, last, end = next(iter(s.chunks(7)))
    assert not last
    s.commit(end)
    rest = next(iter(s.chunks(7)))               # continues the same logical batch
    assert rest[2][0] == 0 and bool(torch.isin(rest[0], s.groups[0]).all())
    assert not bool(torch.isin(rest[0], idx).any())


def test_refuses_a_batch_larger_than_a_group():
    with pytest.raises(ValueError, match="bands"):
        CyclicPoissonSampler(100, 30, bands=4)
