"""Each method's ``dpfy train`` defaults run: methods that need plain SGD (ADADP, NoisyMax,
NoisyBTLS) get momentum 0 unless --momentum is given; other runs keep the SGD recipe's 0.9."""

import pytest

from dpfy.train.config import TrainConfig


@pytest.mark.parametrize("method", ["adadp", "noisy_max", "noisy_btls", "noise_decay,noisy_max"])
def test_methods_that_need_plain_sgd_default_to_it(method):
    cfg = TrainConfig(method=method)
    assert (cfg.optimizer, cfg.momentum) == ("sgd", 0.0)


def test_other_runs_keep_the_recipe_and_a_given_momentum_wins():
    assert TrainConfig().momentum == 0.9
    assert TrainConfig(method="noise_decay").momentum == 0.9
    assert TrainConfig(method="adadp", momentum=0.5).momentum == 0.5  # refused at make_private
