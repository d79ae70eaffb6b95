"""Small, fast settings shared by the training tests: logistic regression on sklearn digits
(the ``interrupt`` fixture, shared with tests/cli, is in tests/conftest.py)."""

import pytest

from dpfy.train import TrainConfig

FAST = dict(dataset="digits", model="logreg", epochs=3, batch_size=128, lr=1.0, clip=1.0,
            seed=7, threads=1)


@pytest.fixture
def fast_config() -> TrainConfig:
    return TrainConfig(**FAST)
