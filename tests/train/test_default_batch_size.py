"""``--batch-size`` defaults to one that fits the dataset (stated in --help): the benchmark's
2048 where it is at most a quarter of the training set, else a quarter of it."""

from dpfy.cli.train import train_parser
from dpfy.train.config import TrainConfig, resolve


def _batch(dataset: str, n: int) -> int:
    return resolve(TrainConfig(dataset=dataset), num_examples=n, reference_delta=None)[0].batch_size


def test_small_datasets_get_a_batch_that_fits():
    assert _batch("digits", 1438) == 1438 // 4 == 359        # 2048 > N was refused before
    assert _batch("breast_cancer", 455) == 113
    assert _batch("fashion_mnist", 60000) == 2048


def test_a_given_batch_is_kept_and_help_states_the_defaults():
    cfg = TrainConfig(dataset="digits", batch_size=64)
    assert resolve(cfg, num_examples=1438, reference_delta=None)[0].batch_size == 64
    text = " ".join(train_parser().format_help().split())
    assert "digits 359" in text and "breast_cancer 113" in text
