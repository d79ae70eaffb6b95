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


def _user_batch(tmp_path, users: int, sampling: str, k: int | None) -> int:
    import numpy as np

    path = tmp_path / "ids.npy"
    np.save(path, np.arange(1438) % users)       # 1438 digits examples, 9 or 10 per user at 150
    cfg = TrainConfig(dataset="digits", user_ids=str(path), user_sampling=sampling,
                      max_examples_per_user=k)
    return resolve(cfg, num_examples=1438, reference_delta=None)[0].batch_size


def test_user_level_default_batch_counts_what_a_step_samples(tmp_path):
    """Issue 35 §3: ULS samples users, so the default batch is a quarter of the 150 users
    (it was a quarter of the 1438 examples, 359 > 150, and the sampler refused it); ELS samples
    the examples kept after capping: min(n_u, k) summed over users."""
    assert _user_batch(tmp_path, 150, "uls", None) == 150 // 4 == 37
    assert _user_batch(tmp_path, 150, "uls", 5) == 37
    assert _user_batch(tmp_path, 150, "els", 1) == 150 // 4      # 150 examples kept
    assert _user_batch(tmp_path, 150, "els", 5) == 750 // 4      # every user has >= 9 examples
    assert _user_batch(tmp_path, 150, "els", 100) == 1438 // 4   # the cap keeps everything
