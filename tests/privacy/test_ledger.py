"""Ledger completeness: samplings, composed releases, JSON round trip, compactness."""


import json

import pytest

import dpfy.privacy as privacy
from dpfy.privacy import Ledger, Release, Sampling, epsilon


def test_json_round_trip_keeps_every_field_and_epsilon():
    ledger = Ledger(dataset_size=50000)
    ledger.record_step(sampling=Sampling.POISSON, sample_rate=0.02,
                       releases=[Release("gradient", 1.0), Release("loss_probe", 5.0)],
                       count=3)
    ledger.record_step(sampling=Sampling.POISSON, sample_rate=0.02,
                       releases=[Release("gradient", 0.9)], count=7)
    again = Ledger.from_json(ledger.to_json())
    assert again.to_dict() == ledger.to_dict()
    assert epsilon(again, delta=1e-5) == epsilon(ledger, delta=1e-5)
    fixed = Ledger.homogeneous(sample_rate=0.01, noise_multiplier=1.0, steps=5,
                               sampling=Sampling.FIXED_SIZE, dataset_size=1000)
    assert Ledger.from_json(fixed.to_json()).step_groups[0].sampling is Sampling.FIXED_SIZE


def test_100k_identical_steps_stay_small():
    ledger = Ledger()
    for _ in range(100_000):
        ledger.record_step(sampling=Sampling.POISSON, sample_rate=0.01,
                           releases=[Release("gradient", 1.0)])
    assert len(ledger.step_groups) == 1 and ledger.num_steps == 100_000
    assert len(ledger.to_json()) < 400


def test_effective_noise_multiplier_and_non_private():
    ledger = Ledger()
    ledger.record_step(sampling=Sampling.NONE, sample_rate=1.0,
                       releases=[Release("gradient", 3.0), Release("count", 4.0)])
    assert ledger.step_groups[0].effective_noise_multiplier() == pytest.approx(2.4)  # (1/9+1/16)^-½
    ledger.record_step(sampling=Sampling.NONE, sample_rate=1.0,
                       releases=[Release("gradient", 0.0)])
    assert not ledger.is_private()
    assert ledger.step_groups[1].effective_noise_multiplier() == 0.0


def test_sampling_semantics():
    assert Sampling.POISSON.adjacency == "add_or_remove" and Sampling.POISSON.amplified
    assert Sampling.FIXED_SIZE.adjacency == "replace_one" and Sampling.FIXED_SIZE.amplified
    assert Sampling.SHUFFLE.adjacency == "replace_one" and not Sampling.SHUFFLE.amplified
    assert Sampling.NONE.adjacency is None


def test_all_exports_exist():
    for name in privacy.__all__:
        assert getattr(privacy, name) is not None


def test_the_old_name_groups_reads_step_groups_and_warns():
    """``Ledger.groups`` was renamed ``step_groups`` (issue 37 §4); the old name still reads the
    same list, with a DeprecationWarning naming the new one. The JSON key stays "groups"."""
    ledger = Ledger.homogeneous(sample_rate=0.01, noise_multiplier=1.0, steps=5)
    with pytest.warns(DeprecationWarning, match=r"Ledger\.groups is deprecated.*step_groups"):
        assert ledger.groups is ledger.step_groups
    assert len(ledger.to_dict()["groups"]) == 1


def _group_rows(ledger):
    return [(g.count, g.sample_rate, g.releases, g.max_examples_per_user)
            for g in ledger.step_groups]


def test_segment_and_prefix_cut_groups_at_step_boundaries():
    """Steps [start, stop) as a ledger of their own: groups of 3 (σ 1.0) and 7 (σ 0.9) steps,
    steps [2, 6) are the last 1 of the first group and the first 3 of the second (counted by
    hand); a prefix is the segment from step 0, and a segment without stop runs to the end."""
    g1, g2 = [Release("gradient", 1.0)], [Release("gradient", 0.9)]
    ledger = Ledger(dataset_size=1000)
    ledger.record_step(sampling=Sampling.POISSON, sample_rate=0.02, releases=g1, count=3)
    ledger.record_step(sampling=Sampling.POISSON, sample_rate=0.02, releases=g2, count=7)
    assert _group_rows(ledger.segment(2, 6)) == [(1, 0.02, tuple(g1), None),
                                                 (3, 0.02, tuple(g2), None)]
    assert _group_rows(ledger.segment(4)) == [(6, 0.02, tuple(g2), None)]
    assert _group_rows(ledger.prefix(4)) == [(3, 0.02, tuple(g1), None),
                                             (1, 0.02, tuple(g2), None)]
    assert ledger.segment(10).num_steps == 0 and ledger.segment(2, 6).dataset_size == 1000


@pytest.mark.parametrize("where", ["top", "group", "release"])
def test_a_field_the_format_does_not_define_is_refused_not_ignored(where):
    """A misspelt ``max_examples_per_user`` (k = 8 examples per user under ELS) was dropped and
    the file read as if it were not there; any unknown field is now refused, by name."""
    d = json.loads(Ledger.homogeneous(sample_rate=0.01, noise_multiplier=1.0, steps=10).to_json())
    target = {"top": d, "group": d["groups"][0], "release": d["groups"][0]["releases"][0]}[where]
    target["max_example_per_user"] = 8
    with pytest.raises(ValueError, match="max_example_per_user"):
        Ledger.from_json(json.dumps(d))
