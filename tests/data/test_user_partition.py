"""The synthetic federated partition: every example has one user, sizes are power-law with a
floor, label mixes follow Dirichlet(α), and the public seed fixes it all."""

from __future__ import annotations

import torch

from dpfy.data.user_partition import partition_users


def _labels(n=6000, classes=10):
    return torch.arange(n) % classes


def test_every_example_has_one_user_and_every_user_the_minimum():
    p = partition_users(_labels(), num_users=200, alpha=0.5, min_size=5, seed=1)
    assert p.user_ids.shape == (6000,) and int(p.user_ids.min()) == 0
    assert int(p.user_ids.max()) == 199
    assert int(p.sizes.sum()) == 6000 and int(p.sizes.min()) >= 5
    assert sum(len(ix) for ix in p.users()) == 6000
    # power law: the heaviest 5 % of users hold far more than 5 % of the examples
    top = torch.sort(p.sizes, descending=True).values[:10].sum()
    assert top > 0.2 * 6000


def test_the_public_seed_fixes_the_partition_and_alpha_sets_the_skew():
    a = partition_users(_labels(), num_users=100, alpha=0.1, seed=3)
    b = partition_users(_labels(), num_users=100, alpha=0.1, seed=3)
    assert torch.equal(a.user_ids, b.user_ids) and a.sha256() == b.sha256()
    assert not torch.equal(a.user_ids, partition_users(_labels(), num_users=100, alpha=0.1,
                                                       seed=4).user_ids)

    def top_share(p):
        y = _labels()
        return sum(torch.bincount(y[ix], minlength=10).max().item() / len(ix)
                   for ix in p.users()) / p.num_users
    iid = partition_users(_labels(), num_users=100, alpha=100.0, seed=3)
    assert top_share(a) > 0.6 > 0.3 > top_share(iid)


def test_save_writes_one_id_per_line(tmp_path):
    p = partition_users(_labels(60), num_users=4, min_size=5, seed=0)
    lines = p.save(tmp_path / "ids.txt").read_text().split()
    assert [int(v) for v in lines] == p.user_ids.tolist()
