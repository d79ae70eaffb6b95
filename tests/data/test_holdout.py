"""The shared train/validation carve reproduces the split the experiments used before it."""

import pytest
import torch

from dpfy.data.splits import holdout_indices


def test_reproduces_the_experiments_previous_split():
    # the code each experiment had (label_dp, pur, individual_accounting): one permutation of
    # the 60,000 training images under seed 1234, the first 8,000 for training, the next 2,000
    # for validation
    perm = torch.randperm(60_000, generator=torch.Generator().manual_seed(1234))
    old_tr, old_va = perm[:8000], perm[8000:10_000]
    tr, va = holdout_indices(60_000, 8000, 2000, seed=1234)
    assert torch.equal(tr, old_tr) and torch.equal(va, old_va)
    assert len(set(tr.tolist()) | set(va.tolist())) == 10_000  # disjoint


def test_refuses_more_than_there_is():
    with pytest.raises(ValueError, match="num_train \\+ num_val must be <= num_examples"):
        holdout_indices(100, 80, 30, seed=0)
