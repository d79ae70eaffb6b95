"""Small, fast settings shared by the training tests: logistic regression on sklearn digits."""

import sys
from pathlib import Path

import pytest

import dpfy.train.trainer as trainer_mod
from dpfy.train import TrainConfig, train

DATA_TESTS = str(Path(__file__).resolve().parents[1] / "data")     # for fake_idx
if DATA_TESTS not in sys.path:
    sys.path.insert(0, DATA_TESTS)

QUIET = dict(progress=False, echo=lambda s: None)

FAST = dict(dataset="digits", model="logreg", epochs=3, batch_size=128, lr=1.0, clip=1.0,
            seed=7, threads=1)


@pytest.fixture
def fast_config() -> TrainConfig:
    return TrainConfig(**FAST)


@pytest.fixture
def interrupt(monkeypatch):
    """``interrupt(cfg, out, after_epochs=k)``: run ``cfg`` and stop it after k epochs."""
    def run(cfg: TrainConfig, out: Path, *, after_epochs: int) -> None:
        real, calls = trainer_mod.run_epoch, []

        def crash(*args, **kwargs):
            calls.append(1)
            if len(calls) > after_epochs:
                raise KeyboardInterrupt
            return real(*args, **kwargs)

        monkeypatch.setattr(trainer_mod, "run_epoch", crash)
        try:
            with pytest.raises(KeyboardInterrupt):
                train(cfg, out=out, **QUIET)
        finally:
            monkeypatch.setattr(trainer_mod, "run_epoch", real)
    return run
